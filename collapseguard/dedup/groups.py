"""Near-duplicate groups from fingerprints: candidate pairs, verification, transitive groups.

1. Candidates: pairs whose pHashes are within ``max_distance`` bits (``search.candidate_pairs``),
   and, when the images' central windows are given (``fingerprint.windows``), pairs of one
   image's window and another's whole picture within as many bits
   (``search.candidate_pairs_between``): a copy cropped by up to about 10% a side.
2. Verification: a candidate becomes an edge only if the two thumbnails (the window's, for a
   window's candidate) correlate at ``min_corr`` or more (a second, independent look).
3. Groups: connected components of the verified edges (copies of copies join one group).
4. No chaining of unrelated pictures: in each component the medoid (the member with the highest
   summed correlation to the others) is found, and a member whose thumbnail correlates with the
   medoid below ``min_medoid_corr`` leaves the group (it becomes a single). Two pictures that
   only meet through a chain of small steps are therefore never kept together unless both stay
   close to the picture the group is centred on. With windows, two members' correlation here is
   the best of whole against whole and of either's windows against the other's whole: the
   picture a group's crops were cut from is its medoid, and its crops stay beside it.

Group ids are the smallest row index in the group, so they depend only on the input order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collapseguard.dedup.search import (
    MAX_DISTANCE,
    candidate_pairs,
    candidate_pairs_between,
)
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
                   chunk: int = 1 << 20, window_hashes: np.ndarray | None = None,
                   window_thumbs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(i, j, stats)``: candidate pairs whose thumbnails agree, ``i < j``, each once. With
    ``window_hashes`` (n, K) and ``window_thumbs`` (n, K, 256), pairs of a window and another
    image's whole picture too (counted in ``window_candidate_pairs`` and
    ``window_verified_pairs``, a pair the wholes verified too among them)."""
    ci, cj, _ = candidate_pairs(hashes, params.max_distance)
    keep = _agree(thumbs, ci, thumbs, cj, params.min_corr, chunk)
    gi, gj = ci[keep], cj[keep]
    stats = {"candidate_pairs": int(ci.size), "verified_pairs": int(keep.sum()),
             "window_candidate_pairs": 0, "window_verified_pairs": 0}
    if window_hashes is None or not len(hashes):
        return gi, gj, stats
    n_win = window_hashes.shape[1]
    if window_hashes.shape != (len(hashes), n_win) or window_thumbs is None or \
            window_thumbs.shape != (len(hashes), n_win, thumbs.shape[1]):
        raise ValueError("window_hashes must be (n, K) and window_thumbs (n, K, thumbnail size) "
                         f"for {len(hashes)} hashes")
    q, j, _ = candidate_pairs_between(window_hashes.reshape(-1), hashes, params.max_distance)
    i, w = q // n_win, q % n_win
    other = i != j
    i, w, j = i[other], w[other], j[other]
    flat = window_thumbs.reshape(-1, window_thumbs.shape[-1])
    keep = _agree(flat, i * n_win + w, thumbs, j, params.min_corr, chunk)
    wi, wj = np.minimum(i[keep], j[keep]), np.maximum(i[keep], j[keep])
    stats.update(window_candidate_pairs=int(i.size), window_verified_pairs=int(keep.sum()))
    pairs = np.unique(np.concatenate([gi * len(hashes) + gj, wi * len(hashes) + wj]))
    return pairs // len(hashes), pairs % len(hashes), stats


def _agree(a: np.ndarray, ia: np.ndarray, b: np.ndarray, ib: np.ndarray, min_corr: float,
           chunk: int) -> np.ndarray:
    """``correlation(a[ia], b[ib]) >= min_corr``, in chunks of ``chunk`` pairs."""
    keep = np.zeros(ia.size, bool)
    for s in range(0, ia.size, chunk):
        keep[s: s + chunk] = correlation(a[ia[s: s + chunk]], b[ib[s: s + chunk]]) >= min_corr
    return keep


