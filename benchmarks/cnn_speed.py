"""Images/s of `cnn` (CPU) versus pyiqa's PIQE on the same 1024x768 images, in one run.

    python benchmarks/cnn_speed.py [--n 16] [--threads 2] [--weights PATH] [--n-crops K [K ...]]

Images: bundled photos and procedural art resized to exactly 1024x768 (the resize only makes the
test images; both detectors score them at that native size). Decoding is not timed; each detector
gets one warm-up batch first. Prints one line per detector and the speed ratio. ``--n-crops``
times the cnn at several crop counts (the speed/accuracy knob) in the same run, each against the
same PIQE rate.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from PIL import Image


def test_images(n: int) -> list[np.ndarray]:
    from collapseguard.training_data_tools import sources

    srcs = [a for _, a in sources.bundled_photos()] + [a for _, a in sources.procedural_art(8, seed=3)]
    out = [np.asarray(Image.fromarray(a).resize((1024, 768), Image.BICUBIC)) for a in srcs]
    return (out * (n // len(out) + 1))[:n]


def rate(det, images, batch: int) -> float:
    det.score(images[:batch])  # warm-up
    t = time.perf_counter()
    for s in range(0, len(images), batch):
        det.score(images[s : s + batch])
    return len(images) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--n-crops", type=int, nargs="+", default=[None],
                    help="crops per image for cnn (default: the count stored with the weights)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from collapseguard.detectors import create

    images = test_images(args.n)
    weights = {"weights": args.weights} if args.weights else {}
    cnns = [create("cnn", device="cpu", n_crops=k, **weights) for k in args.n_crops]
    piqe = create("pyiqa:piqe", device="cpu")
    r_cnn = [rate(cnn, images, 8) for cnn in cnns]
    r_piqe = rate(piqe, images, 8)
    print(f"images: {len(images)} x 1024x768, torch threads {args.threads}")
    for cnn, r in zip(cnns, r_cnn):
        print(f"cnn        {r:8.2f} images/s  (version {cnn.version}, {cnn.n_crops} crops)")
    print(f"pyiqa:piqe {r_piqe:8.2f} images/s")
    for cnn, r in zip(cnns, r_cnn):
        print(f"speed ratio cnn ({cnn.n_crops} crops)/piqe: {r / r_piqe:.1f}x")


if __name__ == "__main__":
    main()
