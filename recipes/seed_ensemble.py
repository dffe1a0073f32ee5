"""Rank the evaluation set with the mean of several cnn weights' scores, beside each of them.

    python recipes/seed_ensemble.py --eval EVAL/stored/manifest.csv --cache DIR VERSION [VERSION ...]

Reads the per-weights score caches ``recipes/judge_cnn.py`` writes (``DIR/cnn-<VERSION>.csv``),
so every VERSION must have been judged first. Prints, per storage (PNG and JPEG q90 4:2:0), the
AUROC of step 0 against steps 5 and 10 for each family, for each weights version and for the
plain mean of their scores (all are logits of one training objective), then the ranking terms of
``judge_cnn.py``'s rule: the worst held-out network family's 0v10, the worst default family's 0v5
and the family mean 0v5. Thresholds are not read: an ensemble needs its own calibration, so the
clean-kind term is left out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from collapseguard.evaluation.metrics import auroc

try:
    from judge_cnn import HELD_OUT, NETWORKS
except ImportError:  # run from another folder
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from judge_cnn import HELD_OUT, NETWORKS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", type=Path, required=True, help="the evaluation set's stored manifest")
    ap.add_argument("--cache", type=Path, required=True, help="judge_cnn.py's --cache folder")
    ap.add_argument("--storage", action="append", default=None)
    ap.add_argument("versions", nargs="+", help="weights versions (12 hex digits) with a cache file")
    a = ap.parse_args(argv)
    storages = a.storage or ["png", "jpeg q90 4:2:0"]
    ev = pd.read_csv(a.eval)
    ev = ev[ev["storage"].isin(storages)].copy()
    ev["file"] = [str(a.eval.parent / p) for p in ev["path"]]
    for v in a.versions:
        cache = a.cache / f"cnn-{v}.csv"
        if not cache.exists():
            ap.error(f"no scores for {v}: {cache} is missing (run judge_cnn.py with these weights)")
        scores = pd.read_csv(cache).drop_duplicates("path", keep="last").set_index("path")["score"]
        ev[v] = ev["file"].map(scores)
        if ev[v].isna().any():
            ap.error(f"{cache} lacks {int(ev[v].isna().sum())} of the evaluation set's files")
    ev["mean"] = ev[a.versions].mean(axis=1)
    columns = [*a.versions, "mean"]
    for storage, d in ev.groupby("storage"):
        rows = []
        for fam, g in d.groupby("family"):
            row = {"family": fam}
            for c in columns:
                neg = g.loc[g["step"] == 0, c]
                for step in (5, 10):
                    row[f"{c} 0v{step}"] = auroc(neg, g.loc[g["step"] == step, c])
            rows.append(row)
        t = pd.DataFrame(rows).set_index("family")
        print(f"\n== {storage}")
        print(t.round(3).to_string())
        default = [f for f in t.index if f not in NETWORKS]
        held = [f for f in t.index if f in HELD_OUT]
        print(f"{'':14s} {'worst held-out 0v10':>20s} {'worst default 0v5':>18s} {'family mean 0v5':>16s}")
        for c in columns:
            print(f"{c:14s} {t.loc[held, f'{c} 0v10'].min():20.3f} "
                  f"{t.loc[default, f'{c} 0v5'].min():18.3f} {t[f'{c} 0v5'].mean():16.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
