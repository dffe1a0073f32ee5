"""Seeded random subsets of a dataset, chosen before anything is decoded (``audit --sample N``).

Every sample (a shard's ``source, key`` or a loose file's) gets a pseudo-random 64-bit rank from a
keyed hash of its source and key; the N lowest ranks form the subset (bottom-k sampling). Listing
the keys reads only tar headers, so choosing the subset costs no decoding, and the selection is a
tiny picklable predicate (``HashSelect``) that worker processes apply while they read: samples
outside it are skipped before they are decoded. Same inputs + same seed = the same subset.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from collapseguard.errors import CollapseguardError
from collapseguard.io.inputs import expand, unique_inputs
from collapseguard.io.tar import CappedTarInfo, member_key, open_shard, split_key
from collapseguard.io.urls import local_path


def sample_rank(seed: int, source: str, key: str, nth: int = 0) -> int:
    """The pseudo-random 64-bit rank of a sample for ``seed`` (uniform, independent of order).
    ``nth`` tells apart the samples of a key that repeats within a shard (0 for the first)."""
    text = f"{source}\0{key}" + (f"\0{nth}" if nth else "")
    h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                        key=int(seed).to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "big")


@dataclass(frozen=True)
class HashSelect:
    """``select(source, key, nth=0)``: true for samples whose rank is at most ``cutoff``."""

    seed: int
    cutoff: int

    def __call__(self, source: str, key: str, nth: int = 0) -> bool:
        return sample_rank(self.seed, source, key, nth) <= self.cutoff


def shard_keys(path: str) -> Iterator[str]:
    """The sample keys of a tar shard in order, from its headers only (file bodies are skipped),
    named exactly as ``ShardReader`` names them. A shard that cannot be read (or stops being
    readable) yields the keys read so far: the audit itself then reports it as a failed shard."""
    last = None
    try:
        seekable = local_path(path) is not None  # a URL is read through once, as a stream
        with open_shard(path) as f, tarfile.open(fileobj=f, mode="r:*" if seekable else "r|*",
                                                 tarinfo=CappedTarInfo) as tf:  # no header bombs
            for info in tf:
                if info.isdir():
                    continue
                group = split_key(info.name)[0]  # grouped by raw name, as ShardReader groups
                if group != last:
                    yield member_key(info.name)[1]
                    last = group
    except (tarfile.TarError, OSError, EOFError, ValueError, CollapseguardError):
        return


def parquet_keys(name: str, image_column: str | None = None) -> Iterator[str]:
    """The row keys of a Parquet input in order (its key column or row index; no image bytes are
    read). A file that cannot be read yields none: the audit reports it as a failed input."""
    from collapseguard.io.parquet import find_id_column, parquet_file
    try:
        with parquet_file(name) as pf:
            id_col = find_id_column(pf.schema_arrow)
            if id_col is None:
                yield from (str(i) for i in range(pf.metadata.num_rows))
                return
            start = 0
            for batch in pf.iter_batches(columns=[id_col]):
                for i, v in enumerate(batch.column(0).to_pylist()):
                    yield str(v if v is not None else start + i)
                start += batch.num_rows
    except (OSError, ValueError, CollapseguardError):
        return


def list_samples(inputs: Sequence[str], image_column: str | None = None) -> Iterator[tuple[str, str, int]]:
    """``(source, key, nth)`` of every sample named by ``inputs`` (shards and Parquet rows first,
    then image files; each file once, as ``score`` reads them). ``nth`` counts earlier samples of
    the same key in the shard. A URL input that cannot be listed names no sample (``run_score``
    reports it as a failed input)."""
    data, files = expand(inputs, failed=[], image_column=image_column)
    shards, files = unique_inputs(data, files)
    for inp in shards:
        s = inp.name
        seen: dict[str, int] = {}
        keys = parquet_keys(s, image_column) if inp.kind == "parquet" else shard_keys(s)
        for key in keys:
            nth = seen.get(key, 0)
            seen[key] = nth + 1
            yield s, key, nth
    for f in files:
        yield f.source, f.key, 0


def choose_sample(inputs: Sequence[str], n: int, seed: int = 0,
                  image_column: str | None = None) -> tuple[HashSelect | None, int]:
    """A predicate selecting ``n`` random samples of ``inputs``, and the number of samples there are.

    Returns ``(None, total)`` when ``n >= total`` (everything is audited).
    """
    if n < 1:
        raise ValueError(f"sample size must be at least 1, got {n}")
    ranks = np.fromiter((sample_rank(seed, *sample) for sample in list_samples(inputs, image_column)),
                        dtype=np.uint64)
    total = len(ranks)
    if n >= total:
        return None, total
    cutoff = int(np.partition(ranks, n - 1)[n - 1])
    return HashSelect(int(seed), cutoff), total
