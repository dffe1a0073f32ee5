"""Does a cnn read the noise level of clean digital art as damage? Same pictures, four dither levels.

    python benchmarks/dither_probe.py [WEIGHTS ...] [--n 40] [--threshold T]

Procedural art of seed 99 (never a training or calibration source: training art uses seeds 0 and
11, the study 7, the default calibration 20261130-20261131; all of them at dither 0.6) drawn with the dither sigma 0 (banded gradients), 0.3, 0.6 (what all training art
had up to session 9) and 1.2, pictures otherwise identical (``sources.procedural_art(dither=...)``).
All are clean, so a detector should give the four versions the same scores. Prints, per weights
file (default: the packaged ones), the mean and max score at each level, the range of the four
means (smaller is better) and how many images lie above ``--threshold``.
"""

from __future__ import annotations

import argparse

import torch

from collapseguard.detectors.cnn import CNNDetector
from collapseguard.training_data_tools.sources import procedural_art

LEVELS = (0.0, 0.3, 0.6, 1.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="*", default=[None])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--threshold", type=float, default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    art = {d: [a for _, a in procedural_art(args.n, seed=99, max_side=900, dither=d)] for d in LEVELS}
    for w in args.weights:
        det = CNNDetector(weights=w, device="cpu")
        means = {}
        print(f"cnn {det.version} ({w or 'packaged'}), {args.n} art images per level")
        for d in LEVELS:
            s = det.score(art[d])
            means[d] = float(s.mean())
            above = f"  above {args.threshold:g}: {(s > args.threshold).sum()}" if args.threshold is not None else ""
            print(f"  dither {d:<4} mean {s.mean():6.2f}  max {s.max():6.2f}{above}")
        print(f"  range of the means: {max(means.values()) - min(means.values()):.2f}")


if __name__ == "__main__":
    main()
