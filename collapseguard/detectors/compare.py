"""``compare``: which of two copies of one picture is more degraded.

``Comparator.compare(a, b)`` returns P(``b`` is more degraded than ``a``) for two RGB images of
the same picture (different sizes, crops, storages and re-renderings allowed). Each image is
described once (``describe``): a ``cnn`` score at native resolution and the
``pair_features`` ladder at common scales. A pair is compared at the largest scale both images
reach, so both are aligned to one size before their features are set against each other. The
model is logistic in the difference of the two descriptions:

    P(b worse than a) = sigmoid(w . (x(b) - x(a)) / s),    x = (features at the common scale, cnn)

with no intercept, so ``compare(a, b) + compare(b, a) == 1`` and ``compare(a, a) == 0.5``. The
weights ``w`` and scales ``s`` ship as ``weights/compare.safetensors`` (``recipes/compare_weights.py``
fits them on pairs from replication chains; docs/DEDUP.md, "The pairwise comparator"). An input
whose weight is 0 is not used: the recipe fits a chosen subset, named in the file's ``inputs``
metadata.

The cnn it reads is its own: the weights ``weights/compare_cnn.safetensors`` (version
49cd8979952f, with their ONNX graph), on which the comparator's weights were fitted and measured.
They are pinned rather than following the shipped ``cnn``: a refit on the shipped detector's
weights ranked copies worse in several families (docs/DEDUP.md, "The comparator's cnn"). A
weights file whose metadata names ``cnn_mix`` reads ``MixedCnn``, its own cnn's score plus that
share of the shipped detector's (the packaged file names none).

As a registry entry (``create("compare")``) it is also a detector: ``score`` is the image's own
utility ``w . x / s`` at its largest scale (higher = more degraded), only meaningful against other
copies of the same picture. ``score_detailed`` returns the description as extra columns (``cnn``,
``f<scale>_<feature>``) and, with ``fingerprints=True``, the dedup fingerprints (``ph0..ph3``: the
64-bit pHash as four 16-bit parts; ``tp0..tp42``: the int8 thumbnail, 6 bytes a value; the same
of each central window as ``w0ph0..``, ``w0tp0..``, ...: ``fingerprint_columns``). With ``fingerprints="only"``
the registry gives ``FingerprintOnly``: the fingerprints without the cnn or the features, the cheap
first pass of ``dedup``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from collapseguard.detectors.base import (
    Detector,
    DetectorError,
    as_batch,
    params_version,
)
from collapseguard.detectors.fingerprint import (
    THUMB_SIDE,
    WINDOWS,
    fingerprint_arrays,
)
from collapseguard.detectors.pair_features import (
    FEATURES,
    LAYOUT_GRID,
    SCALES,
    common_scale,
    described,
    ladder,
)

WEIGHTS_NAME = "compare.safetensors"
#: the cnn weights the comparator reads (not necessarily the shipped ``cnn``'s)
CNN_WEIGHTS_NAME = "compare_cnn.safetensors"
#: the inputs of the logistic model, in order
INPUTS = (*FEATURES, "cnn")
FEATURE_COLUMNS = tuple(f"f{s}_{n}" for s in SCALES for n in FEATURES)
HASH_COLUMNS = tuple(f"ph{i}" for i in range(4))
THUMB_BYTES = THUMB_SIDE * THUMB_SIDE
#: a thumbnail's bytes, 6 to a column (48 bits: exact in a float64), so a row carries 43 values
#: for it rather than 256 (``pack_thumbnails`` / ``unpack_thumbnails``)
THUMB_COLUMNS = tuple(f"tp{i}" for i in range(-(-THUMB_BYTES // 6)))
#: the same of each central window (``fingerprint.WINDOWS``): ``w0ph0..``, ``w0tp0..``, ``w1ph0..``
#: ``pair_features.colour_layout`` (192 int8 values) packed 6 bytes a float64 column
LAYOUT_BYTES = 3 * LAYOUT_GRID * LAYOUT_GRID
LAYOUT_COLUMNS = tuple(f"cl{i}" for i in range(-(-LAYOUT_BYTES // 6)))
WINDOW_HASH_COLUMNS = tuple(tuple(f"w{k}{c}" for c in HASH_COLUMNS) for k in range(len(WINDOWS)))
WINDOW_THUMB_COLUMNS = tuple(tuple(f"w{k}{c}" for c in THUMB_COLUMNS) for k in range(len(WINDOWS)))


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))


def load_weights(path: str | Path | None = None) -> dict[str, np.ndarray]:
    """``{"w": ..., "s": ...}`` from a safetensors file (default: the packaged one)."""
    from safetensors.numpy import load

    try:
        data = Path(path).read_bytes() if path else (
            resources.files("collapseguard") / "weights" / WEIGHTS_NAME).read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise DetectorError(f"comparator weights missing ({exc}); fit them with "
                            "recipes/compare_weights.py") from None
    try:
        tensors = load(data)
        n = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8: 8 + n]).get("__metadata__") or {}
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one error
        raise DetectorError(f"comparator weights cannot be read: {exc}") from None
    w, s = tensors.get("w"), tensors.get("s")
    if w is None or s is None or w.shape != (len(INPUTS),) or s.shape != (len(INPUTS),):
        raise DetectorError(f"comparator weights must hold w and s of shape ({len(INPUTS)},)")
    meta = {str(k): str(v) for k, v in meta.items()}
    # from the values, not the file's bytes: safetensors writes its metadata in no fixed order
    version = params_version(w.astype("<f4").tobytes(), s.astype("<f4").tobytes(), sorted(meta.items()))
    return {"w": w.astype(np.float64), "s": s.astype(np.float64), "_bytes": data, "meta": meta,
            "version": version}


def comparator_cnn(mix: float | None = None, **kwargs) -> Detector:
    """The cnn the comparator reads: ``cnn`` on the packaged ``compare_cnn`` weights (``kwargs``
    as for ``create("cnn")``: runtime, device, n_crops); with ``mix``, ``MixedCnn`` of it and the
    shipped detector's ``cnn``."""
    from collapseguard.detectors.base import create

    ref = resources.files("collapseguard") / "weights" / CNN_WEIGHTS_NAME
    if not ref.is_file():
        raise DetectorError(f"the comparator's cnn weights are missing from the package ({ref})")
    own = create("cnn", weights=str(ref), **kwargs)
    return own if mix is None else MixedCnn(own, create("cnn", **kwargs), mix)


