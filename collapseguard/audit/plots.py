"""Plots of the audit report, drawn with matplotlib's object API (no pyplot, no global backend)
and returned as PNG bytes to embed."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

KEPT = "#4c78a8"
FLAGGED = "#d6452c"


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _bins(values: np.ndarray, extra: float | None = None, n: int = 40) -> np.ndarray:
    lo, hi = float(values.min()), float(values.max())
    if extra is not None and np.isfinite(extra):
        lo, hi = min(lo, extra), max(hi, extra)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.02 * (hi - lo)
    return np.linspace(lo - pad, hi + pad, n + 1)


def score_histogram(scores, threshold: float, detector: str) -> bytes:
    """Histogram of finite scores, kept and flagged stacked, with the threshold as a dashed line."""
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    fig = Figure(figsize=(7.2, 3.0))
    ax = fig.add_subplot()
    if len(s):
        bins = _bins(s, threshold)
        ax.hist([s[s <= threshold], s[s > threshold]], bins=bins, stacked=True,
                color=[KEPT, FLAGGED], label=["kept", "flagged"])
        ax.axvline(threshold, color="black", linestyle="--", linewidth=1.2,
                   label=f"threshold {threshold:.4g}")
        ax.legend(frameon=False, fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)
    else:
        ax.text(0.5, 0.5, "no image could be scored", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(f"{detector} score (higher = more degraded)")
    ax.set_ylabel("images")
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def step_histogram(steps, flagged) -> bytes:
    """Histogram of estimated replication steps, kept and flagged stacked."""
    st = np.asarray(steps, dtype=np.float64)
    fl = np.asarray(flagged, dtype=bool)
    ok = np.isfinite(st)
    fig = Figure(figsize=(7.2, 2.8))
    ax = fig.add_subplot()
    if ok.any():
        v = st[ok]
        hi = max(1.0, float(np.ceil(v.max())))
        bins = np.linspace(0, hi, int(min(40, max(10, hi * 2))) + 1)
        ax.hist([st[ok & ~fl], st[ok & fl]], bins=bins, stacked=True, color=[KEPT, FLAGGED],
                label=["kept", "flagged"])
        ax.legend(frameon=False, fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2)
    ax.set_xlabel("estimated replication step (0 = looks like an original)")
    ax.set_ylabel("images")
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def compare_scatter(main, other, t_main: float, t_other: float, main_name: str, other_name: str) -> bytes:
    """Scores of two detectors against each other, coloured by who flags the image."""
    a = np.asarray(main, dtype=np.float64)
    b = np.asarray(other, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    fa, fb = a > t_main, b > t_other
    fig = Figure(figsize=(7.2, 4.0))
    ax = fig.add_subplot()
    groups = [(~fa & ~fb, "#9aa5b1", "both call it fine"), (fa & fb, "#7b3294", "both flag"),
              (fa & ~fb, FLAGGED, f"only {main_name} flags"), (~fa & fb, "#e69f00", f"only {other_name} flags")]
    for m, c, label in groups:
        if m.any():
            ax.scatter(a[m], b[m], s=22, color=c, label=f"{label} ({int(m.sum())})", alpha=0.8,
                       linewidths=0)
    if np.isfinite(t_main):
        ax.axvline(t_main, color="black", linestyle="--", linewidth=1)
    if np.isfinite(t_other):
        ax.axhline(t_other, color="black", linestyle=":", linewidth=1)
    ax.set_title("dashed: thresholds (the compared one percentile-matched)", fontsize=9, loc="left")
    ax.set_xlabel(f"{main_name} score")
    ax.set_ylabel(f"{other_name} score")
    if any(m.any() for m, _, _ in groups):
        ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    else:  # e.g. the compared detector failed on every image: say so instead of an empty legend
        ax.text(0.5, 0.5, "no image has both scores", transform=ax.transAxes, ha="center", va="center")
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)
