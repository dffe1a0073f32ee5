"""Does storing images as JPEG change the cnn's verdict? The demo's images, scored as PNG and as JPEG.

    python benchmarks/demo_jpeg.py [WEIGHTS] [--threshold T ...] [--steps N]   (default: the packaged weights)

Rebuilds the images of ``collapseguard demo`` in memory: every bundled photo (centre-cropped to
640 px) and a copy re-rendered 12 times (``--steps``) by one of the demo's replicator families (seed 0, the
demo's own recipe). Scores them as decoded pixels ("None"), then JPEG-encoded at q95 (the demo's
storage, chroma 4:2:0), q95 with 4:4:4 chroma ("95/444") and q85. Prints AUROC clean vs degraded, the highest clean score, every degraded score,
and how many of each side lie above 6.7776 (the calibrated threshold of weights d46a3bb18869,
kept fixed so runs compare; the threshold shipped with each version differs) and above each
``--threshold`` (e.g. a candidate's own calibrated threshold).
"""

import argparse

import numpy as np
import torch

from collapseguard.demo import demo_pairs
from collapseguard.detectors.base import create
from collapseguard.evaluation.metrics import auroc
from collapseguard.training.negatives import jpeg

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("weights", nargs="?", default=None)
ap.add_argument("--threshold", type=float, nargs="*", default=[])
ap.add_argument("--steps", type=int, default=12, help="re-renderings of the degraded copies (the demo's 12)")
args = ap.parse_args()
torch.set_num_threads(2)
det = create("cnn", weights=args.weights) if args.weights else create("cnn")
pairs = list(demo_pairs(args.steps, np.random.default_rng(0)))
clean, deg = [p[2] for p in pairs], [p[3] for p in pairs]
# (quality, chroma subsampling): None = PNG; Pillow's default subsampling is 4:2:0, so "95" is
# how the demo stores its images and "95/444" the same quality with full-resolution chroma
for q, sub in ((None, None), (95, None), (95, 0), (85, None)):
    def f(a, q=q, sub=sub):
        return a if q is None else jpeg(a, q, subsampling=sub)
    sc = det.score([f(a) for a in clean])
    sd = det.score([f(a) for a in deg])
    print(q if sub is None else f"{q}/444", "AUROC", round(auroc(sc, sd), 3), "clean max", sc.max().round(2),
          "deg", np.round(sd, 1), "above thr 6.78:", (sd > 6.7776).sum(), (sc > 6.7776).sum())
    for t in args.threshold:
        print(f"   above {t:g}: degraded {(sd > t).sum()} of {len(sd)}, clean {(sc > t).sum()} of {len(sc)}")