class MixedCnn(Detector):
    """``own(x) + mix * other(x)``: two cnns' scores as one input of the comparator. The
    comparator's own cnn and the shipped detector's read damage differently (the shipped one was
    trained with real networks' re-rendering and web histories), and the comparator's model has
    one weight for its cnn input, so a weights file that names ``cnn_mix`` in its metadata reads
    this sum; ``recipes/compare_weights.py --cnn-mix MIX`` fits weights for a given ``mix``."""

    def __init__(self, own: Detector, other: Detector, mix: float):
        self.own, self.other, self.mix = own, other, float(mix)
        self.name = "cnn"
        self.batch_size = own.batch_size
        self.version = params_version("cnn-mix-v1", own.version, other.version, self.mix)

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return (np.asarray(self.own.score(images), dtype=np.float64)
                + self.mix * np.asarray(self.other.score(images), dtype=np.float64))


def pair_inputs(desc_a: dict, desc_b: dict) -> np.ndarray:
    """The model's input for one pair: ``x(b) - x(a)`` at their common scale."""
    i = common_scale(desc_a["ladder"], desc_b["ladder"])
    fa = np.append(desc_a["ladder"][i], desc_a["cnn"])
    fb = np.append(desc_b["ladder"][i], desc_b["cnn"])
    return np.nan_to_num(fb - fa)


