"""``collapseguard evaluate``: the Banana100 study's evaluation of detectors on replication chains."""

from __future__ import annotations

import os

import click

from collapseguard.commands._common import quiet_option
from collapseguard.detectors import DetectorError


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or any(v < 0 for v in out):
        raise click.BadParameter("expected one or more non-negative integers")
    if len(set(out)) != len(out):
        raise click.BadParameter(f"step given twice: {value}")
    return out


def _name_list(ctx, param, value):
    out = [v.strip() for v in str(value).split(",") if v.strip()]
    if not out:
        raise click.BadParameter("expected at least one detector name")
    if len(set(out)) != len(out):
        raise click.BadParameter(f"detector named twice: {out}")
    return out


@click.command()
@click.option("--chains", "chains", default=None, type=click.Path(exists=True),
              help="Chains: a manifest file, a chains folder or a Banana100 download (any layout "
              "`collapseguard chains ls` reads).")
@click.option("--from-scores", "from_scores", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Recompute the tables from an earlier run's scores.csv instead of scoring "
              "(no speed figures then; --detector, --chains ignored).")
@click.option("--detector", "-d", "--detectors", "detectors", default="cnn,nss", show_default=True, callback=_name_list,
              help="Comma-separated detector names, e.g. cnn,nss,pyiqa:piqe,pyiqa:niqe.")
@click.option("--out", "-o", "out", required=True, type=click.Path(file_okay=False),
              help="Output folder for results.md, chains.csv, scores.csv, auroc.csv, the per-storage and "
                   "per-kind tables (auroc_by_storage.csv, failures_by_storage.csv, drops.csv, "
                   "clean_drops.csv, auroc_by_kind.csv, failures_by_kind.csv), plot, summary.json.")
@click.option("--steps", default="5,10,20", show_default=True, callback=_int_list,
              help="Steps k of the gap Δ_k = (s_k − s_base)/scale; a chain passes when all are > 0.")
@click.option("--base-step", default=1, show_default=True, type=click.IntRange(min=0),
              help="Reference step of the gap (the study uses step 1).")
@click.option("--auroc-steps", default="2,3,5,10,20", show_default=True, callback=_int_list,
              help="Steps k for AUROC of clean (--clean-steps) vs step k; none may be a clean step.")
@click.option("--clean-steps", default="0,1", show_default=True, callback=_int_list,
              help="Steps counted as clean for AUROC (0 alone: originals vs step k).")
@click.option("--scale", "scale_method", type=click.Choice(["std", "iqr"]), default="std",
              show_default=True,
              help="Per-detector normaliser: population std or IQR/1.349 of its scores over the set.")
@click.option("--batch-size", default=16, show_default=True, type=click.IntRange(min=1),
              help="Images decoded and handed to every detector at a time.")
@click.option("--device", default=None, help="Torch device for detectors that use one (e.g. cuda).")
@click.option("--runtime", type=click.Choice(["auto", "torch", "onnx"]), default="auto", show_default=True,
              help="What runs the cnn detectors: onnxruntime on the CPU (auto: when installed and the "
                   "device is the CPU, as filter scores; the same scores within 1e-4) or torch. "
                   "The report names it beside the speed figures.")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1),
              help="Torch CPU threads.")
@click.option("--family", "families", multiple=True, help="Evaluate only this family (repeatable).")
@click.option("--max-chains-per-family", type=click.IntRange(min=1), default=None,
              help="Evaluate only the first N chains (by id) of each family.")
@click.option("--calibration", "calibration", default="default", show_default=True,
              help="Thresholds for the drop tables (clean images dropped per kind and storage, step-k "
                   "images dropped per storage and family): 'default' = each detector's shipped "
                   "calibration where one exists for its version, a calibration JSON (for a single "
                   "detector; with --from-scores, for the detector of the file it was made for), "
                   "or 'none'.")
