"""Filtering inside a data loader: a webdataset stage, a Ray Data scorer and a batched function
for Hugging Face ``datasets``.

Both decide exactly as ``collapseguard filter`` does: the same decoding and scoring loop
(``scoring.records.score_records``), the same threshold resolution (an explicit threshold, else a
calibration file, else the calibration shipped for the detector:
``calibration.thresholds.resolve_threshold``) and the same rule (``filter.decisions.decide``).

webdataset::

    import webdataset as wds
    from collapseguard.inline import wds_filter

    ds = wds.WebDataset("data/shard-{000..009}.tar").compose(wds_filter()).decode("rgb")

The stage sits before ``.decode()``: it reads the raw samples (dicts of bytes with ``__key__`` and
``__url__``) and yields the ones ``filter`` would write to kept/, unchanged.

Ray Data::

    import ray
    from collapseguard.inline import RayScorer

    ds = ray.data.read_webdataset("data/", decoder=None)
    scored = ds.map_batches(RayScorer, fn_constructor_kwargs={"detector": "cnn"},
                            concurrency=2, batch_format="pandas")
    kept = scored.filter(lambda row: row["decision"] == "kept")

``RayScorer`` adds ``score``, ``decision`` and ``reason`` columns; image columns must hold the
encoded bytes (``decoder=None``), because decoding them is part of what is decided.

Hugging Face ``datasets`` (Parquet files with an ``Image`` feature, or a binary ``jpg`` column)::

    import datasets
    from collapseguard.inline import hf_scorer

    ds = datasets.Dataset.from_parquet("data/*.parquet")
    ds = ds.cast_column("image", datasets.Image(decode=False))  # bytes: decoding is judged too
    scorer = hf_scorer()
    kept = ds.filter(scorer.keep, batched=True)          # the rows `filter` writes to kept/
    scored = ds.map(scorer, batched=True)  # + score, decision, reason, score_error, has_alpha

A detector given by name runs as ``filter`` runs it (a cnn: onnxruntime on the CPU where it is
installed, as ``--runtime auto``). The stage and the scorers then pickle as their settings
(``num_proc`` in ``datasets``, spawned ``DataLoader`` workers): each process that unpickles one
creates its own detector, and the same settings pickle to the same bytes, so ``datasets`` can
cache ``.map`` and ``.filter``.

What the loader shows the stage is all it can judge: webdataset drops link and device members of a
tar before any stage sees them, so a sample that ``filter`` sets aside as ``refused_member`` reaches
the stage without that member and is judged by what is left. Member names with ``..`` or a leading
``/`` are rejected as ``unsafe_name`` in both. The stage rejects a key that already named an
earlier sample of the same shard as ``repeated_key``, as ``filter`` does; it knows a shard by
``__url__``, and a sample whose key is the current pass's first key starts a new pass of that
shard: webdataset's ``resampled=True`` streams a shard again, often right after itself, and each
pass is judged afresh (else every sample of a second pass would be dropped, and a single
resampled shard would never yield again). So in a shard ``k, j, k`` the stage judges the second
``k`` by its score where ``filter`` sets it aside; a repeat of any other key (``j, k, i, k``) is
``repeated_key`` in both. Ray's ``read_webdataset`` refuses repeated keys itself.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from collapseguard.filter.decisions import decide
from collapseguard.io.tar import clean_member_name
from collapseguard.scoring.records import Scored, score_records


def _meta(field: str) -> bool:
    return field.startswith("__")


def _members(sample: dict) -> list[tuple[str, bytes]]:
    """A raw webdataset sample's files as ``(name, bytes)``: ``<key>.<extension>`` per field."""
    key = sample.get("__key__", "")
    out = []
    for field, value in sample.items():
        if _meta(field):
            continue
        name = f"{key}.{field}"
        if not isinstance(value, (bytes, bytearray, memoryview)):
            from collapseguard.images import is_image_name
            if is_image_name(name):
                raise TypeError(
                    f"sample {key!r}: field {field!r} holds {type(value).__name__}, not encoded "
                    "bytes; put the collapseguard stage before .decode() (and read Ray datasets "
                    "with decoder=None): decoding is part of what is judged")
            continue
        out.append((name, bytes(value)))
    return out


