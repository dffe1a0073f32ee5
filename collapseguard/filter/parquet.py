"""The per-file work for a Parquet input: one function of (input, options) -> outputs.

``process_parquet`` reads the file's rows in order (``io.parquet``), scores each row's image,
decides as for a shard sample (``filter.decisions``) and writes ``kept/<name>.parquet`` and
``rejected/<name>.parquet``: every input row lands in exactly one of them, in input order, every
column as it was (image bytes identical; the Arrow schema and its metadata, Hugging Face features
included, kept). ``scores/<stem>.parquet`` has one row per input row (``key``: the id column or
the row index; ``row``: the row index). Outputs are staged and committed, and the completion
marker ``.done/<stem>.json`` written last, exactly as ``filter.pipeline.process_shard`` does for
a shard, so resume, ``--overwrite`` and the conservation check treat both alike. A row whose image
or its bytes are null is ``no_image`` (kept unless ``--reject-no-image``), one whose bytes do not
decode (zero-length bytes included) ``decode_error`` (rejected), each with its reason in the
scores. With ``--groups`` (``dedup``'s groups.parquet) a row's decision is also its group's,
matched by the file's stem and the row's key (the first row of a key that repeats), and the scores
get a ``group`` column.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collapseguard.filter.decisions import (
    GroupsOfAnotherInput,
    apply_group,
    check_made_from,
    decide,
    read_row_groups,
    read_shard_groups,
)
from collapseguard.filter.pipeline import (
    SCORE_COLUMNS,
    STATUS_OF_REASON,
    FilterOptions,
    ShardChangedError,
    check_still_owner,
    commit_marker,
    discard_staged,
    file_digest,
    input_identity,
    output_names,
    read_marker,
    scores_table,
)
from collapseguard.io.outdir import digest_stream
from collapseguard.io.outdir import out_dir as open_out_dir
from collapseguard.io.parquet import (
    RowGroupWriter,
    find_image_column,
    open_parquet,
    other_image_columns,
    read_rows,
)
from collapseguard.io.parse import Input
from collapseguard.io.terminal import printable
from collapseguard.io.urls import join, open_stream
from collapseguard.scoring.records import Scored, score_records


def stream_digest(name: str) -> dict:
    """``{"size", "sha256"}`` of a file's bytes, read through once (``open_stream``)."""
    with open_stream(name, allow_pipe=False) as f:
        return digest_stream(f)


def _precomputed(rows, scores_path: str, where: str):
    """Pair rows with an earlier scoring pass's scores (``--drop-fraction``), checking that the
    file still has the rows (keys, count) that were scored."""
    with open_stream(scores_path, allow_pipe=False) as f:
        table = pq.read_table(f).to_pylist()
    redo = ("the scores of the scoring pass are not this file's; run the same command again to "
            "score it anew")
    it = iter(table)
    for row in rows:
        prev = next(it, None)
        if prev is None or prev["key"] != row.key:
            raise ShardChangedError(f"{printable(where)}: row {row.index} is not the one the scoring "
                                    f"pass read (the file changed since): {redo}")
        score = prev["score"]
        yield row, Scored(score=float("nan") if score is None else score, image=prev["image"],
                          error=prev["error"], status=STATUS_OF_REASON.get(prev["reason"], "ok"),
                          width=prev["width"], height=prev["height"], storage=prev["storage"] or "",
                          has_alpha=bool(prev.get("has_alpha")),
                          n_images=1 if row.data is not None else 0)
    if next(it, None) is not None:
        raise ShardChangedError(f"{printable(where)}: fewer rows than the scoring pass read (the "
                                f"file changed since): {redo}")


def decided_runs(keep: list[bool]) -> list[tuple[int, int, bool]]:
    """``(start, length, kept)`` for each run of rows with one decision, in order: how a batch is
    written where Arrow's filter has no kernel for a column's type (``string_view``,
    ``binary_view``), since a slice is a view of any type."""
    runs, start = [], 0
    for kept, run in itertools.groupby(keep):
        length = sum(1 for _ in run)
        runs.append((start, length, kept))
        start += length
    return runs


