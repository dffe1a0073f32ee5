"""The study's arithmetic: Δ gaps, the pass/fail criterion, AUROC and Spearman.

Everything here works on plain arrays and DataFrames of scores, so it can be checked by hand.
Scores are oriented higher = more degraded (the project-wide convention).

- **Scale.** Each detector's scores live on their own scale, so the gap is divided by a stated
  per-detector normaliser: the population standard deviation (``"std"``) or IQR/1.349 (``"iqr"``,
  a robust estimate of the same quantity) of that detector's finite scores over the whole evaluated
  set. A zero or non-finite spread (every score equal) is replaced by 1.0 and flagged.
- **Δ gap.** For a chain, ``Δ_k = (s_k − s_base) / scale`` with ``base`` = step 1 (the study's
  reference: the first replication, so the gap measures *further* degradation).
- **Criterion.** A chain passes when every ``Δ_k`` is strictly positive (a tie is a failure: the
  detector did not see the image get worse). A NaN score at the base or any ``k`` is a failure with
  a reason. A chain without the base step or one of the ``k`` is *skipped* with a note and counts
  neither way.
- **AUROC.** Clean (steps 0 and 1) against step ``k``; the probability that a random step-``k``
  image scores higher than a random clean one, ties counted as one half (Mann-Whitney U). NaN scores
  are left out (and counted).
- **Spearman.** Rank correlation of score with step within one chain, over its finite scores;
  NaN when fewer than three steps or no variation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

#: steps at which the study's gap is taken, and the reference step
DELTA_STEPS = (5, 10, 20)
BASE_STEP = 1
#: "clean" images for AUROC, and the degraded steps each is compared against
CLEAN_STEPS = (0, 1)
AUROC_STEPS = (2, 3, 5, 10, 20)
SCALE_METHODS = ("std", "iqr")

#: chain status values
PASSED, FAILED, SKIPPED = "pass", "fail", "skipped"


@dataclass(frozen=True)
class Scale:
    """A detector's normaliser: ``value`` and how it was obtained."""

    value: float
    method: str
    n: int
    degenerate: bool = False

    def describe(self) -> str:
        what = "population std" if self.method == "std" else "IQR/1.349"
        note = " (degenerate spread; replaced by 1.0)" if self.degenerate else ""
        return f"{what} of {self.n} finite scores = {self.value:.6g}{note}"