def _unsafe(sample: dict) -> bool:
    """Would ``filter`` have had to clean this sample's member names (``..``, a leading ``/``)?"""
    key = str(sample.get("__key__", ""))
    for field in sample:
        if _meta(field):
            continue
        name = f"{key}.{field}"
        if clean_member_name(name) != name.removeprefix("./"):
            return True
        if name.rsplit("/", 1)[-1].startswith("."):
            return True
    return False


#: set in a process forked from one that imported this module (os.register_at_fork)
_FORKED = False


def _mark_forked() -> None:
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def _detector_kwargs(spec: str, kwargs: dict | None) -> dict:
    """The keyword arguments a detector named ``spec`` is created with: a cnn without a
    ``runtime`` runs as ``filter --runtime auto`` runs it (onnxruntime on the CPU where it is
    installed), unless ``$COLLAPSEGUARD_CNN_RUNTIME`` names another."""
    from collapseguard.detectors.cnn_family import RUNTIME_ENV, is_cnn_family
    kwargs = dict(kwargs or {})
    if is_cnn_family(spec) and "runtime" not in kwargs:
        kwargs["runtime"] = os.environ.get(RUNTIME_ENV, "").strip() or "auto"
    return kwargs


class _Decider:
    """A detector, its resolved threshold and the filter's options, shared by the front ends.

    Made from a detector name, it pickles as its settings (the name, the keyword arguments with
    the cnn runtime this process chose, the detector's version, the threshold and the options),
    and the process that unpickles it creates the detector again when it first scores; so the
    front ends can be sent to worker processes, and the same settings always pickle to the same
    bytes. In a process forked from one that had imported torch, torch is limited to one thread
    first: OpenMP's thread pool does not survive a fork. Made from a detector object, it pickles
    that object."""

    def __init__(self, detector="cnn", calibration=None, threshold: float | None = None, *,
                 batch_size: int | None = None, reject_no_image: bool = False,
                 detector_kwargs: dict | None = None):
        from collapseguard.calibration.thresholds import resolve_threshold
        self._spec: tuple[str, dict] | None = None
        if isinstance(detector, str):
            from collapseguard.detectors import create
            from collapseguard.detectors.cnn_family import is_cnn_family
            spec = detector.strip()
            kwargs = _detector_kwargs(spec, detector_kwargs)
            detector = create(spec, **kwargs)
            if is_cnn_family(spec):  # rebuilt on the runtime chosen here: the same scores
                kwargs["runtime"] = getattr(detector, "runtime", "torch")
            self._spec = (spec, kwargs)
        self._detector = detector
        self._made = (getattr(detector, "name", ""), getattr(detector, "version", ""))
        self._lock = threading.Lock()
        self.threshold, self.threshold_source, _ = resolve_threshold(
            detector, threshold, calibration,
            how="pass threshold=T or calibration=FILE (made with `collapseguard calibrate`)")
        self.batch_size = batch_size
        self.reject_no_image = reject_no_image

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_detector", "_lock")}
        state["_detector"] = self._detector if self._spec is None else None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def detector(self):
        """The detector; created again on first use after unpickling."""
        if self._detector is None:
            with self._lock:
                if self._detector is None:
                    self._detector = self._create()
        return self._detector

    def _create(self):
        from collapseguard.detectors import DetectorError, create
        if _FORKED and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
        name, kwargs = self._spec
        detector = create(name, **kwargs)
        made = (getattr(detector, "name", ""), getattr(detector, "version", ""))
        if made != self._made:
            raise DetectorError(
                f"detector {name!r} is now {made[0]}@{made[1]}, not the {self._made[0]}@"
                f"{self._made[1]} this scorer was made with (and its threshold is for); its weights "
                "changed: make the scorer again")
        return detector

    def decide(self, samples: Iterable[dict], *, track_keys: bool = False, images_only: bool = True
               ) -> Iterator[tuple[dict, Scored, str, str]]:
        """Yield ``(sample, scored, decision, reason)`` in input order.

        With ``track_keys``, a sample whose ``__key__`` already named an earlier sample of the
        same pass over a shard (``__url__``; the record starts afresh when the shard changes, and
        when the pass's first key comes again: the module's notes) is rejected as
        ``repeated_key``, as ``filter`` rejects the later copy of ``k`` in ``j, k, i, k``.
        ``images_only=False`` judges every field as an image, whatever its name (columns the
        caller named as image columns)."""
        url, seen, first = object(), set(), None
        for sample, scored in score_records(samples, self.detector, members_of=_members,
                                            batch_size=self.batch_size, images_only=images_only):
            unsafe, repeated = _unsafe(sample), False
            if track_keys:
                key = str(sample.get("__key__", ""))  # io.tar keeps a leading ./ in keys too
                if sample.get("__url__") != url or (key == first and not unsafe):
                    url, seen, first = sample.get("__url__"), set(), None  # a new shard, or pass
                if not unsafe:  # as in io.tar, only samples with safe names claim a key
                    first = key if first is None else first
                    repeated = key in seen
                    seen.add(key)
            decision, reason = decide(scored, self.threshold, unsafe=unsafe, repeated=repeated,
                                      reject_no_image=self.reject_no_image)
            yield sample, scored, decision, reason


