"""Writing an evaluation: results.md, chains.csv, scores.csv, mean_score_vs_step.png, summary.json."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.evaluation.metrics import ALL_FAMILIES, overall_label
from collapseguard.io.csv_cells import csv_cell, csv_uncell
from collapseguard.io.markdown import md_cell, md_code, md_text
from collapseguard.io.strict_json import json_ready

#: distinct error texts listed per detector under "Scoring errors" (a judge's reasons can differ
#: for every image; scores.csv holds them all)
ERRORS_LISTED = 10


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, str):
        return md_cell(v)
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    try:
        f = float(v)
    except (TypeError, ValueError):
        return md_cell(str(v))
    if not math.isfinite(f):
        return "—"
    return f"{f:.{digits}f}"


def _to_csv(df: pd.DataFrame, path: Path) -> None:
    """``df`` as CSV with its text cells passed through ``csv_cell`` (chain and family names come
    from folder names, which may start with ``=``)."""
    text = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])]
    df.assign(**{c: df[c].map(csv_cell) for c in text}).to_csv(path, index=False)


#: columns of a scores.csv read as text, whatever they spell: a chain, family or kind called "NA"
#: or "null" is no missing value (pandas' default reading would make it NaN and drop its rows)
TEXT_COLUMNS = ("chain_id", "source_image", "family", "task", "path", "storage", "source_kind",
                "detector", "detector_version", "version", "error")


def read_scores_csv(path: str | Path) -> pd.DataFrame:
    """A scores.csv that ``evaluate`` wrote, with the values it was given (``csv_uncell``).
    ValueError (or a pandas parser error) for a file that is none or has no rows."""
    df = pd.read_csv(path, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False,
                     na_values={c: [""] for c in ("step", "score")})
    for c in [c for c in df.columns if pd.api.types.is_string_dtype(df[c])]:
        quoted = df[c].str.startswith("'", na=False)  # csv_cell's leading '
        df.loc[quoted, c] = df.loc[quoted, c].map(csv_uncell)
    if df.empty:
        raise ValueError("no score rows")
    return df


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


def _plain(text) -> str:
    """A name as matplotlib text shown as written (``$...$`` would be parsed as mathtext)."""
    return str(text).replace("$", "\\$")


def _legend_lines(axes) -> dict:
    """label -> line over every panel (a detector may have finite scores in some families only)."""
    lines: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            lines.setdefault(label, handle)
    return lines


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
                ax.plot(m.index, m.values, marker="o", ms=3, label=_plain(det))
        ax.set_title(_plain(fam))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        steps = sorted(int(v) for v in g["step"].unique())
        if len(steps) > 1 and steps[-1] >= 10:
            ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(steps, [str(v) for v in steps])
        ax.minorticks_off()
        if not ax.lines:  # every image of the family failed to decode or to score
            ax.text(0.5, 0.5, "no finite score", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(families):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("mean score (z, per detector)")
    lines = _legend_lines(axes.flat)
    if lines:
        fig.legend(list(lines.values()), list(lines), loc="upper center", ncol=min(len(lines), 6),
                   frameon=False)
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
    return [json_ready(r) for r in df.to_dict("records")]


def results_markdown(ev) -> str:
    """The human-readable report of an Evaluation (see ``collapseguard.evaluation.run``)."""
    ks = ev.delta_steps
    out = ["# collapseguard evaluate", ""]
    out.append(f"- chains: {md_code(ev.source)} — {ev.n_chains} chains, {ev.n_images} images, "
               f"families: {', '.join(_fmt(f) for f in ev.families)}; steps present: "
               f"{', '.join(str(s) for s in ev.steps_present)}")
    out.append(f"- criterion (Banana100 study): Δ_k = (s_k − s_{ev.base_step}) / scale for k = "
               f"{', '.join(map(str, ks))}, scores oriented higher = more degraded; a chain **passes** "
               "when every Δ_k > 0 (a tie fails); a NaN score at one of those steps is a failure; a chain "
               "missing one of those steps is skipped.")
    out.append("- scale per detector (over every finite score of that detector in this run):")
    for det, sc in ev.scales.items():
        out.append(f"  - {md_code(det)}: {sc.describe()}")
    if ev.timings:
        out.append("- speed: images/s counts time inside `Detector.score` only (decode excluded, one "
                   f"untimed warm-up image per detector), batch size {ev.batch_size}, "
                   f"{ev.threads or 'default'} thread(s), device {ev.device}"
                   + "".join(f", {md_code(d)} on {r}" for d, r in ev.runtimes.items() if r)
                   + f"; decode took {ev.decode_seconds:.1f} s for {ev.n_images} images.")
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
    out += breakdown_markdown(ev)
    skipped = ev.per_chain[ev.per_chain["status"] == "skipped"]
    if len(skipped):
        out += ["", "## Skipped chains", ""]
        n_det = ev.scores["detector"].nunique()
        for (chain, reason), g in skipped.groupby(["chain_id", "reason"], sort=True):
            who = "all detectors" if len(g) == n_det else ", ".join(g["detector"])
            out.append(f"- {md_code(chain)}: {reason} ({md_text(who)})")
    nan_fail = ev.per_chain[ev.per_chain["reason"].str.startswith("NaN")]
    if len(nan_fail):
        out += ["", "## Failures caused by NaN scores", ""]
        for _, r in nan_fail.iterrows():
            out.append(f"- {md_code(r['detector'])} on {md_code(r['chain_id'])}: {r['reason']}")
    errs = ev.scores[ev.scores["error"].astype(str) != ""]
    if len(errs):
        out += ["", "## Scoring errors", ""]
        for det, g in errs.groupby("detector", sort=True):
            counts = g["error"].astype(str).value_counts(sort=True)  # most frequent first
            for err, k in counts.head(ERRORS_LISTED).items():
                out.append(f"- {md_code(det)}: {k} image(s): {md_code(err)}")
            rest = counts.iloc[ERRORS_LISTED:]
            if len(rest):
                out.append(f"- {md_code(det)}: {int(rest.sum())} image(s) with {len(rest)} other "
                           "error text(s) (each image's is in scores.csv)")
    if ev.notes:
        out += ["", "## Notes", ""]
    for note in ev.notes:
        out.append(f"- note: {md_text(note)}")
    return "\n".join(out) + "\n"


def breakdown_markdown(ev) -> list[str]:
    """The sections by storage, by clean kind and, with thresholds, the drop rates."""
    out = []
    kcols = [f"k{k}" for k in ev.auroc_steps]
    heads = [f"vs {k}" for k in ev.auroc_steps]
    if len(ev.auroc_by_storage):
        out += ["", "## By storage (the manifest's `storage` column, else the file header)", "",
                "### AUROC: clean vs step k per storage and family", ""]
        out.append(markdown_table(ev.auroc_by_storage, ["detector", "storage", "family", "n_clean", *kcols],
                                  ["detector", "storage", "family", "clean images", *heads]))
        out += ["", "### The study's criterion per storage and family", ""]
        out.append(markdown_table(ev.failures_by_storage,
                                  ["detector", "storage", "family", "evaluated", "failed", "passed", "pass_rate"]))
    if ev.has_kinds and len(ev.auroc_by_kind):
        out += ["", "## By clean kind (the manifest's `kind` column: the kind of each chain's source)", "",
                "### AUROC: clean vs step k per kind, every family and storage", ""]
        out.append(markdown_table(ev.auroc_by_kind, ["detector", "source_kind", "n_clean", *kcols],
                                  ["detector", "kind", "clean images", *heads]))
        fk = ev.failures_by_kind
        fk = fk[fk["family"] == overall_label(ev.families)]
        out += ["", "### The study's criterion per kind, every family and storage", ""]
        out.append(markdown_table(fk, ["detector", "source_kind", "evaluated", "failed", "passed", "pass_rate"],
                                  ["detector", "kind", "evaluated", "failed", "passed", "pass rate"]))
    if ev.thresholds:
        out += ["", "## Drops at a threshold (score > threshold is dropped, as `filter` does)", ""]
        for det, (thr, desc) in ev.thresholds.items():
            out.append(f"- {md_code(det)}: {md_text(desc)}")
        cd = ev.clean_drops
        out += ["", "### Clean images dropped (step 0, one per source and storage), per kind and storage", ""]
        out.append(markdown_table(cd, ["detector", "source_kind", "storage", "n", "dropped", "fraction", "max_score"],
                                  ["detector", "kind", "storage", "images", "dropped", "share dropped",
                                   "highest score"]))
        d = ev.drops
        steps = [k for k in sorted(d["step"].unique()) if k > 0] if len(d) else []
        if steps:
            # dropna=False and the reindex keep a family or step none of whose images were scored
            wide = d[d["step"] > 0].pivot_table(index=["detector", "storage", "family"], columns="step",
                                                values="fraction", aggfunc="first", dropna=False)
            wide = wide.reindex(columns=steps).reset_index()
            wide.columns = [c if isinstance(c, str) else f"s{c}" for c in wide.columns]
            out += ["", "### Share of step-k images dropped, per storage and family", ""]
            out.append(markdown_table(wide, ["detector", "storage", "family", *[f"s{k}" for k in steps]],
                                      ["detector", "storage", "family", *[f"step {k}" for k in steps]]))
    return out


def plots_available() -> bool:
    """Is matplotlib (the ``[plots]`` extra) installed? Without it the figure is left out."""
    return importlib.util.find_spec("matplotlib") is not None


def write_outputs(ev, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    """Write every output file of an Evaluation into ``out_dir``; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    paths["scores"] = out / "scores.csv"
    _to_csv(ev.scores, paths["scores"])
    paths["chains"] = out / "chains.csv"
    _to_csv(ev.per_chain, paths["chains"])
    paths["auroc"] = out / "auroc.csv"
    _to_csv(ev.auroc, paths["auroc"])
    tables = {"auroc_by_storage": ev.auroc_by_storage, "failures_by_storage": ev.failures_by_storage,
              "auroc_by_kind": ev.auroc_by_kind, "failures_by_kind": ev.failures_by_kind,
              "drops": ev.drops, "clean_drops": ev.clean_drops}
    for name, table in tables.items():
        if len(table) and (ev.has_kinds or "kind" not in name) and (ev.thresholds or "drops" not in name):
            paths[name] = out / f"{name}.csv"
            _to_csv(table, paths[name])
        else:  # an earlier run's table would sit beside results that do not show it
            (out / f"{name}.csv").unlink(missing_ok=True)
    if plot and plots_available():
        paths["plot"] = plot_mean_score_vs_step(ev.scores, out / "mean_score_vs_step.png")
    else:  # an earlier run's plot would sit beside tables it does not show
        (out / "mean_score_vs_step.png").unlink(missing_ok=True)
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
        "by_storage": {"auroc": _records(ev.auroc_by_storage), "failures": _records(ev.failures_by_storage)},
        "by_kind": ({"auroc": _records(ev.auroc_by_kind), "failures": _records(ev.failures_by_kind)}
                    if ev.has_kinds else None),
        "thresholds": {d: {"threshold": t, "from": desc} for d, (t, desc) in ev.thresholds.items()},
        "drops": _records(ev.drops) if ev.thresholds else [],
        "clean_drops": _records(ev.clean_drops) if ev.thresholds else [],
        "detectors": {t.detector: t.version for t in ev.timings},
        "notes": list(ev.notes),
        "files": {k: v.name for k, v in paths.items()},
    }
    paths["summary"] = out / "summary.json"
    _atomic_write(paths["summary"], json.dumps(summary, indent=2, allow_nan=False))
    return paths


__all__ = ["ALL_FAMILIES", "markdown_table", "plot_mean_score_vs_step", "results_markdown",
           "write_outputs", "zscore_by_detector"]