@click.option("--no-plot", is_flag=True, help="Skip the PNG plot.")
@quiet_option("No progress on stderr.")
def evaluate(chains, from_scores, detectors, out, steps, base_step, auroc_steps, clean_steps, scale_method,
             batch_size, device, runtime,
             threads, families, max_chains_per_family, calibration, no_plot, quiet):
    """Score replication chains with each detector and apply the study's criterion.

    For every detector and chain: Δ_k = (s_k − s_base)/scale at each --steps k (scores oriented
    higher = more degraded; scale = that detector's spread over the evaluated set, see --scale). A
    chain passes when every Δ_k > 0; the failure count per detector is the study's criterion.
    Chains missing a needed step are skipped with a note; a NaN score is a failure with a reason.
    Also: AUROC of clean (steps 0, 1) vs step k per family and overall, Spearman ρ of score with
    step per chain, and images/s of each detector measured in this run (scoring time only, decode
    excluded; the cnn on onnxruntime by default, as filter scores it: --runtime). Every table is also split by storage (the manifest's `storage` column, as `chains
    store` writes it, else the file header: png, jpeg q90 4:2:0, webp ...) and, when the manifest
    has a `kind` column, by the kind of each chain's source; with a threshold (--calibration), the
    share of clean images dropped per kind and storage and of step-k images per storage and family. Detectors such as pyiqa:* and vlm:* may need optional extras (see `detectors`).
    """
    from collapseguard.detectors.cnn_family import set_default_runtime
    from collapseguard.evaluation import report, run_evaluation
    from collapseguard.scoring.progress import PhaseBars
    progress = PhaseBars("evaluate: score", quiet)
    click.get_current_context().call_on_close(set_default_runtime(runtime))

    earlier = [k for k in steps if k < base_step]
    if earlier:  # Δk = score(k) - score(base) would pass a chain whose score fell with damage
        raise click.BadParameter(f"--steps {','.join(map(str, earlier))} lie before the base step "
                                 f"{base_step}: the criterion compares later steps with it",
                                 param_hint="--steps")
    if base_step in steps:  # Δ at the base step is 0 by definition: every chain would fail
        raise click.BadParameter(f"--steps must not include the base step {base_step}",
                                 param_hint="--steps")
    both = sorted(set(auroc_steps) & set(clean_steps))
    if both:  # an image on both sides of the AUROC: its column would mean nothing
        raise click.BadParameter(f"step(s) {','.join(map(str, both))} also in --clean-steps "
                                 f"{','.join(map(str, clean_steps))}; give --auroc-steps without them",
                                 param_hint="--auroc-steps")
    kw = {"scale_method": scale_method, "delta_steps": steps, "base_step": base_step,
          "auroc_steps": auroc_steps, "clean_steps": clean_steps}
    if calibration not in ("default", "none") and len(detectors) > 1 and not from_scores:
        raise click.BadParameter("a calibration file is for one detector; give one --detector name "
                                 "or --calibration default", param_hint="--calibration")
    if from_scores:
        from click.core import ParameterSource
        ctx = click.get_current_context()
        unused = [flag for flag, name in (("--detector", "detectors"), ("--chains", "chains"))
                  if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE]
        if unused:  # said, not silently dropped: the tables are every detector's of the file
            click.echo(f"note: {' and '.join(unused)} not used with --from-scores: the tables are "
                       f"those of every detector in {from_scores}", err=True)
        ev = _from_scores(from_scores, calibration=calibration, **kw)
    elif not chains:
        raise click.UsageError("give --chains (or --from-scores)")
    else:
        try:
            ev = run_evaluation(chains, detectors, batch_size=batch_size, device=device,
                                threads=threads, progress=progress, families=families or None,
                                max_chains_per_family=max_chains_per_family,
                                threshold_of=_threshold_finder(calibration), **kw)
        except (DetectorError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            progress.close()
    paths = report.write_outputs(ev, out, plot=not no_plot)
    if not no_plot and "plot" not in paths:
        click.echo("no plot: drawing it needs matplotlib: pip install 'collapseguard[plots]'", err=True)
    for warning in ev.warnings:
        click.echo(f"warning: {warning}", err=True)
    speed = {t.detector: t.images_per_s for t in ev.timings if t.images}
    for _, r in ev.failures.iterrows():
        rate = f", {speed[r['detector']]:.1f} images/s" if r["detector"] in speed else ""
        click.echo(f"{r['detector']}: failed {r['failed']} of {r['evaluated']} chains "
                   f"({r['skipped']} skipped){rate}")
    if len(ev.failures) and int(ev.failures["evaluated"].sum()) == 0:
        raise click.ClickException(
            f"no chain could be evaluated: every chain lacks step {base_step} or one of the steps "
            f"{','.join(map(str, steps))} (see the skipped counts; pass --steps the chains have; "
            f"the scores are in {os.path.join(out, 'scores.csv')})")
    click.echo(f"wrote {', '.join(p.name for p in paths.values())} to {out}")


def _threshold_finder(calibration: str):
    """detector -> (threshold, description) or None, for --calibration default | none | PATH."""
    from collapseguard.calibration.thresholds import (
        CalibrationError,
        CalibrationMismatch,
        default_calibration,
        load_calibration,
        resolve_threshold,
    )

    def find(det):
        if calibration == "none":
            return None
        if calibration == "default":
            cal = default_calibration(det.name, str(det.version))
            if cal is None:
                return None
            return cal.threshold, f"shipped calibration: {cal.describe()}"
        try:
            thr, desc, _ = resolve_threshold(det, calibration=calibration)
        except CalibrationMismatch:  # evaluate has no --threshold: say what it does take
            cal = load_calibration(calibration)
            raise click.ClickException(
                f"--calibration {calibration} was made for detector {cal.detector}@{cal.detector_version}, "
                f"not {det.name}@{det.version}; calibrate this detector (`collapseguard calibrate "
                f"--detector {det.name} ...`) or pass --calibration default or none") from None
        except (OSError, CalibrationError) as exc:
            raise click.ClickException(f"--calibration {calibration}: {exc}") from None
        return thr, desc
    return find


def _from_scores(path, calibration: str = "none", **kw):
    """An Evaluation recomputed from an earlier run's scores.csv (no timings)."""
    import pandas as pd

    from collapseguard.evaluation import evaluate_scores
    from collapseguard.evaluation.report import read_scores_csv

    try:
        df = read_scores_csv(path)
        thresholds = _thresholds_of_scores(df, calibration)
        ev = evaluate_scores(df, source=str(path), thresholds=thresholds, **kw)
    except (KeyError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise click.ClickException(f"{path}: not a scores.csv written by `evaluate` "
                                   f"({str(exc).strip()})") from None
    ev.notes.append("tables recomputed from a scores file: no speed measured in this run")
    ev.device = "none"
    return ev


class _Named:
    """A detector's name and version, as a scores file records them (for the calibration check)."""

    def __init__(self, name: str, version: str):
        self.name, self.version = name, version


def _thresholds_of_scores(df, calibration: str) -> dict:
    """Thresholds for the detectors of a scores file (``detector`` and ``version`` columns)."""
    if calibration == "none" or "version" not in df.columns:
        return {}
    pairs = list(df[["detector", "version"]].drop_duplicates().astype(str).itertuples(index=False))
    if calibration != "default" and len(pairs) > 1:
        # a calibration file is for one detector: it gives that detector of the file its
        # threshold and leaves the others without one; matching none, the first one's mismatch
        # says why
        from collapseguard.calibration.thresholds import (
            CalibrationError,
            load_calibration,
        )
        try:
            named = load_calibration(calibration).detector
        except (OSError, CalibrationError) as exc:
            raise click.ClickException(f"--calibration {calibration}: {exc}") from None
        pairs = [p for p in pairs if p[0] == named] or pairs[:1]
    find = _threshold_finder(calibration)
    out = {}
    for name, version in pairs:
        found = find(_Named(name, version))
        if found is not None:
            out[name] = found
    return out
