"""Figures of an audit: flagged fraction with a confidence interval, per-source table, and where
two detectors disagree.

Decision rule everywhere: an image is *flagged* when ``score > threshold`` (the filter's rule);
images that could not be scored (NaN) are neither flagged nor counted in the denominator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from collapseguard.calibration.thresholds import is_dropped, threshold_for_drop_fraction

CONFIDENCE = 0.95


def binomial_interval(k: int, n: int, confidence: float = CONFIDENCE,
                      method: str = "clopper-pearson") -> tuple[float, float]:
    """Two-sided interval for a proportion from ``k`` successes in ``n`` trials.

    ``method``: ``"clopper-pearson"`` (exact, conservative) or ``"wilson"`` (score interval).
    Returns ``(nan, nan)`` when ``n == 0``.
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n == 0:
        return math.nan, math.nan
    a = 1 - confidence
    if method == "clopper-pearson":
        lo = 0.0 if k == 0 else float(sps.beta.ppf(a / 2, k, n - k + 1))
        hi = 1.0 if k == n else float(sps.beta.ppf(1 - a / 2, k + 1, n - k))
        return lo, hi
    if method == "wilson":
        z = float(sps.norm.ppf(1 - a / 2))
        p = k / n
        den = 1 + z * z / n
        centre = (p + z * z / (2 * n)) / den
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
        return max(0.0, centre - half), min(1.0, centre + half)
    raise ValueError(f"unknown interval method {method!r}; use 'clopper-pearson' or 'wilson'")


@dataclass
class FlagCounts:
    """How many images were scored and flagged, with the flagged fraction's interval."""

    samples: int
    scored: int
    flagged: int
    errors: int
    fraction: float
    ci_low: float
    ci_high: float

    def as_dict(self) -> dict:
        return {k: _num(v) for k, v in self.__dict__.items()}


def _num(v):
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def dataset_estimate(counts: FlagCounts, population: int) -> dict:
    """How many of ``population`` samples would be flagged, from a random sample's ``counts``:
    ``{"count", "low", "high"}``, the fraction and its interval scaled to the scorable part of the
    population. The range never contradicts the sample itself: the flagged samples seen are in
    the dataset (low >= flagged), and so are the scored samples seen unflagged (high <= the
    scorable population minus those)."""
    scale = population * counts.scored / max(1, counts.samples)
    low = max(counts.flagged, math.floor(counts.ci_low * scale))
    high = max(low, min(math.ceil(counts.ci_high * scale), math.floor(scale) - (counts.scored - counts.flagged)))
    return {"count": min(max(round(counts.fraction * scale), low), high), "low": low, "high": high}


def flag_counts(scores, threshold: float, confidence: float = CONFIDENCE) -> FlagCounts:
    """Counts for ``scores`` (NaN = could not score) at ``threshold``."""
    s = np.asarray(scores, dtype=np.float64)
    scored = int(np.isfinite(s).sum())
    flagged = int(is_dropped(s, threshold).sum())
    lo, hi = binomial_interval(flagged, scored, confidence)
    return FlagCounts(len(s), scored, flagged, len(s) - scored,
                      flagged / scored if scored else math.nan, lo, hi)


