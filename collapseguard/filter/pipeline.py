"""The per-shard work: one function of (input shard, options) -> outputs.

``process_shard`` reads a shard as raw samples, scores each sample's images, decides, and writes
``kept/<name>.tar``, ``rejected/<name>.tar`` and ``scores/<stem>.parquet`` under temporary names,
renaming them when the shard is complete and writing the completion marker
``.done/<stem>.json`` last. Output bytes depend only on the input and the options, so a run that
was killed and resumed gives the same files as one that was not.
"""

from __future__ import annotations

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
from collapseguard.filter.decisions import decide
from collapseguard.io.tar import ShardReader, ShardWriter
from collapseguard.scoring.records import Scored, sample_error, score_records

SCORE_COLUMNS = ("key", "score", "decision", "reason", "detector", "detector_version", "image",
                 "width", "height", "storage", "error")


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
    #: folder of scores/*.parquet from an earlier scoring pass to decide from (no re-scoring)
    scores_from: str = ""
    #: the id the run holding ``<out>/.lock`` wrote into it; checked before every commit
    run_id: str = ""

    def fingerprint(self) -> dict:
        """Settings that change a shard's outputs; a completed shard is reused only if equal."""
        d = asdict(self)
        d.pop("out_dir")
        d.pop("batch_size")
        d.pop("scores_from")
        d.pop("run_id")
        return json.loads(json.dumps(d, sort_keys=True))  # as it reads back from the marker


def shard_name(path: str) -> str:
    return os.path.basename(path)


def shard_stem(path: str) -> str:
    name = shard_name(path)
    return name.removesuffix(".tar")


def output_paths(shard: str, out_dir: str) -> dict[str, Path]:
    out = Path(out_dir)
    return {
        "kept": out / "kept" / shard_name(shard),
        "rejected": out / "rejected" / shard_name(shard),
        "scores": out / "scores" / f"{shard_stem(shard)}.parquet",
        "marker": out / ".done" / f"{shard_stem(shard)}.json",
    }


