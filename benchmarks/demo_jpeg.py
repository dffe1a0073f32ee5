"""Does storing images as JPEG change the cnn's verdict? The demo's images, scored as PNG and as JPEG.

    python benchmarks/demo_jpeg.py [WEIGHTS]        (default: the packaged weights)

Rebuilds the images of ``collapseguard demo`` in memory: every bundled photo (centre-cropped to
640 px) and a copy re-rendered 12 times by one of the demo's replicator families (seed 0, the
demo's own recipe). Scores them as decoded pixels ("None"), then JPEG-encoded at q95 (the demo's
storage) and q85. Prints AUROC clean vs degraded, the highest clean score, every degraded score,
and how many of each side lie above 6.7776 (the calibrated threshold of weights d46a3bb18869,
kept fixed so runs compare; the threshold shipped with each version differs).
"""

import sys

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from collapseguard.demo import DEMO_FAMILIES, _fit
from collapseguard.detectors.base import create
from collapseguard.training.negatives import jpeg
from collapseguard.training_data_tools.replicators import create_replicator
from collapseguard.training_data_tools.sources import bundled_photos

torch.set_num_threads(2)
det = create("cnn", weights=sys.argv[1]) if len(sys.argv) > 1 else create("cnn")
rng = np.random.default_rng(0)
clean, deg = [], []
for i, (_name, img) in enumerate(bundled_photos(min_side=256)):
    img = _fit(img)
    clean.append(img)
    rep = create_replicator(DEMO_FAMILIES[i % 5], rng)
    x = img
    for _ in range(12):
        x = rep.step(x, rng)
    deg.append(x)
for q in (None, 95, 85):
    def f(a, q=q):
        return a if q is None else jpeg(a, q)
    sc = det.score([f(a) for a in clean])
    sd = det.score([f(a) for a in deg])
    y = np.r_[np.zeros(len(sc)), np.ones(len(sd))]
    print(q, "AUROC", round(roc_auc_score(y, np.r_[sc, sd]), 3), "clean max", sc.max().round(2),
          "deg", np.round(sd, 1), "above thr 6.78:", (sd > 6.7776).sum(), (sc > 6.7776).sum())
