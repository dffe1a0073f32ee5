"""Make the chains the shipped `cnn` weights are trained on (step 1 of benchmarks/train_cnn.sh).

    python benchmarks/make_train_chains.py SOURCES OUT_DIR

SOURCES is a source spec (e.g. ``bundled,art:64:320-640``); every replicator family, 20 steps,
keeping 0,1,2,3,5,10,20; seed 0; 2 worker processes.
"""

from __future__ import annotations

import sys
import time

import torch

from collapseguard.training_data_tools import chains, sources

if __name__ == "__main__":
    torch.set_num_threads(1)
    spec, out = sys.argv[1], sys.argv[2]
    t = time.time()
    df = chains.make_chains(list(sources.resolve_sources(spec, seed=0)), None, steps=20,
                            keep=(0, 1, 2, 3, 5, 10, 20), out_dir=out, seed=0, workers=2, progress=False)
    print(f"chains: {df['chain_id'].nunique()} chains, {len(df)} images, families "
          f"{sorted(df['family'].unique())} in {time.time() - t:.0f}s")
