"""Grouping 1,000,000 fingerprints: time and peak memory of ``dedup.groups.group_ids``.

    OMP_NUM_THREADS=2 taskset -c 0,1 python benchmarks/dedup_scale.py [--n 1000000] [--groups 50000]

Synthetic fingerprints with planted near-duplicate groups: ``--groups`` groups of 2-8 copies each,
every copy its group's original 64-bit hash with 0-8 bits flipped and the original's thumbnail
plus noise (correlation with the original about 0.9), the rest unrelated (uniform random hashes and
thumbnails). Prints the seconds of the candidate search, verification and grouping, the peak
resident memory of the process (generation included), the share of planted copies found in their
group, and how many unrelated fingerprints joined any group.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np


def make(n: int, n_groups: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 9, n_groups)
    planted = int(sizes.sum())
    if planted > n:
        raise SystemExit(f"{planted} planted copies do not fit in {n}")
    hashes = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    hashes |= rng.integers(0, 2, n).astype(np.uint64)
    thumbs = np.empty((n, 256), np.int8)
    base = rng.standard_normal((n, 256), dtype=np.float32)  # unrelated rows stay as drawn
    truth = np.full(n, -1, np.int64)
    row = 0
    for g, k in enumerate(sizes):
        rows = np.arange(row, row + k)
        truth[rows] = g
        flips = rng.integers(0, 9, k)
        flips[0] = 0  # the group's original
        for r, f in zip(rows, flips):
            bits = rng.choice(64, f, replace=False).astype(np.uint64)
            mask = np.bitwise_or.reduce(np.uint64(1) << bits) if f else np.uint64(0)
            hashes[r] = hashes[row] ^ mask
        base[rows[1:]] = base[row] + 0.45 * rng.standard_normal((k - 1, 256), dtype=np.float32)
        row += k
    base -= base.mean(axis=1, keepdims=True)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    thumbs[:] = np.round(base * 127)
    perm = rng.permutation(n)  # planted copies spread over the whole table
    return hashes[perm], thumbs[perm], truth[perm], planted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=50_000)
    args = ap.parse_args()
    from collapseguard.dedup.groups import GroupingParams, group_ids

    t0 = time.perf_counter()
    hashes, thumbs, truth, planted = make(args.n, args.groups)
    t1 = time.perf_counter()
    labels, stats = group_ids(hashes, thumbs, GroupingParams())
    t2 = time.perf_counter()
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    found = 0
    for g in np.unique(truth[truth >= 0]):
        rows = np.flatnonzero(truth == g)
        lab = labels[rows]
        # a copy is found when it shares a group with the most common group of its planted copies
        vals, counts = np.unique(lab[lab >= 0], return_counts=True)
        if vals.size:
            found += int((lab == vals[np.argmax(counts)]).sum())
    wrong = int(((truth < 0) & (labels >= 0)).sum())
    print(f"fingerprints: {args.n}  planted copies: {planted} in {args.groups} groups")
    print(f"made in {t1 - t0:.1f} s; grouped in {t2 - t1:.1f} s "
          f"(candidates {stats['candidate_pairs']}, verified {stats['verified_pairs']}, "
          f"groups {stats['groups']})")
    print(f"peak memory: {peak_gb:.2f} GB")
    print(f"planted copies found in their group: {found / planted:.4f}; unrelated fingerprints "
          f"in a group: {wrong} of {args.n - planted}")


if __name__ == "__main__":
    main()
