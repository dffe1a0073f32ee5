"""``collapseguard audit``: how much of a dataset is model-degraded, where, with examples."""

from __future__ import annotations

import os

import click

from collapseguard.commands._common import (
    detector_kwargs,
    detector_option,
    load_detector,
    no_pipe_option,
    quiet_option,
    refuse_pipes,
    threshold_options,
    trust_pickle_option,
    workers_option,
)
from collapseguard.io.inputs import InputError, refuse_overwriting_inputs


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Output folder: report.html, summary.json, flagged.csv, scores.parquet.")
@detector_option()
@threshold_options("Flag")
@click.option("--compare", default=None, metavar="NAMES",
              help="Other detectors to compare, comma-separated (e.g. pyiqa:piqe,nss): shows the "
                   "images they call fine that the main detector flags, and vice versa.")
@click.option("--sample", type=click.IntRange(min=1), default=None, metavar="N",
              help="Audit a seeded random subset of N samples (figures become estimates); the "
                   "others are never decoded.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of --sample and of the random gallery of kept images.")
@workers_option(default=1)
@click.option("--gallery-size", type=click.IntRange(min=1, max=100), default=12, show_default=True,
              help="Images per gallery.")
@click.option("--image-column", default=None, metavar="NAME",
              help="Parquet inputs: the column holding the images (default: found by type and "
                   "name).")
@click.option("--groups", default=None, metavar="PATH",
              help="A groups.parquet made by `collapseguard dedup`: the report adds a section "
                   "with up to --gallery-size of its groups (those with a degraded copy first), "
                   "each copy beside the kept one at 1:1 crops. Only copies in INPUTS are read "
                   "back: a source named only by the table is never opened or run.")
@no_pipe_option()
@trust_pickle_option()
@quiet_option("No progress bar and no summary table.")
def audit(inputs, out, detector, threshold, calibration, compare, sample, seed, workers,
          gallery_size, image_column, groups, no_pipe, trust_pickle, quiet):
    """Audit a dataset: score INPUTS (shards, Parquet files, folders, image files, brace patterns
    such as 'data/shard-{000..099}.tar'; paths or URLs such as 'pipe:CMD', http(s)://, s3://) and
    write a self-contained report.html with the flagged
    fraction and its confidence interval, the score histogram, the estimated replication step,
    a per-shard table and galleries (most degraded, borderline, random kept), each image as a
    thumbnail plus a native-resolution crop. Nothing is modified; exits non-zero if an input
    failed."""
    from collapseguard.audit.run import (
        OUTPUT_FILES,
        AuditOptions,
        format_summary,
        run_audit,
    )

    refuse_pipes(inputs, no_pipe)
    try:  # "nothing is modified": no output file may replace an input
        refuse_overwriting_inputs([os.path.join(out, f) for f in OUTPUT_FILES], inputs)
    except InputError as exc:
        raise click.ClickException(str(exc)) from None
    kwargs = detector_kwargs(detector, trust_pickle)
    det = load_detector(detector, kwargs)
    names = _names(compare)
    options = AuditOptions(detector=detector, threshold=threshold, calibration=calibration,
                           compare=names,
                           compare_kwargs={n: detector_kwargs(n, trust_pickle) for n in names},
                           sample=sample, seed=seed, workers=workers,
                           detector_kwargs=kwargs, gallery_size=gallery_size,
                           image_column=image_column, groups=groups)
    try:
        summary = run_audit(inputs, out, options, quiet=quiet, detector_obj=det)
    except ValueError as exc:  # plain ValueErrors of argument checks
        raise click.ClickException(str(exc)) from None
    if not quiet:
        click.echo(format_summary(summary))
    if summary["failures"]:
        raise click.ClickException(f"{len(summary['failures'])} input(s) failed (listed in the report)")
