"""How much did the chains in a manifest change? PSNR of step k to step 0, per source kind and family.

    python benchmarks/manifest_damage.py CHAINS_DIR [CHAINS_DIR ...] [--step 10]

For chains already made (``collapseguard chains make``, benchmarks/fresh_set.sh,
make_default_calibration.sh): the median over chains of PSNR(step 0, step k) per (source kind,
family), and how many chains are pixel-identical at step k (infinite PSNR; no detector can rank
them). The source kind is the source name up to its first "-" or "/" (``wp`` photos, ``art``,
``tex``, ...). Chains whose size changed (aspect drift) are left out of the median and counted.
Where chain_damage.py asks what each family does to a standard image, this asks what the chains of
a given set actually contain.

    python benchmarks/manifest_damage.py CHAINS_DIR --scores SCORES.csv [--step 10]

With ``--scores`` (a per-image CSV with ``chain_id``, ``step`` and ``score`` columns, such as
``benchmarks/select_cnn.py --out``'s ``chains_<version>.csv`` for the same set), also prints
AUROC of step 0 against step k within bands of that chain's PSNR at step k: is a low AUROC a
detector that misses visible damage, or chains with next to none? Chains whose size changed
(``resized``) and pixel-identical ones get bands of their own.

    python benchmarks/manifest_damage.py CHAINS_DIR --scores SCORES.csv --clean-scores CLEAN.csv

With ``--clean-scores`` as well (``select_cnn.py --out``'s ``clean_<version>.csv``, the set's extra
clean images), prints the issue's two ranking criteria recomputed on chains with visible damage
only: AUROC of every clean image (chain step 0 + extra clean) against step 5 and step 10 of the
chains whose PSNR at that step is below a cut (all, < 40, < 35, < 30 dB), and the share of clean
images above the threshold that drops 95% of those step-10 images. Chains whose size changed have
no PSNR and count only under "all". This is the nearest measurable form of criteria written for
chains whose every step is damaged: a no-reference detector cannot see damage that is not there.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from collapseguard.calibration.scoring import full_reference
from collapseguard.images import load_image
from collapseguard.training_data_tools.manifest import read_manifest

BANDS = ((0.0, 30.0, "< 30 dB"), (30.0, 35.0, "30-35 dB"), (35.0, 40.0, "35-40 dB"),
         (40.0, np.inf, ">= 40 dB"))
BAND_ORDER = [name for _, _, name in BANDS] + ["identical", "resized", "all"]


def chain_psnr(chains_dir: str, step: int) -> pd.DataFrame:
    """One row per chain with step ``step``: chain_id, kind, family and PSNR(step 0, step k)
    (inf when pixel-identical, NaN when the size changed)."""
    m = read_manifest(chains_dir)
    m = m[m["step"].isin([0, step])]
    rows = []
    for cid, g in m.groupby("chain_id", sort=True):
        g = g.set_index("step")
        if step not in g.index:
            continue
        a, b = load_image(g.loc[0, "path"]), load_image(g.loc[step, "path"])
        kind = str(g.loc[0, "source_image"]).replace("/", "-").split("-")[0]
        psnr = full_reference(a, b, "psnr") if a.shape == b.shape else np.nan  # no resizing here
        rows.append({"chain_id": cid, "kind": kind, "family": g.loc[0, "family"], "psnr": psnr})
    return pd.DataFrame(rows, columns=["chain_id", "kind", "family", "psnr"])


def damage_band(psnr: float) -> str:
    if np.isnan(psnr):
        return "resized"
    if np.isinf(psnr):
        return "identical"
    return next(name for lo, hi, name in BANDS if lo <= psnr < hi)


def auroc_by_damage(per_chain: pd.DataFrame, scores: pd.DataFrame, step: int) -> pd.DataFrame:
    """AUROC of step 0 vs step ``step`` scores of the chains in each PSNR band, per source kind
    and over all kinds ("all"); ``chains`` counts the chains behind each figure."""
    from collapseguard.evaluation.metrics import auroc
    s = scores[scores["step"].isin([0, step])][["chain_id", "step", "score"]]
    s = s.merge(per_chain[["chain_id", "kind", "psnr"]], on="chain_id", how="inner")
    s["band"] = s["psnr"].map(damage_band)
    rows = []
    for kind in sorted(s["kind"].unique()) + ["all"]:
        k = s if kind == "all" else s[s["kind"] == kind]
        for band in BAND_ORDER:
            g = k if band == "all" else k[k["band"] == band]
            rows.append({"kind": kind, "band": band, "chains": int(g["chain_id"].nunique()),
                         "auroc": auroc(g.loc[g["step"] == 0, "score"], g.loc[g["step"] == step, "score"])})
    return pd.DataFrame(rows)


#: PSNR cuts of ``visible_criteria`` (dB): a chain counts when its PSNR at the step is below the
#: cut; NaN keeps every chain (pixel-identical and resized ones too)
CUTS = ((np.nan, "all chains"), (40.0, "< 40 dB"), (35.0, "< 35 dB"), (30.0, "< 30 dB"))


def visible_criteria(chains_dir: str, scores: pd.DataFrame, clean_scores: np.ndarray,
                     steps=(5, 10)) -> pd.DataFrame:
    """AUROC of all clean images vs step k of the chains damaged past each PSNR cut at step k, and
    the clean share above the threshold that drops 95% of those chains' step-10 images."""
    from collapseguard.evaluation.metrics import auroc
    from collapseguard.training.metrics import clean_false_positive_rate

    scores = scores.assign(chain_id=scores["chain_id"].astype(str))
    clean = np.concatenate([scores.loc[scores["step"] == 0, "score"].to_numpy(float),
                            np.asarray(clean_scores, float)])
    psnr = {k: chain_psnr(chains_dir, k).set_index("chain_id")["psnr"] for k in steps}
    rows = []
    for cut, name in CUTS:
        row = {"chains": name, "n_clean": len(clean)}
        for k in steps:
            p = psnr[k]
            ids = p.index if np.isnan(cut) else p.index[p.to_numpy() < cut]  # NaN (resized) < cut: False
            pos = scores.loc[(scores["step"] == k) & scores["chain_id"].isin(set(ids)), "score"].to_numpy(float)
            row[f"n_step{k}"] = len(pos)
            row[f"auroc_0v{k}"] = auroc(clean, pos) if len(pos) else float("nan")
            if k == 10:
                row["clean_above_thr95_10"] = clean_false_positive_rate(clean, pos)[1]
        rows.append(row)
    return pd.DataFrame(rows)


