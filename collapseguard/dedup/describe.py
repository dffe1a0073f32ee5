"""The grouped images' descriptions (``dedup``'s pass 3), at the one scale their group compares at.

A group ranks its copies at the largest scale of ``pair_features.SCALES`` that all of them reach
(``compare.group_utilities``), which the copies' sizes tell before any is described: the rung of
the member with the shortest shorter side (``pair_features.reached_rung``). ``RungDescriber``
describes an image as ``Comparator.describe`` does (the same cnn score, up to float rounding,
the same features and ``size_extras``), but only at the rungs asked for, and without the
fingerprints pass 1 already has: the features of the other rungs, which the decisions never
read, are left NaN.
``group_rungs`` gives every grouped row its group's rung.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np

from collapseguard.detectors.base import Detector
from collapseguard.detectors.pair_features import (
    FEATURES,
    SCALES,
    described,
    reached_rung,
)

#: images per call of the cnn: on a CPU its cost per image grows with the batch, as its crops'
#: activations leave the cache (``benchmarks/dedup_scale.py --cnn-batch``; docs/DEDUP.md, "Speed")
CNN_BATCH = 4


class RungDescriber(Detector):
    """``comparator``'s description (``cnn`` and the ``FEATURE_COLUMNS``) at the rungs asked for
    (indices into ``SCALES``), no fingerprints. ``rungs`` maps an image's (height, width) to its
    rungs (several rows of one size: the rungs of all of them); an image of a size it does not
    name, or every image when ``rungs`` is None, gets every rung. ``score`` is the comparator's
    ``utility`` of the description; the cnn scores ``CNN_BATCH`` images at a time (a score can
    differ from the one a larger batch gives in the last float bits)."""

    def __init__(self, comparator, rungs: dict[tuple[int, int], frozenset[int]] | None):
        self.comparator = comparator
        self.rungs = rungs
        self.name = comparator.name
        self.version = comparator.version
        self.batch_size = comparator.batch_size

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        c = self.comparator
        cnn = np.concatenate([np.asarray(c.cnn.score(images[k: k + CNN_BATCH]), dtype=np.float64)
                              for k in range(0, len(images), CNN_BATCH)]) if images else np.zeros(0)
        want = [None if self.rungs is None else self.rungs.get(tuple(img.shape[:2])) for img in images]
        return c.description_columns([{"cnn": float(s), **described(img, c.features_used, r)}
                                      for s, img, r in zip(cnn, images, want)])


def rungs_by_size(height: np.ndarray, width: np.ndarray, rungs: np.ndarray) -> list | None:
    """The rungs of some rows (-1: every rung) as ``RungDescriber`` takes them, in a form that
    pickles and prints the same each time: ``[[height, width, [rungs]], ...]`` sorted, or None
    when a row wants every rung."""
    if (rungs < 0).any():
        return None
    by: dict[tuple[int, int], set[int]] = {}
    for h, w, r in zip(height, width, rungs):
        by.setdefault((int(h), int(w)), set()).add(int(r))
    return [[h, w, sorted(r)] for (h, w), r in sorted(by.items())]


def as_size_map(entries: list | None) -> dict[tuple[int, int], frozenset[int]] | None:
    """``rungs_by_size``'s list as ``RungDescriber``'s mapping."""
    if entries is None:
        return None
    return {(int(h), int(w)): frozenset(int(x) for x in r) for h, w, r in entries}


def described_rungs(features: np.ndarray) -> np.ndarray:
    """(rows, rungs) bool: the rungs a row's features hold (``hf`` is computed at every rung
    described)."""
    return ~np.isnan(features.reshape(len(features), len(SCALES), len(FEATURES))[:, :, 0])


def size_rungs(width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """The highest rung each image reaches, from its size."""
    return np.array([reached_rung(int(min(w, h))) for w, h in zip(width, height)], np.int64)


def group_rungs(labels: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Per row, the rung its group compares at (the lowest ``reach`` among the members); -1 for
    a row in no group."""
    out = np.full(len(labels), -1, np.int64)
    grouped = np.flatnonzero(labels >= 0)
    if grouped.size:
        ids, inverse = np.unique(labels[grouped], return_inverse=True)
        low = np.full(ids.size, len(SCALES), np.int64)
        np.minimum.at(low, inverse, reach[grouped])
        out[grouped] = low[inverse]
    return out


@contextmanager
def torch_threads(n: int | None):
    """torch's CPU threads set to ``n`` for the block (None: left alone), then restored. Two
    threads on two cores that other processes also use wait on each other at every operation:
    the comparator's cnn in one process runs faster on one (docs/DEDUP.md, "Speed"). A process
    that has not imported torch (the cnn on onnxruntime, or an install without torch) is left
    alone: importing torch only to set its threads would cost more than it saves."""
    torch = sys.modules.get("torch")
    if n is None or torch is None:
        yield
        return

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(before)
