"""``collapseguard calibrate``: a threshold with a stated false-drop guarantee, from replication chains."""

from __future__ import annotations

import importlib.util
import re
import tarfile
from pathlib import Path

import click

from collapseguard.commands._common import (
    FiniteFloatRange,
    RecordsArgs,
    check_out_file,
    command_line,
    quiet_option,
)
from collapseguard.io.terminal import first_of, percent, printable

#: ``--clean KIND=LOCATION``: a kind is a short plain name
_KIND = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,63})=(.+)")


def _locations(values) -> tuple:
    """--clean values as ``(kind, location)``: ``KIND=LOCATION`` names the clean kind (``""``
    without one); local paths must exist, URLs (``pipe:``, ``s3://``, ...) are checked when read.
    A value that is an existing path is a path, even with a ``=`` in it."""
    from collapseguard.io.urls import is_remote, local_path
    out = []
    for v in values:
        kind, loc = "", v
        m = _KIND.fullmatch(v)
        if m and not Path(local_path(v) or v).exists():
            kind, loc = m.group(1), m.group(2)
        if is_remote(loc):
            out.append((kind, loc))
            continue
        p = Path(local_path(loc) or loc)
        if not p.exists():
            raise click.BadParameter(f"{loc}: no such file or folder", param_hint="'--clean'")
        out.append((kind, p))
    return tuple(out)


def _steps(text: str) -> list[int]:
    try:
        steps = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise click.BadParameter(f"expected comma-separated step numbers, got {text!r}") from None
    if not steps or steps[0] < 0:
        raise click.BadParameter("clean steps must be non-negative integers")
    return steps


@click.command(cls=RecordsArgs)
@click.option("--chains", "chains_dir", type=click.Path(exists=True, path_type=Path),
              help="Chains: a manifest file, a chains folder or a Banana100 download (any layout "
              "`collapseguard chains ls` reads).")
@click.option("--detector", "-d", "detector_name", default=None,
              help="Detector name (default: the package default, cnn).")
@click.option("--max-false-drop", "alpha", type=float, default=0.01, show_default=True,
              help="alpha: the largest acceptable fraction of clean images dropped.")
@click.option("--confidence", type=float, default=0.95, show_default=True,
              help="1 - delta: probability that the false-drop rate really is at most alpha.")
@click.option("--clean-steps", default="0", show_default=True,
              help="Chain steps counted as clean (target 'step'), e.g. 0 or 0,1.")
@click.option("--clean", "clean_dirs", multiple=True, callback=lambda c, p, v: _locations(v),
              help="Extra clean images: a folder (recursive), a shard or a URL of either; repeat for more. "
                   "KIND=LOCATION names their kind (e.g. screenshots=shots/), reported per kind and "
                   "used by --per-kind. Files named NAME__x.png are variants of one picture NAME: "
                   "they stay on one side of the split and give the bound one score, their highest.")
@click.option("--per-kind", is_flag=True,
              help="Guarantee --max-false-drop for each clean kind (the chains manifest's `kind` "
                   "column and --clean KIND=...), jointly at --confidence, instead of for the pooled "
                   "clean images. Needs enough clean images of every kind in the threshold part: at 1% "
                   "and 95%, 299 for one kind, 368 each for two, 459 each for five.")
@click.option("--target", default="step", show_default=True,
              help="Truth of degradation: 'step', or 'fr:ssim' / 'fr:ssim<0.85' / 'fr:psnr<30' "
                   "(full-reference similarity to the chain's step-0 image below the level; "
                   "defaults SSIM 0.90, PSNR 30 dB; 'fr:ssim:0.85' avoids shell quoting).")
@click.option("--holdout", type=FiniteFloatRange(0, 1, max_open=True), default=0.3, show_default=True,
              help="Share of source images held out for the drop curve (split by source image).")