def _correlations(thumbs: np.ndarray, window_thumbs: np.ndarray | None, rows: np.ndarray,
                  to: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(whole, mine, theirs)``: the correlation of each of ``rows`` with row ``to`` whole
    against whole, of each row's windows with ``to``'s whole (rows, K: ``to`` a crop of the row),
    and of ``to``'s windows with each row's whole (rows, K: the row a crop of ``to``); the last
    two empty (rows, 0) without windows."""
    whole = correlation(thumbs[rows], thumbs[to][None, :])
    if window_thumbs is None:
        return whole, np.zeros((len(whole), 0)), np.zeros((len(whole), 0))
    mine = correlation(window_thumbs[rows], thumbs[to][None, None, :])
    theirs = correlation(window_thumbs[to][None, :, :], thumbs[rows][:, None, :])
    return whole, mine, theirs


def best_correlation(thumbs: np.ndarray, window_thumbs: np.ndarray | None, rows: np.ndarray,
                     to: int) -> np.ndarray:
    """Correlation of each of ``rows`` with row ``to``: whole against whole, or with windows the
    best of that and of either's windows against the other's whole."""
    whole, mine, theirs = _correlations(thumbs, window_thumbs, rows, to)
    return np.max(np.column_stack([whole, mine, theirs]), axis=1)


#: how much better a window of one image must match another's whole than the wholes match for
#: the two to be framed differently: copies framed alike differ by a few hundredths either way
#: (int8 rounding, damage), a crop by 5% a side gains several tenths on most pictures
FRAMING_MARGIN = 0.035
#: the first window that tells a framing apart (``fingerprint.WINDOWS[1]``, 88%): a crop of up to
#: about 3% a side best matches the 94% window and is compared with its original, as without
#: windows (the comparator reads 1-3% crops of the bundled photos at ``p_worse`` 0.50-0.85)
FRAMING_WINDOW = 1


def _framing(thumbs, window_thumbs, rows, to) -> tuple[np.ndarray, np.ndarray]:
    """``(apart, narrower)`` of each of ``rows`` against row ``to``: framed differently (one is a
    crop of about 5% a side or more of the other: a window from ``FRAMING_WINDOW`` on matches the
    other's whole better than the wholes match, by more than ``FRAMING_MARGIN``), and the row the
    crop."""
    whole, mine, theirs = _correlations(thumbs, window_thumbs, rows, to)
    if mine.shape[1] <= FRAMING_WINDOW:
        no = np.zeros(len(whole), bool)
        return no, no.copy()
    wider = mine[:, FRAMING_WINDOW:].max(axis=1)  # ``to`` is the crop
    crop = theirs[:, FRAMING_WINDOW:].max(axis=1)  # the row is the crop
    apart = np.maximum(wider, crop) > whole + FRAMING_MARGIN
    return apart, apart & (crop >= wider)


def window_relation(thumbs: np.ndarray, window_thumbs: np.ndarray, row: int, to: int,
                    margin: float) -> tuple[int, bool]:
    """``(k, row_is_crop)``: the window ``k`` of one of the two rows that matches the other's whole
    best, when it beats the wholes' correlation by more than ``margin`` (else ``(-1, False)``),
    and whether ``row`` is the crop (``to``'s window ``k`` matches it)."""
    whole, mine, theirs = _correlations(thumbs, window_thumbs, np.array([row]), to)
    best = max(mine[0].max(), theirs[0].max()) if mine.shape[1] else -1.0
    if best <= whole[0] + margin:
        return -1, False
    if theirs[0].max() >= mine[0].max():
        return int(np.argmax(theirs[0])), True
    return int(np.argmax(mine[0])), False


def framed_apart(thumbs: np.ndarray, window_thumbs: np.ndarray | None, rows: np.ndarray,
                 to: int) -> np.ndarray:
    """Is each of ``rows`` framed differently from row ``to`` (a crop of about 5% a side or more
    of it, or it such a crop of the row)?"""
    return _framing(thumbs, window_thumbs, rows, to)[0]


def narrower(thumbs: np.ndarray, window_thumbs: np.ndarray | None, members: np.ndarray,
             sample: int = 64) -> np.ndarray:
    """Is each of ``members`` a crop (``framed_apart``, the narrower one) of another member? Each
    is checked against up to ``sample`` members (the first ones; all in a small group)."""
    out = np.zeros(len(members), bool)
    if window_thumbs is None:
        return out
    for m in members[:sample]:
        out |= _framing(thumbs, window_thumbs, members, m)[1]
    return out


def _medoid_filter(members: np.ndarray, thumbs: np.ndarray, params: GroupingParams,
                   rng: np.random.Generator, window_thumbs: np.ndarray | None = None) -> np.ndarray:
    """The members that stay: those correlating with the medoid at ``min_medoid_corr`` or more."""
    pool = members if members.size <= MEDOID_SAMPLE else np.sort(rng.choice(members, MEDOID_SAMPLE, replace=False))
    t = thumbs[pool].astype(np.int32)
    sim = t @ t.T
    if window_thumbs is not None:  # the best of whole against whole and windows against wholes:
        wt = window_thumbs[pool].astype(np.int32)  # the picture a group's crops were cut from
        mine = np.einsum("akt,bt->abk", wt, t).max(axis=2)  # is the medoid, not one of its crops
        sim = np.maximum(sim, np.maximum(mine, mine.T))
    medoid = pool[int(np.argmax(sim.sum(axis=1)))]
    corr = best_correlation(thumbs, window_thumbs, members, medoid)
    return members[corr >= params.min_medoid_corr]


def group_ids(hashes: np.ndarray, thumbs: np.ndarray, params: GroupingParams = GroupingParams(),
              window_hashes: np.ndarray | None = None, window_thumbs: np.ndarray | None = None
              ) -> tuple[np.ndarray, dict]:
    """Group id per row (-1 for a single), and statistics of the search. ``window_hashes`` (n, K)
    and ``window_thumbs`` (n, K, 256): the fingerprints of each row's central windows, which find
    cropped copies (None: whole pictures only)."""
    n = len(hashes)
    gi, gj, stats = verified_edges(hashes, thumbs, params, window_hashes=window_hashes,
                                   window_thumbs=window_thumbs)
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
            kept = _medoid_filter(members, thumbs, params, rng, window_thumbs)
            left += members.size - kept.size
            members = kept
        if members.size > 1:
            labels[members] = members.min()
    grouped = labels >= 0
    stats.update(groups=int(np.unique(labels[grouped]).size), grouped=int(grouped.sum()),
                 left_medoid=int(left))
    return labels, stats