def per_source_table(df: pd.DataFrame, threshold: float, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per source (shard or folder), in order of first appearance.

    Columns: source, samples, scored, errors, flagged, fraction, ci_low, ci_high, median_score,
    max_score, and median_step when ``df`` has an ``equivalent_step`` column.
    """
    rows = []
    has_step = "equivalent_step" in df.columns
    for source, g in df.groupby("source", sort=False):
        c = flag_counts(g["score"].to_numpy(np.float64), threshold, confidence)
        s = g["score"].to_numpy(np.float64)
        fin = s[np.isfinite(s)]
        row = {"source": source, "samples": c.samples, "scored": c.scored, "errors": c.errors,
               "flagged": c.flagged, "fraction": c.fraction, "ci_low": c.ci_low,
               "ci_high": c.ci_high,
               "median_score": float(np.median(fin)) if len(fin) else math.nan,
               "max_score": float(fin.max()) if len(fin) else math.nan}
        if has_step:
            st = g["equivalent_step"].to_numpy(np.float64)
            st = st[np.isfinite(st)]
            row["median_step"] = float(np.median(st)) if len(st) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def storage_table(df: pd.DataFrame) -> list[dict]:
    """Audited samples per storage kind (column ``storage``: "png", "jpeg 4:2:0", ...; "" is
    counted as "unknown", e.g. an image that could not be read), most common first, with how many
    of each were scored and flagged. Empty when ``df`` has no storage column (older score files)."""
    if "storage" not in df.columns or df.empty:
        return []
    kind = df["storage"].fillna("").astype(str).replace("", "unknown")
    scored = np.isfinite(df["score"].to_numpy(np.float64))
    flagged = df["flagged"].to_numpy(bool) if "flagged" in df.columns else np.zeros(len(df), bool)
    rows = []
    first = list(dict.fromkeys(kind))  # kinds in order of first appearance
    counts = kind.value_counts()
    for k in sorted(first, key=lambda k: -counts[k]):  # most common first; ties keep that order
        m = (kind == k).to_numpy()
        n_scored, n_flagged = int((m & scored).sum()), int((m & flagged).sum())
        rows.append({"storage": str(k), "samples": int(m.sum()), "scored": n_scored,
                     "flagged": n_flagged, "fraction": n_flagged / n_scored if n_scored else math.nan})
    return rows


#: detectors whose noise detection is known to suffer from 4:2:0 chroma subsampling (MODEL_CARD.md)
CHROMA_SENSITIVE = ("cnn",)


def storage_note(table: list[dict], detector: str) -> str | None:
    """A caution when chroma-subsampled JPEGs are audited with a detector that sees less noise in
    them; None otherwise."""
    n = sum(r["scored"] for r in table)
    sub = sum(r["scored"] for r in table if r["storage"] in ("jpeg 4:2:0", "jpeg 4:2:2"))
    members = detector[len("ens:"):].split("+") if detector.startswith("ens:") else [detector]
    if not sub or not any(m.split(":")[0] in CHROMA_SENSITIVE for m in members):
        return None
    return (f"{sub} of {n} scored images are JPEGs with subsampled chroma (4:2:0 or 4:2:2), which "
            f"hides much of the colour of static noise: {detector} misses more noise damage in such "
            "files (MODEL_CARD.md, \"JPEG storage and chroma subsampling\"), so their flagged "
            "fraction may be an underestimate.")


@dataclass
class Comparison:
    """Where a compared detector disagrees with the main one on the images both could score.

    The compared detector's threshold is percentile-matched: it flags the same fraction of these
    images as the main detector does (ties at its threshold are kept, so it may flag fewer).
    """

    name: str
    version: str
    n_both: int
    threshold: float
    main_flagged: int
    other_flagged: int
    both_flagged: int
    #: boolean masks over the rows compared (True only where both scores are finite)
    main_only: np.ndarray
    other_only: np.ndarray
    agreement: float
    cohen_kappa: float
    spearman: float

    def as_dict(self) -> dict:
        return {"detector": self.name, "detector_version": self.version, "images_compared": self.n_both,
                "matched_threshold": _num(self.threshold),
                "threshold_rule": ("percentile-matched: flags the same fraction as the main detector, or "
                                   "fewer where its scores tie at the threshold (tied scores are kept)"),
                "main_flagged": self.main_flagged, "other_flagged": self.other_flagged,
                "both_flagged": self.both_flagged,
                "main_flags_other_calls_fine": int(self.main_only.sum()),
                "other_flags_main_calls_fine": int(self.other_only.sum()),
                "agreement": _num(self.agreement), "cohen_kappa": _num(self.cohen_kappa),
                "spearman": _num(self.spearman)}


def compare(main_scores, threshold: float, other_scores, name: str = "", version: str = "") -> Comparison:
    """Compare a detector's scores with the main detector's at a percentile-matched threshold."""
    a = np.asarray(main_scores, dtype=np.float64)
    b = np.asarray(other_scores, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"score arrays differ in length: {a.shape} vs {b.shape}")
    both = np.isfinite(a) & np.isfinite(b)
    n = int(both.sum())
    fa = is_dropped(a, threshold) & both
    if n == 0:
        z = np.zeros(a.shape, bool)
        return Comparison(name, version, 0, math.nan, 0, 0, 0, z, z.copy(), math.nan, math.nan, math.nan)
    if fa.sum() == n:  # every image flagged: a cut just below the lowest score flags them all
        t_other = float(np.nextafter(b[both].min(), -np.inf))
    else:
        t_other = threshold_for_drop_fraction(b[both], fa.sum() / n)
    fb = is_dropped(b, t_other) & both
    main_only, other_only = fa & ~fb, fb & ~fa
    agree = 1 - (main_only.sum() + other_only.sum()) / n
    pa, pb = fa.sum() / n, fb.sum() / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    kappa = (agree - pe) / (1 - pe) if pe < 1 else math.nan
    constant = n <= 2 or np.ptp(a[both]) == 0 or np.ptp(b[both]) == 0  # (a constant has no rank order)
    rho = math.nan if constant else float(sps.spearmanr(a[both], b[both]).statistic)
    return Comparison(name, version, n, float(t_other), int(fa.sum()), int(fb.sum()),
                      int((fa & fb).sum()), main_only, other_only, float(agree), float(kappa), rho)


def quantiles(values, qs=(0.1, 0.25, 0.5, 0.75, 0.9)) -> dict:
    """``{"p10": ..., ...}`` of the finite values (empty dict when there are none)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return {}
    return {f"p{round(q * 100)}": float(np.quantile(v, q)) for q in qs}


def format_step(value: float, max_step: float | None) -> str:
    """An equivalent step for people: "12.3", or ">= 20" where the calibration's map is clamped."""
    if max_step is not None and value >= max_step - 1e-9:
        return f">= {max_step:g}"
    return f"{value:.1f}"
