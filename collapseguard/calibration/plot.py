"""The picture beside a calibration: drop curve by step per family, clean vs degraded histograms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.calibration.thresholds import Calibration


def curve_title(cal: Calibration) -> str:
    """The drop curve's title: measured on held-out sources, or in-sample with ``--holdout 0``."""
    held_out = (cal.split or {}).get("holdout", 1) > 0
    return f"{cal.detector}: drop curve " + ("(holdout sources)" if held_out else "(in-sample: --holdout 0)")


def plot_calibration(cal: Calibration, table: pd.DataFrame | None, path: str | Path) -> Path:
    """Write a PNG: left, fraction dropped vs step per family (Clopper–Pearson band); right, score
    histograms of clean and degraded images (``table`` with a boolean ``clean`` column, or
    ``kind``/``step`` columns read with the calibration's clean steps) and the threshold."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=80)
    curve = pd.DataFrame(cal.drop_curve)
    if len(curve):
        for fam, g in curve.groupby("family", sort=True):
            g = g.sort_values("step")
            if g["step"].nunique() < 2:  # extra clean images: a single step-0 point, not a curve
                continue
            x = np.maximum(g["step"].to_numpy(), 0.5)  # log axis: step 0 drawn at 0.5
            if fam == "all":  # the confidence band only for the overall curve, to stay readable
                ax1.plot(x, g["fraction"], marker="o", ms=4, lw=2.5, color="black", label="all", zorder=5)
                ax1.fill_between(x, g["ci_low"], g["ci_high"], alpha=0.15, color="black",
                                 label="all: 95% CI" if cal.confidence == 0.95 else "all: CI")
            else:
                ax1.plot(x, g["fraction"], marker="o", ms=3, lw=1.2, label=fam)
        ax1.set_xscale("log")
        ax1.axhline(0.9, ls=":", color="grey")
        ax1.axhline(0.99, ls=":", color="grey")
    ax1.set_xlabel("replication step (0 drawn at 0.5)")
    ax1.set_ylabel("fraction dropped")
    ax1.set_ylim(-0.02, 1.02)
    ax1.set_title(curve_title(cal))
    if ax1.get_legend_handles_labels()[0]:  # no chain family in the holdout: nothing to label
        ax1.legend(fontsize=7, loc="upper left")
    else:
        ax1.text(0.5, 0.5, "no chains in the held-out sources", ha="center", va="center",
                 transform=ax1.transAxes, color="grey")
    if table is not None and len(table):
        s = table["score"].to_numpy(dtype=np.float64)
        clean = table["clean"].to_numpy(dtype=bool)
        ok = np.isfinite(s)
        lo, hi = np.nanpercentile(s[ok], [0.5, 99.5]) if ok.any() else (0, 1)
        lo, hi = min(lo, cal.threshold), max(hi, cal.threshold)
        if not hi - lo > 1e-9 * max(1.0, abs(lo)):  # every score equal: zero-width bins divide by zero
            lo, hi = lo - 0.5, hi + 0.5
        bins = np.linspace(lo, hi, 60)
        for sel, name in ((ok & clean, "clean"), (ok & ~clean, "degraded")):
            if sel.any():  # an empty histogram with density=True divides by zero
                ax2.hist(np.clip(s[sel], bins[0], bins[-1]), bins=bins, alpha=0.6, density=True, label=name)
    ax2.axvline(cal.threshold, color="red", label=f"threshold {cal.threshold:.4g}")
    ax2.set_xlabel("score (higher = more degraded)")
    rate = cal.alpha if cal.alpha is not None else cal.guaranteed_false_drop
    ax2.set_title(f"at most {rate:.3g} false drops, confidence {cal.confidence}, n_clean={cal.n_clean}"
                  if cal.is_calibrated and rate is not None and cal.confidence is not None else cal.label,
                  fontsize=9)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
