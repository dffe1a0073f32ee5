"""Fingerprints that show a change kept the shipped behaviour bit for bit.

    python benchmarks/fingerprint.py [--weights W.safetensors]
    PYTHONPATH=/path/to/older/checkout python benchmarks/fingerprint.py   # the same, older code

Prints three SHA-256 prefixes:
- ``scores``: the packaged cnn's (or ``--weights``') scores of every bundled photo (CPU, 2 threads);
- ``train``: the weights of a 120-iteration training run on tiny generated chains with JPEG
  delivery (the default recipe's draws and losses; ``tests/cg_chains.py`` makes the chains);
- ``jpeg``: the pixels of ``training.negatives.jpeg`` round trips (the training's JPEG code).
Equal lines before and after a change mean scoring, training and its JPEG augmentation are
unchanged. The collapseguard that is imported is printed first, so an older checkout on
PYTHONPATH shows.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import collapseguard  # noqa: E402


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    from collapseguard.detectors.base import create
    from collapseguard.training.negatives import jpeg
    from collapseguard.training_data_tools.sources import bundled_photos

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default=None, help="cnn weights to score with (default: the packaged)")
    args = ap.parse_args()
    print("collapseguard from", Path(collapseguard.__file__).parent)
    torch.set_num_threads(2)
    photos = [im for _, im in bundled_photos(min_side=256)]
    kw = {"weights": args.weights} if args.weights else {}
    scores = create("cnn", device="cpu", **kw).score(photos)
    print("scores", digest([np.asarray(scores, np.float64)]))

    from cg_chains import make_tiny_chains, smooth_art

    from collapseguard.detectors.cnn_model import NetConfig
    from collapseguard.training.bank import chain_bank, image_bank
    from collapseguard.training.loop import TrainConfig, train_net
    from collapseguard.training_data_tools.manifest import read_manifest

    with tempfile.TemporaryDirectory() as tmp:
        df = read_manifest(make_tiny_chains(Path(tmp), n_sources=8))
        bank = chain_bank(df, size=32, per_image=4, seed=0, delivery_jpeg=0.5)
    rng = np.random.default_rng(3)
    clean = image_bank([(f"c{i}", smooth_art(rng)) for i in range(6)], size=32, per_image=4, seed=0)
    cfg = TrainConfig(iterations=120, lr=5e-3, log_every=20, chains_per_batch=6, clean_per_batch=4,
                      crops_per_image=2, threads=1, net=NetConfig(width=6, crop_size=32))
    net, _ = train_net(bank, clean, cfg, log=lambda s: None)
    print("train ", digest([v.numpy() for v in net.state_dict().values()]))
    print("jpeg  ", digest([jpeg(p, q) for p in photos[:6] for q in (70, 85, 98)]))


if __name__ == "__main__":
    main()
