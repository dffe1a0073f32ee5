"""Images/s of several detectors on the same 1024x768 images, in one run, with their ratios.

    python benchmarks/detector_speed.py [--n 16] [--threads 1] [--batch-size 8] [--rounds 5]
        [--detectors cnn,pyiqa:piqe,nss] [--device cpu] [--weights PATH] [--n-crops K [K ...]]
        [--runtime auto|onnx|torch] [--run-images R [R ...]]

Images: the bundled photos and procedural art of ``collapseguard.training_data_tools.sources``
(when present, else seeded procedural images) brought to exactly 1024x768 once, before timing;
every detector then scores those same decoded arrays at that native size. Timing counts only the
time inside ``Detector.score`` (``collapseguard.evaluation.scoring.time_detectors``: one untimed
warm-up image per detector, then batches of ``--batch-size``, the detectors taking turns batch by
batch). The whole timing is repeated in ``--rounds`` rounds, the detector order reversed every
other round, and a round's ratio compares the detectors' rates within that round: on a shared
machine a burst of load then moves one round's ratio, not the reported median.

``--runtime``, ``--weights`` and ``--n-crops`` apply to ``cnn`` (``--runtime auto``, the default, is
what ``filter`` runs: onnxruntime on the CPU where it is installed; ``--threads`` sets torch's
and onnxruntime's threads alike): ``--n-crops 48 96`` times the cnn at each crop
count (the speed/accuracy knob) beside the same other detectors; ``--run-images 1 2 4`` (the cnn on
onnxruntime) times it at each number of images per onnxruntime call. Detectors that cannot be created
(missing extra or weights) are reported and left out. Printed: each detector's median images/s,
and the median (lowest-highest) per-round ratio of the first detector to each other one.
"""

from __future__ import annotations

import argparse
import os
import platform

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
from PIL import Image

W, H = 1024, 768


