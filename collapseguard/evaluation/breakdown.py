"""The evaluation's tables split by how the images are stored and by the kind of clean source.

A scores frame carries ``storage`` and ``source_kind`` (``scoring.GROUP_COLUMNS``); an empty
cell is one group, shown as ``(unknown)`` for storage and ``(none)`` for kind, so a manifest
without a ``kind`` column is one kind group and old scores files without the columns still work.

- ``auroc_by``: clean (steps 0, 1) vs step k per detector x group x family (and all families).
- ``failures_by``: the study's criterion per detector x group x family; a chain's group is the
  one value its images share (``mixed`` when they differ).
- ``drop_rates``: with a threshold per detector (drop when score > threshold, as the filter does),
  the share of images dropped per detector x storage x family x step.
- ``clean_drop_rates``: the share of clean images (step 0, one per source and storage) dropped
  per detector x kind x storage: the false drops a user of each kind of image would see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from collapseguard.evaluation import metrics

DROP_COLUMNS = ["detector", "threshold", "storage", "family", "step", "n", "dropped", "fraction"]
CLEAN_DROP_COLUMNS = ["detector", "threshold", "source_kind", "storage", "sources", "n", "dropped",
                      "fraction", "max_score"]

#: how an empty group cell is shown
EMPTY_LABEL = {"storage": "(unknown)", "source_kind": "(none)"}


def group_labels(df: pd.DataFrame, column: str) -> pd.Series:
    """The group of each row: the column's text, ``EMPTY_LABEL`` where empty or absent."""
    empty = EMPTY_LABEL.get(column, "(none)")
    if column not in df.columns:
        return pd.Series(empty, index=df.index, dtype=object)
    v = df[column].fillna("").astype(str)
    return v.where(v != "", empty)


def with_groups(scores: pd.DataFrame) -> pd.DataFrame:
    """``scores`` with both group columns filled in (``group_labels``), and ``source_image`` (the
    chain id where a scores frame has no sources: each chain its own original)."""
    out = scores.assign(storage=group_labels(scores, "storage"),
                        source_kind=group_labels(scores, "source_kind"))
    if "source_image" not in out.columns:
        out["source_image"] = out["chain_id"]
    return out


def auroc_by(scores: pd.DataFrame, column: str, ks: Sequence[int] = metrics.AUROC_STEPS,
             clean_steps: Sequence[int] = metrics.CLEAN_STEPS, by_family: bool = True) -> pd.DataFrame:
    """``metrics.auroc_table`` within each group of ``column``: columns detector, ``column``,
    family, n_clean, k<step>, n_k<step>, nan_scores. Without ``by_family`` only the overall rows."""
    s = with_groups(scores)
    parts = []
    for value, g in s.groupby(column, sort=True):
        t = metrics.auroc_table(g, ks, clean_steps)
        if not by_family:
            t = t[t["family"] == metrics.overall_label(g["family"].unique())]
        parts.append(t.assign(**{column: value}))
    if not parts:
        return pd.DataFrame(columns=["detector", column, "family"])
    out = pd.concat(parts, ignore_index=True)
    return out[["detector", column, *[c for c in out.columns if c not in ("detector", column)]]]


def chain_groups(scores: pd.DataFrame, column: str) -> pd.Series:
    """chain_id -> the group its images share (``mixed`` when they differ). An image whose group
    is unknown (a file too damaged to read its header) takes its chain's group: the chain stays
    in its storage's row, where its NaN score fails it."""
    s = with_groups(scores)
    empty = EMPTY_LABEL.get(column, "(none)")

    def shared(v: pd.Series) -> str:
        known = v[v != empty]
        values = (known if len(known) else v).unique()
        return values[0] if len(values) == 1 else "mixed"

    return s.groupby("chain_id")[column].agg(shared)


