"""Judge candidate cnn weights against the shipped ones by the rule in docs/history/model_history.md.

    python recipes/judge_cnn.py --eval EVAL/stored/manifest.csv --web-history WH/manifest.csv \\
        --cache DIR [--candidate W.safetensors --calibration CAL.json] [--storage png ...]

EVAL is an evaluation set with network families (``NETWORKS=1 bash recipes/eval_set.sh EVAL``),
WH the web-history clean set (``python recipes/web_history_set.py build``). For the shipped
weights (threshold from their shipped calibration) and, with ``--candidate``, for candidate
weights (threshold from ``--calibration``; ``--shipped-calibration`` sets the shipped weights' one, a calibration JSON made for them by
``collapseguard calibrate --detector cnn:W``), per storage (PNG and JPEG q90 4:2:0 by default):

- per family, AUROC step 0 vs 5 and 0 vs 10 and the share of step-10 images above the threshold;
- per kind, the share of the evaluation set's step-0 images and of the web-history set's clean
  pictures above the threshold;
- the rule's three terms: the worst held-out network family's 0v10 (``--held-out``, by default
  every family of ``HELD_OUT`` the set holds), the worst
  web-history kind's share, and the worst default family's 0v5 (the families outside
  ``--networks``), with the verdict when a candidate is given; beside them, the family mean and
  the spread of the step-0 medians across kinds in step-0 standard deviations (content read as
  damage), which decide nothing.

Scores are cached per weights version in ``--cache`` (``cnn-<version>.csv``: path, score), so a
rerun scores only new files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.calibration.thresholds import default_calibration
from collapseguard.detectors.cnn import CNNDetector
from collapseguard.evaluation.metrics import auroc
from collapseguard.training.metrics import score_paths

#: the real-network families of the evaluation set (``recipes/eval_set.py``'s NETWORK_FAMILIES):
#: not "default" families in the rule's third term
NETWORKS = ("animevideov3", "waifu2x", "realesrgan", "waifu2x_upconv7", "maxim_restore", "maxim_retouch")
#: those no training or calibration recipe reads (the rule's first term; rules written before the
#: MAXIM families existed read ``--held-out realesrgan,waifu2x_upconv7``)
HELD_OUT = ("realesrgan", "waifu2x_upconv7", "maxim_restore", "maxim_retouch")


def cached_scores(det: CNNDetector, paths: list[str], cache: Path) -> dict[str, float]:
    cache.mkdir(parents=True, exist_ok=True)
    file = cache / f"cnn-{det.version}.csv"
    have = pd.read_csv(file) if file.exists() else pd.DataFrame(columns=["path", "score"])
    todo = sorted(set(paths) - set(have["path"]))
    if todo:
        print(f"  scoring {len(todo)} files with cnn {det.version}", flush=True)
        for i in range(0, len(todo), 512):
            part = todo[i:i + 512]
            new = pd.DataFrame({"path": part, "score": score_paths(det, part)})
            have = pd.concat([have, new], ignore_index=True)
            have.to_csv(file, index=False)
    return dict(zip(have["path"], have["score"].astype(float)))


def judge(name: str, det: CNNDetector, thr: float, ev: pd.DataFrame, wh: pd.DataFrame,
          cache: Path, held_out: tuple[str, ...] = HELD_OUT) -> dict:
    paths = ev["file"].tolist() + wh["png"].tolist() + wh["jpeg90"].tolist()
    s = cached_scores(det, paths, cache)
    ev = ev.assign(score=ev["file"].map(s))
    print(f"\n== {name}: cnn {det.version}, threshold {thr:.4f}")
    rows = []
    for (storage, fam), g in ev.groupby(["storage", "family"]):
        neg = g.loc[g["step"] == 0, "score"]
        rows.append({"storage": storage, "family": fam, "chains": g["chain_id"].nunique(),
                     "0v5": auroc(neg, g.loc[g["step"] == 5, "score"]),
                     "0v10": auroc(neg, g.loc[g["step"] == 10, "score"]),
                     "step10 dropped": float((g.loc[g["step"] == 10, "score"] > thr).mean()),
                     "step0 dropped": float((neg > thr).mean())})
    fams = pd.DataFrame(rows)
    print(fams.round(3).to_string(index=False))
    step0 = ev[ev["step"] == 0]
    clean = step0.groupby(["kind", "storage"])["score"].apply(lambda x: float((x > thr).mean()))
    clean = clean.unstack("storage")
    clean.loc["all"] = step0.groupby("storage")["score"].apply(lambda x: float((x > thr).mean()))
    print("evaluation set, step 0 (clean) above the threshold, by kind:")
    print(clean.round(3).to_string())
    kinds = []
    for kind, g in [*wh.groupby("kind"), ("all", wh)]:
        kinds.append({"kind": kind, "n": len(g),
                      "over png": float((g["png"].map(s) > thr).mean()),
                      "over jpeg90": float((g["jpeg90"].map(s) > thr).mean())})
    kinds = pd.DataFrame(kinds)
    print(kinds.round(3).to_string(index=False))
    held = fams[fams["family"].isin(held_out)]
    default = fams[~fams["family"].isin(NETWORKS)]
    per_kind = kinds[kinds["kind"] != "all"]
    terms = {
        "worst_held_out_0v10": {st: float(g["0v10"].min()) for st, g in held.groupby("storage")},
        "worst_web_kind_share": {"png": float(per_kind["over png"].max()),
                                 "jpeg q90 4:2:0": float(per_kind["over jpeg90"].max())},
        "worst_default_0v5": {st: float(g["0v5"].min()) for st, g in default.groupby("storage")},
        "family_mean_0v5": {st: float(g["0v5"].mean()) for st, g in fams.groupby("storage")},
        # how much the clean score depends on content (decides nothing): the spread of the
        # step-0 medians across kinds, in step-0 standard deviations
        "kind_spread_sd": {st: float(np.ptp(g.groupby("kind")["score"].median()) / g["score"].std())
                           for st, g in step0.groupby("storage")},
    }
    print("rule terms:", json.dumps(terms, indent=1))
    return terms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", type=Path, required=True, help="the evaluation set's stored manifest")
    ap.add_argument("--web-history", type=Path, required=True)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--candidate", type=Path)
    ap.add_argument("--calibration", type=Path, help="the candidate's calibration JSON")
    ap.add_argument("--shipped-calibration", type=Path,
                    help="judge the shipped weights at this calibration's threshold instead of the shipped one")
    ap.add_argument("--storage", action="append", default=None)
    ap.add_argument("--held-out", default=",".join(HELD_OUT),
                    help="comma-separated held-out network families of the rule's first term "
                         "(default: %(default)s)")
    a = ap.parse_args(argv)
    held_out = tuple(f for f in a.held_out.split(",") if f)
    storages = a.storage or ["png", "jpeg q90 4:2:0"]
    ev = pd.read_csv(a.eval)
    ev = ev[ev["storage"].isin(storages)].copy()
    ev["file"] = [str(a.eval.parent / p) for p in ev["path"]]
    wh = pd.read_csv(a.web_history)
    for col in ("png", "jpeg90"):
        wh[col] = [str(p if Path(p).is_absolute() else a.web_history.parent / p) for p in wh[col]]

    shipped = CNNDetector(device="cpu")
    if a.shipped_calibration is not None:
        thr0 = float(json.loads(a.shipped_calibration.read_text())["threshold"])
    else:
        thr0 = default_calibration("cnn", shipped.version).threshold
    base = judge("shipped", shipped, thr0, ev, wh, a.cache, held_out)
    if a.candidate is None:
        return 0
    if a.calibration is None:
        ap.error("--candidate needs --calibration (its calibration JSON)")
    cand = CNNDetector(weights=a.candidate, device="cpu")
    thr = float(json.loads(a.calibration.read_text())["threshold"])
    new = judge("candidate", cand, thr, ev, wh, a.cache, held_out)
    ok1 = all(new["worst_held_out_0v10"][st] > base["worst_held_out_0v10"][st] for st in storages)
    ok2 = all(new["worst_web_kind_share"][st] < base["worst_web_kind_share"][st] for st in storages)
    ok3 = all(new["worst_default_0v5"][st] >= base["worst_default_0v5"][st] - 0.02 for st in storages)
    print(f"\nrule: 1 worst held-out network 0v10 higher: {ok1}; 2 worst web-history kind lower: {ok2}; "
          f"3 worst default family 0v5 down by <= 0.02: {ok3}; ship: {ok1 and ok2 and ok3}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
