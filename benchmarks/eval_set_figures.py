"""The issue's acceptance figures from an evaluation of the eval set (recipes/eval_set.sh):

    collapseguard evaluate --chains OUT/stored --detectors cnn --clean-steps 0 --out OUT/eval
    python benchmarks/eval_set_figures.py OUT/eval

Prints, from the files ``evaluate`` wrote (auroc_by_storage.csv, failures_by_storage.csv,
clean_drops.csv, drops.csv): AUROC step 0 vs 5 and 0 vs 10 per family x storage with the mean over
families (the figure the model-history rules compare), the study's criterion per family x
storage, and at the threshold evaluate used the share of clean images dropped per kind and of
step-10 images dropped per family. ``--detector`` picks one detector of a run that scored several;
a run of one detector needs none.

``--kind-max-drop A`` also reads scores.csv and asks what a per-kind false-drop target costs: per
storage, the lowest threshold at which no clean kind loses more than A of its images, chosen on
these very images (an in-sample oracle, which no calibration can beat on them), and the share of
step-10 images per family it drops.

``--top-clean N`` also reads scores.csv and lists, per storage and clean kind, the N clean
pictures (step 0) that score highest: the ones a threshold drops first, to look at.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

STORAGES = ("png", "jpeg q90 4:2:0", "jpeg q75 4:2:0", "webp q80")


def table(df: pd.DataFrame, index: str, value: str, columns: str = "storage") -> str:
    wide = df.pivot_table(index=index, columns=columns, values=value, aggfunc="first")
    wide = wide[[c for c in STORAGES if c in wide.columns] + [c for c in wide.columns if c not in STORAGES]]
    first = [r for r in ("all", "family mean") if r in wide.index]
    wide = wide.loc[first + [r for r in wide.index if r not in first]]
    return wide.to_string(float_format=lambda v: f"{v:.3f}")


def with_family_mean(au: pd.DataFrame, value: str) -> pd.DataFrame:
    """``au`` plus a "family mean" row per storage: the unweighted mean of ``value`` over the
    families (not the pooled "all" row, which weighs families by their chain counts)."""
    fams = au[au["family"] != "all"]
    mean = fams.groupby("storage", as_index=False)[value].mean().assign(family="family mean")
    return pd.concat([au, mean], ignore_index=True)


def pick_detector(au: pd.DataFrame, wanted: str | None) -> str:
    """The detector whose rows to print: ``wanted``, or the only one the run scored."""
    have = sorted(au["detector"].unique())
    if wanted is None:
        if len(have) != 1:
            raise SystemExit(f"this run scored several detectors; pick one with --detector: {have}")
        return have[0]
    if wanted not in have:
        raise SystemExit(f"--detector {wanted!r}: not in this run; it scored {have}")
    return wanted


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("eval_dir", type=Path)
    ap.add_argument("--detector", default=None, help="one detector of the run (default: the only one)")
    ap.add_argument("--kind-max-drop", type=float, default=None, metavar="A",
                    help="also: the lowest threshold dropping at most A of every clean kind (in-sample) "
                         "and the step-10 drops it gives")
    ap.add_argument("--top-clean", type=int, default=0, metavar="N",
                    help="also: the N highest-scoring clean pictures of each kind, per storage")
    a = ap.parse_args(argv)
    d = a.eval_dir
    au = pd.read_csv(d / "auroc_by_storage.csv")
    a.detector = pick_detector(au, a.detector)
    au = au[au["detector"] == a.detector]
    for k in (5, 10):
        if f"k{k}" not in au.columns or au[f"k{k}"].isna().all():  # not in evaluate's --auroc-steps
            continue
        print(f"\nAUROC clean vs step {k} (clean = the steps evaluate was given, see results.md)")
        print(table(with_family_mean(au, f"k{k}"), "family", f"k{k}"))
    f = pd.read_csv(d / "failures_by_storage.csv")
    f = f[f["detector"] == a.detector]
    print("\nthe study's criterion (Δ5, Δ10, Δ20 > 0 against step 1): share of chains passing")
    print(table(f, "family", "pass_rate"))
    print("chains evaluated per family and storage:", int(f["evaluated"].min()), "to", int(f["evaluated"].max()))
    cd = pd.read_csv(d / "clean_drops.csv") if (d / "clean_drops.csv").exists() else None
    cd = None if cd is None else cd[cd["detector"] == a.detector]
    if cd is None or cd.empty:
        print("\n(no drop rates: evaluate had no threshold for this detector; give it --calibration)")
    else:
        print(f"\nshare of clean images (step 0) dropped at threshold {cd['threshold'].iloc[0]:.4g}, per kind")
        print(table(cd, "source_kind", "fraction"))
        print("clean images per kind and storage:")
        print(table(cd, "source_kind", "n").replace(".000", ""))
        dr = pd.read_csv(d / "drops.csv")
        dr = dr[(dr["detector"] == a.detector) & (dr["step"] == 10)]
        print("\nshare of step-10 images dropped at that threshold, per family")
        print(table(dr, "family", "fraction"))
    if a.kind_max_drop is not None:
        print(f"\nthe lowest threshold dropping at most {a.kind_max_drop:g} of every clean kind, chosen "
              "on these images (in-sample), and what it drops at step 10")
        print("\n".join(kind_oracle(pd.read_csv(d / "scores.csv"), a.detector, a.kind_max_drop)))
    if a.top_clean > 0:
        print(f"\nthe {a.top_clean} highest-scoring clean pictures (step 0) of each kind")
        print("\n".join(top_clean(pd.read_csv(d / "scores.csv"), a.detector, a.top_clean)))


def top_clean(scores: pd.DataFrame, detector: str, n: int) -> list[str]:
    """Lines: per storage and clean kind, the ``n`` highest-scoring step-0 pictures (one image per
    source and storage) with their scores, highest first."""
    from collapseguard.evaluation.breakdown import with_groups

    s = with_groups(scores[scores["detector"] == detector])
    clean = s[s["step"] == 0].drop_duplicates(["source_image", "storage"])
    lines = []
    for storage in [c for c in STORAGES if c in set(clean["storage"])] + \
            sorted(set(clean["storage"]) - set(STORAGES)):
        lines.append(f"{storage}:")
        for kind, g in clean[clean["storage"] == storage].groupby("source_kind", sort=True):
            top = g.sort_values("score", ascending=False, kind="stable").head(n)
            lines.append(f"  {kind}: " + ", ".join(f"{r.source_image} {r.score:.2f}" for r in top.itertuples()))
    return lines


def kind_oracle(scores: pd.DataFrame, detector: str, alpha: float) -> list[str]:
    """Lines: per storage, the lowest threshold with every clean kind's (step 0, one image per
    source and storage) dropped share at most ``alpha``, the kind that sets it, and the step-10
    share dropped per family and over all families at that threshold."""
    import math

    import numpy as np

    from collapseguard.evaluation.breakdown import drop_rates, with_groups

    s = with_groups(scores[scores["detector"] == detector])
    s = s[np.isfinite(s["score"].to_numpy(np.float64))]
    lines = []
    for storage in [c for c in STORAGES if c in set(s["storage"])]:
        g = s[s["storage"] == storage]
        clean = g[g["step"] == 0].drop_duplicates(["source_image", "storage"])
        per_kind = {}
        for kind, gk in clean.groupby("source_kind", sort=True):
            desc = np.sort(gk["score"].to_numpy(np.float64))[::-1]
            allowed = math.floor(alpha * len(desc) + 1e-9)  # 0.29 * 100 is 28.999...: allow 29
            per_kind[kind] = float(desc[min(allowed, len(desc) - 1)])
        kind, t = max(per_kind.items(), key=lambda kv: kv[1])
        dr = drop_rates(g, {detector: t})
        dr = dr[dr["step"] == 10]
        fams = " ".join(f"{r.family} {r.fraction:.3f}" for r in dr.itertuples() if r.family != "all")
        every = dr.loc[dr["family"] == "all", "fraction"]
        lines.append(f"{storage} | threshold {t:.6g} (set by {kind}; all clean dropped "
                     f"{(clean['score'] > t).mean():.3f}); step 10 dropped "
                     f"{float(every.iloc[0]) if len(every) else float('nan'):.3f}: {fams}")
    return lines


if __name__ == "__main__":
    main()
