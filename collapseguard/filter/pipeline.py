"""The per-shard work: one function of (input shard, options) -> outputs.

``process_shard`` reads a shard as raw samples, scores each sample's images, decides, and writes
``kept/<name>.tar``, ``rejected/<name>.tar`` and ``scores/<stem>.parquet`` under temporary names,
committing them when the shard is complete and writing the completion marker
``.done/<stem>.json`` last. Samples and repeated keys follow ``io.tar``'s rules: a sample whose
key came earlier in the shard is rejected as ``repeated_key``, and a sample rejected for its names
or as a repeat is the only kind that may be written under another key (never beside one of its
own key in an output). Output bytes depend only on the input and the options, so a run that
was killed and resumed gives the same files as one that was not. ``--out`` may be a local folder
or an object-storage prefix; ``io.outdir`` says how commits and the lock work on each.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collapseguard.engines.local import parent_is_gone
from collapseguard.errors import CollapseguardError
from collapseguard.filter import sidecars
from collapseguard.filter.decisions import (
    apply_group,
    check_made_from,
    decide,
    read_shard_groups,
)
from collapseguard.images import is_image_name
from collapseguard.io.outdir import digest_stream
from collapseguard.io.outdir import out_dir as open_out_dir
from collapseguard.io.parse import Input, basename_of, strip_suffix
from collapseguard.io.shard_writer import ShardWriter
from collapseguard.io.tar import MAX_SAMPLE_BYTES, MAX_SHARD_BYTES, ShardReader
from collapseguard.io.terminal import printable
from collapseguard.io.urls import (
    identity,
    is_gzip_name,
    is_remote,
    join,
    open_stream,
)
from collapseguard.scoring.records import (
    Scored,
    sample_error,
    score_records,
    set_aside_flags,
)

SCORE_COLUMNS = ("key", "score", "decision", "reason", "detector", "detector_version", "image",
                 "width", "height", "storage", "has_alpha", "error")
#: the Arrow type of each column of a scores table (``scores/<stem>.parquet``)
SCORE_TYPES = {"key": pa.string(), "score": pa.float64(), "decision": pa.string(),
               "reason": pa.string(), "detector": pa.string(), "detector_version": pa.string(),
               "image": pa.string(), "width": pa.int32(), "height": pa.int32(),
               "storage": pa.string(), "has_alpha": pa.bool_(), "error": pa.string()}


def scores_table(rows: dict[str, list], stem: str, row_index: list[int] | None = None,
                 group: list[str] | None = None) -> pa.Table:
    """The scores table of one shard or Parquet file: ``rows`` (``SCORE_COLUMNS``, one list each),
    then ``shard`` (``stem`` on every row), for a Parquet input ``row`` (its row index), and with
    ``filter --groups`` ``group`` (each sample's dedup group, "" for none)."""
    columns = {c: pa.array(rows[c], SCORE_TYPES[c]) for c in SCORE_COLUMNS}
    columns["shard"] = pa.array([stem] * len(rows["key"]), pa.string())
    if row_index is not None:
        columns["row"] = pa.array(row_index, pa.int64())
    if group is not None:
        columns["group"] = pa.array(group, pa.string())
    return pa.table(columns)


def discard_staged(out, staged: dict[str, str]) -> None:
    """Remove a failed input's staged kept, rejected, scores and marker files, whatever exists."""
    for key in ("kept", "rejected", "scores", "marker"):
        if key in staged:
            try:
                out.discard(staged[key])
            except OSError:
                pass


@dataclass(frozen=True)
class FilterOptions:
    """Everything a worker needs to process a shard (picklable, no detector object)."""

    out_dir: str
    detector: str
    threshold: float
    detector_kwargs: tuple = ()
    batch_size: int = 0
    reject_no_image: bool = False
    write_rejected: bool = True
    dry_run: bool = False
    #: the --out of an earlier scoring pass to decide from (no re-scoring): its scores/<stem>.parquet,
    #: and its .done/<stem>.json, whose ``input_digest`` the shard's bytes must still match
    scores_from: str = ""
    #: the id the run holding ``<out>/.lock`` wrote into it; checked before every commit
    run_id: str = ""
    #: a sample's members past this many bytes are refused unread (``refused_member``): the data
    #: a worker holds at once (``io.tar.MAX_SAMPLE_BYTES``)
    max_sample_bytes: int = MAX_SAMPLE_BYTES
    #: a shard read past this many bytes fails (``io.tar.MAX_SHARD_BYTES``)
    max_shard_bytes: int = MAX_SHARD_BYTES
    #: Parquet inputs: the column holding the images ("" = found by type and name)
    image_column: str = ""
    #: ``dedup``'s groups.parquet to apply (``apply_group``), its SHA-256, and whether to drop
    #: every copy a group does not keep
    groups: str = ""
    groups_digest: str = ""
    drop_duplicates: bool = False
    #: ``decisions.KEPT_ELSEWHERE``: what a group whose kept copy is not among the run's inputs does
    kept_elsewhere: str = "stand-in"
    #: this shard's rows that stand in for a kept copy outside the run's inputs (``(key, row)``
    #: pairs, ``decisions.stand_ins``), set per shard by ``run_filter`` with ``--kept-elsewhere
    #: stand-in``: they depend on every input of the run, and are what the shard's decisions read
    stand_ins: tuple = ()

    def fingerprint(self, parquet: bool = True) -> dict:
        """Settings that change a shard's outputs; a completed shard is reused only if equal.
        ``image_column`` counts only for Parquet inputs (``parquet``) and only when set;
        ``max_sample_bytes`` only for tar shards (Parquet rows are not cut into members) and
        only when not the default."""
        d = asdict(self)
        d.pop("out_dir")
        d.pop("batch_size")
        d.pop("scores_from")
        d.pop("run_id")
        d.pop("max_shard_bytes")  # a shard over it fails: no output to compare
        if parquet or d["max_sample_bytes"] == MAX_SAMPLE_BYTES:  # as markers without it read
            d.pop("max_sample_bytes")
        if not (parquet and d["image_column"]):  # unset, or a tar shard: markers still match
            d.pop("image_column")
        d.pop("groups")  # where the table lies does not matter; its digest does
        for k in ("groups_digest", "drop_duplicates"):
            if not d[k]:
                d.pop(k)  # runs without --groups keep the settings they always had
        d.pop("kept_elsewhere")  # it changes decisions only through the stand-ins
        standing = d.pop("stand_ins")
        if standing:  # only then do the run's other inputs change this shard's decisions
            d["groups_stand_ins"] = hashlib.sha256(
                json.dumps(sorted(map(list, standing), key=repr)).encode()).hexdigest()[:16]
        return json.loads(json.dumps(d, sort_keys=True))  # as it reads back from the marker


def shard_name(path: Input | str) -> str:
    """The file name of a shard's (or Parquet file's) kept/ and rejected/ outputs: the input's
    ``basename`` (for a name read back from a marker, ``io.parse.basename_of``)."""
    return path.basename if isinstance(path, Input) else basename_of(path)


def shard_stem(path: Input | str) -> str:
    """``shard_name`` without its shard or Parquet suffix: scores and markers are named by it."""
    return path.stem if isinstance(path, Input) else strip_suffix(shard_name(path))


def output_names(shard: Input | str) -> dict[str, str]:
    """The outputs of a shard (an ``io.parse.Input``, or a name read back from a marker),
    relative to ``--out``."""
    return {
        "kept": f"kept/{shard_name(shard)}",
        "rejected": f"rejected/{shard_name(shard)}",
        "scores": f"scores/{shard_stem(shard)}.parquet",
        "marker": f".done/{shard_stem(shard)}.json",
    }


def output_paths(shard: str, out_dir: str) -> dict[str, Path]:
    """``output_names`` under a local ``out_dir``."""
    return {k: Path(out_dir, v) for k, v in output_names(shard).items()}


def read_marker(shard: Input | str, out_dir: str) -> dict | None:
    """The completion marker of a shard, or None when the shard is not complete."""
    text = open_out_dir(out_dir).read_text(output_names(shard)["marker"])
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


def input_identity(shard: str) -> dict:
    """What a completion marker records of its input, to tell on resume whether it changed
    (``io.urls.identity``: size and mtime, a URL's size/ETag/last-modified, a ``pipe:`` command)."""
    return {"path": shard if is_remote(shard) else os.path.abspath(shard), **identity(shard)}


def _tmp(p: Path, run_id: str = "") -> Path:
    """The temporary name of an output while it is written: per run, so two writers (a run and
    a stale worker of a killed one) never share a file."""
    return p.with_name(f"{p.name}.{run_id}.tmp" if run_id else f"{p.name}.tmp")


class ShardChangedError(CollapseguardError, RuntimeError):
    """A shard read for the second time (``--drop-fraction``'s split) is not the one the scoring
    pass read: its scores belong to other bytes, so it is not split by them."""


class RunLostError(CollapseguardError, RuntimeError):
    """This worker's run no longer owns ``--out`` (its parent died, or another run holds the lock):
    it must not commit anything."""


def lock_owner(out_dir: str) -> str:
    """The run id written into ``<out>/.lock`` by the run holding it ("" when none is written)."""
    return (open_out_dir(out_dir).read_text(".lock") or "").strip()


def check_still_owner(options: FilterOptions) -> None:
    """Raise ``RunLostError`` unless the run that started this task still owns ``--out``.

    Called before every commit (rename of outputs, marker): a worker whose parent died, or whose
    run was superseded by another holding the lock, leaves its temporary files and stops.
    """
    if parent_is_gone():
        raise RunLostError("the filter run that started this worker has ended; not committing")
    owner = lock_owner(options.out_dir) if options.run_id else ""
    if options.run_id and not owner:
        raise RunLostError(f"{options.out_dir}/.lock is gone: --out was removed or replaced during "
                           "the run; not committing")
    if options.run_id and owner != options.run_id:
        raise RunLostError(f"{options.out_dir}/.lock is held by another run; not committing")


def file_digest(path: Path) -> dict:
    """Size and SHA-256 of a file, as a completion marker records its outputs."""
    with open(path, "rb") as f:
        return digest_stream(f)


def outputs_match(marker: dict, out_dir: str) -> bool:
    """Do the outputs a completion marker lists exist with the recorded size and checksum?"""
    recorded = marker.get("outputs")
    if not isinstance(recorded, dict) or not recorded:
        return False
    out = open_out_dir(out_dir)
    names = output_names(str(marker.get("shard", "")))
    for key, want in recorded.items():
        name = names.get(key)
        if name is None or not isinstance(want, dict):
            return False
        if out.size(name) != want.get("size") or out.digest(name) != want:
            return False
    return sidecars.still_valid(marker, str(marker.get("shard", "")), out)


def commit_marker(record: dict, out, staged: str, name: str, options: FilterOptions) -> dict:
    """Write the completion ``record`` to ``staged`` and commit it as ``name`` (``.done/<stem>.json``)
    in ``out``, last of an input's outputs; nothing is left staged if that fails. Returns it."""
    try:
        Path(staged).write_text(json.dumps(record, indent=1, sort_keys=True))
        check_still_owner(options)
        out.commit(staged, name)
    except BaseException:
        try:
            out.discard(staged)
        except OSError:
            pass
        raise
    return record


def process_shard(shard: Input | str, options: FilterOptions, detector=None,
                  progress: Callable[[int], None] | None = None) -> dict:
    """Filter one shard (an ``io.parse.Input``, or the name its reader opens); returns the
    completion record (also written as the marker).

    ``detector`` is the already-loaded detector named by ``options.detector`` (workers keep one
    per process); ``progress(n)`` is called with the number of samples done since the last call.
    """
    inp, shard = (shard, shard.name) if isinstance(shard, Input) else (shard, shard)
    if detector is None:
        from collapseguard.engines import get_detector
        detector = get_detector(options.detector, options.detector_kwargs)
    t0 = time.perf_counter()
    identity = input_identity(shard)  # before reading: a shard changed meanwhile is redone on resume
    side_identity = sidecars.input_identity(sidecars.find_sidecars(shard))
    side: list[tuple[str, str]] = []  # (staged, name) of img2dataset's NNNNN.parquet, ...
    orphans: list[dict] = []  # parquet rows that match no sample (sidecars.ORPHAN_FOLDER)
    out = open_out_dir(options.out_dir)
    names = output_names(inp)
    write_kept = not options.dry_run
    write_rej = write_kept and options.write_rejected
    written = {"kept": write_kept, "rejected": write_rej}  # no empty folders for outputs not written
    rid = options.run_id
    staged = {k: out.stage(name, rid) for k, name in names.items() if written.get(k, True)}
    kept_w = rej_w = None
    rows = {c: [] for c in SCORE_COLUMNS}
    reasons: Counter = Counter()
    n_images = 0
    reader = ShardReader(shard, max_sample_bytes=options.max_sample_bytes,
                         max_shard_bytes=options.max_shard_bytes)

    def discard_all() -> None:  # a failed shard leaves no partial files, whatever failed
        for w in (kept_w, rej_w):
            if w is not None:
                w.abort()
        discard_staged(out, staged)
        for tmp, _ in side:
            Path(tmp).unlink(missing_ok=True)

    try:
        gz = is_gzip_name(shard_name(inp))  # a .tar.gz/.tgz shard's outputs are gzipped too
        kept_w = ShardWriter(staged["kept"], gzip=gz) if write_kept else None
        rej_w = ShardWriter(staged["rejected"], gzip=gz) if write_rej else None
        done_since = 0
        if options.scores_from:
            scored = read_marker(inp, options.scores_from)
            if scored is None:  # every shard of the run was scored: no record means it was undone
                raise ShardChangedError(f"{printable(shard)}: the scoring pass left no record of "
                                        "it; run the same command again to score it anew")
            stream = precomputed_scores(reader, join(options.scores_from, names["scores"]),
                                        shard=shard, scored_digest=scored.get("input_digest"))
        else:
            stream = score_records(reader, detector,
                                   members_of=lambda s: [(m.name, m.data) for m in s.members],
                                   batch_size=options.batch_size or None)
        groups = (read_shard_groups(options.groups, shard_stem(shard), options.groups_digest,
                                    options.stand_ins) if options.groups else None)
        if groups is not None:  # a shard of another size fails before it is read
            check_made_from(options.groups, shard_stem(shard), options.groups_digest, shard,
                            size=identity.get("size"))
        for sample, scored in stream:
            decision, reason = decide(scored, options.threshold, **set_aside_flags(sample),
                                      reject_no_image=options.reject_no_image)
            if groups is not None:
                group_row = groups.get(sample.key) if sample.repeat == 0 else None
                decision, reason = apply_group(
                    decision, reason, group_row, options.drop_duplicates, threshold=options.threshold,
                    detector=f"{detector.name}@{detector.version}")
                rows.setdefault("group", []).append((group_row or {}).get("group", ""))
            writer = kept_w if decision == "kept" else rej_w
            if writer is not None:  # only a sample set aside for its names or its repeated key
                # (whatever reason comes first) may change key there
                writer.write(sample, movable=bool(sample.unsafe_names) or sample.repeat > 0,
                             tag=len(rows["key"]))
            reasons[reason] += 1
            n_images += scored.n_images
            error = sample_error(sample, scored.error)
            for col, val in (("key", sample.key), ("score", scored.score), ("decision", decision),
                             ("reason", reason), ("detector", detector.name),
                             ("detector_version", detector.version), ("image", scored.image),
                             ("width", scored.width), ("height", scored.height),
                             ("storage", scored.storage), ("has_alpha", scored.has_alpha),
                             ("error", error)):
                rows[col].append(val)
            done_since += 1
            if progress is not None and done_since >= 16:
                progress(done_since)
                done_since = 0
        if progress is not None and done_since:
            progress(done_since)
        if groups is not None and reader.digest is not None:  # read whole: its bytes are known
            check_made_from(options.groups, shard_stem(shard), options.groups_digest, shard,
                            **reader.digest)
        for w in (kept_w, rej_w):
            if w is not None:
                w.close()
    except BaseException as exc:
        discard_all()
        if isinstance(exc, ShardChangedError):  # its scores are stale: the next run scores it anew
            try:
                check_still_owner(options)  # a stale worker of a killed run leaves them alone
                open_out_dir(options.scores_from).remove(names["marker"])
            except (OSError, RunLostError):
                pass  # the run fails on this shard all the same; the error is the shard's
        raise
    try:  # from here to the commits, an interrupt too (``WorkerStopped``) discards what is staged
        if rej_w is not None:
            for i, key in rej_w.renamed.items():  # neighbours of one key: moved aside in rejected/
                rows["error"][i] = "; ".join(x for x in (
                    rows["error"][i], f"written to rejected/ under the key {key!r}, so that a reader "
                    f"cannot merge it with a neighbour (a sample of the key {rows['key'][i]!r}, or one "
                    "whose name gives webdataset no key)") if x)
        # the shard's stem (as scores/<stem>.parquet and kept/<stem>.tar are named), so tables
        # concatenated still say where a row is; the same whether the shard is .tar or .tar.gz
        table = scores_table(rows, shard_stem(inp),
                             group=rows.get("group", []) if groups is not None else None)
        pq.write_table(table, staged["scores"])
        outputs = {"scores": file_digest(Path(staged["scores"]))}
        for key, w in (("kept", kept_w), ("rejected", rej_w)):
            if w is not None:
                outputs[key] = {"size": w.size, "sha256": w.sha256}
        side_notes: list[str] = []
        side = sidecars.write_sidecars(
            shard, list(zip(rows["key"], rows["decision"], rows["reason"])), orphans=orphans,
            notes=side_notes,
            outputs=tuple(k for k in ("kept", "rejected") if written[k]),
            summary={"detector": detector.name, "detector_version": detector.version,
                     "threshold": options.threshold, "kept": rows["decision"].count("kept"),
                     "rejected": rows["decision"].count("rejected")},
            stage=lambda name: out.stage(name, rid))
        side_outputs = {name: file_digest(Path(tmp)) for tmp, name in side}
        check_still_owner(options)
        for key in ("kept", "rejected", "scores"):
            if key in outputs:
                out.commit(staged[key], names[key])
        for tmp, name in side:
            out.commit(tmp, name)
    except BaseException:
        kept_w = rej_w = None  # closed already
        discard_all()
        raise
    n = len(rows["key"])
    record = {
        "shard": shard,
        "samples": n,
        "images": n_images,
        "kept": sum(1 for d in rows["decision"] if d == "kept"),
        "rejected": sum(1 for d in rows["decision"] if d == "rejected"),
        "reasons": dict(sorted(reasons.items())),
        "skipped_members": reader.skipped,
        "seconds": round(time.perf_counter() - t0, 3),
        "options": options.fingerprint(parquet=False),
        "detector_version": detector.version,
        "input": {k: v for k, v in identity.items() if k != "path"},
        "outputs": outputs,
    }
    if reader.digest is not None:  # the bytes read: a second pass must read the same
        record["input_digest"] = reader.digest
    if options.scores_from:  # split from a scoring pass's scores: a new cut may split it again
        record["decided_from_scoring_pass"] = True
    if side_identity:
        record["sidecars"] = {"inputs": side_identity, "outputs": side_outputs}
    if orphans:
        record["orphan_rows"] = orphans
    if side_notes:
        record["sidecar_notes"] = side_notes
    return commit_marker(record, out, staged["marker"], names["marker"], options)


#: the scoring status a scores row's reason stands for (a decision read back from a scoring pass)
STATUS_OF_REASON = {"decode_error": "decode_error", "no_image": "no_image",
                     "score_error": "score_error"}


def precomputed_scores(samples, scores_path: str, *, shard: str = "",
                       scored_digest: dict | None = None):
    """Pair samples with the rows of an earlier pass's scores file (same shard, same order).

    ``ShardChangedError`` when the shard is not the one scored: a key that differs, a sample more
    or fewer, or (given ``scored_digest``, the ``{"size", "sha256"}`` the scoring pass read, and
    ``samples`` a ``ShardReader``) other bytes, checked once the shard has been read whole."""
    with open_stream(str(scores_path), allow_pipe=False) as f:
        table = pq.read_table(f).to_pylist()
    where = printable(shard or str(scores_path))
    redo = ("the scores of the scoring pass are not this shard's; run the same command again to "
            "score it anew")
    it = iter(table)
    for sample in samples:
        row = next(it, None)
        if row is None:
            raise ShardChangedError(f"{where}: more samples than the scoring pass read (the shard "
                                    f"changed since): {redo}")
        if row["key"] != sample.key:
            raise ShardChangedError(f"{where}: the sample {printable(sample.key)!r} is not the one "
                                    f"the scoring pass read there (the shard changed since): {redo}")
        score = row["score"]
        yield sample, Scored(score=float("nan") if score is None else score, image=row["image"],
                             error=row["error"], status=STATUS_OF_REASON.get(row["reason"], "ok"),
                             width=row["width"], height=row["height"],
                             storage=row.get("storage") or "",  # scores files written before storage was recorded lack it
                             has_alpha=bool(row.get("has_alpha")),
                             n_images=sum(is_image_name(m.name) for m in sample.members))
    if next(it, None) is not None:
        raise ShardChangedError(f"{where}: fewer samples than the scoring pass read (the shard "
                                f"changed since): {redo}")
    read = getattr(samples, "digest", None)
    if isinstance(scored_digest, dict) and read is not None and read != scored_digest:
        raise ShardChangedError(f"{where}: its bytes differ from those the scoring pass read "
                                f"({scored_digest.get('size')} bytes then, {read['size']} now; "
                                f"SHA-256 {str(scored_digest.get('sha256'))[:12]}... then, "
                                f"{read['sha256'][:12]}... now): {redo}")


def filter_task(task: tuple[Input | str, FilterOptions], detector, progress=None) -> dict:
    """Engine task function for ``filter``: ``task`` is ``(input, options)``, the input an
    ``io.parse.Input`` (a tar shard or a Parquet file) or a shard's name."""
    shard, options = task
    if isinstance(shard, Input) and shard.kind == "parquet":
        from collapseguard.filter.parquet import process_parquet
        return process_parquet(shard, options, detector, progress)
    return process_shard(shard, options, detector, progress)


def discard_abandoned(task: tuple[Input | str, FilterOptions]) -> None:
    """Remove what a ``filter_task`` of this run staged in a local or shared ``--out`` and can no
    longer commit (its worker was killed: the Ray engine's interrupt): ``NAME.<run id>.tmp``
    beside each output it writes, as ``process_shard`` and ``process_parquet`` name them. Only
    this run's names: another run's files, and committed outputs, are left alone."""
    shard, options = task
    if not options.run_id:
        return
    out = open_out_dir(options.out_dir)
    if out.remote:  # staged on the worker's node, outside --out
        return
    names = list(output_names(shard).values())
    if not (isinstance(shard, Input) and shard.kind == "parquet"):
        try:
            names += sidecars.output_names(str(shard))
        except OSError:
            pass
    for name in names:
        _tmp(Path(out.url(name)), options.run_id).unlink(missing_ok=True)


#: what an engine calls for a task whose worker it killed (``engines.ray.discard_staged``)
filter_task.discard_abandoned = discard_abandoned
