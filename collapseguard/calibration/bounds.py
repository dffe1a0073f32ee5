"""Finite-sample statistics: the false-drop bound, binomial intervals, isotonic maps.

The threshold bound (``order_statistic_threshold``)
----------------------------------------------------
Let the clean calibration scores X_1..X_n be exchangeable with a new clean score X (i.i.d. from
the clean distribution), and drop an image when ``score > t``. Take ``t`` = the k-th largest clean
score. With U_i = P(X > X_i), the true false-drop rate of ``t`` is the k-th smallest of n uniform
variables, U_(k) ~ Beta(k, n - k + 1), so

    P(false-drop rate > alpha) = P(U_(k) > alpha) = P(Binomial(n, alpha) <= k - 1).

We take the largest k with ``P(Binomial(n, alpha) <= k - 1) <= delta`` ("binomial order statistic",
the conformal / tolerance-interval construction). Ties in the scores only lower the true rate (the
rule is strict), so the bound stays valid. A k >= 1 exists only when ``(1 - alpha)**n <= delta``,
i.e. ``n >= log(delta) / log(1 - alpha)`` (299 for alpha = 1 %, delta = 5 %); with fewer clean
scores we refuse and say how many are needed. The rate actually guaranteed at confidence 1 - delta
is the (1 - delta) quantile of Beta(k, n - k + 1), which is <= alpha.

The scores must be exchangeable, so ``calibration.build`` passes one score per clean picture (its
highest: ``build.source_maxima``), never several near-identical copies of one picture.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from collapseguard.io.calibration_file import (
    CalibrationError,
    _check_rates,
    min_clean_samples,
)

#: the name written into calibration files
BOUND_NAME = ("binomial order statistic (conformal): threshold = k-th largest clean score, "
              "largest k with P(Binomial(n, alpha) <= k-1) <= delta; drop if score > threshold")

#: the name written into calibration files made with ``per_kind_threshold``
PER_KIND_NAME = ("binomial order statistic (conformal) per clean kind, Bonferroni over kinds: "
                 "threshold = the largest of the kinds' thresholds, each at confidence 1 - delta/G; "
                 "drop if score > threshold")


class NotEnoughCleanSamples(CalibrationError):
    """Too few clean scores for the alpha / confidence asked for; ``needed`` says how many."""

    def __init__(self, n: int, needed: int, alpha: float, confidence: float, detail: str = "",
                 unit: str = "clean scores", kind: str | None = None):
        """``kind``: the clean kind whose ``n`` falls short (a per-kind bound), named first."""
        self.n, self.needed, self.alpha, self.confidence = n, needed, alpha, confidence
        self.detail, self.unit, self.kind = detail, unit, kind
        where = f"the clean kind {kind!r} has only " if kind is not None else ""
        one = unit[:-1] if n == 1 and unit.endswith("s") else unit  # "1 distinct clean picture"
        super().__init__(
            f"{where}{n} {one}, which cannot support at most {alpha:.3g} false drops with {confidence:.3g} "
            f"confidence: at least {needed} {unit} are needed{detail} (add clean images with "
            f"--clean, more chains, or relax --max-false-drop / --confidence)")

    def __reduce__(self):  # pickles with its own arguments (it crosses worker processes)
        return type(self), (self.n, self.needed, self.alpha, self.confidence, self.detail, self.unit,
                             self.kind)


def order_statistic_rank(n: int, alpha: float, confidence: float) -> int:
    """The largest k (1-based, counted from the top) with P(Binomial(n, alpha) <= k-1) <= delta; 0 if none."""
    a, c = _check_rates(alpha, confidence)
    delta = 1.0 - c
    if n <= 0:
        return 0
    ks = np.arange(1, n + 1)
    ok = stats.binom.cdf(ks - 1, n, a) <= delta
    return int(ks[ok].max()) if ok.any() else 0


def guaranteed_rate(n: int, k: int, confidence: float) -> float:
    """The false-drop rate bounded at ``confidence`` for the k-th largest of n: Beta(k, n-k+1) quantile."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    return float(stats.beta.ppf(float(confidence), k, n - k + 1))