@click.option("--out", "-o", "out", type=click.Path(path_type=Path), required=True,
              help="Calibration JSON to write; a PNG plot is written beside it.")
@click.option("--scores-out", type=click.Path(path_type=Path), default=None,
              help="Also write the per-image scores table (CSV), reusable with --from-scores.")
@click.option("--from-scores", type=click.Path(exists=True, path_type=Path), default=None,
              help="Reuse a scores CSV (from --scores-out) instead of scoring images again.")
@click.option("--describe-clean", "describe_clean", multiple=True,
              help="Free text recorded in the file's clean_sources (what the clean images are); repeatable.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Images per detector call.")
@click.option("--device", default=None, help="torch device for the detector (e.g. cuda).")
@click.option("--no-plot", is_flag=True, help="Do not write the PNG plot.")
@quiet_option()
def calibrate(chains_dir, detector_name, alpha, confidence, clean_steps, clean_dirs, per_kind, target,
              holdout, out, scores_out, from_scores, describe_clean, batch_size, device, no_plot, quiet):
    """Calibrate a detector's threshold against replication chains.

    The threshold is the k-th largest clean score, with k chosen so that the fraction of clean
    images dropped (score > threshold) exceeds --max-false-drop with probability at most
    1 - --confidence (binomial order-statistic bound). The guarantee holds for clean images like
    the calibration's clean set; include clean images like your data with --clean. The file also
    holds the per-step drop curve with confidence intervals, and monotone maps score ->
    P(degraded) and score -> equivalent replication step. Use it with
    `collapseguard filter --calibration FILE`. The held-out drop rates are also given per storage
    (the chains manifest's `storage` column, as `chains store` writes it, else the file header) and,
    when the manifest has a `kind` column or --clean names kinds, per kind of clean source.

    A pooled guarantee speaks for the mix: a kind that is a small part of the clean images can
    lose far more than --max-false-drop of its images. --per-kind gives each kind its own
    guarantee (each kind's order-statistic threshold at confidence 1 - delta/G over G kinds; the
    largest is used), at the price of a higher threshold.
    """
    from collapseguard.calibration.build import (
        bound_count_text,
        breakdown_text,
        build_calibration,
        curve_table,
        first_steps_text,
        label_clean,
        per_kind_text,
        top_clean_text,
    )
    from collapseguard.calibration.scoring import (
        parse_target,
        read_scores,
        save_scores,
        score_table,
    )
    from collapseguard.calibration.thresholds import save_calibration

    steps = _steps(clean_steps)
    try:
        parse_target(target)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--target") from None
    if not 0 < alpha < 1 or not 0 < confidence < 1:
        raise click.BadParameter("--max-false-drop and --confidence must be in (0, 1)")
    check_out_file(out)  # before scoring anything
    if scores_out is not None:
        check_out_file(scores_out, "--scores-out")
        if Path(scores_out).resolve() == Path(out).resolve():
            raise click.UsageError("--scores-out and --out must be different files")
    # the plot goes beside --out, never over it or over the scores table (e.g. --out cal.png)
    png_out = Path(out).with_suffix(".png")
    if png_out.resolve() in {Path(p).resolve() for p in (out, scores_out) if p is not None}:
        png_out = Path(out).with_name(Path(out).name + ".plot.png")
    if not no_plot:
        check_out_file(png_out, "the plot")  # a folder there failed after the calibration was written
    if from_scores is not None and scores_out is not None:
        raise click.UsageError("--scores-out writes the scores this run computes; with --from-scores "
                               "it computes none (copy the table instead)")
    sources, warnings = [], []
    if from_scores is not None:
        if chains_dir is not None or clean_dirs:
            raise click.UsageError("--from-scores replaces --chains/--clean; give one or the other")
        try:
            table, det_name, det_version = read_scores(from_scores)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        if detector_name is not None and detector_name != det_name:
            _same_detector_or_fail(detector_name, det_name, det_version, from_scores)
        sources.append(f"scores table {from_scores}")
        sources += _clean_folders_of(table)
    else:
        if chains_dir is None and not clean_dirs:
            raise click.UsageError("give --chains DIR, --clean DIR (repeatable) or both, or --from-scores")
        from collapseguard.detectors import DEFAULT_DETECTOR, create
        from collapseguard.training_data_tools.loaders import load_chains

        manifest = load_chains(chains_dir, notes=warnings) if chains_dir is not None else None
        if manifest is not None:
            from collapseguard.training_data_tools.chain_check import (
                unrelated_step_notes,
            )

            warnings += unrelated_step_notes(manifest)
            for warning in warnings:  # before the scoring, which can take a while
                click.echo(f"warning: {warning}", err=True)
        detector = create(detector_name or DEFAULT_DETECTOR)
        if device:
            detector = detector.to(device)
        det_name, det_version = detector.name, str(detector.version)
        if manifest is not None:
            sources.append(f"chains {chains_dir}: steps {','.join(map(str, steps))} "
                           f"({manifest['source_image'].nunique()} sources)")
        sources += [f"clean images {d}" + (f" (kind {k})" if k else "") for k, d in clean_dirs]
        n_total = (len(manifest) if manifest is not None else 0)
        extra = f" and the --clean images ({len(clean_dirs)} folder(s)/shard(s))" if clean_dirs else ""
        if not quiet:
            click.echo(f"scoring {n_total} chain images{extra} with {det_name}@{det_version} ...", err=True)
        from collapseguard.scoring.progress import PhaseBars
        progress = PhaseBars("calibrate: score", quiet)
        try:
            table = score_table(detector, manifest, clean_dirs, target=target, batch_size=batch_size,
                                progress=progress,
                                warn=lambda text: click.echo(f"warning: {text}", err=True))
        except (ValueError, OSError, tarfile.TarError) as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            progress.close()
        if table.attrs.get("clean_in_chains"):
            click.echo(f"note: {table.attrs['clean_in_chains']} --clean image(s) are also chain images of "
                       "--chains and were scored once, as chain images", err=True)
        if table.attrs.get("clean_chain_pixels"):
            click.echo(f"note: {table.attrs['clean_chain_pixels']} --clean image(s) have the pixels of a chain's "
                       "step-0 image and count as one picture with that chain", err=True)
        if table.attrs.get("clean_identical"):
            click.echo(f"note: {table.attrs['clean_identical']} --clean image(s) are copies of other "
                       "--clean images (the same bytes, or the same decoded pixels under other metadata "
                       "or another lossless format) and count as one picture with them", err=True)
        if scores_out is not None:
            save_scores(table, scores_out, det_name, det_version)
            click.echo(f"scores written to {scores_out}", err=True)
    sources += list(describe_clean)
    command = command_line(click.get_current_context())
    try:
        cal = build_calibration(table, det_name, det_version, alpha=alpha, confidence=confidence,
                                clean_steps=steps, target=target, holdout=holdout, command=command,
                                clean_sources=sources, per_kind=per_kind)
    except ValueError as exc:  # plain ValueErrors of argument checks
        from collapseguard.calibration.bounds import NotEnoughCleanSamples

        hint = ""
        if isinstance(exc, NotEnoughCleanSamples) and from_scores is None:  # the scoring need not be redone
            hint = (f"; the scores are saved in {scores_out}: try other --max-false-drop / --confidence / "
                    f"--holdout with --from-scores {scores_out} in place of --chains and --clean, without "
                    "scoring again" if scores_out is not None
                    else "; to try other --max-false-drop / --confidence / --holdout without scoring again, "
                         "rerun with --scores-out FILE, then with --from-scores FILE in place of --chains "
                         "and --clean")
        raise click.ClickException(str(exc) + hint) from None
    cal.notes += warnings
    n_unscored = (cal.split or {}).get("n_unscored", 0)
    if n_unscored:
        click.echo(f"note: {n_unscored} image(s) could not be scored and were left out: "
                   f"{_unscored_text(table)}", err=True)
    save_calibration(cal, out)
    click.echo(f"wrote {out}")
    click.echo(printable(cal.describe()))  # the detector named by a --from-scores table
    held = cal.split.get("heldout_false_drop")
    click.echo(f"  bound: {bound_count_text(cal)}; "
               f"{'held-out' if holdout > 0 else 'in-sample (--holdout 0)'} false-drop "
               + (f"{percent(held, 2)} of {cal.split.get('n_clean_holdout')} clean images" if held is not None
                  else "n/a (no clean image held out)"))
    if cal.per_kind:
        click.echo(per_kind_text(cal))
    for note in cal.notes:
        if note.startswith("--per-kind:"):  # asked for per kind, and there was one kind
            click.echo(f"note: {note}", err=True)
    click.echo(top_clean_text(cal))
    click.echo(curve_table(cal))
    if cal.breakdown:
        click.echo(breakdown_text(cal))
    if not per_kind:
        for r in (cal.breakdown or {}).get("source_kind", {}).get("clean", []):
            if r["fraction"] > alpha and r["source_kind"] != "(none)":
                name = r["source_kind"] if str(r["source_kind"]).isprintable() else ascii(r["source_kind"])
                click.echo(f"note: clean kind {name} loses {r['fraction']:.1%} of its {r['n']} images "
                           f"({cal.breakdown.get('measured_on', '')}), above --max-false-drop "
                           f"{alpha:g}: the guarantee is for the pooled clean images; --per-kind "
                           "gives each kind its own", err=True)
    if cal.first_step_dropped:
        click.echo(first_steps_text(cal, "  {family}: first step with >=90% dropped: {0.9}, >=99%: {0.99}"))
    if not no_plot and importlib.util.find_spec("matplotlib") is None:
        click.echo("no plot: drawing it needs matplotlib: pip install 'collapseguard[plots]'", err=True)
    elif not no_plot:
        from collapseguard.calibration.plot import plot_calibration

        png = plot_calibration(cal, table.assign(clean=label_clean(table, target, steps)),
                               png_out)
        click.echo(f"plot written to {png}")