def read_marker(shard: str, out_dir: str) -> dict | None:
    """The completion marker of a shard, or None when the shard is not complete."""
    p = output_paths(shard, out_dir)["marker"]
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def input_identity(shard: str) -> dict:
    """What a completion marker records of its input, to tell on resume whether it changed."""
    st = os.stat(shard)
    return {"path": os.path.abspath(shard), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _tmp(p: Path, run_id: str = "") -> Path:
    """The temporary name of an output while it is written: per run, so two writers (a run and
    a stale worker of a killed one) never share a file."""
    return p.with_name(f"{p.name}.{run_id}.tmp" if run_id else f"{p.name}.tmp")


class RunLostError(CollapseguardError, RuntimeError):
    """This worker's run no longer owns ``--out`` (its parent died, or another run holds the lock):
    it must not commit anything."""


def lock_owner(out_dir: str) -> str:
    """The run id written into ``<out>/.lock`` by the run holding it ("" when none is written)."""
    try:
        return (Path(out_dir) / ".lock").read_text().strip()
    except OSError:
        return ""


def check_still_owner(options: FilterOptions) -> None:
    """Raise ``RunLostError`` unless the run that started this task still owns ``--out``.

    Called before every commit (rename of outputs, marker): a worker whose parent died, or whose
    run was superseded by another holding the lock, leaves its temporary files and stops.
    """
    if parent_is_gone():
        raise RunLostError("the filter run that started this worker has ended; not committing")
    if options.run_id and lock_owner(options.out_dir) != options.run_id:
        raise RunLostError(f"{options.out_dir}/.lock is held by another run; not committing")


def file_digest(path: Path) -> dict:
    """Size and SHA-256 of a file, as a completion marker records its outputs."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def outputs_match(marker: dict, out_dir: str) -> bool:
    """Do the outputs a completion marker lists exist with the recorded size and checksum?"""
    recorded = marker.get("outputs")
    if not isinstance(recorded, dict) or not recorded:
        return False
    paths = output_paths(str(marker.get("shard", "")), out_dir)
    for key, want in recorded.items():
        p = paths.get(key)
        if p is None or not isinstance(want, dict) or not p.is_file():
            return False
        if p.stat().st_size != want.get("size") or file_digest(p) != want:
            return False
    return True


def process_shard(shard: str, options: FilterOptions, detector=None,
                  progress: Callable[[int], None] | None = None) -> dict:
    """Filter one shard; returns the completion record (also written as the marker).

    ``detector`` is the already-loaded detector named by ``options.detector`` (workers keep one
    per process); ``progress(n)`` is called with the number of samples done since the last call.
    """
    if detector is None:
        from collapseguard.engines import get_detector
        detector = get_detector(options.detector, options.detector_kwargs)
    t0 = time.perf_counter()
    identity = input_identity(shard)  # before reading: a shard changed meanwhile is redone on resume
    paths = output_paths(shard, options.out_dir)
    write_kept = not options.dry_run
    write_rej = write_kept and options.write_rejected
    written = {"kept": write_kept, "rejected": write_rej}  # no empty folders for outputs not written
    for key, p in paths.items():
        if written.get(key, True):
            p.parent.mkdir(parents=True, exist_ok=True)
    rid = options.run_id
    kept_w = ShardWriter(str(_tmp(paths["kept"], rid))) if write_kept else None
    rej_w = ShardWriter(str(_tmp(paths["rejected"], rid))) if write_rej else None
    rows = {c: [] for c in SCORE_COLUMNS}
    reasons: Counter = Counter()
    n_images = 0
    reader = ShardReader(shard)
    try:
        done_since = 0
        if options.scores_from:
            stream = precomputed_scores(reader, Path(options.scores_from) / paths["scores"].name)
        else:
            stream = score_records(reader, detector,
                                   members_of=lambda s: [(m.name, m.data) for m in s.members],
                                   batch_size=options.batch_size or None)
        for sample, scored in stream:
            decision, reason = decide(scored, options.threshold, unsafe=bool(sample.unsafe_names),
                                      refused=bool(sample.refused),
                                      reject_no_image=options.reject_no_image)
            writer = kept_w if decision == "kept" else rej_w
            if writer is not None:
                writer.write(sample)
            reasons[reason] += 1
            n_images += scored.n_images
            error = sample_error(sample, scored.error)
            for col, val in (("key", sample.key), ("score", scored.score), ("decision", decision),
                             ("reason", reason), ("detector", detector.name),
                             ("detector_version", detector.version), ("image", scored.image),
                             ("width", scored.width), ("height", scored.height),
                             ("storage", scored.storage), ("error", error)):
                rows[col].append(val)
            done_since += 1
            if progress is not None and done_since >= 16:
                progress(done_since)
                done_since = 0
        if progress is not None and done_since:
            progress(done_since)
    except BaseException:
        for w in (kept_w, rej_w):
            if w is not None:
                w.close()
        for key in ("kept", "rejected", "scores"):  # a failed shard leaves no partial files
            _tmp(paths[key], rid).unlink(missing_ok=True)
        raise
    for w in (kept_w, rej_w):
        if w is not None:
            w.close()
    table = pa.table({
        "key": pa.array(rows["key"], pa.string()),
        "score": pa.array(rows["score"], pa.float64()),
        "decision": pa.array(rows["decision"], pa.string()),
        "reason": pa.array(rows["reason"], pa.string()),
        "detector": pa.array(rows["detector"], pa.string()),
        "detector_version": pa.array(rows["detector_version"], pa.string()),
        "image": pa.array(rows["image"], pa.string()),
        "width": pa.array(rows["width"], pa.int32()),
        "height": pa.array(rows["height"], pa.int32()),
        "storage": pa.array(rows["storage"], pa.string()),
        "error": pa.array(rows["error"], pa.string()),
    })
    try:
        pq.write_table(table, _tmp(paths["scores"], rid))
        outputs = {"scores": file_digest(_tmp(paths["scores"], rid))}
        for key, w in (("kept", kept_w), ("rejected", rej_w)):
            if w is not None:
                outputs[key] = {"size": w.size, "sha256": w.sha256}
        check_still_owner(options)
    except BaseException:
        for key in ("kept", "rejected", "scores"):
            _tmp(paths[key], rid).unlink(missing_ok=True)
        raise
    for key in ("kept", "rejected", "scores"):
        if key in outputs:
            os.replace(_tmp(paths[key], rid), paths[key])
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
        "options": options.fingerprint(),
        "detector_version": detector.version,
        "input": {"size": identity["size"], "mtime_ns": identity["mtime_ns"]},
        "outputs": outputs,
    }
    tmp_marker = _tmp(paths["marker"], rid)
    try:
        tmp_marker.write_text(json.dumps(record, indent=1, sort_keys=True))
        check_still_owner(options)
    except BaseException:
        tmp_marker.unlink(missing_ok=True)
        raise
    os.replace(tmp_marker, paths["marker"])
    return record


_STATUS_OF_REASON = {"decode_error": "decode_error", "no_image": "no_image",
                     "score_error": "score_error"}


def precomputed_scores(samples, scores_path: Path):
    """Pair samples with the rows of an earlier pass's scores file (same shard, same order)."""
    table = pq.read_table(scores_path).to_pylist()
    it = iter(table)
    for sample in samples:
        row = next(it, None)
        if row is None or row["key"] != sample.key:
            raise RuntimeError(f"{scores_path} does not match the shard (at key {sample.key!r}); "
                               "the shard changed since it was scored")
        score = row["score"]
        yield sample, Scored(score=float("nan") if score is None else score, image=row["image"],
                             error=row["error"], status=_STATUS_OF_REASON.get(row["reason"], "ok"),
                             width=row["width"], height=row["height"],
                             storage=row.get("storage") or "",  # scores files written before storage was recorded lack it
                             n_images=0 if row["reason"] == "no_image" else 1)


def filter_task(task: tuple[str, FilterOptions], detector, progress=None) -> dict:
    """Engine task function for ``filter``: ``task`` is ``(shard, options)``."""
    shard, options = task
    return process_shard(shard, options, detector, progress)