@dataclass
class BoundResult:
    threshold: float
    k: int
    n: int
    alpha: float
    confidence: float
    guaranteed_false_drop: float
    empirical_false_drop: float
    method: str = BOUND_NAME


def order_statistic_threshold(clean_scores, alpha: float = 0.01, confidence: float = 0.95) -> BoundResult:
    """Threshold with P(true false-drop rate > alpha) <= 1 - confidence (see module docstring).

    NaN scores are ignored (they are errors, not clean evidence); +inf is a clean score above any
    threshold and counts. Raises NotEnoughCleanSamples with the number needed when there are too
    few scored clean images, and CalibrationError when so many clean scores are +inf that no finite
    threshold keeps the guarantee.
    """
    a, c = _check_rates(alpha, confidence)
    s = np.asarray(clean_scores, dtype=np.float64).reshape(-1)
    s = s[~np.isnan(s)]
    n = len(s)
    k = order_statistic_rank(n, a, c)
    if k < 1:
        raise NotEnoughCleanSamples(n, min_clean_samples(a, c), a, c)
    desc = np.sort(s)[::-1]
    t = float(desc[k - 1])
    if not np.isfinite(t):
        raise CalibrationError(f"{int(np.sum(np.isposinf(s)))} of {n} clean scores are +inf: no finite "
                               f"threshold drops at most {a:.3g} of clean images")
    return BoundResult(threshold=t, k=k, n=n, alpha=a, confidence=c,
                       guaranteed_false_drop=guaranteed_rate(n, k, c),
                       empirical_false_drop=float(np.mean(s > t)))


@dataclass
class KindBound:
    """One clean kind's part of a per-kind threshold (``per_kind_threshold``)."""

    kind: str
    bound: BoundResult


def per_kind_threshold(clean_scores, kinds, alpha: float = 0.01, confidence: float = 0.95,
                       required=()) -> tuple[BoundResult, list[KindBound]]:
    """A threshold that keeps *every* kind's false-drop rate at most ``alpha``, all together with
    probability at least ``confidence``.

    Each of the G kinds gets its own order-statistic threshold at confidence ``1 - delta / G``
    (Bonferroni: the chance that any kind's true rate exceeds alpha is at most delta), and the
    threshold is the largest of them. A higher threshold only lowers each kind's rate, so every
    kind keeps its guarantee. A pooled threshold guarantees only the mix: a kind that is 5% of the
    clean images can lose 15% of its images while the pool loses 1%.

    Returns the binding kind's bound with ``empirical_false_drop`` recomputed over all clean
    scores at the final threshold, ``confidence`` the joint one and ``guaranteed_false_drop`` the
    largest of the kinds' own bounds (each holds at the higher final threshold too, so the largest
    holds for every kind), and every kind's own bound.
    ``required`` names kinds that must be covered even if ``kinds`` holds none of them (the
    calibration's kinds whose sources all went to the held-out part). Raises NotEnoughCleanSamples
    naming every kind with too few scores.
    """
    a, c = _check_rates(alpha, confidence)
    s = np.asarray(clean_scores, dtype=np.float64).reshape(-1)
    labels = np.asarray([str(k) for k in kinds], dtype=object)
    if labels.shape != s.shape:
        raise ValueError(f"{len(labels)} kind labels for {len(s)} clean scores")
    names = sorted(set(labels.tolist()) | {str(k) for k in required})  # a required kind may have none
    if not names:
        raise NotEnoughCleanSamples(0, min_clean_samples(a, c), a, c)
    each = 1.0 - (1.0 - c) / len(names)
    parts, short = [], []
    for name in names:
        try:
            parts.append(KindBound(name, order_statistic_threshold(s[labels == name], a, each)))
        except NotEnoughCleanSamples as exc:
            short.append((name, exc.n))
    if short:
        needed = min_clean_samples(a, each)
        listed = ", ".join(f"{name!r} has {n}" for name, n in short)
        smallest, n_smallest = min(short, key=lambda kn: kn[1])
        raise NotEnoughCleanSamples(n_smallest, needed, a, c,
                                    (f" for each of the {len(names)} clean kinds" if len(names) > 1
                                     else " for the one clean kind") + f" ({listed}; "
                                    f"{len(names)} kinds together need {needed} per kind)", kind=smallest)
    top = max(parts, key=lambda p: p.bound.threshold)
    t = top.bound.threshold
    # the rate guaranteed for every kind at once: each kind's bound holds for its own threshold,
    # so for the higher final one too; the largest of them holds for all
    worst = max(p.bound.guaranteed_false_drop for p in parts)
    s = s[~np.isnan(s)]
    joint = BoundResult(threshold=t, k=top.bound.k, n=top.bound.n, alpha=a, confidence=c,
                        guaranteed_false_drop=worst,
                        empirical_false_drop=float(np.mean(s > t)) if len(s) else 0.0,
                        method=PER_KIND_NAME)
    return joint, parts


