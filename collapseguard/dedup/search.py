"""Candidate pairs of near-identical 64-bit hashes without comparing all pairs: multi-index hashing.

The 64 bits are cut into ``BLOCKS`` blocks (21, 21 and 22 bits). By the pigeonhole principle, two
hashes at Hamming distance ``d <= 3 * (r + 1) - 1`` agree within distance ``r`` on at least one
block, so every pair within ``max_distance`` (at most ``MAX_DISTANCE`` = 8, with ``r = 2``) is found
by looking each hash's blocks up, with up to ``r`` bits flipped, in one table per block. A table is
a direct-address array over the block's values (counts and starts, ``2^22`` entries at most), so a
look-up is two array reads and the whole search is a fixed number of vectorised passes over all
hashes: its time grows with the number of hashes times the bucket load, never with their square.
Each pair is reported once (``i < j``), by the first block that finds it. Up to ``BRUTE_FORCE``
hashes every pair is compared instead (the same pairs, without building the tables).
``candidate_pairs_between`` does the same between a set of query hashes (the windows' of
``fingerprint.windows``) and the tables of another set.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from collapseguard.detectors.fingerprint import popcount

BLOCKS = ((0, 21), (21, 42), (42, 64))  # bit ranges, least significant first
MAX_DISTANCE = 3 * (2 + 1) - 1
#: up to this many hashes, all pairs are compared (cheaper than the tables' fixed cost)
BRUTE_FORCE = 2048
#: up to this many query-index pairs, ``candidate_pairs_between`` compares every pair (about 0.1 s
#: on one core; building the tables costs more below it)
BRUTE_FORCE_PAIRS = 1 << 24
#: pairs compared at once there
BRUTE_FORCE_CHUNK = 1 << 22


def _flips(bits: int, radius: int) -> np.ndarray:
    masks = [0]
    for r in range(1, radius + 1):
        masks += [sum(1 << b for b in c) for c in combinations(range(bits), r)]
    return np.array(masks, dtype=np.int64)


def _block(hashes: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return ((hashes >> np.uint64(lo)) & np.uint64((1 << (hi - lo)) - 1)).astype(np.int64)


def candidate_pairs(hashes: np.ndarray, max_distance: int = MAX_DISTANCE,
                    chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(i, j, distance)`` of every pair ``i < j`` of ``hashes`` (uint64) within ``max_distance``
    bits of each other. ``chunk`` bounds the candidate pairs held at once."""
    hashes = _checked(hashes, max_distance)
    if hashes.size <= BRUTE_FORCE:
        return _all_pairs(hashes, max_distance)
    return _probe(hashes, hashes, max_distance, chunk, same=True)


def candidate_pairs_between(queries: np.ndarray, index: np.ndarray, max_distance: int = MAX_DISTANCE,
                            chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, j, distance)`` of every pair of a query hash ``queries[q]`` and an indexed hash
    ``index[j]`` within ``max_distance`` bits of each other (each pair once; the tables are built
    over ``index`` only, so many queries cost their look-ups, not a larger table)."""
    queries = _checked(queries, max_distance)
    index = _checked(index, max_distance)
    if queries.size * index.size <= BRUTE_FORCE_PAIRS:
        return _all_pairs_between(queries, index, max_distance)
    return _probe(queries, index, max_distance, chunk, same=False)


def _checked(hashes: np.ndarray, max_distance: int) -> np.ndarray:
    if not 0 <= max_distance <= MAX_DISTANCE:
        raise ValueError(f"max_distance must be within 0..{MAX_DISTANCE}, got {max_distance}")
    return np.ascontiguousarray(hashes, dtype=np.uint64).reshape(-1)


def _probe(queries: np.ndarray, index: np.ndarray, max_distance: int, chunk: int,
           same: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The multi-index search: every query's blocks, with up to ``radius`` bits flipped, looked up
    in one direct-address table per block of ``index``. ``same``: ``queries`` is ``index`` (pairs
    ``i < j`` only)."""
    radius = max_distance // len(BLOCKS)  # a pair within max_distance is within this on some block
    found_i, found_j, found_d = [], [], []
    qkeys = [_block(queries, lo, hi) for lo, hi in BLOCKS]
    ikeys = qkeys if same else [_block(index, lo, hi) for lo, hi in BLOCKS]
    step = max(1, chunk // 8)
    for b, (lo, hi) in enumerate(BLOCKS):
        k = ikeys[b]
        order = np.argsort(k, kind="stable").astype(np.int64)
        counts = np.bincount(k, minlength=1 << (hi - lo))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for f in _flips(hi - lo, radius):
            q = qkeys[b] ^ f
            c = counts[q]
            src = np.flatnonzero(c)
            for s in range(0, src.size, step):
                part = src[s: s + step]
                cnt = c[part]
                i = np.repeat(part, cnt)
                first = np.repeat(starts[q[part]], cnt)
                offs = np.arange(i.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
                j = order[first + offs]
                if same:
                    keep = i < j
                    i, j = i[keep], j[keep]
                for e in range(b):  # found by an earlier block already: reported there
                    keep = popcount(qkeys[e][i] ^ ikeys[e][j]) > radius
                    i, j = i[keep], j[keep]
                d = popcount(queries[i] ^ index[j])
                keep = d <= max_distance
                found_i.append(i[keep])
                found_j.append(j[keep])
                found_d.append(d[keep].astype(np.int8))
    if not found_i:
        empty = np.zeros(0, np.int64)
        return empty, empty.copy(), np.zeros(0, np.int8)
    return np.concatenate(found_i), np.concatenate(found_j), np.concatenate(found_d)


def _all_pairs(hashes: np.ndarray, max_distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``candidate_pairs`` by comparing every pair (for few hashes)."""
    i, j = np.triu_indices(hashes.size, 1)
    d = popcount(hashes[i] ^ hashes[j])
    keep = d <= max_distance
    return i[keep].astype(np.int64), j[keep].astype(np.int64), d[keep].astype(np.int8)


def _all_pairs_between(queries: np.ndarray, index: np.ndarray,
                       max_distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``candidate_pairs_between`` by comparing every query with every indexed hash,
    ``BRUTE_FORCE_CHUNK`` pairs at a time."""
    step = max(1, BRUTE_FORCE_CHUNK // max(1, index.size))
    found_q, found_j, found_d = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int8)]
    for s in range(0, queries.size, step):
        d = popcount(queries[s: s + step, None] ^ index[None, :])
        q, j = np.nonzero(d <= max_distance)
        found_q.append(q.astype(np.int64) + s)
        found_j.append(j.astype(np.int64))
        found_d.append(d[q, j].astype(np.int8))
    return np.concatenate(found_q), np.concatenate(found_j), np.concatenate(found_d)
