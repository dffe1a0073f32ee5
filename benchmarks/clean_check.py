"""Clean images never used in training or calibration: how many would the filter drop?

    python benchmarks/clean_check.py [WEIGHTS ...] --folder DIR [DIR ...] [--heldout-split]
                                     [--threshold T ...]

For example the `test` half of Debian's stellarium-data astrophotographs
(``bash recipes/nightsky.sh DEB_DIR DIR test``): real night skies whose sensor noise resembles the
noise replication adds, the clean images a degradation filter is most likely to drop by mistake. Printed per weights file (default: the packaged weights):
the score quantiles, and the share scored above the shipped calibration's threshold (for the
packaged weights; the calibration is tied to a weights version) and above each ``--threshold``.

Any clean folders work. With ``--heldout-split`` only the files that ``collapseguard train`` holds
out of its ``--clean`` folders (``training.negatives.split_clean``) are scored: e.g. the training
folders of recipes/train_cnn.sh, giving clean photos, night skies and art that training never
saw, a second check of the shipped guarantee on images unlike the calibration's.

    python benchmarks/clean_check.py [WEIGHTS ...] --thumbnails 48,64,100,128,192,256

    python benchmarks/clean_check.py [WEIGHTS ...] --folder DIR [DIR ...] --mirror

adds how far each score moves when the image is mirrored left to right, which shows the same
damage: the median and 90th percentile of the change, its largest, and the share of images whose
side of the shipped threshold (or of each ``--threshold``) changes. A net with the ``mirror``
option moves by nothing.

    python benchmarks/clean_check.py [WEIGHTS ...] --thumbnails 48,64,100,128,192,256

scores instead the top-left square crop of scikit-image's astronaut, coffee and chelsea photos at
each size (nothing downloaded): whether a thumbnail scores like the same content at full size. A
crop under the 48 px crop window is reflect-padded, and a few windows give little to average.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.calibration.thresholds import default_calibration
from collapseguard.detectors.cnn import CNNDetector
from collapseguard.training.metrics import score_paths
from collapseguard.training.negatives import list_images, split_clean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="*", help="cnn weights files (default: the packaged weights)")
    ap.add_argument("--folder", nargs="+", help="folders of clean images")
    ap.add_argument("--thumbnails", help="comma-separated sizes: score crops of bundled photos instead")
    ap.add_argument("--heldout-split", action="store_true",
                    help="score only the files collapseguard train holds out of these folders")
    ap.add_argument("--threshold", type=float, nargs="*", default=[])
    ap.add_argument("--mirror", action="store_true",
                    help="also score every image mirrored left to right and print how far scores move")
    args = ap.parse_args(argv)
    if args.thumbnails:
        return thumbnails(args.weights, [int(v) for v in args.thumbnails.split(",")])
    if not args.folder:
        ap.error("give --folder DIR ... or --thumbnails SIZES")
    paths = list_images([Path(f) for f in args.folder])
    if args.heldout_split:
        paths = split_clean(paths)[1]
    files = [str(p) for p in paths]
    if not files:
        ap.error(f"no images in {args.folder}")
    rows = []
    for w in args.weights or [None]:
        det = CNNDetector(weights=w, device="cpu")
        s = score_paths(det, files)
        row = {"weights": Path(w).name if w else "packaged", "version": det.version, "n": len(s)}
        row.update({f"q{q}": float(np.quantile(s, q / 100)) for q in (50, 90, 99)})
        row["max"] = float(s.max())
        row["highest"] = Path(files[int(np.argmax(s))]).name
        cal = default_calibration("cnn", det.version)
        if cal is not None and cal.threshold is not None:
            row["shipped threshold"] = cal.threshold
            row["above shipped threshold"] = float(np.mean(s > cal.threshold))
        for t in args.threshold:
            row[f"above {t:g}"] = float(np.mean(s > t))
        if args.mirror:
            row.update(mirror_moves(det, files, s, [*([cal.threshold] if "shipped threshold" in row else []),
                                                    *args.threshold]))
        rows.append(row)
    print(pd.DataFrame(rows).set_index("weights").T.to_string())
    return 0


def mirror_moves(det, files: list[str], scores: np.ndarray, thresholds: list[float]) -> dict:
    """How far ``det``'s ``scores`` of ``files`` move when each image is mirrored left to right."""
    mirrored = score_paths(det, files, transform=lambda im: np.ascontiguousarray(im[:, ::-1]))
    moved = np.abs(mirrored - scores)
    out = {"mirror |change| q50": float(np.median(moved)), "mirror |change| q90": float(np.quantile(moved, 0.9)),
           "mirror |change| max": float(moved.max())}
    for t in thresholds:
        out[f"mirror flips side of {t:.4g}"] = float(np.mean((scores > t) != (mirrored > t)))
    return out


def thumbnails(weights, sizes) -> int:
    """Scores of the top-left ``size`` px square of three bundled photos, per weights file."""
    from skimage import data

    for w in weights or [None]:
        det = CNNDetector(weights=w, device="cpu")
        cal = default_calibration("cnn", det.version)
        shipped = f", shipped threshold {cal.threshold:.4g}" if cal is not None else ""
        print(f"{Path(w).name if w else 'packaged'} ({det.version}{shipped})")
        print(f"{'photo':<10}" + "".join(f"{s:>8}" for s in sizes))
        for name in ("astronaut", "coffee", "chelsea"):
            img = getattr(data, name)()
            print(f"{name:<10}" + "".join(f"{float(v):>8.2f}" for v in det.score([img[:s, :s] for s in sizes])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
