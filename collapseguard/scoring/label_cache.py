"""Label images with any detector into a cached, resumable table (the teacher side of distillation).

``label_images(detector, items, cache_path)`` scores every image once per detector version and
remembers the result in ``cache_path`` (Parquet, or CSV when the name ends in ``.csv``), keyed by
the SHA-256 of the image's encoded bytes. Re-running with the same cache skips every image already
labelled, so a slow judge (a 7B VLM) can be stopped and resumed, and identical images (same bytes)
are scored once. Images are scored through the one scoring loop (``scoring.records``): decoded,
capped and batched as ``score`` and ``filter`` do.

Rows record a status: ``ok`` (finite score), ``nan`` (the detector could not score it, e.g. an
unparseable VLM answer — kept so a deterministic failure is not retried; pass ``retry_nan=True``
to try again), ``decode_error``, ``missing`` (file not found) or ``unreadable`` (the file could
not be read: permissions, an I/O error). Only ``ok`` rows carry a score.

A cache file belongs to one detector name + version; using it with another raises
:class:`~collapseguard.detectors.base.DetectorError` instead of mixing labels.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.detectors.base import Detector, DetectorError
from collapseguard.io.atomic import replaced_when_done
from collapseguard.scoring.records import score_records

CACHE_COLUMNS = ["key", "path", "score", "raw", "status", "detector", "detector_version"]


def image_key(data: bytes) -> str:
    """The identity of an image: SHA-256 hex digest of its encoded bytes."""
    return hashlib.sha256(data).hexdigest()


def _read_item(item) -> tuple[str, bytes | None, str]:
    """(path or '', bytes or None, status) for a path, bytes, or a mapping with 'path'/'data'."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return "", bytes(item), "ok"
    if isinstance(item, Mapping):
        path = str(item.get("path", "") or "")
        data = item.get("data", item.get("bytes"))
        if data is not None:
            return path, bytes(data), "ok"
        if not path:
            raise DetectorError("a record needs 'path' or 'data'")
        item = path
    if isinstance(item, (str, os.PathLike)):
        p = str(item)
        try:
            with open(p, "rb") as fh:
                return p, fh.read(), "ok"
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return p, None, "missing"
        except OSError:  # permissions, an I/O error: a row of its own, never the whole run
            return p, None, "unreadable"
    raise DetectorError(f"cannot label a {type(item).__name__}: pass paths, bytes or {{'path'|'data'}} records")


def read_cache(cache_path: str | os.PathLike) -> pd.DataFrame:
    """The cache table (empty with the right columns when the file does not exist)."""
    p = Path(cache_path)
    if not p.is_file():
        return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("score", "raw") else "object") for c in CACHE_COLUMNS})
    df = pd.read_csv(p, dtype={"key": str, "path": str, "status": str, "detector": str, "detector_version": str},
                     keep_default_na=False, na_values={"score": ["", "nan", "NaN"], "raw": ["", "nan", "NaN"]}) \
        if p.suffix.lower() == ".csv" else pd.read_parquet(p)
    missing = [c for c in CACHE_COLUMNS if c not in df.columns]
    if missing:
        raise DetectorError(f"{p} is not a label cache (missing columns {missing})")
    if p.suffix.lower() == ".csv":  # the paths as given, not as made inert for spreadsheets
        from collapseguard.io.csv_cells import csv_uncell

        df = df.assign(path=df["path"].map(csv_uncell))
    _check_rows(df, p)
    return df[CACHE_COLUMNS]


def _check_rows(df: pd.DataFrame, p: Path) -> None:
    """Refuse a cache that no labelling run writes: scores that are not numbers, an ``ok`` row
    without a finite score (one NaN target makes a distilled student all NaN), a key twice (one
    row a content hash: which of two would count?)."""
    for col in ("score", "raw"):
        if len(df) and not pd.api.types.is_numeric_dtype(df[col]):
            raise DetectorError(f"{p}: its {col} column holds text, not numbers; label into a new cache file")
    ok = (df["status"] == "ok").to_numpy()
    bad = np.flatnonzero(ok & ~np.isfinite(df["score"].to_numpy(float)))
    if bad.size:
        raise DetectorError(f"{p}: row {bad[0] + 1} has status ok but its score is not a finite number "
                            f"({df['score'].iloc[bad[0]]!r}); remove the row or set its status to nan")
    twice = df["key"][df["key"].duplicated() & (df["key"] != "")]
    if len(twice):
        raise DetectorError(f"{p} holds the key {str(twice.iloc[0])[:12]}... twice (one row an image's "
                            "content hash); keep one of the rows")


