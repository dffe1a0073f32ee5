"""Batched scoring of records (shard samples or image files), shared by score, filter and audit.

A record holds one or more encoded images. Each image is decoded at native resolution and scored;
a record's score is the highest (most degraded) of its images. Decoding errors and NaN scores are
kept as text, never turned into scores. Batches are bounded by count and by total pixels, so a
shard of 5K images does not hold gigabytes at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collapseguard.detectors.base import Detector
from collapseguard.images import DecodeError, decode_with_storage, is_image_name

#: flush a batch once it holds this many pixels, whatever the batch size
MAX_BATCH_PIXELS = 48_000_000
#: a record whose images hold more pixels than this together is not scored (a decode error):
#: one small shard sample of many large-claiming images must not take gigabytes
MAX_RECORD_PIXELS = 128_000_000


@dataclass
class Scored:
    """The outcome of scoring one record."""

    score: float = math.nan
    #: member/file name of the image the score came from (the most degraded one)
    image: str = ""
    #: "" when scored; else the reason text (decode error, no image, detector gave NaN)
    error: str = ""
    #: one of "ok", "decode_error", "no_image", "score_error"
    status: str = "ok"
    extra: dict[str, float] = field(default_factory=dict)
    n_images: int = 0
    width: int = 0
    height: int = 0
    #: how the scored image is stored (``images.image_storage``: "png", "jpeg 4:2:0", ...)
    storage: str = ""


def image_members(members: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(n, b) for n, b in members if is_image_name(n)]


def score_records(
    records: Iterable[Any],
    detector: Detector,
    members_of=lambda r: r,
    batch_size: int | None = None,
    max_pixels: int = MAX_BATCH_PIXELS,
    max_record_pixels: int = MAX_RECORD_PIXELS,
) -> Iterator[tuple[Any, Scored]]:
    """Yield ``(record, Scored)`` in input order.

    ``members_of(record)`` returns the record's files as ``[(name, bytes), ...]``; only image
    files are decoded. ``batch_size`` defaults to the detector's own.
    """
    batch_size = batch_size or detector.batch_size or 16
    pending: list[tuple[Any, Scored, list[int]]] = []  # record, result, indices into images
    images: list[np.ndarray] = []
    names: list[str] = []
    storages: list[str] = []
    pixels = 0

    def flush():
        nonlocal images, names, storages, pixels, pending
        if images:
            detail = detector.score_detailed(images)
            scores = np.asarray(detail["score"], dtype=np.float64)
            if scores.shape != (len(images),):
                raise RuntimeError(f"detector {detector.name} returned {scores.shape} scores "
                                   f"for {len(images)} images")
        for rec, res, idx in pending:
            if idx:
                vals = scores[idx]
                finite = np.isfinite(vals)
                if not finite.any():
                    h, w = images[idx[0]].shape[:2]
                    res.status, res.error = "score_error", (
                        f"{detector.name} could not score the image ({w}x{h} px"
                        f"{'; small images are a common cause' if min(h, w) < 128 else ''})")
                    res.image = names[idx[0]]
                else:
                    if not finite.all():  # scored by its other images: say which one was not
                        res.error = "; ".join(f"{names[i]}: {detector.name} could not score it"
                                              for i, ok in zip(idx, finite) if not ok)
                    j = int(np.nanargmax(np.where(finite, vals, -np.inf)))
                    res.score = float(vals[j])
                    res.image = names[idx[j]]
                    res.storage = storages[idx[j]]
                    for k, arr in detail.items():
                        if k != "score":
                            res.extra[k] = float(np.asarray(arr, dtype=np.float64)[idx[j]])
            yield rec, res
        pending, images, names, storages, pixels = [], [], [], [], 0

    for rec in records:
        members = image_members(members_of(rec))
        res = Scored(n_images=len(members))
        idx: list[int] = []
        if not members:
            res.status, res.error = "no_image", "no image file in the sample"
        decoded, errors, record_pixels = [], [], 0
        for name, data in members:
            try:
                arr, storage = decode_with_storage(data)
            except DecodeError as exc:
                errors.append(f"{name}: {exc}")
                continue
            record_pixels += arr.shape[0] * arr.shape[1]
            if record_pixels > max_record_pixels:
                errors.append(f"{name}: the sample's images hold over {max_record_pixels} pixels "
                              "together; the rest were not decoded")
                break
            decoded.append((name, arr, storage))
        if errors:
            # one undecodable image makes the whole record untrustworthy: nothing of it is scored
            res.status, res.error = "decode_error", "; ".join(errors)
        else:
            for name, arr, storage in decoded:
                if not res.width:
                    res.height, res.width = arr.shape[:2]
                idx.append(len(images))
                images.append(arr)
                names.append(name)
                storages.append(storage)
                pixels += arr.shape[0] * arr.shape[1]
        pending.append((rec, res, idx))
        if len(images) >= batch_size or pixels >= max_pixels:
            yield from flush()
    yield from flush()

def sample_error(sample, error: str) -> str:
    """A row's error text: the scoring error plus what was wrong with the sample's members (left
    out when ``error`` already says it, as an earlier pass's error read back by ``scores_from``)."""
    notes = []
    if sample.unsafe_names:
        notes.append("unsafe member names: " + ", ".join(repr(n) for n in sample.unsafe_names[:5]))
    if sample.refused:
        notes.append("members not read: " + ", ".join(
            f"{name!r} ({why})" for name, why in sample.refused[:5]))
    error = error or ""
    return "; ".join(([error] if error else []) + [n for n in notes if n not in error])
