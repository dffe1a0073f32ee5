"""``filter --reshard N``: the kept samples rewritten into even shards of N samples.

Kept shards shrink unevenly (a shard of many degraded copies loses most of its samples). After
the filter run, ``reshard`` reads ``kept/`` shard by shard in input order and writes
``resharded/00000.tar, 00001.tar, ...`` of exactly N samples each (the last holds the rest).
Members are copied byte for byte (names, bytes and mtimes). Beside them:

- ``resharded/key_map.parquet``: one row per sample, ``key, shard, source_shard`` (the new shard's
  file name and the kept/ shard it came from), in the order written;
- ``resharded/NNNNN.parquet`` when kept/ has img2dataset parquet sidecars: the rows of that new
  shard's keys, in the shard's order.

A key must be unique over the kept samples (two samples of one key in a shard would read back as
one); a repeat is refused before anything is written. The folder is written under a temporary
name and put in place when complete, replacing an earlier ``resharded/``. The temporary folders
a killed run left (``.resharded.<id>.tmp/``, ``.resharded.old.<id>/``) are removed by the next
one; it holds ``<out>/.lock`` meanwhile, so no other run's folder is taken for a leftover.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from collapseguard.errors import CollapseguardError
from collapseguard.filter.sidecars import stem_of
from collapseguard.io.shard_writer import ShardWriter
from collapseguard.io.tar import ShardReader

FOLDER = "resharded"
#: kept/ holds what the filter run let through (its --max-sample-bytes may be above the default)
_KEPT = 2**62
KEY_MAP = "key_map.parquet"


class ReshardError(CollapseguardError, ValueError):
    """The kept samples cannot be resharded (repeated keys, a missing kept shard)."""


def _kept_shards(out_dir: Path, shard_names: Sequence[str]) -> list[Path]:
    paths = []
    for name in shard_names:
        p = out_dir / "kept" / name
        if not p.is_file():
            raise ReshardError(f"{p} is missing: the filter run did not complete that shard")
        paths.append(p)
    return paths


def _metadata(kept: list[Path]):
    """key -> row (dict) of the kept/ parquet sidecars, and their common column order."""
    import pyarrow.parquet as pq
    rows, schema = {}, None
    for p in kept:
        side = p.with_name(stem_of(p.name) + ".parquet")
        if not side.is_file():
            continue
        table = pq.read_table(side)
        if "key" not in table.column_names:
            continue
        schema = schema or table.schema
        for r in table.to_pylist():
            rows.setdefault(str(r["key"]), r)
    return rows, schema


def reshard(out_dir: str | os.PathLike, shard_names: Sequence[str], n: int) -> dict:
    """Write ``<out_dir>/resharded/`` from ``<out_dir>/kept/<name>`` for each of ``shard_names``
    (the kept shards' file names, in input order). Returns ``{"shards", "samples"}``."""
    if n < 1:
        raise ReshardError(f"--reshard needs a positive number of samples per shard, got {n}")
    from collapseguard.io.urls import is_remote, local_path
    if is_remote(str(out_dir)):
        raise ReshardError(f"--reshard needs a local --out; {out_dir} is not one")
    out_dir = Path(local_path(str(out_dir)) or out_dir)
    from collapseguard.filter.run import out_lock
    with out_lock(out_dir):
        _remove_leftovers(out_dir)
        return _reshard(out_dir, shard_names, n)


def _remove_leftovers(out_dir: Path) -> None:
    """Remove the temporary folders of a reshard that was killed (the caller holds the lock)."""
    for pattern in (f".{FOLDER}.*.tmp", f".{FOLDER}.old.*"):
        for p in out_dir.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _reshard(out_dir: Path, shard_names: Sequence[str], n: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    kept = _kept_shards(out_dir, shard_names)
    seen: dict[str, str] = {}
    total = 0
    for p in kept:  # a first pass over the keys: refuse before writing anything
        for sample in ShardReader(str(p), max_sample_bytes=_KEPT):
            if sample.key in seen:
                raise ReshardError(f"key {sample.key!r} is in both kept/{seen[sample.key]} and "
                                   f"kept/{p.name}: resharded, the two samples would read back as "
                                   "one; reshard shards whose keys are unique (img2dataset's are)")
            seen[sample.key] = p.name
            total += 1
    n_shards = max(1, -(-total // n))
    width = max(5, len(str(n_shards - 1)))
    meta, schema = _metadata(kept)
    tmp = out_dir / f".{FOLDER}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir(parents=True)
    try:
        index = {"key": [], "shard": [], "source_shard": []}
        writer, count, i = None, 0, 0
        shard_keys: list[str] = []

        def close_shard():
            nonlocal writer
            if writer is None:
                return
            writer.close()
            if schema is not None:
                part = [meta[k] for k in shard_keys if k in meta]
                pq.write_table(pa.Table.from_pylist(part, schema=schema),
                               tmp / f"{i:0{width}d}.parquet")
            writer = None

        for p in kept:
            for sample in ShardReader(str(p), max_sample_bytes=_KEPT):
                if writer is None:
                    writer = ShardWriter(str(tmp / f"{i:0{width}d}.tar"))
                    shard_keys, count = [], 0
                writer.write(sample)
                shard_keys.append(sample.key)
                index["key"].append(sample.key)
                index["shard"].append(f"{i:0{width}d}.tar")
                index["source_shard"].append(p.name)
                count += 1
                if count == n:
                    close_shard()
                    i += 1
        close_shard()
        pq.write_table(pa.table({k: pa.array(v, pa.string()) for k, v in index.items()}),
                       tmp / KEY_MAP)
        final = out_dir / FOLDER
        if final.exists():
            old = out_dir / f".{FOLDER}.old.{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"shards": -(-total // n) if total else 0, "samples": total}