def group_utilities(descs: Sequence[dict], w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Utilities of several copies of one picture at the largest scale all of them reach:
    ``sigmoid(u[j] - u[i])`` is P(copy j more degraded than copy i); for two copies it is
    ``Comparator.prob``."""
    lads = np.array([d["ladder"] for d in descs])  # (k, scales, features)
    reached = ~np.isnan(lads[:, :, 0]).any(axis=0)
    idx = np.flatnonzero(reached)
    i = int(idx[-1]) if idx.size else 0
    x = np.column_stack([lads[:, i, :], [d["cnn"] for d in descs]])
    return np.nan_to_num(x / s) @ w


class Comparator(Detector):
    """P(b more degraded than a) for two copies of one picture; see the module text."""

    batch_size = 8

    def __init__(self, weights: str | Path | None = None, fingerprints: bool = False,
                 cnn=None, untrained: bool = False, other_cnn: bool = False):
        """``other_cnn``: allow a ``cnn`` other than the one the weights were fitted on (their
        ``cnn`` metadata), to measure what that costs; otherwise that is a DetectorError."""
        self.name = "compare"
        self.fingerprints = bool(fingerprints)
        t = None if untrained else load_weights(weights)
        mix = t["meta"].get("cnn_mix") if t is not None else None
        try:
            mix = float(mix) if mix else None
        except ValueError:
            raise DetectorError(f"comparator weights name cnn_mix {mix!r}, not a number") from None
        self.cnn = cnn if cnn is not None else comparator_cnn(mix)
        #: what the descriptions depend on (the cnn, the features, the fingerprints), not the
        #: weights: descriptions kept by a ``dedup`` run stay valid when only the weights change
        self.description_version = params_version("describe-v2", self.cnn.version, SCALES, FEATURES,
                                                  THUMB_SIDE, self.fingerprints)
        if untrained:  # descriptions only (for fitting the weights)
            self.w = np.zeros(len(INPUTS))
            self.s = np.ones(len(INPUTS))
            self.version = params_version("untrained", self.cnn.version)
            #: every feature: a fit chooses among them
            self.features_used: frozenset[str] | None = None
        else:
            fitted_on = t["meta"].get("cnn")
            if fitted_on and fitted_on != self.cnn.version and not other_cnn:
                raise DetectorError(f"these comparator weights were fitted on cnn {fitted_on}, not on "
                                    f"the cnn given ({self.cnn.version}): refit them "
                                    "(recipes/compare_weights.py --cnn) or give their cnn")
            self.w, self.s = t["w"], t["s"]
            self.version = params_version(t["version"], self.cnn.version)
            #: the features the weights read (the others are left NaN, and cost nothing)
            self.features_used = frozenset(f for f, w in zip(FEATURES, self.w) if w != 0)
        if self.features_used is not None:
            self.description_version = params_version(self.description_version,
                                                      sorted(self.features_used))

    # -- descriptions ---------------------------------------------------------------------------

    def describe(self, images: Sequence[np.ndarray], extras: bool = False) -> list[dict]:
        """One description per image: ``{"cnn": float, "ladder": (scales, features) array}``
        (the images as every detector takes them: ``base.as_batch``); with ``extras``, also what
        dedup's larger-copy and colour rules read (``pair_features.size_extras``)."""
        images = as_batch(images)
        cnn = np.asarray(self.cnn.score(images), dtype=np.float64)
        if extras:
            return [{"cnn": float(c), **described(img, self.features_used)} for c, img in zip(cnn, images)]
        return [{"cnn": float(c), "ladder": ladder(img, self.features_used)}
                for c, img in zip(cnn, images)]

    def utility(self, desc: dict) -> float:
        """``w . x / s`` at the image's own largest scale (higher = more degraded)."""
        rows = np.flatnonzero(~np.isnan(desc["ladder"][:, 0]))
        x = np.append(desc["ladder"][rows[-1] if rows.size else 0], desc["cnn"])
        return float(np.dot(self.w, np.nan_to_num(x) / self.s))

    def group_utilities(self, descs: Sequence[dict]) -> np.ndarray:
        """``group_utilities`` with this comparator's weights."""
        return group_utilities(descs, self.w, self.s)

    def prob(self, desc_a: dict, desc_b: dict) -> float:
        """P(b more degraded than a) from two descriptions."""
        return float(sigmoid(np.dot(self.w, pair_inputs(desc_a, desc_b) / self.s)))

    def compare(self, a: np.ndarray, b: np.ndarray) -> float:
        """P(``b`` is more degraded than ``a``), for two RGB uint8 images of one picture."""
        da, db = self.describe([a, b])
        return self.prob(da, db)

    # -- as a detector --------------------------------------------------------------------------

    def description_columns(self, descs: list[dict]) -> dict[str, np.ndarray]:
        """``score`` (the utility), ``cnn``, ``octave`` and ``colour_sat``, ``colour_cast`` (its
        ``chroma``; NaN where a description has none), its ``layout`` packed in ``LAYOUT_COLUMNS``
        (where every description has one) and the ``FEATURE_COLUMNS`` of some descriptions."""
        out: dict[str, np.ndarray] = {
            "score": np.array([self.utility(d) for d in descs], dtype=np.float32),
            "cnn": np.array([d["cnn"] for d in descs]),
            "octave": np.array([d.get("octave", np.nan) for d in descs], dtype=np.float64),
            "colour_sat": np.array([d.get("chroma", (np.nan, np.nan))[0] for d in descs], dtype=np.float64),
            "colour_cast": np.array([d.get("chroma", (np.nan, np.nan))[1] for d in descs], dtype=np.float64),
        }
        if descs and all("layout" in d for d in descs):
            packed = pack_int8(np.array([d["layout"] for d in descs], np.int8))
            for j, col in enumerate(LAYOUT_COLUMNS):
                out[col] = packed[:, j]
        flat = np.array([d["ladder"].ravel() for d in descs]).reshape(len(descs), len(FEATURE_COLUMNS))
        for j, col in enumerate(FEATURE_COLUMNS):
            out[col] = flat[:, j]
        return out

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        images = as_batch(images)
        out = self.description_columns(self.describe(images, extras=True))
        if self.fingerprints:
            out.update(fingerprint_columns(images))
        return out


def pack_int8(values: np.ndarray) -> np.ndarray:
    """int8 rows (n, m) as (n, ceil(m / 6)) float64 values, each 6 of their bytes (exact)."""
    n, m = len(values), int(np.prod(np.shape(values)[1:]))
    cols = -(-m // 6)
    raw = np.zeros((n, cols * 6), np.uint8)
    raw[:, :m] = np.asarray(values, np.int8).reshape(n, m).view(np.uint8)
    wide = np.zeros((n, cols, 8), np.uint8)
    wide[:, :, :6] = raw.reshape(n, cols, 6)
    return wide.view("<u8")[..., 0].astype(np.float64)


def unpack_int8(values: np.ndarray, m: int) -> np.ndarray:
    """``pack_int8``'s values (..., ceil(m / 6)) as int8 rows (..., m)."""
    v = np.asarray(values, np.float64)
    wide = v.astype("<u8")[..., None].view(np.uint8)  # (..., cols, 8)
    return np.ascontiguousarray(wide[..., :6]).reshape(*v.shape[:-1], -1)[..., :m].view(np.int8)


def pack_thumbnails(thumbs: np.ndarray) -> np.ndarray:
    """int8 thumbnails (n, 256) as (n, 43) float64 values, each 6 of their bytes."""
    return pack_int8(np.asarray(thumbs, np.int8).reshape(len(thumbs), THUMB_BYTES))


def unpack_thumbnails(values: np.ndarray) -> np.ndarray:
    """``pack_thumbnails``' values (..., 43) as int8 thumbnails (..., 256)."""
    return unpack_int8(values, THUMB_BYTES)


def fingerprint_columns(images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """``ph0..ph3`` (the 64-bit pHash as four 16-bit parts) and ``tp0..tp42`` (the int8
    thumbnail, ``pack_thumbnails``) of each image, and the same of each central window
    (``WINDOW_HASH_COLUMNS``, ``WINDOW_THUMB_COLUMNS``), as float64 columns."""
    hashes, thumbs, whashes, wthumbs = fingerprint_arrays(images)
    out = {}

    def put(hashes, thumbs, hash_cols, thumb_cols):
        packed = pack_thumbnails(thumbs)
        for i, col in enumerate(hash_cols):
            out[col] = ((hashes >> np.uint64(48 - 16 * i)) & np.uint64(0xFFFF)).astype(np.float64)
        for i, col in enumerate(thumb_cols):
            out[col] = packed[:, i]

    put(hashes, thumbs, HASH_COLUMNS, THUMB_COLUMNS)
    for k in range(len(WINDOWS)):
        put(whashes[:, k], wthumbs[:, k], WINDOW_HASH_COLUMNS[k], WINDOW_THUMB_COLUMNS[k])
    return out


class FingerprintOnly(Detector):
    """The dedup fingerprints alone (``create("compare", fingerprints="only")``): ``score`` is 0
    for every image and the extra columns are ``fingerprint_columns``'; no cnn, no comparison
    features. ``full()`` is the comparator with fingerprints that describes the images that need
    more (those in a group, and samples holding several images, whose most degraded image only
    the full description can tell)."""

    batch_size = 16

    def __init__(self, weights: str | Path | None = None, full: Comparator | None = None):
        self.name = "compare"
        self.version = params_version("fingerprints-only", THUMB_SIDE)
        self.description_version = params_version("describe-fingerprints-v1", THUMB_SIDE)
        self._weights = weights
        self._full = full

    def full(self) -> Comparator:
        if self._full is None:
            self._full = Comparator(weights=self._weights, fingerprints=True)
        return self._full

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return np.zeros(len(images), dtype=np.float32)

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        return {"score": np.zeros(len(images), dtype=np.float32), **fingerprint_columns(images)}


def description_from_row(row) -> dict:
    """A description rebuilt from a scores row (``score_detailed``'s extra columns)."""
    lad = np.array([row[c] for c in FEATURE_COLUMNS], dtype=np.float64).reshape(len(SCALES), -1)
    return {"cnn": float(row["cnn"]), "ladder": lad}


def create_comparator(fingerprints: bool | str = False, weights: str | None = None) -> Detector:
    """The comparator; with ``fingerprints="only"`` the fingerprints alone (``FingerprintOnly``)."""
    if fingerprints == "only":
        return FingerprintOnly(weights=weights)
    return Comparator(weights=weights, fingerprints=bool(fingerprints))
