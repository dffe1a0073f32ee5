"""Score every image of a chain manifest with several detectors, timing each in the same run.

Images are decoded once per batch and handed to every detector in turn, so all detectors see the
same pixels and the timing is comparable: **images/s counts only the time spent inside
``detector.score``** (decoding and file reading are excluded and reported separately). Before
timing, each detector scores one image untimed (warm-up: lazy weight loading, first-call
allocations); that result is discarded.

Decoding and scoring are the one scoring loop's (``scoring.records``: ``decode_members``,
``score_batch``). A file that cannot be decoded gets NaN from every detector with error
``decode_error: ...``. A detector that raises on a batch is retried image by image; an image it
still fails on gets NaN with the exception as its error. A detector that returns the wrong number
of scores is an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collapseguard.detectors.base import Detector
from collapseguard.images import storage_label
from collapseguard.scoring import records

log = logging.getLogger(__name__)

#: manifest columns copied into every scores row
ID_COLUMNS = ("chain_id", "source_image", "family", "task", "step", "path")
#: columns every scores row also gets, for the per-storage and per-kind tables: ``storage`` is the
#: manifest's ``storage`` cell (what ``chains store`` wrote, e.g. ``webp q80``) where there is one,
#: else what the file's header says (``images.storage_label``: ``png``, ``jpeg q90 4:2:0``, ``webp``;
#: ``""`` for a file that could not be read); ``source_kind`` is the manifest's optional ``kind``
#: column (the clean kind of the chain's source: photo, screenshot, ...), ``""`` without one
GROUP_COLUMNS = ("storage", "source_kind")


@dataclass
class Timing:
    """Scoring time of one detector: images passed to ``score`` and seconds spent inside it."""

    detector: str
    version: str
    images: int = 0
    seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        """For JSON: ``images_per_s`` is None when no image was scored."""
        rate = self.images_per_s
        return {"detector": self.detector, "version": self.version, "images": self.images,
                "seconds": self.seconds, "images_per_s": rate if np.isfinite(rate) else None}


def _score_checked(det: Detector, images: Sequence[np.ndarray]) -> np.ndarray:
    return records.checked_scores(det, images)["score"]


def score_batch(det: Detector, images: Sequence[np.ndarray]) -> tuple[np.ndarray, list[str], float]:
    """Scores, per-image errors ("" when fine) and the seconds spent in the detector.

    Falls back to one image at a time when the batch call raises (``records.score_batch``).
    """
    t0 = time.perf_counter()
    detail, errors = records.score_batch(det, images, retry=True)
    return detail["score"], errors, time.perf_counter() - t0


def time_detectors(
    detectors: Sequence[Detector], images: Sequence[np.ndarray], batch_size: int = 16, warmup: bool = True
) -> list[Timing]:
    """Images/s of each detector on the same decoded ``images`` (scoring time only).

    The detectors take turns batch by batch, in an order reversed every other batch (as
    ``score_manifest`` interleaves them), so that a burst of load on a shared machine falls on all
    of them instead of on one detector's whole timing.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    timings = [Timing(det.name, det.version) for det in detectors]
    if warmup and len(images):
        for det in detectors:
            _score_checked(det, images[:1])
    order = list(range(len(detectors)))
    for b, i in enumerate(range(0, len(images), batch_size)):
        chunk = images[i : i + batch_size]
        for j in (order if b % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            _score_checked(detectors[j], chunk)
            timings[j].seconds += time.perf_counter() - t0
            timings[j].images += len(chunk)
    return timings


def score_manifest(
    manifest: pd.DataFrame,
    detectors: Sequence[Detector],
    batch_size: int = 16,
    warmup: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[pd.DataFrame, list[Timing], float]:
    """Score every manifest row with every detector.

    Returns ``(scores, timings, decode_seconds)`` where ``scores`` is a long table with one row per
    image × detector: the manifest's id columns, ``detector``, ``version``, ``score`` (NaN when it
    could not be scored) and ``error``. ``progress(done, total)`` is called after each batch.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if not detectors:
        raise ValueError("no detectors to evaluate")
    names = [d.name for d in detectors]
    if len(set(names)) != len(names):
        raise ValueError(f"detector named twice: {names}")
    missing = [c for c in ID_COLUMNS if c not in manifest.columns]
    if missing:
        raise ValueError(f"manifest lacks column(s) {missing}")
    rows = manifest.reset_index(drop=True)
    timings = [Timing(d.name, d.version) for d in detectors]
    warmed = [not warmup] * len(detectors)
    n = len(rows)
    results: dict[str, tuple[np.ndarray, list[str]]] = {
        d.name: (np.full(n, np.nan), [""] * n) for d in detectors
    }
    decode_s = 0.0
    given = rows["storage"].fillna("").astype(str) if "storage" in rows.columns else None
    storage = [""] * n
    for start in range(0, n, batch_size):
        idx = list(range(start, min(n, start + batch_size)))
        images, ok_idx = [], []
        t0 = time.perf_counter()
        for i in idx:
            try:
                with open(rows.at[i, "path"], "rb") as f:
                    data = f.read()
            except OSError as exc:
                data, why = None, str(exc)
            else:
                decoded, errs = records.decode_members([(str(rows.at[i, "path"]), data)])
                why = errs[0] if errs else ""
                # from the header, also for a file that does not decode (a truncated PNG is still
                # a PNG): its chain stays in its storage's tables instead of counting as "mixed"
                storage[i] = storage_label(data)
            if why:
                for d in detectors:
                    results[d.name][1][i] = f"decode_error: {why}"[:300]
                continue
            images.append(decoded[0][1])
            ok_idx.append(i)
        decode_s += time.perf_counter() - t0
        if images:
            for j, det in enumerate(detectors):
                if not warmed[j]:
                    try:
                        _score_checked(det, images[:1])
                    except Exception as exc:  # noqa: BLE001 - the real call below records it
                        log.debug("warm-up of %s failed: %s", det.name, exc)
                    warmed[j] = True
                scores, errors, secs = score_batch(det, images)
                timings[j].seconds += secs
                timings[j].images += len(images)
                out_scores, out_err = results[det.name]
                for k, i in enumerate(ok_idx):
                    out_scores[i] = scores[k]
                    out_err[i] = errors[k] or ("" if np.isfinite(scores[k]) else "nan_score")
        if progress is not None:
            progress(idx[-1] + 1, n)
    ident = rows[list(ID_COLUMNS)].copy()
    ident["storage"] = [g or h for g, h in zip(given, storage)] if given is not None else storage
    ident["source_kind"] = rows["kind"].fillna("").astype(str) if "kind" in rows.columns else ""
    parts = []
    for det in detectors:
        part = ident.copy()
        part["detector"] = det.name
        part["version"] = det.version
        part["score"] = results[det.name][0]
        part["error"] = results[det.name][1]
        parts.append(part)
    return pd.concat(parts, ignore_index=True), timings, decode_s