class WdsFilter:
    """A webdataset pipeline stage (``.compose(stage)``): yields the samples ``filter`` keeps.

    ``kept``, ``rejected`` and ``reasons`` count what passed through; ``on_reject(sample,
    reason, score)``, when given, is called for every sample that is dropped.
    """

    def __init__(self, decider: _Decider, on_reject=None):
        self._decider = decider
        self.on_reject = on_reject
        self.kept = 0
        self.rejected = 0
        self.reasons: Counter = Counter()

    @property
    def threshold(self) -> float:
        return self._decider.threshold

    @property
    def threshold_source(self) -> str:
        return self._decider.threshold_source

    def __call__(self, src: Iterable[dict]) -> Iterator[dict]:
        for sample, scored, decision, reason in self._decider.decide(src, track_keys=True):
            self.reasons[reason] += 1
            if decision == "kept":
                self.kept += 1
                yield sample
            else:
                self.rejected += 1
                if self.on_reject is not None:
                    self.on_reject(sample, reason, scored.score)


def wds_filter(detector="cnn", calibration=None, threshold: float | None = None, *,
               batch_size: int | None = None, reject_no_image: bool = False,
               detector_kwargs: dict | None = None, on_reject=None) -> WdsFilter:
    """A stage for ``wds.WebDataset(urls).compose(stage)`` that yields exactly the raw samples
    ``collapseguard filter`` would keep, unchanged.

    ``detector`` is a name (as ``--detector``) or a created detector; ``calibration`` a
    calibration file; ``threshold`` overrides both (uncalibrated). Without either, the
    calibration shipped for the detector is used, as in ``filter``. A cnn named without
    ``detector_kwargs={"runtime": ...}`` runs on ``$COLLAPSEGUARD_CNN_RUNTIME``, else as
    ``filter --runtime auto`` (onnxruntime on the CPU where it is installed). Given by name, the
    detector is not pickled with the stage: a process that unpickles it creates its own.

    The stage's counters (``kept``, ``rejected``, ``reasons``) and ``on_reject`` run in the process
    that iterates the dataset: inside a ``torch.utils.data.DataLoader`` with ``num_workers > 0``,
    each worker counts in its own copy of the stage and the main process's copy stays unchanged.
    """
    return WdsFilter(_Decider(detector, calibration, threshold, batch_size=batch_size,
                              reject_no_image=reject_no_image, detector_kwargs=detector_kwargs),
                     on_reject=on_reject)


