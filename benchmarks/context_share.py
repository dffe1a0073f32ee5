"""How much of a context net's score comes from its image-level term? Per folder of images.

    python benchmarks/context_share.py [WEIGHTS] --folder DIR [DIR ...] [--threshold T]

For weights trained with ``--context`` (the packaged ones by default): splits each image's score
into the crop part (the aggregated crop logits, what a crop-only net computes) and the context
term, and prints per folder the median of each, and the share of images above the threshold
(default: the packaged calibration's) with the full score and with the crop part alone. Images
that only the context term pushes over the threshold are the ones it is responsible for; listed
by name. Decoding as the detector does it (``images.load_image``).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from collapseguard.detectors.cnn import CNNDetector, image_crops
from collapseguard.images import load_image
from collapseguard.training.negatives import list_images


@torch.inference_mode()
def parts(det: CNNDetector, paths) -> tuple[np.ndarray, np.ndarray]:
    """(crop part, context term) per image."""
    size = det.net.config.crop_size
    crop_part, ctx = [], []
    for p in paths:
        x = torch.from_numpy(image_crops(load_image(p), size, det.n_crops)[None]).to(det.device)
        a, b = det.net.score_parts(x)
        crop_part.append(float(a[0]))
        ctx.append(float(b[0]))
    return np.array(crop_part), np.array(ctx)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="?", default=None)
    ap.add_argument("--folder", nargs="+", required=True)
    ap.add_argument("--threshold", type=float, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    det = CNNDetector(weights=args.weights, device="cpu")
    if not det.net.config.context:
        ap.error(f"weights {det.version} have no context term")
    t = args.threshold
    if t is None:
        from collapseguard.calibration.files import default_calibration
        cal = default_calibration("cnn", det.version)
        if cal is None:
            ap.error(f"no packaged calibration for {det.version}: pass --threshold")
        t = cal.threshold
    print(f"weights {det.version}, threshold {t:g}")
    for d in args.folder:
        paths = [str(p) for p in list_images([d])]
        crop_part, ctx = parts(det, paths)
        full = crop_part + ctx
        only = [os.path.basename(p) for p, a, b in zip(paths, full, crop_part) if a > t >= b]
        print(f"{d}: n={len(paths)}  median crop part {np.median(crop_part):.2f}, context term "
              f"{np.median(ctx):.2f}  above threshold: full score {np.mean(full > t):.1%}, "
              f"crop part alone {np.mean(crop_part > t):.1%}")
        if only:
            print("  over the threshold only with the context term:", ", ".join(sorted(only)[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
