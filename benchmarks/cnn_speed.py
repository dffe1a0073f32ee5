"""Images/s of `cnn` (CPU) versus pyiqa's PIQE on the same 1024x768 images, in one run.

    python benchmarks/cnn_speed.py [--n 16] [--threads 2] [--rounds 5] [--weights PATH] [--n-crops K [K ...]]

Images: bundled photos and procedural art resized to exactly 1024x768 (the resize only makes the
test images; both detectors score them at that native size). Decoding is not timed; each detector
gets one warm-up batch first. ``--n-crops`` times the cnn at several crop counts (the
speed/accuracy knob) in the same run, each against the same PIQE timings.

The detectors are timed in ``--rounds`` alternating rounds (default 5; the order is reversed
every other round), and a round's ratio compares the detectors' rates within that round. This
machine is shared and its steal time comes in bursts: timed one after the other, the same command
printed 9.9x and then 25.1x (session 17), because a burst fell on one detector's whole timing.
Printed: each detector's median rate over the rounds, and per cnn the median ratio with the
lowest and highest round.
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
    """Images/s of ``det`` over ``images`` in batches (no warm-up: see ``rounds``)."""
    t = time.perf_counter()
    for s in range(0, len(images), batch):
        det.score(images[s : s + batch])
    return len(images) / (time.perf_counter() - t)


def rounds(timers: dict, n_rounds: int) -> dict[str, list[float]]:
    """``{name: [rate per round]}`` for callables ``timers[name]() -> rate``, timed in alternating
    order (forward in even rounds, reversed in odd ones) so that no detector always runs first or
    last."""
    names = list(timers)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(n_rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            out[n].append(float(timers[n]()))
    return out


def ratio_summary(rates: dict[str, list[float]], num: str, den: str) -> tuple[float, float, float]:
    """Median, lowest and highest of the per-round ratios ``rates[num][i] / rates[den][i]``."""
    r = np.asarray(rates[num], dtype=float) / np.asarray(rates[den], dtype=float)
    return float(np.median(r)), float(r.min()), float(r.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds (median reported)")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--n-crops", type=int, nargs="+", default=[None],
                    help="crops per image for cnn (default: the count stored with the weights)")
    args = ap.parse_args()
    if args.rounds < 1 or args.n < 1:
        ap.error("--rounds and --n must be >= 1")
    torch.set_num_threads(args.threads)
    from collapseguard.detectors import create

    images = test_images(args.n)
    weights = {"weights": args.weights} if args.weights else {}
    cnns = [create("cnn", device="cpu", n_crops=k, **weights) for k in args.n_crops]
    piqe = create("pyiqa:piqe", device="cpu")
    timers = {f"cnn{i}": (lambda d=cnn: rate(d, images, 8)) for i, cnn in enumerate(cnns)}
    timers["piqe"] = lambda: rate(piqe, images, 8)
    for det in [*cnns, piqe]:
        det.score(images[:8])  # warm-up, outside the timed rounds
    rates = rounds(timers, args.rounds)
    print(f"images: {len(images)} x 1024x768, torch threads {args.threads}, {args.rounds} alternating rounds")
    for i, cnn in enumerate(cnns):
        print(f"cnn        {np.median(rates[f'cnn{i}']):8.2f} images/s  (median; version {cnn.version}, "
              f"{cnn.n_crops} crops)")
    print(f"pyiqa:piqe {np.median(rates['piqe']):8.2f} images/s  (median)")
    for i, cnn in enumerate(cnns):
        med, lo, hi = ratio_summary(rates, f"cnn{i}", "piqe")
        print(f"speed ratio cnn ({cnn.n_crops} crops)/piqe: {med:.1f}x (median of {args.rounds} rounds; "
              f"rounds {lo:.1f}x-{hi:.1f}x)")


if __name__ == "__main__":
    main()