@contextlib.contextmanager
def _cache_lock(cache_path: Path):
    """An exclusive lock on ``<cache>.lock`` while the cache is read back and rewritten, so that
    two processes labelling into one cache do not drop each other's rows (POSIX; elsewhere a
    no-op)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_path.with_name(cache_path.name + ".lock"), "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _check_owner(cache: pd.DataFrame, cache_path: Path, name: str, version: str) -> None:
    if len(cache):
        seen = set(zip(cache["detector"].astype(str), cache["detector_version"].astype(str)))
        if seen != {(name, version)}:
            other = ", ".join(f"{n}@{v}" for n, v in sorted(seen))
            raise DetectorError(
                f"{cache_path} holds labels of {other}, not {name}@{version}; use another cache file"
            )


def _write_cache(df: pd.DataFrame, cache_path: Path) -> None:
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_when_done(cache_path) as tmp:
        if cache_path.suffix.lower() == ".csv":  # a path starting like a formula is made inert
            from collapseguard.io.csv_cells import csv_cell

            df.assign(path=df["path"].map(csv_cell)).to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)


def label_images(
    detector: Detector,
    items: Iterable,
    cache_path: str | os.PathLike,
    batch_size: int | None = None,
    flush_every: int = 512,
    flush_seconds: float = 60.0,
    retry_nan: bool = False,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """Score ``items`` with ``detector``, reusing and extending the cache at ``cache_path``.

    Args:
        detector: any :class:`Detector` (``create("vlm:...")``, ``create("rali:...")``, ...).
        items: image paths, encoded image bytes, or mappings with ``path`` and/or ``data``.
        cache_path: ``.parquet`` (default) or ``.csv`` file; created if missing, rewritten
            atomically every ``flush_every`` new labels, at least every ``flush_seconds`` while
            new labels come, and at the end: a run stopped by Ctrl-C or an error (or SIGTERM, which
            the command line takes as Ctrl-C) loses none, one killed outright (SIGKILL, or SIGTERM
            outside the command line, which skips the final write) at most that many or that
            long of a slow teacher's work.
        batch_size: images per ``score_detailed`` call (default: the detector's ``batch_size``).
        retry_nan: re-score images whose cached status is ``nan``.
        progress: called with the number of items handled since the last call (e.g. tqdm.update).

    Returns:
        One row per input item, in input order: ``key, path, score, raw, status, detector,
        detector_version`` (``score``/``raw`` NaN unless status is ``ok``; ``raw`` is the
        detector's raw value where it has one, e.g. a VLM rating, else equal to ``score``).
    """
    cache_path = Path(cache_path)
    name, version = str(detector.name), str(detector.version)
    cache = read_cache(cache_path)
    _check_owner(cache, cache_path, name, version)
    known: dict[str, dict] = {r["key"]: r for r in cache.to_dict("records")}
    # with retry_nan, a cached "nan" is scored again when an item asks for it; rows of images
    # not in this run stay in the cache as they are
    retry = {k for k, r in known.items() if r["status"] == "nan"} if retry_nan else set()
    bs = max(1, int(batch_size or getattr(detector, "batch_size", 16) or 16))

    order: list[tuple[str, str, str]] = []  # (key, path, status-if-unreadable)
    new_rows: list[dict] = []
    mine: set[str] = set()  # keys this run labelled (they win over what another writer stored)
    since_flush = 0
    last_save = time.monotonic()

    def row(key, path, score, raw, status):
        return {"key": key, "path": path, "score": score, "raw": raw, "status": status,
                "detector": name, "detector_version": version}

    def save():
        # another process may have added labels since this one read the cache: read it back
        # under the lock and keep its rows, with this run's own labels on top
        nonlocal since_flush, last_save
        with _cache_lock(cache_path):
            current = read_cache(cache_path)
            _check_owner(current, cache_path, name, version)
            merged = {**known, **{r["key"]: r for r in current.to_dict("records")}}
            merged.update({k: known[k] for k in mine})
            known.update(merged)
            _write_cache(pd.DataFrame(list(known.values()), columns=CACHE_COLUMNS), cache_path)
        since_flush, last_save = 0, time.monotonic()

    def to_label():
        """The items that need a label, once per content hash, as (key, path, bytes)."""
        queued: set[str] = set()
        for item in items:
            path, data, status = _read_item(item)
            if data is None:
                order.append(("", path, status))
            else:
                key = image_key(data)
                order.append((key, path, ""))
                if (key not in known or key in retry) and key not in queued:
                    queued.add(key)
                    yield key, path, data
            if progress is not None:
                progress(1)

    # the one scoring loop: decoding (pixel caps), batches, NaN and a detector's wrong count
    try:
        for (key, path, _), res in score_records(to_label(), detector, batch_size=bs,
                                                 members_of=lambda r: [(r[1] or "image", r[2])],
                                                 images_only=False):
            if res.status == "ok":
                rec = row(key, path, res.score, res.extra.get("raw", res.score), "ok")
            else:
                rec = row(key, path, np.nan, np.nan, "decode_error" if res.status == "decode_error" else "nan")
            known[key] = rec
            new_rows.append(rec)
            mine.add(key)
            if res.status != "decode_error":
                since_flush += 1
            if since_flush >= flush_every or (since_flush and time.monotonic() - last_save >= flush_seconds):
                save()
    finally:  # labels already made are kept, whatever stops the run (a slow teacher's hours)
        if new_rows or not cache_path.is_file():
            save()

    result = []
    for key, path, status in order:
        if not key:
            result.append(row("", path, np.nan, np.nan, status))
        else:
            rec = dict(known[key])
            # the item's own path ('' for bytes): never a path an earlier run (or whoever wrote
            # the cache file) stored under the same content hash
            rec["path"] = path
            result.append(rec)
    return pd.DataFrame(result, columns=CACHE_COLUMNS)
