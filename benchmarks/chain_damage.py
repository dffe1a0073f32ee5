"""Mean damage per replicator family per step: PSNR and SSIM of step k to step 0, plus step time.

Run: python benchmarks/chain_damage.py [--chains 6] [--steps 0,1,2,3,5,10,20] [--families ...]
Sources: bundled photos and procedural art (half each), one chain per (source, family), seeded.
The target shape of the study: subtle at steps 1-3 (PSNR > ~35 dB, SSIM > ~0.95), visible by
5-10, heavy by 20.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout


def main() -> None:
    from collapseguard.training_data_tools.replicators import (
        create_replicator,
        list_families,
    )
    from collapseguard.training_data_tools.sources import bundled_photos, procedural_art

    ap = argparse.ArgumentParser()
    ap.add_argument("--chains", type=int, default=6)
    ap.add_argument("--steps", default="1,2,3,5,10,20")
    ap.add_argument("--families", default=",".join(list_families()))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        import torch
        torch.set_num_threads(1)  # as in make_chains' workers
    except ImportError:
        pass
    keep = [int(s) for s in args.steps.split(",")]
    photos = [p for p in bundled_photos() if p[0].startswith(("skimage/a", "skimage/c", "sklearn", "matplotlib", "skimage/rocket", "skimage/coffee"))]
    sources = (photos[: (args.chains + 1) // 2] + procedural_art(args.chains, seed=args.seed, min_side=320, max_side=640))[: args.chains]
    print(f"{len(sources)} sources, steps {keep}")
    print(f"{'family':<18}{'metric':<6}" + "".join(f"{k:>7}" for k in keep) + f"{'wall s/step':>12}{'cpu s/step':>11}  (1024x768)")
    big = np.asarray(procedural_art(1, seed=99, min_side=1024, max_side=1024)[0][1])
    big = np.ascontiguousarray(np.resize(big, (768, 1024, 3))) if big.shape[:2] != (768, 1024) else big
    for fam in args.families.split(","):
        psnr = np.zeros((len(sources), len(keep)))
        ssim = np.zeros_like(psnr)
        for i, (name, img) in enumerate(sources):
            rng = np.random.default_rng([args.seed, i, zlib.crc32(fam.encode())])
            rep = create_replicator(fam, rng)
            x, j = img, 0
            for k in range(1, max(keep) + 1):
                x = rep.step(x, rng)
                if k in keep:
                    psnr[i, j] = peak_signal_noise_ratio(img, x, data_range=255)
                    ssim[i, j] = structural_similarity(img, x, channel_axis=2, data_range=255)
                    j += 1
        rep = create_replicator(fam, np.random.default_rng(1))
        rng = np.random.default_rng(2)
        rep.step(big, rng)
        t, c = time.perf_counter(), time.process_time()
        for _ in range(3):
            rep.step(big, rng)
        dt, dc = (time.perf_counter() - t) / 3, (time.process_time() - c) / 3
        print(f"{fam:<18}{'PSNR':<6}" + "".join(f"{v:7.1f}" for v in psnr.mean(0)) + f"{dt:12.3f}{dc:11.3f}")
        print(f"{'':<18}{'SSIM':<6}" + "".join(f"{v:7.3f}" for v in ssim.mean(0)))


if __name__ == "__main__":
    main()
