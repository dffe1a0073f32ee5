"""Writing an evaluation: results.md, chains.csv, scores.csv, mean_score_vs_step.png, summary.json."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.evaluation.metrics import ALL_FAMILIES


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, str):
        return v.replace("|", "\\|")
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v).replace("|", "\\|")
    if not math.isfinite(f):
        return "—"
    return f"{f:.{digits}f}"


def markdown_table(df: pd.DataFrame, columns: Sequence[str], headers: Sequence[str] | None = None,
                   digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table of ``columns`` (NaN shown as —)."""
    headers = list(headers or columns)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_fmt(r[c], digits) for c in columns) + " |")
    return "\n".join(lines)


def zscore_by_detector(scores: pd.DataFrame) -> pd.Series:
    """Each detector's scores as z-scores over its own finite scores (for plotting side by side)."""
    out = pd.Series(np.nan, index=scores.index, dtype=np.float64)
    for _, g in scores.groupby("detector", sort=False):
        v = g["score"].to_numpy(np.float64)
        fin = v[np.isfinite(v)]
        sd = float(fin.std()) if fin.size else 0.0
        mu = float(fin.mean()) if fin.size else 0.0
        out.loc[g.index] = (v - mu) / sd if sd > 0 else v - mu
    return out


def plot_mean_score_vs_step(scores: pd.DataFrame, path: str | Path) -> Path:
    """One panel per family: mean z-scored score against step, one line per detector."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    df = scores.assign(z=zscore_by_detector(scores))
    families = sorted(df["family"].unique())
    detectors = list(dict.fromkeys(df["detector"]))
    ncols = min(3, len(families))
    nrows = math.ceil(len(families) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), squeeze=False,
                             sharey=True)
    for ax, fam in zip(axes.flat, families):
        g = df[df["family"] == fam]
        for det in detectors:
            m = g[g["detector"] == det].groupby("step")["z"].mean().dropna()
            if len(m):
                ax.plot(m.index, m.values, marker="o", ms=3, label=det)
        ax.set_title(fam)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        steps = sorted(int(v) for v in g["step"].unique())
        if len(steps) > 1 and steps[-1] >= 10:
            ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(steps, [str(v) for v in steps])
        ax.minorticks_off()
    for ax in list(axes.flat)[len(families):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("mean score (z, per detector)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _records(df: pd.DataFrame) -> list[dict]:
    def clean(v):
        if isinstance(v, (np.integer,)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            return float(v) if math.isfinite(v) else None
        if isinstance(v, (np.bool_,)):
            return bool(v)
        return v

    return [{k: clean(v) for k, v in r.items()} for r in df.to_dict("records")]


def results_markdown(ev) -> str:
    """The human-readable report of an Evaluation (see ``collapseguard.evaluation.run``)."""
    ks = ev.delta_steps
    out = ["# collapseguard evaluate", ""]
    out.append(f"- chains: `{ev.source}` — {ev.n_chains} chains, {ev.n_images} images, "
               f"families: {', '.join(ev.families)}; steps present: "
               f"{', '.join(str(s) for s in ev.steps_present)}")
    out.append(f"- criterion (Banana100 study): Δ_k = (s_k − s_{ev.base_step}) / scale for k = "
               f"{', '.join(map(str, ks))}, scores oriented higher = more degraded; a chain **passes** "
               "when every Δ_k > 0 (a tie fails); a NaN score at one of those steps is a failure; a chain "
               "missing one of those steps is skipped.")
    out.append("- scale per detector (over every finite score of that detector in this run):")
    for det, sc in ev.scales.items():
        out.append(f"  - `{det}`: {sc.describe()}")
    if ev.timings:
        out.append("- speed: images/s counts time inside `Detector.score` only (decode excluded, one "
                   f"untimed warm-up image per detector), batch size {ev.batch_size}, "
                   f"{ev.threads or 'default'} torch thread(s), device {ev.device}; decode took "
                   f"{ev.decode_seconds:.1f} s for {ev.n_images} images.")
    else:
        out.append("- speed: not measured in this run.")
    out += ["", "## Failures per detector (the study's criterion)", ""]
    speed = {t.detector: t.images_per_s for t in ev.timings}
    f = ev.failures.assign(images_per_s=[_fmt(speed.get(d), 1) for d in ev.failures["detector"]])
    dcols = [f"median_delta_{k}" for k in ks]
    out.append(markdown_table(
        f, ["detector", "evaluated", "failed", "passed", "skipped", "fail_nan", "pass_rate", *dcols,
            "images_per_s"],
        ["detector", "chains evaluated", "failed", "passed", "skipped", "failed (NaN)", "pass rate",
         *[f"median Δ{k}" for k in ks], "images/s"]))
    out += ["", "### Failures per detector and family", ""]
    out.append(markdown_table(ev.failures_by_family,
                              ["detector", "family", "evaluated", "failed", "passed", "skipped"]))
    out += ["", "## AUROC: clean (steps " + ", ".join(map(str, ev.clean_steps)) + ") vs step k", ""]
    kcols = [f"k{k}" for k in ev.auroc_steps]
    out.append(markdown_table(ev.auroc, ["detector", "family", "n_clean", *kcols],
                              ["detector", "family", "clean images", *[f"vs {k}" for k in ev.auroc_steps]]))
    out += ["", "## Spearman ρ of score with step, per chain", ""]
    out.append(markdown_table(ev.spearman, ["detector", "family", "chains", "mean", "median"]))
    skipped = ev.per_chain[ev.per_chain["status"] == "skipped"]
    if len(skipped):
        out += ["", "## Skipped chains", ""]
        n_det = ev.scores["detector"].nunique()
        for (chain, reason), g in skipped.groupby(["chain_id", "reason"], sort=True):
            who = "all detectors" if len(g) == n_det else ", ".join(g["detector"])
            out.append(f"- `{chain}`: {reason} ({who})")
    nan_fail = ev.per_chain[ev.per_chain["reason"].str.startswith("NaN")]
    if len(nan_fail):
        out += ["", "## Failures caused by NaN scores", ""]
        for _, r in nan_fail.iterrows():
            out.append(f"- `{r['detector']}` on `{r['chain_id']}`: {r['reason']}")
    errs = ev.scores[ev.scores["error"].astype(str) != ""]
    if len(errs):
        out += ["", "## Scoring errors", ""]
        for (det, err), g in errs.groupby(["detector", "error"], sort=True):
            out.append(f"- `{det}`: {len(g)} image(s): {err}")
    for note in ev.notes:
        out.append(f"- note: {note}")
    return "\n".join(out) + "\n"


def write_outputs(ev, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    """Write every output file of an Evaluation into ``out_dir``; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    paths["scores"] = out / "scores.csv"
    ev.scores.to_csv(paths["scores"], index=False)
    paths["chains"] = out / "chains.csv"
    ev.per_chain.to_csv(paths["chains"], index=False)
    paths["auroc"] = out / "auroc.csv"
    ev.auroc.to_csv(paths["auroc"], index=False)
    if plot:
        paths["plot"] = plot_mean_score_vs_step(ev.scores, out / "mean_score_vs_step.png")
    paths["results"] = out / "results.md"
    _atomic_write(paths["results"], results_markdown(ev))
    summary = {
        "source": ev.source,
        "chains": ev.n_chains,
        "images": ev.n_images,
        "families": list(ev.families),
        "steps_present": list(ev.steps_present),
        "criterion": {"base_step": ev.base_step, "delta_steps": list(ev.delta_steps),
                      "pass": "all delta_k > 0", "nan": "failure", "missing_step": "skipped"},
        "scale": {d: {"method": s.method, "value": s.value, "n": s.n, "degenerate": s.degenerate,
                      "description": s.describe()} for d, s in ev.scales.items()},
        "speed": {"measures": "seconds inside Detector.score; decode excluded; one untimed warm-up image",
                  "batch_size": ev.batch_size, "threads": ev.threads, "device": ev.device,
                  "decode_seconds": ev.decode_seconds,
                  "detectors": [t.as_dict() for t in ev.timings]},
        "failures": _records(ev.failures),
        "failures_by_family": _records(ev.failures_by_family),
        "auroc": {"clean_steps": list(ev.clean_steps), "steps": list(ev.auroc_steps),
                  "table": _records(ev.auroc)},
        "spearman": _records(ev.spearman),
        "detectors": {t.detector: t.version for t in ev.timings},
        "notes": list(ev.notes),
        "files": {k: v.name for k, v in paths.items()},
    }
    paths["summary"] = out / "summary.json"
    _atomic_write(paths["summary"], json.dumps(summary, indent=2, allow_nan=False))
    return paths


__all__ = ["ALL_FAMILIES", "markdown_table", "plot_mean_score_vs_step", "results_markdown",
           "write_outputs", "zscore_by_detector"]