def detector_scale(scores: Iterable[float], method: str = "std") -> Scale:
    """The spread of one detector's finite scores over the evaluated set (see module docstring)."""
    if method not in SCALE_METHODS:
        raise ValueError(f"scale method must be one of {SCALE_METHODS}, got {method!r}")
    x = np.asarray(list(scores), dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Scale(1.0, method, 0, degenerate=True)
    if method == "std":
        v = float(np.std(x))
    else:
        q75, q25 = np.percentile(x, [75, 25])
        v = float(q75 - q25) / 1.349
    if not math.isfinite(v) or v <= 0:
        return Scale(1.0, method, int(x.size), degenerate=True)
    return Scale(v, method, int(x.size))


@dataclass
class ChainResult:
    """Δ gaps and verdict for one chain under one detector."""

    deltas: dict[int, float]
    status: str
    reason: str = ""
    spearman: float = float("nan")
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        """True/False for evaluated chains, None for skipped ones."""
        return None if self.status == SKIPPED else self.status == PASSED


def chain_deltas(
    steps: Sequence[int],
    scores: Sequence[float],
    scale: float,
    ks: Sequence[int] = DELTA_STEPS,
    base: int = BASE_STEP,
) -> ChainResult:
    """Δ_k = (s_k − s_base)/scale for one chain, and the pass/fail/skip verdict.

    ``steps`` and ``scores`` are parallel (one entry per image of the chain). Raises ValueError on
    repeated steps or a non-positive scale.
    """
    if not (isinstance(scale, (int, float, np.floating)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    steps = [int(s) for s in steps]
    if len(steps) != len(scores):
        raise ValueError("steps and scores must have the same length")
    if len(set(steps)) != len(steps):
        seen: set[int] = set()
        repeated = sorted({s for s in steps if s in seen or seen.add(s)})
        shown = ", ".join(map(str, repeated[:10])) + (", ..." if len(repeated) > 10 else "")
        raise ValueError(f"repeated step in chain: step(s) {shown} appear more than once "
                         f"({len(steps)} images, {len(set(steps))} distinct steps)")
    if base in ks or len(set(ks)) != len(ks):
        raise ValueError(f"gap steps {list(ks)} must be distinct and exclude the base step {base}")
    by_step = {s: float(v) for s, v in zip(steps, scores)}
    rho = spearman_with_step(steps, scores)
    missing = [s for s in (base, *ks) if s not in by_step]
    deltas = {k: float("nan") for k in ks}
    if missing:
        return ChainResult(deltas, SKIPPED, f"missing step(s) {missing}", rho)
    for k in ks:  # NaN where either score is: the finite ones stay, for the tables' medians
        deltas[k] = (by_step[k] - by_step[base]) / scale
    nan_steps = [s for s in (base, *ks) if not math.isfinite(by_step[s])]
    if nan_steps:
        return ChainResult(deltas, FAILED, f"NaN score at step(s) {nan_steps}", rho)
    bad = [k for k in ks if not deltas[k] > 0]
    if bad:
        return ChainResult(deltas, FAILED, f"not worse than step {base} at step(s) {bad}", rho)
    return ChainResult(deltas, PASSED, "", rho)


def spearman_with_step(steps: Sequence[int], scores: Sequence[float]) -> float:
    """Spearman rank correlation of score with step over finite scores (NaN if undefined)."""
    s = np.asarray(steps, dtype=np.float64)
    v = np.asarray(scores, dtype=np.float64)
    ok = np.isfinite(v)
    s, v = s[ok], v[ok]
    if s.size < 3 or np.all(v == v[0]) or np.all(s == s[0]):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = stats.spearmanr(s, v).statistic
    return float(rho)


def auroc(negatives: Iterable[float], positives: Iterable[float]) -> float:
    """P(score of a positive > score of a negative), ties counted 1/2; NaNs dropped.

    Returns NaN when either side has no finite score.
    """
    neg = np.asarray(list(negatives), dtype=np.float64)
    pos = np.asarray(list(positives), dtype=np.float64)
    neg, pos = neg[np.isfinite(neg)], pos[np.isfinite(pos)]
    n0, n1 = neg.size, pos.size
    if n0 == 0 or n1 == 0:
        return float("nan")
    ranks = stats.rankdata(np.concatenate([neg, pos]))  # average ranks for ties
    u = ranks[n0:].sum() - n1 * (n1 + 1) / 2.0
    return float(u / (n0 * n1))


# ---------------------------------------------------------------------------------------------
# Tables over a long scores frame: columns chain_id, family, step, detector, score
# ---------------------------------------------------------------------------------------------

ALL_FAMILIES = "all"


def overall_label(families: Iterable[str]) -> str:
    """The family label of the overall rows: ``"all"``, or ``"(all)"`` (``"((all))"``, ...) when a
    family of the chains is itself named ``all``, so that its rows and the overall ones stay apart."""
    fams = {str(f) for f in families}
    label = ALL_FAMILIES
    while label in fams:
        label = f"({label})"
    return label


def scales_for(scores: pd.DataFrame, method: str = "std") -> dict[str, Scale]:
    """One Scale per detector over every score of that detector in ``scores``."""
    return {det: detector_scale(g["score"], method) for det, g in scores.groupby("detector", sort=False)}


def per_chain_table(
    scores: pd.DataFrame,
    scales: dict[str, Scale],
    ks: Sequence[int] = DELTA_STEPS,
    base: int = BASE_STEP,
) -> pd.DataFrame:
    """One row per (chain, detector): Δ_k columns, pass, status, reason, spearman."""
    rows = []
    order = {d: i for i, d in enumerate(dict.fromkeys(scores["detector"]))}  # as given
    groups = sorted(scores.groupby(["detector", "chain_id"], sort=True), key=lambda kv: order[kv[0][0]])
    for (det, chain), g in groups:
        res = chain_deltas(g["step"].to_numpy(), g["score"].to_numpy(), scales[det].value, ks, base)
        row = {"chain_id": chain, "family": g["family"].iloc[0], "detector": det}
        row.update({f"delta_{k}": res.deltas[k] for k in ks})
        row.update({"pass": res.passed, "status": res.status, "reason": res.reason,
                    "spearman": res.spearman})
        rows.append(row)
    cols = ["chain_id", "family", "detector", *[f"delta_{k}" for k in ks], "pass", "status",
            "reason", "spearman"]
    return pd.DataFrame(rows, columns=cols)


def failure_counts(per_chain: pd.DataFrame, by_family: bool = False) -> pd.DataFrame:
    """Evaluated / failed / passed / skipped chains per detector (and family, if asked).

    ``failed`` is the study's criterion; ``fail_nan`` counts the failures caused by NaN scores.
    ``pass_rate`` is passed / evaluated (skipped chains excluded).
    """
    keys = ["detector", "family"] if by_family else ["detector"]
    rows = []
    for key, g in per_chain.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        failed = int((g["status"] == FAILED).sum())
        passed = int((g["status"] == PASSED).sum())
        skipped = int((g["status"] == SKIPPED).sum())
        evaluated = failed + passed
        row = dict(zip(keys, key))
        row.update({
            "chains": len(g), "evaluated": evaluated, "failed": failed, "passed": passed,
            "skipped": skipped,
            "fail_nan": int(((g["status"] == FAILED) & g["reason"].str.startswith("NaN")).sum()),
            "pass_rate": passed / evaluated if evaluated else float("nan"),
        })
        for c in [c for c in g.columns if c.startswith("delta_")]:
            row["median_" + c] = float(g[c].median()) if g[c].notna().any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def auroc_table(
    scores: pd.DataFrame,
    ks: Sequence[int] = AUROC_STEPS,
    clean_steps: Sequence[int] = CLEAN_STEPS,
) -> pd.DataFrame:
    """AUROC of clean (``clean_steps``) vs step k, per detector × family and overall ("all",
    or ``overall_label``'s other name when a family is called "all").

    Columns: detector, family, n_clean, then ``k<step>`` for each k (NaN where step k is absent)
    and ``n_k<step>``; also ``nan_scores`` (finite-score rows dropped per group).
    """
    rows = []
    fams = sorted(scores["family"].unique())
    overall = overall_label(fams)
    for det, gd in scores.groupby("detector", sort=False):
        for fam, g in [(overall, gd), *((f, gd[gd["family"] == f]) for f in fams)]:
            clean = g.loc[g["step"].isin(clean_steps), "score"].to_numpy(np.float64)
            row = {"detector": det, "family": fam, "n_clean": int(np.isfinite(clean).sum()),
                   "nan_scores": int((~np.isfinite(g["score"].to_numpy(np.float64))).sum())}
            for k in ks:
                pos = g.loc[g["step"] == k, "score"].to_numpy(np.float64)
                row[f"k{k}"] = auroc(clean, pos)
                row[f"n_k{k}"] = int(np.isfinite(pos).sum())
            rows.append(row)
    return pd.DataFrame(rows)


def spearman_summary(per_chain: pd.DataFrame) -> pd.DataFrame:
    """Mean and median per-chain Spearman ρ per detector × family and overall (``overall_label``)."""
    rows = []
    overall = overall_label(per_chain["family"].unique())
    for det, gd in per_chain.groupby("detector", sort=False):
        fams = sorted(gd["family"].unique())
        for fam, g in [(overall, gd), *((f, gd[gd["family"] == f]) for f in fams)]:
            r = g["spearman"].to_numpy(np.float64)
            r = r[np.isfinite(r)]
            rows.append({"detector": det, "family": fam, "chains": int(r.size),
                         "mean": float(r.mean()) if r.size else float("nan"),
                         "median": float(np.median(r)) if r.size else float("nan")})
    return pd.DataFrame(rows)