class RayScorer:
    """A callable class for Ray Data's ``map_batches``: adds ``score``, ``decision`` and
    ``reason`` columns to each batch (pandas DataFrame or dict of numpy arrays).

    Rows are webdataset samples as ``ray.data.read_webdataset(..., decoder=None)`` gives them: one
    column per file extension holding the encoded bytes, plus ``__key__``. Columns named by
    ``image_columns`` (default: every column whose name is an image extension) are scored, each
    as encoded image bytes whatever its name (``image``, ``photo`` from ``read_parquet``); a
    row's score is its most degraded image's, as in ``filter``.
    """

    def __init__(self, detector="cnn", calibration=None, threshold: float | None = None, *,
                 batch_size: int | None = None, reject_no_image: bool = False,
                 detector_kwargs: dict | None = None, image_columns: list[str] | None = None):
        self._decider = _Decider(detector, calibration, threshold, batch_size=batch_size,
                                 reject_no_image=reject_no_image, detector_kwargs=detector_kwargs)
        self.image_columns = image_columns

    def _columns(self, names) -> list[str]:
        from collapseguard.images import is_image_name
        if self.image_columns is not None:
            missing = [c for c in self.image_columns if c not in names]
            if missing:
                raise KeyError(f"image column(s) {missing} not in the batch (columns: {list(names)})")
            return list(self.image_columns)
        return [c for c in names if not _meta(c) and is_image_name(f"x.{c}")]

    def __call__(self, batch):
        import numpy as np
        is_pandas = hasattr(batch, "iloc")
        names = list(batch.columns) if is_pandas else list(batch)
        cols = self._columns(names)
        n = len(batch) if is_pandas else (len(next(iter(batch.values()))) if batch else 0)
        keys = (batch["__key__"] if "__key__" in names else [str(i) for i in range(n)])
        keys = list(keys)
        rows = []
        for i in range(n):
            row = {"__key__": str(keys[i])}
            for c in cols:
                v = batch[c].iloc[i] if is_pandas else batch[c][i]
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue  # this sample has no file of that extension
                row[c] = v
            rows.append(row)
        scores, decisions, reasons = [], [], []
        for _, scored, decision, reason in self._decider.decide(
                rows, images_only=self.image_columns is None):
            scores.append(scored.score)
            decisions.append(decision)
            reasons.append(reason)
        if is_pandas:
            batch = batch.copy()
            batch["score"] = np.asarray(scores, dtype=np.float64)
            batch["decision"] = decisions
            batch["reason"] = reasons
            return batch
        out = dict(batch)
        out["score"] = np.asarray(scores, dtype=np.float64)
        out["decision"] = np.asarray(decisions, dtype=object)
        out["reason"] = np.asarray(reasons, dtype=object)
        return out


def _row_image(value, column: str, i: int) -> tuple[list[tuple[str, bytes]], str]:
    """A Hugging Face batch value as the scoring loop's members (``[(column, bytes)]``, or none)
    and why there is none."""
    if value is None:
        return [], "the image is null"
    if isinstance(value, dict):  # Image(decode=False): {"bytes": ..., "path": ...}
        data = value.get("bytes")
        if data is None:
            path = value.get("path")
            return [], (f"the image holds no bytes (only the path {path!r})" if path
                        else "the image holds no bytes")
        return [(column, bytes(data))], ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [(column, bytes(value))], ""
    raise TypeError(f"row {i}: column {column!r} holds {type(value).__name__}, not encoded bytes; "
                    f"cast it with ds.cast_column({column!r}, datasets.Image(decode=False)): "
                    "decoding is part of what is judged")


def _is_column(value) -> bool:
    """Does a batch value hold a column (a list or array of row values), not one row's value?"""
    if isinstance(value, (list, tuple)):
        return True
    if value is None or isinstance(value, (str, bytes, bytearray, memoryview, Mapping)):
        return False
    return (hasattr(value, "__len__") and hasattr(value, "__getitem__")
            and getattr(value, "ndim", 1) != 0)


def _check_batch(batch) -> None:
    """Refuse one row where a batch is expected (``map``/``filter`` without ``batched=True``)."""
    for name in list(batch):
        if not _is_column(batch[name]):
            raise TypeError(
                f"HFScorer takes batches: pass batched=True, as in ds.map(scorer, batched=True) "
                f"and ds.filter(scorer.keep, batched=True) (it was given one row: column {name!r} "
                f"holds a {type(batch[name]).__name__}, not a list of values)")