def _procedural(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    out = []
    for _ in range(n):
        f = rng.uniform(0.005, 0.05, 3)
        img = np.stack([127 + 100 * np.sin(xx * f[c] + yy * f[(c + 1) % 3] + rng.uniform(0, 6))
                        for c in range(3)], -1)
        img += rng.normal(0, rng.uniform(1, 8), img.shape)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out


def test_images(n: int) -> tuple[list[np.ndarray], str]:
    """``n`` RGB uint8 arrays of exactly 1024x768 (cycled from the available sources)."""
    try:
        from collapseguard.training_data_tools import sources

        srcs = [a for _, a in sources.bundled_photos()] + [a for _, a in sources.procedural_art(8, seed=3)]
        what = "bundled photos + procedural art"
    except Exception as exc:  # noqa: BLE001 - fall back to seeded procedural images
        srcs, what = _procedural(min(n, 8)), f"seeded procedural images ({type(exc).__name__})"
    imgs = [np.asarray(Image.fromarray(a).resize((W, H), Image.BICUBIC)) if a.shape[:2] != (H, W) else a
            for a in srcs]
    return (imgs * (n // len(imgs) + 1))[:n], what


def round_rates(detectors, labels: list[str], images, batch_size: int, n_rounds: int) -> dict[str, list[float]]:
    """``{label: [images/s per round]}``: ``time_detectors`` over all detectors, ``n_rounds`` times,
    in forward order in even rounds and reversed in odd ones (warm-up in the first round only)."""
    from collapseguard.evaluation.scoring import time_detectors

    out: dict[str, list[float]] = {lab: [] for lab in labels}
    for r in range(n_rounds):
        idx = list(range(len(detectors)))
        if r % 2:
            idx.reverse()
        timings = time_detectors([detectors[i] for i in idx], images, batch_size=batch_size, warmup=r == 0)
        for i, t in zip(idx, timings):
            out[labels[i]].append(float(t.images_per_s))
    return out


def ratio_summary(rates: dict[str, list[float]], num: str, den: str) -> tuple[float, float, float]:
    """Median, lowest and highest of the per-round ratios ``rates[num][i] / rates[den][i]``."""
    r = np.asarray(rates[num], dtype=float) / np.asarray(rates[den], dtype=float)
    return float(np.median(r)), float(r.min()), float(r.max())


def _label(name: str, det, run_images: int | None) -> str:
    """A cnn variant's label: its crop count, and its images per onnxruntime call when given."""
    return f"{name} ({det.n_crops} crops" + (f", {run_images}/call)" if run_images else ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="images to score per detector and round")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads of every detector, torch's and onnxruntime's alike")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (medians reported)")
    ap.add_argument("--detectors", default="cnn,pyiqa:piqe,nss")
    ap.add_argument("--device", default="cpu", help="device for detectors that take one")
    ap.add_argument("--weights", default=None, help="cnn weights (default: the packaged ones)")
    ap.add_argument("--n-crops", type=int, nargs="+", default=[None],
                    help="crops per image for cnn, one cnn per count (default: the count stored with the weights)")
    ap.add_argument("--runtime", default="auto", choices=("auto", "onnx", "torch"),
                    help="the cnn's runtime (default auto, as filter: onnxruntime on the CPU where installed)")
    ap.add_argument("--run-images", type=int, nargs="+", default=[None],
                    help="with the cnn on onnxruntime: images per onnxruntime call, one cnn per value "
                         "(default: cnn_onnx.RUN_IMAGES)")
    args = ap.parse_args()
    if args.rounds < 1 or args.n < 1 or args.batch_size < 1:
        ap.error("--rounds, --n and --batch-size must be >= 1")

    import torch

    from collapseguard.detectors import DetectorError, create

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # onnxruntime's sessions read it when made
    images, what = test_images(args.n)
    dets, labels = [], []
    for name in [d.strip() for d in args.detectors.split(",") if d.strip()]:
        variants = [{}]
        if name == "cnn":
            extra = {"weights": args.weights} if args.weights else {}
            extra["runtime"] = args.runtime
            variants = [{**extra, **({"n_crops": k} if k else {}), "run_images": r}
                        for k in args.n_crops for r in args.run_images]
        for kw in variants:
            run_images = kw.pop("run_images", None)
            try:
                det = create(name, **kw)
                det = det.to(args.device) or det
            except (DetectorError, ImportError, OSError) as exc:
                print(f"{name:<12} not available: {exc}")
                break
            if run_images is not None:
                if not hasattr(det, "run_images"):
                    ap.error("--run-images needs the cnn on onnxruntime (--runtime onnx or auto)")
                det.run_images = run_images
            dets.append(det)
            labels.append(_label(name, det, run_images) if len(variants) > 1 else name)
    if not dets:
        ap.error("no detector could be created")
    runtimes = sorted({getattr(d, "runtime", "torch") for d, lab in zip(dets, labels) if lab.startswith("cnn")})
    print(f"images: {len(images)} x {W}x{H} ({what}); cnn runtime {', '.join(runtimes) or '-'}; "
          f"threads {args.threads}; batch {args.batch_size}; "
          f"{args.rounds} rounds; device {args.device}; cpu {platform.processor() or platform.machine()}")
    print("timing: seconds inside Detector.score only (decode excluded), after one warm-up image")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import load_line

    print(f"at the start: {load_line()}")
    rates = round_rates(dets, labels, images, args.batch_size, args.rounds)
    print(f"at the end: {load_line()}")
    for det, lab in zip(dets, labels):
        print(f"{lab:<16} {np.median(rates[lab]):9.2f} images/s  (median of {args.rounds} rounds; "
              f"version {det.version})")
    for lab in labels[1:]:
        med, lo, hi = ratio_summary(rates, labels[0], lab)
        print(f"speed ratio {labels[0]}/{lab}: {med:.1f}x (median of {args.rounds} rounds; "
              f"rounds {lo:.1f}x-{hi:.1f}x)")


if __name__ == "__main__":
    main()
