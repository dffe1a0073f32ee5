"""``collapseguard filter``: split WebDataset shards into kept/ and rejected/ by degradation."""

from __future__ import annotations

import json
import os

import click

from collapseguard.commands._common import (
    FiniteFloatRange,
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
from collapseguard.filter.decisions import KEPT_ELSEWHERE
from collapseguard.io.tar import MAX_SAMPLE_BYTES, MAX_SHARD_BYTES
from collapseguard.io.terminal import printable


@click.command("filter")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Output folder, or an object-storage prefix (s3://bucket/out): kept/, "
                   "rejected/, scores/, summary.json.")
@detector_option()
@threshold_options("Drop")
@click.option("--drop-fraction", type=FiniteFloatRange(0, 1, max_open=True), default=None,
              help="Uncalibrated: drop this fraction of the highest-scoring samples of this data "
                   "(scores everything first, then decides).")
@workers_option()
@click.option("--resume/--overwrite", default=True, show_default=True,
              help="Skip shards already completed in --out, or redo everything.")
@click.option("--no-rejected", is_flag=True, help="Do not write rejected/ shards (scores still list them).")
@click.option("--reject-no-image", is_flag=True, help="Reject samples that hold no image (default: keep).")
@click.option("--dry-run", is_flag=True, help="Only score and decide: write scores/ and summary.json.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local worker processes, or a Ray cluster (extra [ray]).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Images per detector call.")
@click.option("--runtime", type=click.Choice(["auto", "torch", "onnx"]), default="auto", show_default=True,
              help="What runs the cnn detectors: onnxruntime on the CPU (auto: when installed; the "
                   "same scores within 1e-4, workers without torch) or torch.")
@click.option("--reshard", type=click.IntRange(min=1), default=None, metavar="N",
              help="Also write the kept samples into even shards of N samples: <out>/resharded/ "
                   "with key_map.parquet (key -> shard) and the img2dataset parquet rows per shard.")
@click.option("--max-sample-bytes", type=click.IntRange(min=1), default=None, metavar="BYTES",
              help="Members that would take one sample of a tar shard past BYTES are refused unread "
                   "and the sample rejected as refused_member; a worker holds one sample at a time, "
                   "so its memory is the detector's plus about twice this (Parquet inputs are read "
                   f"by record batch instead). [default: {MAX_SAMPLE_BYTES} (512 MiB)]")
@click.option("--max-shard-bytes", type=click.IntRange(min=1), default=None, metavar="BYTES",
              help="A shard of which more than BYTES are read (as stored, or its tar stream "
                   "decompressed; a Parquet file: its size) fails, named: a source that never "
                   "ends stops there. A read that "
                   "waits longer than COLLAPSEGUARD_READ_TIMEOUT seconds (default 60) for the next "
                   f"bytes fails its shard too. [default: {MAX_SHARD_BYTES} (64 GiB)]")
@click.option("--image-column", default=None, metavar="NAME",
              help="Parquet inputs: the column holding the images (a Hugging Face Image struct or "
                   "encoded bytes); default: found by type and name (image, img, jpg, jpeg, png, webp).")
@no_pipe_option()
@click.option("--groups", type=click.Path(exists=True, dir_okay=False), default=None,
              help="groups.parquet from `collapseguard dedup`: also reject each copy its group "
                   "marks degraded_copy (reason degraded_copy; the scores table gets a group "
                   "column). Other copies are kept unless --drop-duplicates.")
@click.option("--drop-duplicates", is_flag=True,
              help="With --groups: keep one copy per group (the least degraded), reject the "
                   "others as duplicate (classic deduplication). Where dedup kept a damaged copy over "
                   "its original (see its groups gallery), the original is the one rejected.")
@click.option("--kept-elsewhere", type=click.Choice(KEPT_ELSEWHERE), default=None,
              help="With --groups, for a group whose kept copy is not among INPUTS (a loose file "
                   "dedup also read, or a shard left out of this run): 'stand-in' keeps its "
                   "best-ranked copy among INPUTS in its place, so no picture loses every copy "
                   "here to the group rule; 'reference' decides its copies against the copy kept "
                   "elsewhere (filtering new data against a collection you already hold). "
                   "[default: stand-in]")
@trust_pickle_option()
@quiet_option("No progress bar and no summary table.")
def filter_cmd(inputs, out, detector, threshold, calibration, drop_fraction, workers, resume,
               no_rejected, reject_no_image, dry_run, engine, batch_size, reshard, runtime,
               max_sample_bytes, max_shard_bytes, image_column, no_pipe, groups, drop_duplicates,
               kept_elsewhere, trust_pickle, quiet):
    """Filter WebDataset shards and Parquet files: score every image, drop degraded samples, copy
    everything else through byte for byte. INPUTS are shards (.tar, .tar.gz, .tgz), Parquet files
    with images as bytes (kept/NAME.parquet and rejected/NAME.parquet keep every row and column),
    folders of them, or brace patterns such as 'data/shard-{000..099}.tar', as paths or URLs
    ('pipe:CMD', http(s)://, s3://, any fsspec protocol). Exits non-zero if any shard failed,
    naming it."""
    from collapseguard.filter.run import run_filter_cli

    refuse_pipes(inputs, no_pipe)
    if drop_fraction is not None and (threshold is not None or calibration is not None):
        raise click.UsageError("--drop-fraction cannot be combined with --threshold/--calibration")
    for flag, given in (("--drop-duplicates", drop_duplicates), ("--kept-elsewhere", kept_elsewhere)):
        if given and not groups:
            raise click.UsageError(f"{flag} needs --groups (a dedup groups.parquet)")
    if reshard is not None and dry_run:
        raise click.UsageError("--reshard writes kept samples; it cannot be combined with --dry-run")
    from collapseguard.detectors.cnn_family import set_default_runtime

    click.get_current_context().call_on_close(set_default_runtime(runtime))
    kwargs = detector_kwargs(detector, trust_pickle)
    det = load_detector(detector, kwargs)
    try:
        summary = run_filter_cli(inputs, out, det, kwargs=kwargs, threshold=threshold,
                                 calibration=calibration, drop_fraction=drop_fraction,
                                 workers=workers, engine=engine, resume=resume,
                                 write_rejected=not no_rejected, reject_no_image=reject_no_image,
                                 dry_run=dry_run, batch_size=batch_size or 0, quiet=quiet,
                                 limits={k: v for k, v in (("max_sample_bytes", max_sample_bytes),
                                                           ("max_shard_bytes", max_shard_bytes))
                                         if v is not None},
                                 allow_pipe=not no_pipe, image_column=image_column or "",
                                 groups=groups, drop_duplicates=drop_duplicates,
                                 kept_elsewhere=kept_elsewhere or "stand-in")
    except ValueError as exc:  # plain ValueErrors of argument checks
        raise click.ClickException(str(exc)) from None
    if not quiet:
        click.echo(format_summary(summary, out), err=True)
    unjudged = summary["reasons"].get("no_image", 0)
    if unjudged and not reject_no_image:  # said even with -q: kept without a judgement
        click.echo(f"note: {unjudged} sample(s) hold no image to judge (no image file, a null image, or a "
                   "Parquet image cell with only a path and no bytes) and were kept unjudged; the scores' "
                   "error column says which; --reject-no-image rejects them", err=True)
    if summary.get("loose_files_not_filtered"):  # said even with -q: these images are in no output
        click.echo(f"note: {summary['loose_files_not_filtered']} loose image file(s) beside the shards "
                   f"were not filtered (e.g. {printable(summary['loose_file_example'])}); filter reads "
                   ".tar shards: `collapseguard score` reads loose files", err=True)
    unjudged = [r for r in summary["per_shard"] if r.get("unjudged_image_columns")]
    if unjudged:  # said even with -q: images of these columns were kept or rejected unjudged
        r = unjudged[0]
        click.echo(f"note: {len(unjudged)} Parquet file(s) hold more image columns than the one judged "
                   f"(e.g. {printable(r['shard'])}: judged {printable(r['image_column'])!r}, not "
                   f"{', '.join(repr(printable(c)) for c in r['unjudged_image_columns'])}); each row "
                   "follows its judged image: name the column to judge with --image-column", err=True)
    if summary.get("orphan_rows_not_failed"):  # rows claiming samples the shards do not hold
        named = [f"{printable(o['file'])} ({o['not_failed']}: {', '.join(map(printable, o['not_failed_keys']))}"
                 f"{', ...' if o['not_failed'] > len(o['not_failed_keys']) else ''})"
                 for r in summary["per_shard"] for o in r.get("orphan_rows") or () if o["not_failed"]]
        click.echo(f"note: {summary['orphan_rows_not_failed']} sidecar parquet row(s) not marked as "
                   f"failed match no sample of their shard; written to {printable(os.path.join(out, 'orphan_rows'))}: "
                   + "; ".join(named[:5]), err=True)
    failed_inputs = [printable(f["input"]) for f in summary.get("inputs_failed") or ()]
    if summary["shards_failed"] or failed_inputs:
        raise click.ClickException("; ".join(
            ([f"failed input(s) (cannot be listed): {', '.join(failed_inputs)}"] if failed_inputs else [])
            + (["failed shard(s): " + ", ".join(summary["shards_failed"])] if summary["shards_failed"] else [])))
    if reshard is not None:
        from collapseguard.filter.pipeline import shard_name
        from collapseguard.filter.reshard import reshard as write_resharded
        from collapseguard.io.parse import kind_of
        names = [shard_name(r["shard"]) for r in summary["per_shard"]]
        # Parquet outputs keep their rows in kept/NAME.parquet: resharding is for tar shards
        done = write_resharded(out, [n for n in names if kind_of(n) != "parquet"], reshard)
        tables = [n for n in names if kind_of(n) == "parquet"]
        if not quiet:
            click.echo(f"resharded: {done['samples']} kept samples into {done['shards']} shard(s) "
                       f"of {reshard} in {os.path.join(out, 'resharded')}", err=True)
            if tables:
                click.echo(f"note: {len(tables)} Parquet file(s) not resharded (--reshard is for tar "
                           f"shards): their kept rows are in {printable(os.path.join(out, 'kept'))}"
                           f" (e.g. {printable(tables[0])})", err=True)


def format_summary(summary: dict, out: str) -> str:
    lines = [
        f"threshold: {summary['threshold_source']}",
        (f"inputs: {summary['shards']}  samples: {summary['samples']}  kept: {summary['kept']}  "
         f"rejected: {summary['rejected']}"),
        "reasons: " + json.dumps(summary["reasons"]),
    ]
    if summary.get("images_per_second"):
        lines.append(f"speed: {summary['images_per_second']:.1f} images/s")
    written = ([] if summary.get("dry_run") else ["kept"]) + (
        ["rejected"] if summary.get("write_rejected", not summary.get("dry_run")) else [])
    lines.append("outputs: " + ", ".join(os.path.join(out, d) for d in written + ["scores", "summary.json"]))
    return "\n".join(lines)
