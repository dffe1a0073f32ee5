"""Audit two small demo datasets and print how many clean and degraded images were flagged.

    python benchmarks/audit_demo.py [--detector nss] [--compare pyiqa:piqe] [--out DIR] [--screenshot]

Photos that ship with installed packages (``bundled_photos``, centre-cropped to 640 px) are split
by index: even ones are *held out* and only set the threshold (unless ``--threshold`` is given:
the highest score among the held-out clean photos, an uncalibrated cut); odd ones form the audited
data. Two datasets are audited with ``run_audit``:

- ``noise``: each audited photo plus a copy re-rendered ``--steps`` times by ``--process``: the
  ``noise_tint`` replicator (grain re-synthesised and sharpened every step, slowly growing colour
  cast; the default), ``noise_resample`` (grain + a 0.8x resample + a slight green gain) or
  ``noise_sharpen`` (grain + an unsharp mask that amplifies it + a green shift);
- ``demo``: the shards of ``collapseguard demo`` (every bundled photo plus a copy degraded by one
  of five replicator families); clean figures there count only the non-held-out photos.

Prints the flagged counts per truth label (and per family for ``demo``), the audit's own flagged
fraction with its interval, and the report paths; ``--screenshot`` also saves a full-page PNG of
each report taken with headless Chromium.
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def _fit(img, side=640):
    h, w = img.shape[:2]
    y, x = max(0, (h - side) // 2), max(0, (w - side) // 2)
    return img[y: y + side, x: x + side]


def _add(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def noise_resample_step(img: np.ndarray, rng) -> np.ndarray:
    """One crude re-render: fresh grain, a 0.8x resample down and back up, a slight green gain."""
    from PIL import Image
    x = img.astype(np.float32) + rng.normal(0, 3.0, img.shape)
    x[..., 1] *= 1.01
    small = Image.fromarray(np.clip(x, 0, 255).astype(np.uint8))
    h, w = img.shape[:2]
    small = small.resize((max(1, int(w * 0.8)), max(1, int(h * 0.8))), Image.Resampling.BICUBIC)
    return np.asarray(small.resize((w, h), Image.Resampling.BICUBIC))


def noise_sharpen_step(img: np.ndarray, rng) -> np.ndarray:
    """One crude re-render (the test suite's loop): fresh grain, an unsharp mask that amplifies
    it, a slight green shift."""
    from scipy import ndimage
    x = img.astype(np.float32) + rng.normal(0, 4.0, img.shape)
    x = x + 0.6 * (x - ndimage.gaussian_filter(x, (1, 1, 0)))
    x[..., 1] += 1.5
    return np.clip(x, 0, 255).astype(np.uint8)


PROCESSES = {"noise_resample": noise_resample_step, "noise_sharpen": noise_sharpen_step}


def build_noise_shards(out: Path, photos, steps: int, process: str = "noise_tint",
                       seed: int = 0) -> list[str]:
    from collapseguard.images import encode_jpeg
    from collapseguard.training_data_tools.replicators import create_replicator
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "noise-000.tar", out / "noise-001.tar"]
    tfs = [tarfile.open(p, "w") for p in paths]
    for j, (i, name, img) in enumerate(photos):
        step = PROCESSES.get(process) or create_replicator(process, rng).step
        x = img
        for _ in range(steps):
            x = step(x, rng)
        for label, im in (("clean", img), ("degraded", x)):
            tf = tfs[j % 2]
            _add(tf, f"{i:03d}_{label}.jpg", encode_jpeg(im, 95))
            _add(tf, f"{i:03d}_{label}.txt", f"a photo ({name})".encode())
    for tf in tfs:
        tf.close()
    return [str(p) for p in paths]


def truth_table(df: pd.DataFrame, held_out: set[int], families: dict[str, str] | None = None) -> dict:
    idx = df["key"].str.slice(0, 3).astype(int)
    label = np.where(df["key"].str.endswith("_degraded"), "degraded", "clean")
    keep = ~((label == "clean") & idx.isin(held_out))
    out = {}
    for lab in ("clean", "degraded"):
        m = keep & (label == lab)
        out[lab] = {"flagged": int(df.loc[m, "flagged"].sum()), "n": int(m.sum())}
    if families:
        fam = df["key"].map(families)
        for f in sorted(set(families.values())):
            m = (fam == f).to_numpy() & (label == "degraded")
            out[f"degraded/{f}"] = {"flagged": int(df.loc[m, "flagged"].sum()), "n": int(m.sum())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--detector", default="nss")
    ap.add_argument("--threshold", type=float, default=None)
    ap.add_argument("--compare", default="", help="comma-separated detectors to compare")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--process", default="noise_tint",
                    help="degradation of the 'noise' dataset: a replicator family (noise_tint, ...) "
                         "or noise_resample (grain + 0.8x resample + green gain per step) or "
                         "noise_sharpen (grain + unsharp mask + green shift per step)")
    ap.add_argument("--skip-demo", action="store_true", help="audit only the 'noise' dataset")
    ap.add_argument("--out", default=None)
    ap.add_argument("--screenshot", action="store_true")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()

    import torch
    torch.set_num_threads(2)
    from collapseguard.audit.run import AuditOptions, run_audit
    from collapseguard.demo import build_demo_shards
    from collapseguard.detectors import create
    from collapseguard.training_data_tools.sources import bundled_photos

    root = Path(args.out or tempfile.mkdtemp(prefix="audit-demo-"))
    t0 = time.perf_counter()
    photos = [(i, n, _fit(a)) for i, (n, a) in enumerate(bundled_photos(min_side=256))]
    held = [p for p in photos if p[0] % 2 == 0]
    audited = [p for p in photos if p[0] % 2 == 1]
    det = create(args.detector)
    if args.threshold is None:
        threshold = float(np.max(det.score([a for _, _, a in held])))
        how = f"highest {det.name} score among {len(held)} held-out clean photos (uncalibrated)"
    else:
        threshold, how = args.threshold, "given with --threshold"
    print(f"detector {det.name}@{det.version}; threshold {threshold:.4f}: {how}")

    noise = build_noise_shards(root / "noise", audited, args.steps, args.process)
    demo = [] if args.skip_demo else [str(p) for p in build_demo_shards(root / "demo", steps=args.steps)]
    families = {}
    for p in demo:
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                if m.name.endswith("_degraded.json"):
                    families[m.name[:-5]] = json.loads(tf.extractfile(m).read())["family"]
    print(f"built datasets in {root} ({time.perf_counter() - t0:.0f}s)")

    compare = tuple(n for n in args.compare.split(",") if n)
    runs = [("noise", noise, None)] + ([("demo", demo, families)] if demo else [])
    print(f"'noise' dataset: {len(audited)} photos + copies after {args.steps} x {args.process}")
    for name, inputs, fams in runs:
        opts = AuditOptions(detector=det.name, threshold=threshold, compare=compare,
                            workers=args.workers, gallery_size=8)
        t = time.perf_counter()
        summary = run_audit(inputs, root / f"audit-{name}", opts, quiet=True, detector_obj=det)
        df = pd.read_parquet(root / f"audit-{name}" / "scores.parquet")
        table = truth_table(df, {i for i, _, _ in held}, fams)
        print(f"\n[{name}] {summary['samples']} samples audited in {time.perf_counter() - t:.0f}s; "
              f"flagged {summary['flagged']}/{summary['scored']} = {100 * summary['flagged_fraction']:.1f}% "
              f"(95% CI {100 * summary['ci_low']:.1f}-{100 * summary['ci_high']:.1f}%)")
        for k, v in table.items():
            print(f"  {k:<28} flagged {v['flagged']:>2} / {v['n']}")
        for c in summary["compare"]:
            print(f"  compare {c['detector']}: agreement {100 * c['agreement']:.0f}%, "
                  f"{c['main_flags_other_calls_fine']} flagged only by {det.name}, "
                  f"{c['other_flags_main_calls_fine']} only by {c['detector']}")
        report = root / f"audit-{name}" / "report.html"
        print(f"  report {report}")
        if args.screenshot:
            from collapseguard.audit.browser import inspect_report
            info = inspect_report(report, screenshot=report.with_suffix(".png"))
            print(f"  screenshot {report.with_suffix('.png')} ({info['images']} images, "
                  f"{len(info['broken'])} broken, {len(info['problems'])} console problems)")


if __name__ == "__main__":
    main()