def process_parquet(inp: Input, options: FilterOptions, detector=None,
                    progress: Callable[[int], None] | None = None) -> dict:
    """Filter one Parquet file; returns the completion record (also written as the marker)."""
    if detector is None:
        from collapseguard.engines import get_detector
        detector = get_detector(options.detector, options.detector_kwargs)
    t0 = time.perf_counter()
    name = inp.name
    identity = input_identity(name)  # before reading: a file changed meanwhile is redone on resume
    out = open_out_dir(options.out_dir)
    names = output_names(inp)
    write_kept = not options.dry_run
    write_rej = write_kept and options.write_rejected
    written = {"kept": write_kept, "rejected": write_rej}
    rid = options.run_id
    staged = {k: out.stage(n, rid) for k, n in names.items() if written.get(k, True)}
    writers: dict[str, RowGroupWriter] = {}
    rows = {c: [] for c in (*SCORE_COLUMNS, "row")}
    reasons: Counter = Counter()
    n_images = 0
    pf = None

    def discard_all() -> None:  # a failed file leaves no partial outputs, whatever failed
        for w in writers.values():
            w.abort()
        discard_staged(out, staged)

    try:
        pf = open_parquet(name, options.max_shard_bytes)
        column = find_image_column(pf.schema_arrow, options.image_column or None, name)
        schema = pf.schema_arrow
        for key in ("kept", "rejected"):
            if written[key]:
                writers[key] = RowGroupWriter(staged[key], schema)
        source = read_rows(pf, column)
        if options.scores_from:
            if read_marker(inp, options.scores_from) is None:
                raise ShardChangedError(f"{printable(name)}: the scoring pass left no record of it; "
                                        "run the same command again to score it anew")
            stream = _precomputed(source, join(options.scores_from, names["scores"]), name)
        else:
            stream = score_records(source, detector, members_of=lambda r: r.members,
                                   batch_size=options.batch_size or None, images_only=False)
        groups = (read_shard_groups(options.groups, inp.stem, options.groups_digest,
                                    options.stand_ins) if options.groups else None)
        # the table's rows of this file by row index (None: a table without them, matched by key)
        by_row = (read_row_groups(options.groups, inp.stem, options.groups_digest,
                                  options.stand_ins) if options.groups else None)
        if groups is not None:  # only to the file the groups were made from
            check_made_from(options.groups, inp.stem, options.groups_digest, name,
                            **stream_digest(name))
        if by_row and not all(0 <= i < pf.metadata.num_rows for i in by_row):
            # rows the file does not have (a table edited by hand, or made from a longer file with
            # no record of its bytes): their decisions would never be applied, and nothing said so
            bad = next(i for i in sorted(by_row) if not 0 <= i < pf.metadata.num_rows)
            raise GroupsOfAnotherInput(
                f"--groups {printable(options.groups)} names row {bad} of {printable(name)}, which has "
                f"{pf.metadata.num_rows} rows: the table was not made from this file")
        seen_keys: set[str] = set()  # a key that repeats: its first row takes the group's decision
        batch, keep = None, []
        done_since = 0

        def write_batch() -> None:
            mask = pa.array(keep, pa.bool_())
            for key, m in (("kept", mask), ("rejected", pc.invert(mask))):
                if key not in writers:
                    continue
                try:
                    writers[key].write(batch.filter(m))
                except pa.ArrowNotImplementedError:  # a type with no take kernel (string_view,
                    for start, length, kept in decided_runs(keep):  # binary_view): as slices
                        if kept == (key == "kept"):
                            writers[key].write(batch.slice(start, length))

        for row, scored in stream:
            if row.batch is not batch:
                if batch is not None:
                    write_batch()
                batch, keep = row.batch, []
            decision, reason = decide(scored, options.threshold,
                                      reject_no_image=options.reject_no_image)
            if groups is not None:
                if by_row is not None:
                    group_row = by_row.get(row.index)
                else:
                    group_row = groups.get(row.key) if row.key not in seen_keys else None
                seen_keys.add(row.key)
                decision, reason = apply_group(
                    decision, reason, group_row, options.drop_duplicates, threshold=options.threshold,
                    detector=f"{detector.name}@{detector.version}")
                rows.setdefault("group", []).append((group_row or {}).get("group", ""))
            keep.append(decision == "kept")
            reasons[reason] += 1
            n_images += scored.n_images
            error = scored.error if row.data is not None else row.missing
            for col, val in (("key", row.key), ("score", scored.score), ("decision", decision),
                             ("reason", reason), ("detector", detector.name),
                             ("detector_version", detector.version), ("image", scored.image),
                             ("width", scored.width), ("height", scored.height),
                             ("storage", scored.storage), ("has_alpha", scored.has_alpha),
                             ("error", error), ("row", row.index)):
                rows[col].append(val)
            done_since += 1
            if progress is not None and done_since >= 16:
                progress(done_since)
                done_since = 0
        if batch is not None:
            write_batch()
        if progress is not None and done_since:
            progress(done_since)
        for w in writers.values():
            w.close()
        n = len(rows["key"])
        if n != pf.metadata.num_rows:  # never a row short: each is in kept/ or rejected/
            raise ShardChangedError(f"{printable(name)}: read {n} rows, its footer says "
                                    f"{pf.metadata.num_rows}")
    except BaseException:
        discard_all()
        raise
    finally:
        if pf is not None:
            pf.close(force=True)
    try:  # from here to the commits, an interrupt too (``WorkerStopped``) discards what is staged
        table = scores_table(rows, inp.stem, rows["row"],
                             group=rows.get("group", []) if groups is not None else None)
        pq.write_table(table, staged["scores"])
        outputs = {"scores": file_digest(Path(staged["scores"]))}
        for key in ("kept", "rejected"):
            if key in writers:
                outputs[key] = file_digest(Path(staged[key]))
        check_still_owner(options)
        for key in ("kept", "rejected", "scores"):
            if key in outputs:
                out.commit(staged[key], names[key])
    except BaseException:
        writers = {}
        discard_all()
        raise
    kept = int(np.sum([d == "kept" for d in rows["decision"]])) if n else 0
    record = {
        "shard": name,
        "samples": n,
        "images": n_images,
        "kept": kept,
        "rejected": n - kept,
        "reasons": dict(sorted(reasons.items())),
        "skipped_members": [],
        "seconds": round(time.perf_counter() - t0, 3),
        "options": options.fingerprint(),
        "detector_version": detector.version,
        "input": {k: v for k, v in identity.items() if k != "path"},
        "outputs": outputs,
        "image_column": column,
    }
    if not options.image_column:  # found, not named: say which image columns nothing judged
        unjudged = other_image_columns(schema, column)
        if unjudged:
            record["unjudged_image_columns"] = unjudged
    if options.scores_from:
        record["decided_from_scoring_pass"] = True
    return commit_marker(record, out, staged["marker"], names["marker"], options)
