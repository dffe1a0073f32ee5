"""Check and time the MAXIM networks the ``maxim_*`` replicator families run (docs/TRAINING_DATA.md):

    python recipes/maxim_check.py [--sides 192,256,384] [--tasks denoising,retouching]

Prints how far ``TFGraph``'s output on the denoising package's own ``assets/fixture.png`` is from
the package's ``assets/result.png`` (mean and max, grey levels; and the fixture's own distance to
it), then the seconds one pass of each task takes on a random image of each side, on one torch
thread after a warm-up pass, and the process's peak resident memory. The tarballs are read from
``COLLAPSEGUARD_MAXIM_DIR`` or ``~/.cache/collapseguard`` (``replicators.maxim.tarball``).
"""

from __future__ import annotations

import argparse
import resource
import tarfile
import time

import numpy as np
from PIL import Image


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="192,256,384")
    ap.add_argument("--tasks", default="denoising,retouching")
    a = ap.parse_args(argv)
    import torch

    from collapseguard.training_data_tools.replicators import maxim

    torch.set_num_threads(1)
    with tarfile.open(maxim.tarball("denoising"), "r:gz") as tf:
        fixture = np.asarray(Image.open(tf.extractfile("package/assets/fixture.png")).convert("RGB"))
        result = np.asarray(Image.open(tf.extractfile("package/assets/result.png")).convert("RGB"), np.float32)
    diff = np.abs(maxim.run("denoising", fixture) - result)
    print(f"denoising on its fixture ({fixture.shape[1]}x{fixture.shape[0]}): mean {diff.mean():.3f}, "
          f"max {diff.max():.3f} grey levels from result.png (fixture itself: mean "
          f"{np.abs(fixture - result).mean():.3f})")
    rng = np.random.default_rng(0)
    for task in a.tasks.split(","):
        maxim.run(task, rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))  # loads the graph
        for side in (int(s) for s in a.sides.split(",")):
            img = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            t = time.perf_counter()
            maxim.run(task, img)
            print(f"{task} {side} px: {time.perf_counter() - t:.1f} s")
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
