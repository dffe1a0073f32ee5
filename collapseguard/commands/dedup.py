"""``collapseguard dedup``: near-duplicate groups, and in each the least degraded copy kept."""

from __future__ import annotations

import os
from pathlib import Path

import click

from collapseguard.commands._common import (
    FiniteFloatRange,
    no_pipe_option,
    quiet_option,
    refuse_pipes,
    workers_option,
)
from collapseguard.io.terminal import printable


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Output folder: groups.parquet and summary.json (and .parts/, what a stopped "
                   "run resumes from).")
@click.option("--level", type=FiniteFloatRange(0.0, 1.0), default=None,
              help="Mark a copy degraded when P(it is more degraded than the kept copy) is above "
                   "this. Default: the level calibrated with the comparator (summary.json states "
                   "its guarantee); a level given here has none.")
@click.option("--max-distance", type=click.IntRange(0, 8), default=8, show_default=True,
              help="Most pHash bits two copies may differ in to be compared.")
@click.option("--min-corr", type=FiniteFloatRange(-1.0, 1.0), default=0.80, show_default=True,
              help="Least thumbnail correlation that confirms a pair.")
@click.option("--min-medoid-corr", type=FiniteFloatRange(-1.0, 1.0), default=0.70, show_default=True,
              help="Least thumbnail correlation of every member with its group's medoid.")
@click.option("--gallery", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Also write OUT/groups.html: up to N groups (those with a degraded copy "
                   "first), each copy beside the kept one, with 1:1 crops.")
@click.option("--fresh", is_flag=True, help="Describe every image again (ignore .parts/ of an earlier run).")
@workers_option()
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Who describes the images: local worker processes, or a Ray cluster (extra [ray]).")
@click.option("--image-column", default=None, metavar="NAME",
              help="Parquet inputs: the column holding the images (a Hugging Face Image struct or "
                   "encoded bytes); default: found by type and name (image, img, jpg, jpeg, png, webp).")
@click.option("--runtime", type=click.Choice(["auto", "torch", "onnx"]), default="auto", show_default=True,
              help="What runs the comparator's cnn: onnxruntime on the CPU (auto: when installed and "
                   "the cnn runs on the CPU; the same scores within 1e-4, and worker processes "
                   "without torch) or torch.")
@no_pipe_option()
@quiet_option()
def dedup(paths, out, level, max_distance, min_corr, min_medoid_corr, gallery, fresh, workers,
          engine, image_column, runtime, no_pipe, quiet):
    """Find copies of one picture in PATHS (image files, folders, .tar shards, Parquet files with
    images as bytes, brace patterns and URLs, as `score` reads them) and keep the least degraded
    copy of each.

    Copies are found by a 64-bit perceptual hash (multi-index hashing: no all-pairs comparison),
    confirmed by a thumbnail correlation, and joined into groups whose members all stay close to
    the group's medoid. Inside a group the pairwise comparator (detector `compare`) ranks the
    copies: rank 0 is kept (the least degraded copy, or a larger copy the comparator cannot tell
    from it); a copy is a `degraded_copy` when it is more degraded than the least degraded one
    with probability above the level; other copies are duplicates that `filter` keeps unless
    told --drop-duplicates. Writes OUT/groups.parquet (source, key, group, rank, decision,
    p_worse, reason, ...) and OUT/summary.json. Apply with `collapseguard filter --groups
    OUT/groups.parquet`. A stopped run, run again with the same OUT, resumes."""
    from collapseguard.dedup.groups import GroupingParams
    from collapseguard.dedup.run import run_dedup
    from collapseguard.detectors.cnn_family import set_default_runtime
    from collapseguard.detectors.compare import load_weights
    from collapseguard.scoring.run import plan_score_tasks

    refuse_pipes(paths, no_pipe)
    click.get_current_context().call_on_close(set_default_runtime(runtime))
    load_weights()  # missing weights fail before any work
    plan_score_tasks(paths, None, [], image_column=image_column)  # inputs that name nothing fail at once
    params = GroupingParams(max_distance=max_distance, min_corr=min_corr,
                            min_medoid_corr=min_medoid_corr)
    from collapseguard.dedup.run import out_lock, shared_stems
    try:
        with out_lock(Path(out)):  # the gallery and the stem check read the table this run wrote
            summary = run_dedup(paths, out, workers=workers, quiet=quiet, level=level, params=params,
                                engine=engine, image_column=image_column, fresh=fresh, lock=False)
            if gallery:
                from collapseguard.dedup.gallery import write_gallery
                write_gallery(f"{out}/groups.parquet", f"{out}/groups.html", gallery, image_column)
            shared = shared_stems(os.path.join(out, "groups.parquet"))
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from None
    d = summary["decisions"]
    bad = summary["reasons"].get("not_fingerprinted", 0)  # singles with no decodable image
    unreadable = f" ({bad} not decodable: reason not_fingerprinted, error in the table)" if bad else ""
    for f in summary["failures"]:
        click.echo(f"FAILED {printable(f.splitlines()[0])}", err=True)
    if shared:  # filter matches a table's rows by stem: such inputs cannot be filtered together
        stem, names = next(iter(shared.items()))
        click.echo(f"warning: {len(shared)} stem(s) name more than one input (e.g. {printable(stem)}: "
                   f"{', '.join(printable(n) for n in names[:2])}): `filter --groups` matches rows by "
                   "stem, refuses such inputs in one run, and run by run each stands in for the "
                   "other's kept copies; rename them apart and run dedup again", err=True)
    failed = len(summary["failures"])
    click.echo(f"{summary['images']} image(s): {summary['groups']} group(s) of {summary['grouped']}; "
               f"{d['degraded_copy']} degraded copies, {summary['reasons'].get('duplicate', 0)} "
               f"duplicates (decision keep, reason duplicate: rejected only by filter "
               f"--drop-duplicates), {d['single']} singles{unreadable} -> {os.path.join(out, 'groups.parquet')}"
               + (f"; {failed} input(s) FAILED above, not in the table" if failed else ""), err=True)
    if failed:
        raise SystemExit(1)

