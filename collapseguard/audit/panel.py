"""``ComparePanel``: the audited detector plus the ``--compare`` ones, on the same decoded images.

With one process, ``audit --compare`` reads and decodes every image once and hands the same arrays
to each detector, instead of a full read-and-decode pass per compared detector. ``score`` is the
main detector's; ``score_detailed`` adds a ``score:<name>`` column per compared detector, so the
filter's ``score_records`` carries them through unchanged. For a sample with several images, the
compared scores are those of the image the main detector rated worst (the one the audit shows).
A compared detector that fails gives NaN for that batch and its error is kept in ``errors``: the
main scores are never lost to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from collapseguard.detectors.base import Detector


def compare_column(name: str) -> str:
    return f"score:{name}"


class ComparePanel(Detector):
    """Scores with ``main``; ``score_detailed`` also scores with every detector in ``others``."""

    def __init__(self, main: Detector, others: Mapping[str, Detector]):
        self.main, self.others = main, dict(others)
        self.name, self.version = main.name, main.version  # and so its description
        self.batch_size = min([main.batch_size or 16, *[o.batch_size or 16 for o in self.others.values()]])
        self.errors: list[str] = []

    @property
    def last_nan_reasons(self):
        """The main detector's reasons for its last call (it scores first in ``score_detailed``)."""
        return getattr(self.main, "last_nan_reasons", None)

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.main.score(images)

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(self.main.score_detailed(images))
        for name, det in self.others.items():
            try:
                vals = np.asarray(det.score(list(images)), dtype=np.float64).reshape(-1)
                if vals.shape != (len(images),):
                    raise RuntimeError(f"returned {vals.shape[0]} scores for {len(images)} images")
            except Exception as exc:  # noqa: BLE001 - recorded, and the main scores are kept
                self.errors.append(f"[{name}] {type(exc).__name__}: {exc}")
                vals = np.full(len(images), np.nan)
            out[compare_column(name)] = vals
        return out