def thresholds_batch(clean: np.ndarray, alpha: float, confidence: float) -> np.ndarray:
    """Vectorised ``order_statistic_threshold`` over rows of an (R, n) array (for simulations)."""
    clean = np.asarray(clean, dtype=np.float64)
    n = clean.shape[1]
    k = order_statistic_rank(n, alpha, confidence)
    if k < 1:
        raise NotEnoughCleanSamples(n, min_clean_samples(alpha, confidence), alpha, confidence)
    # k-th largest = (n-k)-th smallest (0-based)
    return np.partition(clean, n - k, axis=1)[:, n - k]


# ---------------------------------------------------------------------------------------------
# Binomial intervals for the drop curve
# ---------------------------------------------------------------------------------------------

def clopper_pearson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson) two-sided interval for a binomial proportion."""
    if n <= 0:
        return (float("nan"), float("nan"))
    x = int(successes)
    tail = (1.0 - float(confidence)) / 2.0
    lo = 0.0 if x == 0 else float(stats.beta.ppf(tail, x, n - x + 1))
    hi = 1.0 if x == n else float(stats.beta.ppf(1.0 - tail, x + 1, n - x))
    return lo, hi


# ---------------------------------------------------------------------------------------------
# Isotonic maps
# ---------------------------------------------------------------------------------------------

def isotonic_knots(scores, targets, *, y_min: float | None = None, y_max: float | None = None,
                   max_knots: int = 200) -> dict:
    """Fit a non-decreasing map score -> target (sklearn IsotonicRegression) and return its knots.

    The knots ``{"x": [...], "y": [...]}`` are interpolated linearly and clamped at the ends
    (exactly what IsotonicRegression.predict does with out_of_bounds="clip"). Long knot lists are
    thinned to ``max_knots`` points, which keeps the map monotone.
    """
    from sklearn.isotonic import IsotonicRegression

    x = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError("scores and targets must have the same length")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 2:
        raise CalibrationError("need at least 2 finite (score, target) pairs to fit an isotonic map")
    iso = IsotonicRegression(increasing=True, out_of_bounds="clip", y_min=y_min, y_max=y_max)
    iso.fit(x, y)
    kx = np.asarray(iso.X_thresholds_, dtype=np.float64)
    ky = np.asarray(iso.y_thresholds_, dtype=np.float64)
    if len(kx) > max_knots:
        idx = np.unique(np.linspace(0, len(kx) - 1, max_knots).round().astype(int))
        kx, ky = kx[idx], ky[idx]
    ky = np.maximum.accumulate(ky)  # guard against float noise
    return {"x": kx.tolist(), "y": ky.tolist()}
