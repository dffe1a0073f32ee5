"""Near-duplicate groups from fingerprints: candidate pairs, verification, transitive groups.

1. Candidates: pairs whose pHashes are within ``max_distance`` bits (``search.candidate_pairs``).
2. Verification: a candidate becomes an edge only if the two thumbnails correlate at
   ``min_corr`` or more (a second, independent look at the two images).
3. Groups: connected components of the verified edges (copies of copies join one group).
4. No chaining of unrelated pictures: in each component the medoid (the member with the highest
   summed correlation to the others) is found, and a member whose thumbnail correlates with the
   medoid below ``min_medoid_corr`` leaves the group (it becomes a single). Two pictures that only
   meet through a chain of small steps are therefore never kept together unless both stay close
   to the picture the group is centred on.

Group ids are the smallest row index in the group, so they depend only on the input order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collapseguard.dedup.search import MAX_DISTANCE, candidate_pairs
from collapseguard.detectors.fingerprint import correlation

#: groups larger than this get their medoid from a sample of this many members
MEDOID_SAMPLE = 256


@dataclass(frozen=True)
class GroupingParams:
    max_distance: int = MAX_DISTANCE
    min_corr: float = 0.80
    min_medoid_corr: float = 0.70

    def as_dict(self) -> dict:
        return {"max_distance": self.max_distance, "min_corr": self.min_corr,
                "min_medoid_corr": self.min_medoid_corr}


def verified_edges(hashes: np.ndarray, thumbs: np.ndarray, params: GroupingParams,
                   chunk: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(i, j, stats)``: candidate pairs whose thumbnails agree."""
    ci, cj, _ = candidate_pairs(hashes, params.max_distance)
    keep = np.zeros(ci.size, bool)
    for s in range(0, ci.size, chunk):
        keep[s: s + chunk] = correlation(thumbs[ci[s: s + chunk]], thumbs[cj[s: s + chunk]]) >= params.min_corr
    return ci[keep], cj[keep], {"candidate_pairs": int(ci.size), "verified_pairs": int(keep.sum())}


def _medoid_filter(members: np.ndarray, thumbs: np.ndarray, params: GroupingParams,
                   rng: np.random.Generator) -> np.ndarray:
    """The members that stay: those correlating with the medoid at ``min_medoid_corr`` or more."""
    pool = members if members.size <= MEDOID_SAMPLE else np.sort(rng.choice(members, MEDOID_SAMPLE, replace=False))
    t = thumbs[pool].astype(np.int32)
    sums = (t @ t.T).sum(axis=1)
    medoid = pool[int(np.argmax(sums))]
    corr = correlation(thumbs[members], thumbs[medoid][None, :])
    return members[corr >= params.min_medoid_corr]


def group_ids(hashes: np.ndarray, thumbs: np.ndarray, params: GroupingParams = GroupingParams()
              ) -> tuple[np.ndarray, dict]:
    """Group id per row (-1 for a single), and statistics of the search."""
    n = len(hashes)
    gi, gj, stats = verified_edges(hashes, thumbs, params)
    labels = np.full(n, -1, np.int64)
    if n == 0 or gi.size == 0:
        stats.update(groups=0, grouped=0, left_medoid=0)
        return labels, stats
    # here, not at import: the engine's workers import this module and never group
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(gi.size, np.int8), (gi, gj)), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    sizes = np.bincount(comp)
    multi = np.flatnonzero(sizes > 1)
    order = np.argsort(comp, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    rng = np.random.default_rng(0)
    left = 0
    for c in multi:
        members = order[bounds[c]: bounds[c + 1]]  # ascending row order (stable sort)
        if members.size > 2:
            kept = _medoid_filter(members, thumbs, params, rng)
            left += members.size - kept.size
            members = kept
        if members.size > 1:
            labels[members] = members.min()
    grouped = labels >= 0
    stats.update(groups=int(np.unique(labels[grouped]).size), grouped=int(grouped.sum()),
                 left_medoid=int(left))
    return labels, stats
