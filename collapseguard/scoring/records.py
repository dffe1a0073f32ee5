"""The one scoring loop: batched scoring of records (shard samples, image files, chain images),
shared by every scorer of images (score, filter, audit, calibration, evaluation, training's
held-out metrics, the distillation label cache).

A record holds one or more encoded images (or decoded arrays). Each image is decoded at native
resolution (``decode_members``: pixel caps, formats by content) and scored; a record's score is
the highest (most degraded) of its images. Decoding errors and NaN scores are kept as text, never
turned into scores. Batches are bounded by count and by total pixels, so a shard of 5K images does
not hold gigabytes at once. A detector that raises on a batch stops the loop, or with
``retry=True`` is asked again one image at a time, each image it still fails on recorded with the
exception as its reason (``score_batch``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collapseguard.detectors.base import Detector, DetectorError
from collapseguard.images import (
    IMAGE_EXTENSIONS,
    DecodeError,
    decode_detailed,
    heif_hint,
    is_image_name,
)

log = logging.getLogger(__name__)

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
    #: of the image the score came from (else the first decoded, or the first refused whose header
    #: gave its size); None when no image's size is known (none could be read)
    width: int | None = None
    height: int | None = None
    #: how the scored image is stored (``images.image_storage``: "png", "jpeg 4:2:0", ...)
    storage: str = ""
    #: does the scored image have transparent pixels (scored composited over
    #: ``images.ALPHA_BACKGROUND``)?
    has_alpha: bool = False


def image_members(members: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(n, b) for n, b in members if is_image_name(n)]


NO_IMAGE = "no image file in the sample"


def no_image_text(names: Sequence[str], shown: int = 3) -> str:
    """Why a record with the members ``names`` (none an image file) has nothing to score:
    ``NO_IMAGE``, naming the first ``shown`` members and the image types when it has any (an
    image under a name ``is_image_name`` does not take, such as ``x.heic`` without pillow-heif,
    is told apart from a caption-only sample at a glance), and what to install to read a
    HEIC/HEIF member (``images.heif_hint``)."""
    if not names:
        return NO_IMAGE
    listed = ", ".join(str(n)[:80] for n in names[:shown]) + (f" and {len(names) - shown} more"
                                                             if len(names) > shown else "")
    verb = "is not an image type" if len(names) == 1 else "are not image types"
    hint = heif_hint(names)
    return (f"{NO_IMAGE} ({listed} {verb}; images are .{', .'.join(IMAGE_EXTENSIONS)})"
            f"{'; ' + hint if hint else ''}")


def decode_members(
    members: Sequence[tuple[str, bytes | np.ndarray]],
    max_record_pixels: int = MAX_RECORD_PIXELS,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[list[tuple[str, np.ndarray, str]], list[str]]:
    """Decode one record's images: ``([(name, array, storage, has_alpha), ...], errors)``.

    Bytes are decoded by content (``images.decode_detailed``: allowed formats, the per-image
    pixel cap, cut-short PNGs, transparency composited); an array is taken as already decoded
    (storage ``""``; an RGBA array has alpha when some pixel is not opaque). Decoding
    stops once the record's images hold over ``max_record_pixels`` together. ``transform`` (e.g. a
    JPEG re-encoding) is applied to each decoded image. Each error reads ``"<name>: <reason>"``.
    """
    decoded, errors, _ = _decode_members(members, max_record_pixels, transform)
    return [d[:4] for d in decoded], errors


def _decode_full(data: bytes) -> tuple[np.ndarray, str, bool, tuple[int, int]]:
    arr, storage, alpha = decode_detailed(data)
    return arr, storage, alpha, arr.shape[:2]


def _decode_members(members, max_record_pixels, transform, decode=None):
    """``decode_members`` with each image's full (height, width) as a fifth element (with a
    ``transform``, the transformed image's), and the (height, width) of the first image refused
    whose header gave its size (over the pixel limit; None when none did); ``decode``
    (``images.decode_reduced``'s signature, bytes -> (array, storage, has_alpha, (height,
    width))) replaces the full decoding."""
    decode = decode or _decode_full
    decoded, errors, record_pixels, refused_shape = [], [], 0, None
    for name, data in members:
        if isinstance(data, np.ndarray):
            arr, storage = data, ""
            alpha = bool(arr.ndim == 3 and arr.shape[2] == 4 and arr[..., 3].min() < 255)
            shape = arr.shape[:2]
        else:
            try:
                arr, storage, alpha, shape = decode(data)
            except DecodeError as exc:
                errors.append(f"{name}: {exc}")
                if exc.size is not None and refused_shape is None:
                    refused_shape = exc.size[::-1]
                continue
        record_pixels += shape[0] * shape[1]
        if record_pixels > max_record_pixels:
            errors.append(f"{name}: the sample's images hold over {max_record_pixels} pixels "
                          "together; the rest were not decoded")
            break
        if transform is not None:
            arr = transform(arr)
            shape = arr.shape[:2]
        decoded.append((name, arr, storage, alpha, tuple(shape)))
    return decoded, errors, refused_shape


def checked_scores(detector: Detector, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """``detector.score_detailed(images)`` as float64 arrays, one score per image (else
    :class:`DetectorError`)."""
    detail = detector.score_detailed(list(images))
    out = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in detail.items()}
    if out["score"].shape != (len(images),):
        raise DetectorError(f"detector {detector.name} returned {out['score'].shape[0]} scores "
                            f"for {len(images)} images")
    return out


def _nan_reasons(detector: Detector, detail: dict[str, np.ndarray]) -> list[str]:
    """The detector's ``last_nan_reasons`` for the NaN scores of its last call ("" elsewhere, and
    everywhere when it gives none or not one per image)."""
    reasons = getattr(detector, "last_nan_reasons", None)
    n = len(detail["score"])
    if not isinstance(reasons, (list, tuple)) or len(reasons) != n:
        return [""] * n
    return [str(r)[:300] if np.isnan(v) and r else "" for r, v in zip(reasons, detail["score"])]


def score_batch(detector: Detector, images: Sequence[np.ndarray],
                retry: bool = False) -> tuple[dict[str, np.ndarray], list[str]]:
    """Scores (``checked_scores``) and per-image errors (``""`` when the call went through, or the
    detector's ``last_nan_reasons`` for an image it gave NaN).

    A detector that raises stops here, or with ``retry`` is asked again one image at a time: an
    image it still fails on gets NaN and ``"<ExceptionType>: <message>"`` as its error.
    """
    errors = [""] * len(images)
    try:
        detail = checked_scores(detector, images)
        return detail, _nan_reasons(detector, detail)
    except Exception as exc:  # raised again unless retried one by one below
        if not retry:
            raise
        log.debug("%s refused a batch of %d (%s); scoring one by one", detector.name, len(images), exc)
    out: dict[str, np.ndarray] = {"score": np.full(len(images), np.nan)}
    for i, img in enumerate(images):
        try:
            one = checked_scores(detector, [img])
        except Exception as exc:  # noqa: BLE001 - recorded per image
            errors[i] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        errors[i] = _nan_reasons(detector, one)[0]
        for k, v in one.items():
            out.setdefault(k, np.full(len(images), np.nan))[i] = v[0]
    return out, errors


def score_records(
    records: Iterable[Any],
    detector: Detector,
    members_of=lambda r: r,
    batch_size: int | None = None,
    max_pixels: int = MAX_BATCH_PIXELS,
    max_record_pixels: int = MAX_RECORD_PIXELS,
    *,
    images_only: bool = True,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    retry: bool = False,
    decode: Callable[[bytes], tuple] | None = None,
) -> Iterator[tuple[Any, Scored]]:
    """Yield ``(record, Scored)`` in input order.

    ``members_of(record)`` returns the record's files as ``[(name, bytes or array), ...]``; only
    image files are decoded (every member with ``images_only=False``, for callers whose records
    are images whatever their name). ``batch_size`` defaults to the detector's own. ``transform``
    and the pixel caps are ``decode_members``'; ``retry`` is ``score_batch``'s; ``decode``
    (``images.decode_reduced`` with its size bound) replaces the full decoding, for a detector that
    reads reduced images (widths and heights stay those of the full images). At most
    ``batch_size`` records wait for a decision, those without an image to score included: a
    stream of caption-only or undecodable samples is passed on as it comes, not held.

    Records are taken one at a time, in this thread: ``transform`` is called on a record's images
    right after ``members_of(record)`` returns, before the next record's ``members_of`` and before
    anything is yielded, so a caller may attribute each ``transform`` call to the record it last
    gave members for (calibration's pixel digests, ``calibration.scoring._score_batches``).
    """
    batch_size = batch_size or detector.batch_size or 16
    pending: list[tuple[Any, Scored, list[int]]] = []  # record, result, indices into images
    images: list[np.ndarray] = []
    names: list[str] = []
    storages: list[str] = []
    alphas: list[bool] = []
    shapes: list[tuple[int, int]] = []  # of the full images
    pixels = 0

    def flush():
        nonlocal images, names, storages, alphas, shapes, pixels, pending
        if images:
            detail, failed = score_batch(detector, images, retry=retry)
            scores = detail["score"]
        for rec, res, idx in pending:
            if idx:
                vals = scores[idx]
                finite = np.isfinite(vals)
                if not finite.any():
                    h, w = shapes[idx[0]]
                    res.status, res.error = "score_error", failed[idx[0]] or (
                        f"{detector.name} could not score the image ({w}x{h} px"
                        f"{'; small images are a common cause' if min(h, w) < 128 else ''})")
                    res.image = names[idx[0]]
                    res.storage, res.has_alpha = storages[idx[0]], alphas[idx[0]]  # decoded: say how
                else:
                    if not finite.all():  # scored by its other images: say which one was not
                        res.error = "; ".join(f"{names[i]}: {failed[i] or detector.name + ' could not score it'}"
                                              for i, ok in zip(idx, finite) if not ok)
                    j = int(np.nanargmax(np.where(finite, vals, -np.inf)))
                    res.score = float(vals[j])
                    res.image = names[idx[j]]
                    res.height, res.width = shapes[idx[j]]  # the size of the image named
                    res.storage = storages[idx[j]]
                    res.has_alpha = alphas[idx[j]]
                    for k, arr in detail.items():
                        if k != "score":
                            res.extra[k] = float(arr[idx[j]])
            yield rec, res
        pending, images, names, storages, alphas, shapes, pixels = [], [], [], [], [], [], 0

    for rec in records:
        members = members_of(rec)
        every = list(members)
        members = image_members(every) if images_only else every
        res = Scored(n_images=len(members))
        idx: list[int] = []
        if not members:
            res.status, res.error = "no_image", no_image_text([n for n, _ in every])
        decoded, errors, refused_shape = _decode_members(members, max_record_pixels, transform, decode)
        if errors:
            # one undecodable image makes the whole record untrustworthy: nothing of it is scored
            res.status, res.error = "decode_error", "; ".join(errors)
            if refused_shape is not None:  # an image over the pixel limit: its header's size
                res.height, res.width = refused_shape
        else:
            for name, arr, storage, alpha, shape in decoded:
                if not res.width:
                    res.height, res.width = shape
                idx.append(len(images))
                images.append(arr)
                names.append(name)
                storages.append(storage)
                alphas.append(alpha)
                shapes.append(shape)
                pixels += arr.shape[0] * arr.shape[1]
        pending.append((rec, res, idx))
        if len(images) >= batch_size or pixels >= max_pixels or len(pending) >= batch_size:
            yield from flush()
    yield from flush()

#: ``filter``'s reasons for setting a tar sample aside whatever its score, in the order they are
#: tested (a sample with several is set aside for the first): a member name changed to be written
#: safely, a member not read (``io.tar``'s refused members), a key that named an earlier sample of
#: the shard. ``filter.decisions.decide``, ``set_aside_reason`` and the audit's labels
#: (``audit.labels.SET_ASIDE_LABELS``) are all made from this tuple, each reason with the flag of
#: ``first_set_aside`` at its position.
SET_ASIDE_REASONS = ("unsafe_name", "refused_member", "repeated_key")


def first_set_aside(unsafe: bool = False, refused: bool = False, repeated: bool = False) -> str:
    """The first reason of ``SET_ASIDE_REASONS`` whose flag holds ("" for none): ``unsafe``
    (member names were changed), ``refused`` (a member was not read), ``repeated`` (the key named
    an earlier sample of the shard)."""
    holds = dict(zip(SET_ASIDE_REASONS, (unsafe, refused, repeated), strict=True))
    return next((reason for reason in SET_ASIDE_REASONS if holds[reason]), "")


def set_aside_flags(sample) -> dict[str, bool]:
    """``first_set_aside``'s flags of a tar sample (``io.tar.Sample``)."""
    return {"unsafe": bool(sample.unsafe_names), "refused": bool(sample.refused),
            "repeated": sample.repeat > 0}


def set_aside_reason(sample) -> str:
    """Why ``filter`` sets a tar sample aside whatever its score (``filter.decisions``' reason):
    one of ``SET_ASIDE_REASONS``, or "" for none."""
    return first_set_aside(**set_aside_flags(sample))


def sample_error(sample, error: str, say_repeat: bool = False) -> str:
    """A row's error text: the scoring error plus what was wrong with the sample's members (left
    out when ``error`` already says it, as an earlier pass's error read back by ``scores_from``);
    with ``say_repeat`` (a table with no reason or ``set_aside`` column to say it), that its key
    repeats an earlier sample's in the shard, so a join on (source, key) is not trusted blindly."""
    notes = []
    if sample.unsafe_names:
        names = list(dict.fromkeys(sample.unsafe_names))  # a repeated name is listed once per change
        repeated = [n for n in names if sample.unsafe_names.count(n) > 1]
        notes.append("unsafe member names: " + ", ".join(repr(n) for n in names[:5])
                     + (" (repeated within the sample: the copy is written as <name>.dupN)" if repeated else ""))
    if sample.refused:
        notes.append("members not read: " + ", ".join(
            f"{name!r} ({why})" for name, why in sample.refused[:5]))
    if say_repeat and sample.repeat > 0:
        notes.append(f"the key {sample.key!r} repeats an earlier sample's in the shard (filter sets "
                     "it aside: repeated_key)")
    error = error or ""
    return "; ".join(([error] if error else []) + [n for n in notes if n not in error])
