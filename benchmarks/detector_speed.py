"""Images/s of several detectors on the same 1024x768 images, in one run, with their ratios.

    python benchmarks/detector_speed.py [--n 16] [--threads 1] [--batch-size 8]
        [--detectors cnn,pyiqa:piqe,nss] [--device cpu]

Images: the bundled photos and procedural art of ``collapseguard.training_data_tools.sources``
(when present, else seeded procedural images) brought to exactly 1024x768 once, before timing;
every detector then scores those same decoded arrays at that native size. Timing counts only the
time inside ``Detector.score`` (``collapseguard.evaluation.scoring.time_detectors``: one untimed
warm-up image per detector, then batches of ``--batch-size``, the detectors taking turns batch by
batch so that a burst of load on this shared machine does not fall on one of them). Detectors that cannot be created
(missing extra or weights) are reported and left out. Prints one line per detector and the ratio of
the first detector's speed to each other's.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="images to score per detector")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (same for all)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--detectors", default="cnn,pyiqa:piqe,nss")
    ap.add_argument("--device", default="cpu", help="device for detectors that take one")
    args = ap.parse_args()

    import torch

    from collapseguard.detectors import DetectorError, create
    from collapseguard.evaluation.scoring import time_detectors

    torch.set_num_threads(args.threads)
    images, what = test_images(args.n)
    dets = []
    for name in [d.strip() for d in args.detectors.split(",") if d.strip()]:
        try:
            det = create(name)
            det = det.to(args.device) or det
            dets.append(det)
        except (DetectorError, ImportError, OSError) as exc:
            print(f"{name:<12} not available: {exc}")
    print(f"images: {len(images)} x {W}x{H} ({what}); torch threads {args.threads}; "
          f"batch {args.batch_size}; device {args.device}; cpu {platform.processor() or platform.machine()}")
    print("timing: seconds inside Detector.score only (decode excluded), after one warm-up image")
    timings = time_detectors(dets, images, batch_size=args.batch_size)
    for t in timings:
        print(f"{t.detector:<12} {t.images_per_s:9.2f} images/s  ({t.images} images in {t.seconds:.2f} s, "
              f"version {t.version})")
    if len(timings) > 1:
        ref = timings[0]
        for t in timings[1:]:
            print(f"speed ratio {ref.detector}/{t.detector}: {ref.images_per_s / t.images_per_s:.1f}x")


if __name__ == "__main__":
    main()