def _unscored_text(table, shown: int = 5) -> str:
    """The first ``shown`` images of ``table`` without a score, each with why where the table says
    (its ``error`` column), escaped for the terminal."""
    rows = table[table["score"].isna()]
    errors = rows["error"] if "error" in rows.columns else [""] * len(rows)
    return first_of([printable(f"{path} ({error})" if error else str(path))
                     for path, error in zip(rows["path"], errors)], shown)


def _same_detector_or_fail(asked: str, name: str, version: str, table) -> None:
    """``--detector`` spelled otherwise than the table's detector (``cnn:./w.safetensors`` against
    ``cnn:w.safetensors``) is accepted when it is the same detector: same version."""
    from collapseguard.detectors import create

    detector = create(asked)
    if detector.name.split(":", 1)[0] != name.split(":", 1)[0] or str(detector.version) != version:
        raise click.ClickException(f"{table} holds scores of {name}@{version}, not of {asked} "
                                   f"({detector.name}@{detector.version})")


def _clean_folders_of(table, shown: int = 5) -> list[str]:
    """What ``clean_sources`` says of a scores table's clean images: the folders holding them
    (each image's own: a nested clean tree names each subfolder; a shard member's, its shard's),
    the first ``shown`` and how many more."""
    import os

    paths = table.loc[table["kind"] == "clean", "path"].astype(str)
    folders = sorted({os.path.dirname(p.split("#", 1)[0]) or "." for p in paths})
    more = f" and {len(folders) - shown} more" if len(folders) > shown else ""
    return [f"clean images {', '.join(folders[:shown])}{more} (from the scores table)"] if folders else []

