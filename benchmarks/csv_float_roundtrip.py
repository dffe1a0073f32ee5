"""Do scores survive a CSV round trip bit for bit? pandas' own parser against ``read_scores``.

    python benchmarks/csv_float_roundtrip.py [--n 20000]

Writes ``--n`` normal scores (times 3) with ``calibration.scoring.save_scores``, then counts the
values that come back different: read with pandas' default ``read_csv`` and with ``read_scores``
(which parses the cells with Python's float). Run it under the pandas you deploy with: pandas 2.2.3
and 3.0.6 misread about a fifth of such values by one ulp, 3.1.1 none (session 9, in throwaway
venvs); a threshold recomputed with ``calibrate --from-scores`` then moves.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.calibration.scoring import read_scores, save_scores

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--n", type=int, default=20000)
args = ap.parse_args()
x = np.random.default_rng(0).normal(size=args.n) * 3.0
table = pd.DataFrame({"source_image": "s", "family": "f", "step": 0, "kind": "chain",
                      "path": [f"p{i}.png" for i in range(args.n)], "score": x})
with tempfile.TemporaryDirectory() as tmp:
    path = save_scores(table, Path(tmp) / "scores.csv", "nss", "v")
    plain = pd.read_csv(path)["score"].to_numpy()
    ours = read_scores(path)[0]["score"].to_numpy()
print(f"pandas {pd.__version__}: {args.n} scores; off after pandas.read_csv: {(plain != x).sum()}; "
      f"off after read_scores: {(ours != x).sum()}")
