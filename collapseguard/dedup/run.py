"""``run_dedup``: near-duplicate groups over files, folders and shards, each ranked by the comparator.

Inputs are what ``score`` reads: image files, folders, shards and Parquet files (a row's key is
the one ``score`` gives it: its id column, else its row index). Two passes:

1. Fingerprint (resumable): every image is read as ``score`` reads it (the same input expansion
   and tasks: ``scoring.run.plan_score_tasks`` and ``score_task``) and decoded only as far as
   the fingerprints need (``reduced_for_fingerprints``: a JPEG at up to 1/8 scale, luma only),
   and ``FingerprintOnly`` gives its pHash and thumbnail. A shard with a sample of several images is
   described in full here (the sample's image is its most degraded one, which only the full
   description tells). A task's rows are kept under ``DIR/.parts/`` as soon as it completes,
   named by the task and its inputs' identity, so a run that was stopped picks up where it was.
2. Group (in memory): ``groups.group_ids`` over the fingerprints.
3. Describe the grouped images (resumable): the images in a group, and only those, are read
   again and described by the comparator (cnn score and comparison features), each task's rows
   kept under ``DIR/.parts/full/``. An image the comparator cannot describe leaves the grouping,
   which is made again (until every grouped image is described).
4. Decide: in each group the comparator ranks the copies (``fit.group_p_worse``), a monochrome
   copy after every colour copy (``colour.lost_colour``) and a sample ``filter`` sets aside
   whatever its score after both (``set_aside``); the least degraded is kept, unless a larger
   copy is one the comparator cannot tell from it (``TIE``): then the largest such copy is.
   Another copy is a ``degraded_copy`` when P(it is more degraded than the least degraded one)
   is above the level.
   Singles are never described: their ``cnn`` is empty (NaN).
5. Score each group's kept copy with the default no-reference detector (``kept_scores``), so
   that ``filter --groups`` never rejects a picture's other copies for a kept copy it rejects;
   and record each shard's and Parquet file's size and SHA-256 (``source_size``,
   ``source_sha256``), which ``filter --groups`` checks its inputs against.

Outputs: ``DIR/groups.parquet``, one row per image (per sample of a shard) in input order, and
``DIR/summary.json``, each written whole or not at all. Their bytes depend only on the inputs and
the settings, so a resumed run writes the same files as an uninterrupted one.

``decision``/``reason`` of a row:
- ``keep``/``least_degraded``: the copy the group keeps (``rank`` 0);
- ``keep``/``larger_copy``: the copy the group keeps (``rank`` 0) in place of the least degraded
  one, which the comparator cannot tell from it (``p_worse`` at most ``TIE``) and which has
  fewer pixels (a reduced or cropped copy), when it holds fine detail at its own size (not an
  enlargement: ``larger_equal_copy``);
- ``keep``/``duplicate``: another copy, not shown to be worse (``filter --drop-duplicates`` drops it);
- ``degraded_copy``/``degraded_copy``: a copy more degraded than the kept one (``p_worse`` > level);
- ``degraded_copy``/``lost_colour``: a monochrome copy in a group that keeps a colour copy
  (``dedup.colour``; ranked after every colour copy, whatever its ``p_worse``);
- ``single``/``single``: no near-duplicate found (the no-reference filter decides);
- ``single``/``not_fingerprinted``: no image could be decoded (``error`` says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from collapseguard.dedup.colour import group_chroma, lost_colour, split_colour_variants
from collapseguard.dedup.describe import (
    CNN_BATCH,
    RungDescriber,
    as_size_map,
    described_rungs,
    group_rungs,
    rungs_by_size,
    size_rungs,
    torch_threads,
)
from collapseguard.dedup.groups import GroupingParams, framed_apart, group_ids, narrower
from collapseguard.dedup.kept_scores import kept_copy_scores, source_digest, source_digests
from collapseguard.detectors.base import DetectorError
from collapseguard.detectors.compare import (
    FEATURE_COLUMNS,
    HASH_COLUMNS,
    LAYOUT_BYTES,
    LAYOUT_COLUMNS,
    THUMB_BYTES,
    THUMB_COLUMNS,
    WINDOW_HASH_COLUMNS,
    WINDOW_THUMB_COLUMNS,
    FingerprintOnly,
    group_utilities,
    load_weights,
    unpack_int8,
    unpack_thumbnails,
)
from collapseguard.detectors.fingerprint import (
    FINGERPRINT_VERSION,
    REDUCED_SIDE,
    WINDOWS,
)
from collapseguard.detectors.pair_features import FEATURES, SCALES
from collapseguard.engines import LocalEngine, make_engine
from collapseguard.images import decode_reduced
from collapseguard.io.atomic import replaced_when_done
from collapseguard.io.parse import basename_of, strip_suffix
from collapseguard.errors import CollapseguardError
from collapseguard.io.terminal import printable
from collapseguard.io.urls import identity
from collapseguard.scoring.progress import progress_bar
from collapseguard.scoring.run import plan_score_tasks, score_task

DETECTOR = "compare"
DETECTOR_KWARGS = (("fingerprints", True),)
FINGERPRINT_KWARGS = (("fingerprints", "only"),)
OUTPUT_COLUMNS = ("source", "key", "group", "rank", "decision", "p_worse", "reason", "shard",
                  "row", "source_size", "source_sha256", "cnn", "width", "height", "storage",
                  "image", "error", "kept_score", "kept_detector")


def describe_task(task: tuple, detector, progress=None, decode=None, fingerprints: bool = True) -> dict:
    """Engine task: ``score_task`` with the ``compare`` detector (or ``FingerprintOnly``, and
    ``decode``), its rows packed into arrays (the hash as uint64, the thumbnail as int8, the
    features as float32; ``full``: the row has the cnn score and the features). Without
    ``fingerprints`` (a ``RungDescriber``: pass 3) a row is described without them."""
    # shards unhashed: the parent hashes each source once for ``source_sha256``
    rows = score_task(task, detector, progress, decode, set_aside=True, digest=False)
    n = len(rows)
    out = {
        "source": [str(r["source"]) for r in rows],
        "key": [str(r["key"]) for r in rows],
        "error": [str(r.get("error") or "") for r in rows],
        # filter rejects such a sample whatever its score: never a group's kept copy while
        # another copy is not set aside (its copies would all be lost to the group rule)
        "set_aside": [str(r.get("set_aside") or "") for r in rows],
        "storage": [str(r.get("storage") or "") for r in rows],
        "image": [str(r.get("image") or "") for r in rows],
        "width": np.array([r.get("width") or 0 for r in rows], np.int32),
        "height": np.array([r.get("height") or 0 for r in rows], np.int32),
        "cnn": np.array([r.get("cnn", np.nan) for r in rows], np.float64),
        "hash": np.zeros(n, np.uint64),
        "ok": np.zeros(n, bool),
        "full": np.zeros(n, bool),
        "thumb": np.zeros((n, THUMB_BYTES), np.int8),
        # the central windows' (``fingerprint.WINDOWS``): what finds a cropped copy
        "whash": np.zeros((n, len(WINDOWS)), np.uint64),
        "wthumb": np.zeros((n, len(WINDOWS), THUMB_BYTES), np.int8),
        "features": np.full((n, len(FEATURE_COLUMNS)), np.nan, np.float32),
        # fine detail at the image's own size (``pair_features.top_octave``): the larger-copy rule
        "octave": np.array([r.get("octave", np.nan) for r in rows], np.float32),
        # its colour once chroma noise is averaged out (``pair_features.coarse_chroma``): the colour rule
        "chroma": np.array([(r.get("colour_sat", np.nan), r.get("colour_cast", np.nan)) for r in rows],
                           np.float32).reshape(n, 2),
        # its colours by place (``pair_features.colour_layout``; zeros where not described): the
        # colour-variant rule
        "layout": np.zeros((n, LAYOUT_BYTES), np.int8),
    }
    for i, r in enumerate(rows):
        if not np.isfinite(r.get("score", np.nan)):
            continue
        if fingerprints:
            hashes = [_hash_of(r, cols) for cols in (HASH_COLUMNS, *WINDOW_HASH_COLUMNS)]
            if any(h is None for h in hashes):
                continue
            out["hash"][i] = hashes[0]
            out["whash"][i] = hashes[1:]
            packed = np.array([[r.get(c, np.nan) for c in cols]
                               for cols in (THUMB_COLUMNS, *WINDOW_THUMB_COLUMNS)], np.float64)
            if not (np.isfinite(packed).all() and (packed >= 0).all() and (packed < 2 ** 48).all()):
                continue  # not the detector's packed thumbnails: not fingerprinted
            thumbs = unpack_thumbnails(packed)
            out["thumb"][i], out["wthumb"][i] = thumbs[0], thumbs[1:]
        out["ok"][i] = True
        if FEATURE_COLUMNS[0] in r:
            out["features"][i] = [r[c] for c in FEATURE_COLUMNS]
            out["full"][i] = True
        if LAYOUT_COLUMNS[0] in r:
            out["layout"][i] = unpack_int8(np.array([r[c] for c in LAYOUT_COLUMNS], np.float64), LAYOUT_BYTES)
    return out


def _hash_of(row: dict, columns: tuple[str, ...]) -> int | None:
    """The 64-bit hash a row holds as four 16-bit parts (None when a part is missing)."""
    h = 0
    for c in columns:
        p = row.get(c)
        if p is None or not np.isfinite(p):
            return None
        h = (h << 16) | int(p)
    return h


def _multi_image_samples(task: tuple) -> bool:
    """Does a shard task hold a sample of more than one image? (Nothing decoded; a local plain tar
    by its headers alone, other shards read through; a shard that cannot be read answers no, and
    its task reports why.)"""
    if task[0] != "shard":
        return False
    headers = _image_runs_by_headers(str(task[1]))
    if headers is not None:
        return headers
    from collapseguard.images import is_image_name
    from collapseguard.io.tar import ShardReader
    try:
        return any(sum(is_image_name(m.name) for m in s.members) > 1 for s in ShardReader(str(task[1])))
    except Exception:  # noqa: BLE001 - score_task reads it again and records the failure
        return False


def _image_runs_by_headers(path: str) -> bool | None:
    """For a local uncompressed tar: do two image members follow each other under one raw key
    (the members ``ShardReader`` makes one sample of, or more: never fewer)? Read from the member
    headers, the data seeked over. None when the shard is not such a tar or a header is damaged
    (then it is read through)."""
    import tarfile

    from collapseguard.images import is_image_name
    from collapseguard.io.tar import split_key
    from collapseguard.io.urls import local_path

    local = local_path(path)
    if local is None:
        return None
    try:
        with open(local, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tf:  # compressed: ReadError
            key, images = None, 0
            for info in tf:
                if info.isdir():
                    continue
                k = split_key(info.name)[0]
                if k != key:
                    key, images = k, 0
                images += is_image_name(info.name)
                if images > 1:
                    return True
            return False
    except Exception:  # noqa: BLE001 - compressed, damaged or unreadable: read through instead
        return None


def reduced_for_fingerprints(data: bytes):
    """``images.decode_reduced`` at the size the fingerprints reduce to: a JPEG decoded at up to
    1/8 scale, luma only (its fingerprints nearly those of the full decoding)."""
    return decode_reduced(data, REDUCED_SIDE)


def fingerprint_task(task: tuple, detector, progress=None) -> dict:
    """Engine task of pass 1: ``describe_task`` with ``FingerprintOnly`` on reduced decodings
    (``reduced_for_fingerprints``), or with the full comparator for a shard holding a sample of
    several images."""
    if isinstance(detector, FingerprintOnly):
        if _multi_image_samples(task):
            return describe_task(task, detector.full(), progress)
        return describe_task(task, detector, progress, reduced_for_fingerprints)
    return describe_task(task, detector, progress)


def kept_score_task(task: tuple, detector, progress=None) -> dict:
    """Engine task of the kept-copy pass: the task's samples (a ``_sub_task``) scored by
    ``detector`` (the default no-reference detector), decoded in full as ``score`` decodes them,
    ``describe.CNN_BATCH`` images a call (on a CPU a cnn's cost per image grows with the batch):
    ``{"key", "image", "score"}`` per row. A sample of several images scores as ``filter`` scores
    it, the highest score of its images (``image``: that image, which need not be the one the
    comparator described the sample by)."""
    import copy

    detector = copy.copy(detector)  # the same network, scored in small batches
    detector.batch_size = CNN_BATCH
    rows = score_task(task, detector, progress, set_aside=True, digest=False)
    return {"key": [str(r["key"]) for r in rows], "image": [str(r.get("image") or "") for r in rows],
            "score": np.array([r.get("score", np.nan) for r in rows], np.float64)}


def score_rows_on(desc: dict, engine: str, workers: int, runner=None, threads: int | None = 1,
                  quiet: bool = True):
    """``kept_scores.kept_copy_scores``' ``score_rows``: the rows read again from their tasks
    (``_sub_task``) and scored by the default detector on the engine (its workers, in parallel;
    ``runner``: the engine to run on, None: a new one; ``threads``: torch's threads when this
    process scores, as in pass 3, so that its scores are the workers' to the last bit; a progress
    bar unless ``quiet``, as the other passes, whose kept worker pool it then reuses). A task
    whose rows do not come back as the ones asked for (their keys, in order: an input changed
    since) leaves them unread."""
    from collapseguard.detectors import DEFAULT_DETECTOR

    def score_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        jobs, start = [], 0
        for task, _, part in desc["tasks"]:
            n = len(part["key"])
            mine = rows[(rows >= start) & (rows < start + n)]
            if mine.size:
                jobs.append((_sub_task(task, part, mine - start), mine))
            start += n
        where = {int(r): k for k, r in enumerate(rows)}
        scores = np.full(len(rows), np.nan)
        unread = np.ones(len(rows), bool)

        def on_done(k, got, err):
            own = jobs[k][1]
            # keys alone: a sample of several images comes back named by the image the cnn
            # scored highest, which need not be the comparator's ``image``
            if err is None and got is not None and list(got["key"]) == [desc["key"][r] for r in own]:
                at = [where[int(r)] for r in own]
                scores[at] = got["score"]
                unread[at] = False

        inline = workers <= 1 and engine == "local"
        bar = progress_bar(None, desc="score kept copies", unit="img", quiet=quiet)
        with torch_threads(threads if inline else None):
            (runner or make_engine(engine, workers, None)).run(
                kept_score_task, [j[0] for j in jobs], DEFAULT_DETECTOR, (),
                (bar.update if not quiet else None), on_done)
        bar.close()
        return scores, unread

    return score_rows


def describe_rungs_task(job: tuple, detector, progress=None) -> dict:
    """Engine task of pass 3: ``job`` is ``(task, rungs)``; its images described by the comparator
    ``detector`` at their rungs only (``describe.RungDescriber``; ``rungs``: ``rungs_by_size``'s
    list, None: every rung)."""
    task, rungs = job
    return describe_task(task, RungDescriber(detector, as_size_map(rungs)), progress, fingerprints=False)


class Wanted:
    """``select(source, key, nth)`` of a shard or Parquet task: the samples named by (key, nth)."""

    def __init__(self, wanted):
        self.wanted = frozenset(wanted)

    def __call__(self, source, key, nth=0) -> bool:
        return (str(key), int(nth)) in self.wanted


def _sub_task(task: tuple, part: dict, rows: np.ndarray) -> tuple:
    """The task that reads again only the rows ``rows`` (indices into the task's part); a shard's
    or Parquet file's rows named by (key, nth), nth its earlier repeats in the part
    (``readback.repeats``)."""
    if task[0] == "files":
        return ("files", [task[1][j] for j in rows])
    # imported here: the workers import this module, and only the parent makes sub-tasks
    from collapseguard.scoring.readback import repeats

    nth = repeats(part["key"])
    return (task[0], task[1], Wanted((part["key"][j], int(nth[j])) for j in rows))


def task_name(task: tuple, version: str, digest: str = "") -> str:
    """The name of a task's part: its inputs, their identity (size, modification time; a shard's
    or Parquet file's ``digest`` too, the SHA-256 of its bytes, so that one rewritten in place
    with its size and time kept is read again, not taken from the parts) and the version of the
    descriptions (``Comparator.description_version``)."""
    if task[0] == "shard":
        ident = [[str(task[1]), _ident(str(task[1])), digest]]
    elif task[0] == "parquet":  # the file and the image column asked for (None: found)
        name, column = task[1]
        ident = [[str(name), column, _ident(str(name)), digest]]
    else:
        ident = [[f.path, f.source, f.key, _ident(f.path)] for f in task[1]]
    blob = json.dumps([task[0], ident, version], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _task_input(task: tuple) -> str:
    """The input a task reads, as its failure names it."""
    if task[0] == "shard":
        return str(task[1])
    return str(task[1][0]) if task[0] == "parquet" else "image files"


def _task_stem(task: tuple) -> str:
    """The ``shard`` of a task's rows: a shard's or Parquet file's stem, as ``filter`` names its
    outputs (and ``filter --groups`` finds its rows by); "" for image files."""
    if task[0] in ("shard", "parquet"):
        return strip_suffix(basename_of(_task_input(task)))
    return ""


def _ident(path: str) -> dict:
    try:
        d = identity(path)
    except (OSError, ValueError):
        return {}
    return {k: d[k] for k in ("size", "mtime_ns", "etag", "last_modified", "pipe") if k in d}


def _save_part(path: Path, part: dict) -> None:
    with replaced_when_done(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, source=np.array(part["source"], dtype=str), key=np.array(part["key"], dtype=str),
                     error=np.array(part["error"], dtype=str), storage=np.array(part["storage"], dtype=str),
                     image=np.array(part["image"], dtype=str),
                     set_aside=np.array(part["set_aside"], dtype=str),
                     **{k: part[k] for k in ("width", "height", "cnn", "hash", "ok", "full", "thumb",
                                             "whash", "wthumb", "features", "octave", "chroma", "layout")})


def _load_part(path: Path) -> dict | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            part = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError):
        return None
    if "image" not in part:  # kept before the member's name was: "" (the first image)
        part["image"] = np.full(len(part["key"]), "", dtype=str)
    if "full" not in part:  # kept when every image was described in full
        part["full"] = np.ones(len(part["key"]), bool)
    if "set_aside" not in part or "whash" not in part:  # kept before set-aside samples or
        return None  # the windows' fingerprints were: described afresh
    if "octave" not in part:  # kept before top_octave was
        if part["full"].any():  # its descriptions lack what the larger-copy rule reads: afresh
            return None
        part["octave"] = np.full(len(part["key"]), np.nan, np.float32)
    if "chroma" not in part:  # kept before coarse_chroma was
        if part["full"].any():  # its descriptions lack what the colour rule reads: afresh
            return None
        part["chroma"] = np.full((len(part["key"]), 2), np.nan, np.float32)
    if "layout" not in part or part["layout"].shape[1:] != (LAYOUT_BYTES,):  # kept before colour_layout was (or before its luma)
        if part["full"].any():  # its descriptions lack what the colour-variant rule reads: afresh
            return None
        part["layout"] = np.zeros((len(part["key"]), LAYOUT_BYTES), np.int8)
    for k in ("source", "key", "error", "storage", "image", "set_aside"):
        part[k] = [str(x) for x in part[k]]
    return part


def _part_of(task: tuple, part: dict | None) -> dict | None:
    """A kept part, if it describes the task's own samples: a part file holds sources (shards,
    ``pipe:`` commands, URLs) that the gallery reads again, so one that names any other source
    (an --out folder from elsewhere) is described afresh, never trusted."""
    if part is None:
        return None
    if task[0] == "files":
        own = {(f.source, f.key) for f in task[1]}
        ok = all(sk in own for sk in zip(part["source"], part["key"]))
    else:
        ok = all(src == _task_input(task) for src in part["source"])
    return part if ok else None


def describe_inputs(inputs: Sequence[str], out_dir: str | Path, *, workers: int = 1,
                    quiet: bool = False, detector_obj=None, engine: str = "local",
                    image_column: str | None = None, runner=None) -> tuple[dict, list[str], int]:
    """Pass 1: every image fingerprinted (on ``engine``: ``"local"`` or ``"ray"``), parts kept under
    ``out_dir/.parts``; returns (the parts concatenated in input order, failures, parts reused).
    ``image_column`` names the image column of Parquet inputs (None: found as ``score`` finds it);
    ``detector_obj`` is the full comparator (with fingerprints) to reuse in this process;
    ``runner`` an engine to run on instead of a new one (``make_engine``'s)."""
    unread: list[tuple[str, str]] = []
    tasks = plan_score_tasks(inputs, None, unread, image_column=image_column)
    det = FingerprintOnly(full=detector_obj)
    version = f"{det.description_version}/{FINGERPRINT_VERSION}"
    if workers > 1 or engine != "local":
        det = None  # each worker loads its own
    parts_dir = Path(out_dir, ".parts")
    parts_dir.mkdir(parents=True, exist_ok=True)
    # each shard's and Parquet file's bytes hashed once: what names its part, and the table's
    # source_sha256 (``kept_scores.source_digests``)
    digests = {_task_input(t): source_digest(_task_input(t)) for t in tasks if t[0] in ("shard", "parquet")}
    names = [task_name(t, version, digests.get(_task_input(t), (None, ""))[1]) for t in tasks]
    parts: list[dict | None] = [_part_of(t, _load_part(parts_dir / f"{n}.npz"))
                                if (parts_dir / f"{n}.npz").exists() else None
                                for t, n in zip(tasks, names)]
    reused = sum(p is not None for p in parts)
    todo = [i for i, p in enumerate(parts) if p is None]
    failures = [f"{path}: not read: {why}" for path, why in unread]
    bar = progress_bar(None, desc="describe", unit="img", quiet=quiet)

    def on_done(k, part, err):
        i = todo[k]
        if err is not None:
            failures.append(f"{_task_input(tasks[i])}: {err}")
            return
        _save_part(parts_dir / f"{names[i]}.npz", part)
        parts[i] = part

    if todo:
        (runner or make_engine(engine, workers, det)).run(
            fingerprint_task, [tasks[i] for i in todo], DETECTOR, FINGERPRINT_KWARGS,
            (bar.update if not quiet else None), on_done)
    bar.close()
    done = [p for p in parts if p is not None]
    merged = _merged(done)
    merged["shard"] = [_task_stem(t) for p, t in zip(parts, tasks) if p is not None
                       for _ in p["source"]]
    # a Parquet file's rows, each its row index (a task reads every row of its file, in order)
    merged["row"] = [j if t[0] == "parquet" else None for p, t in zip(parts, tasks) if p is not None
                     for j in range(len(p["source"]))]
    # the later passes read only a part's keys: its fingerprints are in ``merged`` (at 1,000,000
    # images the thumbnails alone are about 1 GB, held once)
    merged["tasks"] = [(t, n, {"key": p["key"]}) for p, t, n in zip(parts, tasks, names) if p is not None]
    merged["digests"] = digests
    return merged, failures, reused


def _merged(done: list[dict]) -> dict:
    merged: dict = {}
    for k in ("source", "key", "error", "storage", "image", "set_aside"):
        merged[k] = [x for p in done for x in p[k]]
    for k, shape, dt in (("width", (), np.int32), ("height", (), np.int32), ("cnn", (), np.float64),
                         ("hash", (), np.uint64), ("ok", (), bool), ("full", (), bool),
                         ("thumb", (THUMB_BYTES,), np.int8),
                         ("whash", (len(WINDOWS),), np.uint64),
                         ("wthumb", (len(WINDOWS), THUMB_BYTES), np.int8),
                         ("features", (len(FEATURE_COLUMNS),), np.float32), ("octave", (), np.float32),
                         ("chroma", (2,), np.float32), ("layout", (LAYOUT_BYTES,), np.int8)):
        arrs = [p[k] for p in done]
        merged[k] = np.concatenate(arrs) if arrs else np.zeros((0, *shape), dt)
    return merged


def describe_grouped(desc: dict, need: np.ndarray, out_dir: str | Path, failures: list[str], *,
                     rungs: np.ndarray | None = None, workers: int = 1, quiet: bool = False,
                     detector_obj=None, engine: str = "local", threads: int | None = 1,
                     runner=None) -> None:
    """Pass 3: the rows ``need`` (a mask over ``desc``) described by the comparator, in place
    (``cnn``, ``features``, ``full``; a row it cannot describe loses ``ok`` and gets its
    ``error``). ``rungs`` gives each row the rung of ``SCALES`` to describe it at (-1, or None
    for every row: all rungs; rows of one size in one task get the rungs of all of them); a row
    described before keeps its cnn score and gains the rungs it lacked. Each task's rows are
    kept under ``out_dir/.parts/full/``. ``threads``: torch's threads while this process
    describes (workers == 1; worker processes split the cores); ``runner``: the engine to run
    on (None: a new one)."""
    from collapseguard.detectors.compare import Comparator

    det = detector_obj if detector_obj is not None else Comparator(fingerprints=True)
    version = det.description_version
    inline = workers <= 1 and engine == "local"
    if not inline:
        det = None
    full_dir = Path(out_dir, ".parts", "full")
    full_dir.mkdir(parents=True, exist_ok=True)
    jobs = []  # ((sub task, rungs), part name, global rows)
    start = 0
    for task, name, part in desc["tasks"]:
        n = len(part["key"])
        rows = np.flatnonzero(need[start: start + n])
        if rows.size:
            g = start + rows
            job_rungs = None if rungs is None else rungs_by_size(desc["height"][g], desc["width"][g], rungs[g])
            blob = json.dumps([name, version, rows.tolist()] + ([] if rungs is None else ["rungs", job_rungs]))
            jobs.append(((_sub_task(task, part, rows), job_rungs),
                         hashlib.sha256(blob.encode()).hexdigest()[:24], start + rows))
        start += n

    def apply(job, got: dict | None, err: str | None):
        _, _, rows = job
        if got is None or len(got["key"]) != rows.size or list(got["key"]) != [desc["key"][r] for r in rows]:
            why = err or "the images read again are not the ones fingerprinted"
            failures.append(f"{_task_input(job[0][0])}: not described: {why}")
            desc["ok"][rows] = False
            desc["full"][rows] = True
            for r in rows:
                desc["error"][r] = desc["error"][r] or f"not described: {why}"
            return
        before = desc["full"][rows]
        desc["cnn"][rows] = np.where(before, desc["cnn"][rows], got["cnn"])
        old = desc["features"][rows]
        desc["features"][rows] = np.where(np.isnan(got["features"]), old, got["features"])
        desc["octave"][rows] = np.where(np.isnan(got["octave"]), desc["octave"][rows], got["octave"])
        desc["chroma"][rows] = np.where(np.isnan(got["chroma"]), desc["chroma"][rows], got["chroma"])
        desc["layout"][rows] = got["layout"]
        desc["full"][rows] = True
        bad = ~got["ok"]
        desc["ok"][rows[bad]] = False
        for r, e in zip(rows[bad], np.asarray(got["error"], dtype=object)[bad]):
            desc["error"][r] = str(e)

    todo = []
    for job in jobs:
        path = full_dir / f"{job[1]}.npz"
        got = _load_part(path) if path.exists() else None
        if got is None:
            todo.append(job)
        else:
            apply(job, got, None)
    if not todo:
        return
    bar = progress_bar(None, desc="describe groups", unit="img", quiet=quiet)

    def on_done(k, got, err):
        if err is None:
            _save_part(full_dir / f"{todo[k][1]}.npz", got)
        apply(todo[k], got, err)

    with torch_threads(threads if inline else None):
        (runner or make_engine(engine, workers, det)).run(
            describe_rungs_task, [j[0] for j in todo], DETECTOR, DETECTOR_KWARGS,
            (bar.update if not quiet else None), on_done)
    bar.close()


#: P(worse than the least degraded copy) at or under which the comparator cannot tell two copies
#: apart, and the larger is kept: crops of 1-2% a side, 60% reductions and JPEG q75-q92 re-saves
#: of the bundled photos lie at 0.50-0.71 (``benchmarks/dedup_scale.py --copy-kinds``); the
#: level that marks a degraded copy is far above (0.958)
TIE = 0.75


def group_members(labels: np.ndarray) -> list[np.ndarray]:
    """The rows of each group of ``labels`` (-1: no group), a group's rows in row order, the
    groups in the order of their labels."""
    grouped = np.flatnonzero(labels >= 0)
    order = grouped[np.argsort(labels[grouped], kind="stable")]
    return np.split(order, np.flatnonzero(np.diff(labels[order])) + 1) if order.size else []


def split_colour_groups(desc: dict, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` with each group cut into its colour variants (``colour.split_colour_variants``:
    one layout in other colours is another picture, which the luma fingerprints cannot tell):
    a set of two or more copies stays a group (its id its first row), a set of one is a single.
    Also returns the rows of the groups that were cut."""
    out = labels.copy()
    cut: list[int] = []
    for members in group_members(labels):
        sets = split_colour_variants(members, desc["layout"])
        if len(sets) == 1:
            continue
        for s in sets:
            out[s] = s.min() if s.size > 1 else -1
        cut += members.tolist()
    return out, np.array(sorted(cut), np.int64)


def decide_groups(desc: dict, labels: np.ndarray, w: np.ndarray, s: np.ndarray, level: float
                  ) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """Pass 4's decisions: ``(rank, p_worse, decision, reason)`` per row.

    A copy that is a crop of another (``groups.narrower``: by about 5% a side or more) ranks after
    the copies of its tier that are not, so the kept copy is of the widest framing. ``p_worse``
    is relative to the least degraded copy of the row's framing (NaN for that copy): the copies
    framed as the kept one (not ``groups.framed_apart`` from it) are compared with the
    comparator's least degraded copy of them; the others, a crop of the picture and its copies,
    with the least degraded copy framed as they are (``framings``), which is ``keep`` with
    reason ``other_framing``. The comparator's features read the picture's content as well as
    its damage, and a crop shows less of the picture: cropped by 5-10% a side, 1-2 of the 18
    bundled photos' crops read above the level against their original. So a crop is a
    ``degraded_copy`` only beside a less degraded copy of its own framing."""
    # imported here: worker processes import this module, and need not import scipy.stats
    from collapseguard.dedup.fit import group_p_worse

    n = len(labels)
    rank = np.zeros(n, np.int32)
    p_worse = np.full(n, np.nan)
    decision = ["single"] * n
    reason = ["single" if ok else "not_fingerprinted" for ok in desc["ok"]]
    feats = desc["features"].astype(np.float64).reshape(n, len(SCALES), len(FEATURES))
    coarse = desc.get("chroma")  # the colour rule's coarse_chroma (None: read from ``features``)
    for members in group_members(labels):
        descs = [{"cnn": float(desc["cnn"][m]), "ladder": feats[m]} for m in members]
        grey = lost_colour(group_chroma(feats[members]), None if coarse is None else coarse[members])
        aside = np.array([bool(desc["set_aside"][m]) for m in members])
        # tiers: copies filter keeps on their merits, then grey ones, then those it sets aside;
        # in each, the widest framing first (a crop is never kept over the picture it shows part of)
        crop = narrower(desc["thumb"], desc.get("wthumb"), members)
        tiers = 2 * (grey + 2 * aside) + crop
        u = group_utilities(descs, w, s)
        best, r, p = group_p_worse(u, last=tiers)
        kept = larger_equal_copy(best, p, tiers, desc["width"][members].astype(np.int64)
                                 * desc["height"][members].astype(np.int64), desc["octave"][members])
        if kept != best:  # the kept copy first, the others in the comparator's order
            r = np.where(r < r[kept], r + 1, r)
            r[kept] = 0
        anchor = framings(desc["thumb"], desc.get("wthumb"), members, kept, r)
        ref = np.where(anchor == kept, best if anchor[best] == kept else kept, anchor)
        p = 1.0 / (1.0 + np.exp(-np.clip(u - u[ref], -60, 60)))  # against its framing's best copy
        p[ref == np.arange(len(members))] = np.nan
        for j, m in enumerate(members):
            rank[m] = r[j]
            p_worse[m] = p[j]
            if j == kept:
                decision[m], reason[m] = "keep", "least_degraded" if j == best else "larger_copy"
            else:
                if grey[j]:
                    decision[m], reason[m] = "degraded_copy", "lost_colour"
                elif anchor[j] == j:
                    decision[m], reason[m] = "keep", "other_framing"
                elif p[j] > level:
                    decision[m], reason[m] = "degraded_copy", "degraded_copy"
                else:
                    decision[m], reason[m] = "keep", "duplicate"
    return rank, p_worse, decision, reason


def framings(thumbs: np.ndarray, window_thumbs: np.ndarray | None, members: np.ndarray, kept: int,
             rank: np.ndarray) -> np.ndarray:
    """For each member of a group (indices into ``members``), the member its decision is relative
    to: ``kept`` for those not ``framed_apart`` from the kept copy; for the others, in ``rank``
    order, the first left opens a framing of its own, joined by every member left that is not
    framed apart from it."""
    anchor = np.full(len(members), kept, np.int64)
    left = np.flatnonzero(framed_apart(thumbs, window_thumbs, members, members[kept]))
    left = left[np.argsort(rank[left], kind="stable")]
    while left.size:
        a = left[0]
        same = ~framed_apart(thumbs, window_thumbs, members[left], members[a])
        same[0] = True
        anchor[left[same]] = a
        left = left[~same]
    return anchor


#: how much less fine detail at its own size (``pair_features.top_octave``) a larger copy may hold
#: than the least degraded one and still be kept as the same picture at more pixels: of the
#: bundled photos and library samples (22 pictures), a 60% Lanczos reduction reads at most 0.44
#: over its original, a 1-3% crop 0.02, and a 150% bicubic enlargement more than 0.5 under its
#: original in 18 (``benchmarks/dedup_scale.py --copy-kinds [--pictures samples]``). Keeping a
#: reduction loses detail and keeping an enlargement does not, so the margin spares reductions.
OCTAVE_MARGIN = 0.5


def larger_equal_copy(best: int, p: np.ndarray, tiers: np.ndarray, pixels: np.ndarray,
                      octave: np.ndarray | None = None) -> int:
    """The member a group keeps: ``best`` (the comparator's least degraded), or, when a copy of
    its tier that the comparator cannot tell from it (``p`` at most ``TIE``) has more than 1%
    more pixels and holds detail at its own size (its ``octave`` at most ``OCTAVE_MARGIN`` under
    ``best``'s, or either unknown: an enlargement holds no detail its original lacks), the one
    with the most pixels (ties: the lower ``p``)."""
    ok = (p <= TIE) & (tiers == tiers[best]) & (pixels > pixels[best] * 1.01)  # p is NaN for best itself
    if octave is not None and np.isfinite(octave[best]):
        ok &= ~(octave < octave[best] - OCTAVE_MARGIN)  # NaN: unknown, not refused
    cand = np.flatnonzero(ok)
    if cand.size == 0:
        return best
    return int(cand[np.lexsort((p[cand], -pixels[cand]))[0]])


class DedupBusy(CollapseguardError):
    """Another dedup run holds the output folder."""


#: what a run writes into its output folder (the parts aside): removed when a run starts, so that
#: a run that stops leaves no table, summary or gallery of an earlier run beside its parts
OUTPUTS = ("groups.parquet", "summary.json", "groups.html")


@contextlib.contextmanager
def out_lock(out_dir: Path):
    """Hold ``<out>/.lock`` (``flock``) for a run: a second run on the same folder is refused at
    once instead of writing a table and a summary of other inputs over the first's."""
    if out_dir.is_symlink() and not out_dir.exists():  # mkdir would say only "File exists"
        import errno
        import os
        raise FileNotFoundError(errno.ENOENT, f"it is a broken link (to {printable(os.readlink(out_dir))})")
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "a") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            yield
            return
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DedupBusy(f"another dedup run is writing {printable(str(out_dir))} (its .lock is held): "
                            "wait for it, or choose another --out") from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def run_dedup(inputs: Sequence[str], out_dir: str | Path, *, workers: int = 1, quiet: bool = False,
              level: float | None = None, params: GroupingParams = GroupingParams(),
              weights: str | None = None, detector_obj=None, engine: str = "local",
              image_column: str | None = None, threads: int | None = 1, fresh: bool = False,
              lock: bool = True) -> dict:
    """Group, rank and decide; writes ``groups.parquet`` and ``summary.json``; returns the summary,
    with ``parts_reused`` and the wall ``seconds`` of each pass (``fingerprint``, ``group``,
    ``describe``, ``decide``), which the file leaves out (its bytes depend only on the inputs).
    ``threads``: torch's CPU threads for the comparator in this process (``workers`` 1; None:
    torch's own setting). Worker processes serve both passes (one pool, started once; a worker
    loads the comparator when its first grouped image comes). The run holds ``out_dir``'s lock
    (``out_lock``; ``lock=False``: the caller holds it, to write the gallery under it too) and
    first removes an earlier run's ``OUTPUTS``; ``fresh`` also its parts."""
    out_dir = Path(out_dir)
    with (out_lock(out_dir) if lock else contextlib.nullcontext()):
        if fresh:
            clear_parts(out_dir)
        for name in OUTPUTS:
            (out_dir / name).unlink(missing_ok=True)
        return _run_dedup_locked(inputs, out_dir, workers=workers, quiet=quiet, level=level, params=params,
                                 weights=weights, detector_obj=detector_obj, engine=engine,
                                 image_column=image_column, threads=threads)


def _run_dedup_locked(inputs, out_dir: Path, *, workers, quiet, level, params, weights, detector_obj,
                      engine, image_column, threads) -> dict:
    runner = LocalEngine(workers, keep_pool=True) if engine == "local" and workers > 1 else None
    try:
        return _run_dedup(inputs, out_dir, workers=workers, quiet=quiet, level=level, params=params,
                          weights=weights, detector_obj=detector_obj, engine=engine,
                          image_column=image_column, threads=threads, runner=runner)
    except KeyboardInterrupt:
        print(f"interrupted: what was described is kept in {printable(str(Path(out_dir, '.parts')))} "
              "(each task's part written whole); run the same command again to resume",
              file=sys.stderr, flush=True)
        raise
    finally:
        if runner is not None:
            runner.close()


def _run_dedup(inputs: Sequence[str], out_dir: str | Path, *, workers: int, quiet: bool,
               level: float | None, params: GroupingParams, weights: str | None, detector_obj,
               engine: str, image_column: str | None, threads: int | None, runner) -> dict:
    """``run_dedup`` on ``runner`` (an engine kept for both passes; None: one per pass)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t = load_weights(weights)
    if detector_obj is None and weights is not None:
        # pass 3 describes with the packaged comparator's cnn (the one its weights name): weights
        # fitted on another cnn (or on a ``cnn_mix``) would rank descriptions their model never saw
        fitted_on, own = t["meta"].get("cnn"), load_weights()["meta"].get("cnn")
        if fitted_on and fitted_on != own:
            raise DetectorError(f"comparator weights {weights} were fitted on cnn {fitted_on}, but dedup "
                                f"describes with the comparator's own cnn ({own}): give a detector_obj "
                                "that reads their cnn")
    shipped_level = float(t["meta"].get("level", "nan"))
    level = shipped_level if level is None else float(level)
    clock = time.perf_counter()
    seconds = dict.fromkeys(("fingerprint", "group", "describe", "decide"), 0.0)

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] += now - clock
        clock = now

    desc, failures, reused = describe_inputs(inputs, out_dir, workers=workers, quiet=quiet,
                                             detector_obj=detector_obj, engine=engine,
                                             image_column=image_column, runner=runner)
    ok = desc["ok"]
    lap("fingerprint")
    # the highest rung of SCALES each image reaches: from its size, or from the rungs of a full
    # description (every rung: ``all_rungs``); -1 where only a full description will tell
    all_rungs = desc["full"].copy()
    reach = size_rungs(desc["width"], desc["height"])
    asked = np.full(len(ok), -2, np.int64)  # the rung a row was last described at (-1: every rung)
    grouped_ok = None  # the ``ok`` the groups were last made from
    while True:  # group; describe the grouped images at their group's rung; again until all have it
        held = described_rungs(desc["features"])
        top = len(SCALES) - 1 - np.argmax(held[:, ::-1], axis=1)
        reach = np.where(all_rungs, np.where(held.any(axis=1), top, 0), reach)
        # a row described at a rung it does not reach is smaller than its size said
        reach[(asked >= 0) & ~held[np.arange(len(ok)), np.maximum(asked, 0)] & ~all_rungs] = -1
        if grouped_ok is None or not np.array_equal(grouped_ok, ok):  # the groups change only with ok
            idx = np.flatnonzero(ok)
            pick = (lambda a: a) if idx.size == len(ok) else (lambda a: a[idx])  # no copy when all ok
            sub_labels, stats = group_ids(pick(desc["hash"]), pick(desc["thumb"]), params,
                                          pick(desc["whash"]), pick(desc["wthumb"]))
            labels = np.full(len(ok), -1, np.int64)
            labels[idx[sub_labels >= 0]] = idx[sub_labels[sub_labels >= 0]]  # ids as rows of the table
            grouped_ok = ok.copy()
        target = group_rungs(labels, np.maximum(reach, 0))
        need = (labels >= 0) & ~held[np.arange(len(ok)), np.maximum(target, 0)]
        lap("group")
        if not need.any():
            break
        want = np.where(reach < 0, -1, target)
        describe_grouped(desc, need, out_dir, failures, rungs=want, workers=workers, quiet=quiet,
                         detector_obj=detector_obj, engine=engine, threads=threads, runner=runner)
        asked[need] = want[need]
        all_rungs |= need & (want < 0)
        lap("describe")
    labels, split = split_colour_groups(desc, labels)
    if split.size:  # the counts of what stays grouped
        stats = {**stats, "groups": int(np.unique(labels[labels >= 0]).size), "grouped": int((labels >= 0).sum())}
    rank, p_worse, decision, reason = decide_groups(desc, labels, t["w"], t["s"], level)
    for r in split[labels[split] < 0]:  # alone: a single that a copy of it in other colours had grouped
        reason[r] = "colour_variant"
    kept_score, kept_detector = kept_copy_scores(desc, labels, rank, image_column,
                                                 score_rows_on(desc, engine, workers, runner, threads, quiet))
    source_size, source_sha256 = source_digests(desc)
    import pyarrow as pa  # here, not at import: the engine's workers never write the table
    import pyarrow.parquet as pq

    width = max(6, len(str(len(ok))))
    group = [f"g{g:0{width}d}" if g >= 0 else "" for g in labels]
    table = pa.table({
        "source": pa.array(desc["source"], pa.string()),
        "key": pa.array(desc["key"], pa.string()),
        "group": pa.array(group, pa.string()),
        "rank": pa.array(rank, pa.int32()),
        "decision": pa.array(decision, pa.string()),
        "p_worse": pa.array(p_worse, pa.float64()),
        "reason": pa.array(reason, pa.string()),
        "shard": pa.array(desc["shard"], pa.string()),
        "row": pa.array(desc["row"], pa.int64()),
        "source_size": pa.array(source_size, pa.int64()),
        "source_sha256": pa.array(source_sha256, pa.string()),
        "cnn": pa.array(desc["cnn"], pa.float64()),
        "width": pa.array(desc["width"], pa.int32()),
        "height": pa.array(desc["height"], pa.int32()),
        "storage": pa.array(desc["storage"], pa.string()),
        "image": pa.array(desc["image"], pa.string()),
        "error": pa.array(desc["error"], pa.string()),
        "kept_score": pa.array(kept_score, pa.float64()),
        "kept_detector": pa.array(kept_detector, pa.string()),
    })
    with replaced_when_done(out_dir / "groups.parquet", suffix=".parquet") as tmp:
        pq.write_table(table, tmp)
    counts = {d: decision.count(d) for d in ("keep", "degraded_copy", "single")}
    summary = {
        "images": len(ok),
        "fingerprinted": int(ok.sum()),
        "groups": stats["groups"],
        "grouped": stats["grouped"],
        "described": int((desc["full"] & ok).sum()),
        "decisions": counts,
        "reasons": {r: reason.count(r) for r in sorted(set(reason))},
        "level": level,
        "level_guarantee": t["meta"].get("guarantee", "") if level == shipped_level else
        "a level given by hand: no calibrated guarantee",
        "comparator_weights_version": t["version"],
        # the cnn behind the table's ``cnn`` column: the comparator's (its own cnn, or the mix its
        # weights name), not the shipped detector's
        "comparator_cnn_version": (detector_obj.cnn.version if detector_obj is not None
                                   else t["meta"].get("cnn", "")),
        "grouping": params.as_dict(),
        "search": {k: stats[k] for k in ("candidate_pairs", "verified_pairs", "window_candidate_pairs",
                                         "window_verified_pairs", "left_medoid") if k in stats},
        "failures": failures,
    }
    with replaced_when_done(out_dir / "summary.json", suffix=".json") as tmp:
        Path(tmp).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    summary["parts_reused"] = reused
    lap("decide")
    summary["seconds"] = seconds
    return summary


def clear_parts(out_dir: str | Path) -> None:
    """Remove the kept parts (``--fresh``)."""
    parts = Path(out_dir, ".parts")
    for folder in (parts, parts / "full"):
        if folder.is_dir():
            for p in folder.glob("*.npz"):
                p.unlink()


def shared_stems(table: str) -> dict[str, list[str]]:
    """The stems of a groups table that name more than one source (``{stem: sources}``)."""
    import pyarrow.parquet as pq

    t = pq.read_table(table, columns=["shard", "source"])
    by: dict[str, set[str]] = {}
    for stem, source in set(zip(t.column("shard").to_pylist(), t.column("source").to_pylist())):
        if stem:
            by.setdefault(stem, set()).add(source)
    return {k: sorted(v) for k, v in sorted(by.items()) if len(v) > 1}


__all__ = ["OUTPUT_COLUMNS", "OUTPUTS", "DedupBusy", "clear_parts", "out_lock", "shared_stems", "decide_groups", "describe_inputs", "run_dedup"]