def damage_table(chains_dir: str, step: int) -> pd.DataFrame:
    df = chain_psnr(chains_dir, step)
    out = df.groupby(["kind", "family"]).agg(
        chains=("psnr", "size"),
        median_psnr=("psnr", lambda s: float(np.median(s.dropna())) if s.notna().any() else np.nan),
        identical=("psnr", lambda s: int(np.isinf(s).sum())),
        resized=("psnr", lambda s: int(s.isna().sum())))
    return out.reset_index()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chains", nargs="+")
    ap.add_argument("--step", type=int, default=10)
    ap.add_argument("--scores", default=None, help="per-image scores CSV (chain_id, step, score) of "
                    "the chains; prints AUROC 0 vs --step per PSNR band (one CHAINS_DIR only)")
    ap.add_argument("--clean-scores", default=None, help="with --scores: scores CSV of the set's extra "
                    "clean images (a score column); prints the ranking criteria on visibly damaged chains")
    args = ap.parse_args(argv)
    if args.scores and len(args.chains) != 1:
        ap.error("--scores goes with exactly one CHAINS_DIR")
    if args.clean_scores and not args.scores:
        ap.error("--clean-scores goes with --scores")
    if args.clean_scores:
        scores = pd.read_csv(args.scores, dtype={"chain_id": str})
        clean = pd.read_csv(args.clean_scores)["score"].to_numpy(float)
        t = visible_criteria(args.chains[0], scores, clean)
        print(f"# {args.chains[0]}: every clean image vs the chains damaged past a PSNR cut at that step")
        print(t.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        return 0
    if args.scores:
        per_chain = chain_psnr(args.chains[0], args.step)
        scores = pd.read_csv(args.scores, dtype={"chain_id": str})
        print(f"# {args.chains[0]}: AUROC step 0 vs {args.step} by the chain's PSNR at step {args.step}")
        t = auroc_by_damage(per_chain, scores, args.step)
        t = t[t["chains"] > 0]
        cell = t["auroc"].map(lambda a: "  -  " if np.isnan(a) else f"{a:.3f}") + " (" + t["chains"].astype(str) + ")"
        print(t.assign(cell=cell).pivot(index="band", columns="kind", values="cell")
              .reindex([b for b in BAND_ORDER if b in set(t["band"])]).fillna("").to_string())
        print("(AUROC, chains in brackets; a band with no clean/degraded pair prints -)")
        return 0
    for d in args.chains:
        t = damage_table(d, args.step)
        print(f"# {d}: PSNR of step {args.step} to step 0 (median over chains)")
        print(t.pivot(index="family", columns="kind", values="median_psnr").round(1).to_string())
        print("identical at step", args.step, "(chains):")
        print(t.pivot(index="family", columns="kind", values="identical").to_string())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
