"""``collapseguard score``: one row per image with its degradation score."""

from __future__ import annotations

from collections import Counter

import click

from collapseguard.commands._common import (
    check_out_file,
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
from collapseguard.io.inputs import (
    InputError,
    other_files_note,
    refuse_overwriting_inputs,
)
from collapseguard.io.terminal import printable


@click.command()
@click.argument("paths", nargs=-1, required=True)
@detector_option()
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="Output table: .csv, .tsv or .parquet (by suffix).")
@workers_option(default=1)
@click.option("--image-column", default=None, metavar="NAME",
              help="Parquet inputs: the column holding the images (a Hugging Face Image struct or "
                   "encoded bytes); default: found by type and name (image, img, jpg, jpeg, png, webp).")
@no_pipe_option()
@threshold_options("Flag")
@trust_pickle_option()
@quiet_option()
def score(paths, detector, out, workers, image_column, no_pipe, threshold, calibration,
          trust_pickle, quiet):
    """Score images in PATHS: image files, folders (recursive), shards (.tar, .tar.gz), Parquet
    files with images as bytes (Hugging Face datasets, img2dataset), or brace patterns such as
    'data/shard-{000..009}.tar', as paths or URLs ('pipe:CMD', http(s)://, s3://, any fsspec
    protocol). Higher score = more degraded; an image that cannot be decoded gets an empty score
    and its error text.

    Each row is flagged (column `flagged`: score > `threshold`, empty where the score is empty) at the
    threshold of --threshold, --calibration or the detector's shipped calibration, as `filter`
    decides; a detector without one gets empty `flagged` and `threshold` columns."""
    from collapseguard.calibration.thresholds import (
        NoThresholdError,
        flag_columns,
        resolve_threshold,
    )
    from collapseguard.detectors.base import check_spec
    from collapseguard.scoring.run import (
        check_table_suffix,
        plan_score_tasks,
        run_score,
        write_table,
    )

    try:  # before any scoring: a bad --out must not cost the whole run
        check_table_suffix(out)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    check_out_file(out)
    refuse_pipes(paths, no_pipe)
    try:  # the scores table must not replace the data it scores
        refuse_overwriting_inputs([out], paths)
    except InputError as exc:
        raise click.ClickException(str(exc)) from None
    check_spec(detector)  # an unknown name fails at once; a missing input before a model loads
    unread: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []  # URL inputs that cannot be listed: they fail, the rest is scored
    others: Counter = Counter()  # files of the folders given that are no image type: said once
    tasks = plan_score_tasks(paths, None, unread, image_column=image_column, failed=failed, others=others)
    kwargs = detector_kwargs(detector, trust_pickle)
    det = load_detector(detector, kwargs)  # a model that cannot be built fails here, in one line,
    # not in every worker
    try:  # a calibration made for another detector fails before any scoring
        t, t_source, _ = resolve_threshold(det, threshold, calibration)
    except NoThresholdError:  # no shipped calibration (nss, pyiqa:...): scores without flags
        t, t_source = None, f"no threshold for {detector}: flagged left empty (pass --threshold or --calibration)"
    if workers > 1:
        det = None  # each worker loads its own; do not hold a third copy meanwhile
    try:
        df, failures = run_score(paths, detector, workers=workers, quiet=quiet, detector_obj=det,
                                 detector_kwargs=kwargs, planned=(tasks, unread, failed))
        df = flag_columns(df, t)
        write_table(df, out)
    except ValueError as exc:  # plain ValueErrors of argument checks
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc}") from None
    click.echo(f"{count_line(df)}{flag_count(df)} -> {out}", err=True)
    click.echo(f"threshold: {printable(t_source)}", err=True)
    if others:
        click.echo(f"note: {other_files_note(others)}", err=True)
    for f in failures:
        click.echo(f"FAILED {printable(f.splitlines()[0])}", err=True)
    if failures:
        raise SystemExit(1)


def count_line(df) -> str:
    """What the rows hold: scored rows (a sample's row is scored when any of its images decoded),
    those of them that also carry an error (another image of the sample failed), and rows
    without a score."""
    import numpy as np
    if not len(df):
        return "scored 0 row(s)"
    scored = ~np.isnan(df["score"].to_numpy(dtype=np.float64, na_value=np.nan))
    err = (df["error"].fillna("") != "").to_numpy()
    partial = f" ({int((scored & err).sum())} with an error beside the score)" if (scored & err).any() else ""
    return f"scored {int(scored.sum())} row(s){partial}, {int((~scored).sum())} without a score"



def flag_count(df) -> str:
    """", N flagged" for a table with a threshold, "" without one."""
    if not len(df) or df["threshold"].isna().all():
        return ""
    return f", {int(df['flagged'].fillna(False).sum())} flagged"