def failures_by(per_chain: pd.DataFrame, scores: pd.DataFrame, column: str) -> pd.DataFrame:
    """The criterion per detector x group x family, plus each group over all families."""
    pc = per_chain.assign(**{column: per_chain["chain_id"].map(chain_groups(scores, column))})
    parts = []
    overall = metrics.overall_label(pc["family"].unique())
    for value, g in pc.groupby(column, sort=True):
        parts.append(metrics.failure_counts(g.assign(family=overall), by_family=True).assign(**{column: value}))
        parts.append(metrics.failure_counts(g, by_family=True).assign(**{column: value}))
    if not parts:
        return pd.DataFrame(columns=["detector", column, "family"])
    out = pd.concat(parts, ignore_index=True)
    return out[["detector", column, *[c for c in out.columns if c not in ("detector", column)]]]


def drop_rates(scores: pd.DataFrame, thresholds: Mapping[str, float]) -> pd.DataFrame:
    """Share of images with score > threshold per detector x storage x family x step (family
    ``all`` too, where a step-0 image shared by several chains of one source counts once)."""
    if not thresholds:
        return pd.DataFrame(columns=DROP_COLUMNS)
    s = with_groups(scores)
    rows = []
    for det, gd in s.groupby("detector", sort=False):
        if det not in thresholds:
            continue
        thr = float(thresholds[det])
        overall = metrics.overall_label(gd["family"].unique())
        for storage, gs in gd.groupby("storage", sort=True):
            fams = [(overall, _one_step0_per_source(gs))] + list(gs.groupby("family", sort=True))
            for fam, g in fams:
                for step, gk in g.groupby("step", sort=True):
                    v = gk["score"].to_numpy(np.float64)
                    v = v[np.isfinite(v)]
                    d = int((v > thr).sum())
                    rows.append({"detector": det, "threshold": thr, "storage": storage, "family": fam,
                                 "step": int(step), "n": int(v.size), "dropped": d,
                                 "fraction": d / v.size if v.size else float("nan")})
    return pd.DataFrame(rows, columns=DROP_COLUMNS)


def _one_step0_per_source(g: pd.DataFrame) -> pd.DataFrame:
    """Rows with each source's step-0 image once (chains of one source share their original)."""
    step0 = g["step"] == 0
    return pd.concat([g[~step0], g[step0].drop_duplicates(["detector", "source_image", "storage"])])


def clean_drop_rates(scores: pd.DataFrame, thresholds: Mapping[str, float], clean_step: int = 0) -> pd.DataFrame:
    """Share of clean images (``clean_step``, one per source and storage) with score > threshold,
    per detector x kind x storage, plus every kind and every storage together (``all``, or
    ``metrics.overall_label``'s other name when a kind or storage is itself called so)."""
    if not thresholds:
        return pd.DataFrame(columns=CLEAN_DROP_COLUMNS)
    s = with_groups(scores)
    s = s[s["step"] == clean_step].drop_duplicates(["detector", "source_image", "storage"])
    rows = []
    for det, gd in s.groupby("detector", sort=False):
        if det not in thresholds:
            continue
        thr = float(thresholds[det])
        every_kind = metrics.overall_label(gd["source_kind"].unique())
        every_storage = metrics.overall_label(gd["storage"].unique())
        for kind, gk in [(every_kind, gd)] + list(gd.groupby("source_kind", sort=True)):
            for storage, g in [(every_storage, gk)] + list(gk.groupby("storage", sort=True)):
                v = g["score"].to_numpy(np.float64)
                v = v[np.isfinite(v)]
                d = int((v > thr).sum())
                rows.append({"detector": det, "threshold": thr, "source_kind": kind, "storage": storage,
                             "sources": int(g["source_image"].nunique()), "n": int(v.size), "dropped": d,
                             "fraction": d / v.size if v.size else float("nan"),
                             "max_score": float(v.max()) if v.size else float("nan")})
    return pd.DataFrame(rows, columns=CLEAN_DROP_COLUMNS)