class HFScorer:
    """A batched function for Hugging Face ``datasets`` (``batched=True``) that decides each row as
    ``collapseguard filter`` decides a row of a Parquet input.

    ``ds.map(scorer, batched=True)`` adds ``score``, ``decision`` and ``reason`` columns (and
    ``score_error``, the reason a row has no score, and ``has_alpha``, as in filter's scores);
    ``ds.filter(scorer.keep, batched=True)`` keeps the rows ``filter`` writes to kept/. The image
    column (``image_column``, else the first holding ``Image`` structs, else the first of
    ``image``, ``img``, ``jpg``, ``jpeg``, ``png``, ``webp`` in the batch) must hold encoded bytes:
    an ``Image`` feature cast with ``decode=False`` (``{"bytes", "path"}``) or a binary column.
    A row without image bytes is ``no_image`` (kept unless ``reject_no_image``); bytes that do not
    decode are ``decode_error`` (rejected). One row instead of a batch (``batched=True`` left out)
    is refused with a TypeError that says so.

    With ``num_proc > 1`` each worker unpickles the scorer's settings and creates its own
    detector (a forked worker limits torch to one thread first); decisions are the same as with
    one process.
    """

    def __init__(self, detector="cnn", calibration=None, threshold: float | None = None, *,
                 image_column: str | None = None, batch_size: int | None = None,
                 reject_no_image: bool = False, detector_kwargs: dict | None = None):
        self._decider = _Decider(detector, calibration, threshold, batch_size=batch_size,
                                 reject_no_image=reject_no_image, detector_kwargs=detector_kwargs)
        self.image_column = image_column

    @property
    def threshold(self) -> float:
        return self._decider.threshold

    def _column(self, batch) -> str:
        """The image column, as ``filter`` finds it in a Parquet file (``io.parquet``): named,
        else the first holding ``Image`` structs (``{"bytes", "path"}``), else by name."""
        from collapseguard.io.parquet import IMAGE_COLUMN_NAMES
        names = list(batch)
        if self.image_column is not None:
            if self.image_column not in names:
                raise KeyError(f"image column {self.image_column!r} not in the batch (columns: "
                               f"{list(names)})")
            return self.image_column
        for name in names:
            first = next((v for v in batch[name] if v is not None), None)
            if isinstance(first, dict) and "bytes" in first:
                return name
        for want in IMAGE_COLUMN_NAMES:
            for name in names:
                if name.lower() == want:
                    return name
        raise KeyError(f"no image column in the batch (columns: {list(names)}); pass image_column=")

    def _decisions(self, batch) -> list[tuple[Scored, str, str, str]]:
        _check_batch(batch)
        column = self._column(batch)
        rows = [(i, *_row_image(v, column, i)) for i, v in enumerate(batch[column])]
        paths = sum(1 for v in batch[column] if isinstance(v, dict) and v.get("bytes") is None
                    and v.get("path"))
        if paths:
            import warnings
            warnings.warn(
                f"{paths} row(s) of the batch hold only a file path in {column!r}, no image bytes "
                "(datasets' imagefolder with Image(decode=False) gives such rows): they are "
                "no_image, kept unless reject_no_image=True; read the files into the rows to "
                "judge them: ds.map(lambda r: {col: {'bytes': open(r[col]['path'], 'rb').read(), "
                "'path': r[col]['path']}})", UserWarning, stacklevel=3)
        out = []
        d = self._decider
        for (_, _, missing), scored in score_records(rows, d.detector, members_of=lambda r: r[1],
                                                     batch_size=d.batch_size, images_only=False):
            decision, reason = decide(scored, d.threshold, reject_no_image=d.reject_no_image)
            out.append((scored, decision, reason, missing or scored.error))
        return out

    def __call__(self, batch) -> dict:
        """For ``ds.map(scorer, batched=True)``: the new columns of a batch."""
        got = self._decisions(batch)
        return {"score": [s.score for s, *_ in got], "decision": [d for _, d, _, _ in got],
                "reason": [r for _, _, r, _ in got], "score_error": [e for *_, e in got],
                "has_alpha": [s.has_alpha for s, *_ in got]}

    def keep(self, batch) -> list[bool]:
        """For ``ds.filter(scorer.keep, batched=True)``: which rows ``filter`` keeps."""
        return [d == "kept" for _, d, _, _ in self._decisions(batch)]


def hf_scorer(detector="cnn", calibration=None, threshold: float | None = None, *,
              image_column: str | None = None, batch_size: int | None = None,
              reject_no_image: bool = False, detector_kwargs: dict | None = None) -> HFScorer:
    """An ``HFScorer`` for ``datasets.Dataset.map``/``.filter`` with ``batched=True``.

    ``detector``, ``calibration`` and ``threshold`` are as for ``wds_filter``: without a threshold
    or calibration, the calibration shipped for the detector is used, as in ``filter``. A cnn
    named without ``detector_kwargs={"runtime": ...}`` runs on ``$COLLAPSEGUARD_CNN_RUNTIME``,
    else as ``filter --runtime auto`` (onnxruntime on the CPU where it is installed)."""
    return HFScorer(detector, calibration, threshold, image_column=image_column,
                    batch_size=batch_size, reject_no_image=reject_no_image,
                    detector_kwargs=detector_kwargs)


__all__ = ["HFScorer", "RayScorer", "WdsFilter", "hf_scorer", "wds_filter"]
