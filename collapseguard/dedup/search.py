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
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from collapseguard.detectors.fingerprint import popcount

BLOCKS = ((0, 21), (21, 42), (42, 64))  # bit ranges, least significant first
MAX_DISTANCE = 3 * (2 + 1) - 1
#: up to this many hashes, all pairs are compared (cheaper than the tables' fixed cost)
BRUTE_FORCE = 2048


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
    if not 0 <= max_distance <= MAX_DISTANCE:
        raise ValueError(f"max_distance must be within 0..{MAX_DISTANCE}, got {max_distance}")
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    if hashes.size <= BRUTE_FORCE:
        return _all_pairs(hashes, max_distance)
    radius = max_distance // len(BLOCKS)  # a pair within max_distance is within this on some block
    found_i, found_j, found_d = [], [], []
    keys = [_block(hashes, lo, hi) for lo, hi in BLOCKS]
    for b, (lo, hi) in enumerate(BLOCKS):
        k = keys[b]
        order = np.argsort(k, kind="stable").astype(np.int64)
        counts = np.bincount(k, minlength=1 << (hi - lo))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for f in _flips(hi - lo, radius):
            q = k ^ f
            c = counts[q]
            src = np.flatnonzero(c)
            if not src.size:
                continue
            for s in range(0, src.size, max(1, chunk // 8)):
                part = src[s: s + max(1, chunk // 8)]
                cnt = c[part]
                i = np.repeat(part, cnt)
                first = np.repeat(starts[q[part]], cnt)
                offs = np.arange(i.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
                j = order[first + offs]
                keep = i < j
                i, j = i[keep], j[keep]
                for e in range(b):  # found by an earlier block already: reported there
                    de = popcount(keys[e][i] ^ keys[e][j])
                    keep = de > radius
                    i, j = i[keep], j[keep]
                d = popcount(hashes[i] ^ hashes[j])
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
