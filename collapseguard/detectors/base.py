"""The detector protocol and the registry every scorer lives behind.

Conventions:
- ``score(images)`` takes a batch of decoded RGB uint8 arrays (H, W, 3) at native resolution and
  returns a float32 array of the same length where **higher means more degraded**. NaN means the
  detector could not score that image (for example an unparseable VLM answer); callers record it
  as an error, never as a score. A detector that knows why may set ``last_nan_reasons``, one
  string per image of its last call ("" where it scored), which callers record as that error.
- Every detector has a ``name`` (the spec it was created from, e.g. ``"pyiqa:piqe"``) and a
  ``version`` (a hash of its weights or parameters). Both go into every scores and calibration file.
- Detectors are created by name: ``create("nss")``, ``create("cnn")``, ``create("pyiqa:piqe")``,
  ``create("vlm:/models/VisualQuality-R1-7B")``. Implementations are imported lazily, so the core
  never imports optional extras (pyiqa, transformers) until asked.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from abc import ABC, abstractmethod
from typing import Callable, Sequence

import numpy as np

from collapseguard.errors import CollapseguardError


class DetectorError(CollapseguardError, RuntimeError):
    """A detector cannot be created or run (missing extra, missing weights, bad name)."""


def as_batch(images) -> list:
    """``images`` as every detector's ``score`` takes them: a sequence of (H, W, 3) arrays.

    One image passed on its own (an (H, W, 3) or (H, W) array) is refused: iterated, it would be
    scored row by row as a batch of H narrow images. Every image must be uint8 pixels, (H, W, 3)
    RGB, (H, W, 4) RGBA or (H, W) grey, or a PIL image of any mode (converted as a decoded file
    is, by ``images.shown_rgb_array``: 16-bit and float modes scaled, transparency composited,
    turned by its EXIF orientation): a
    float array in [0, 1], 16-bit pixels or a channels-first array would otherwise be read as another picture by some
    detectors and give a silently wrong score, so each is refused with the same message by every
    detector. RGBA arrays are composited over ``images.ALPHA_BACKGROUND``, as a decoded RGBA file
    is, and grey arrays ((H, W) or (H, W, 1)) are repeated to three channels, so one picture gets
    one score whichever way it arrives.
    """
    from PIL import Image

    if isinstance(images, np.ndarray) and images.ndim in (2, 3):
        raise TypeError(f"score() takes a batch of images (a list, or an (N, H, W, 3) array); got one "
                        f"array of shape {images.shape}: pass [image]")
    if isinstance(images, (Image.Image, str, bytes, os.PathLike)):
        raise TypeError(f"score() takes a batch of images (a list, or an (N, H, W, 3) array); got one "
                        f"{type(images).__name__}: pass [image]")
    return [_as_rgb(img, i) for i, img in enumerate(images)]


def _as_rgb(img, i: int) -> np.ndarray:
    """One image of a batch as an (H, W, 3) uint8 array (see ``as_batch``)."""
    from PIL import Image

    if isinstance(img, Image.Image):  # as its file is decoded: one picture, one score
        from collapseguard.images import shown_rgb_array

        img = shown_rgb_array(img)
    if isinstance(img, (str, bytes, os.PathLike)):  # a file name or its bytes: no pixels yet
        raise TypeError(f"image {i}: expected pixels (a uint8 array or a PIL image), got a "
                        f"{type(img).__name__}; decode files first (collapseguard.images."
                        "decode_image), or score them with `collapseguard score`")
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        raise ValueError(f"image {i}: expected uint8 pixels (0-255), got {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:  # grey with a channel axis: as plain grey
        arr = arr[..., 0]
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"image {i}: expected an (H, W, 3) RGB, (H, W, 4) RGBA or (H, W) grey "
                         f"image, got shape {arr.shape}")
    if arr.shape[2] == 4:
        from collapseguard.images import rgba_composite

        arr = rgba_composite(arr)
    return arr


def _taking_batches(method):
    """``method(self, images)`` with ``images`` passed through ``as_batch`` first."""
    if getattr(method, "_takes_batches", False):
        return method

    @functools.wraps(method)
    def wrapper(self, images, *args, **kwargs):
        return method(self, as_batch(images), *args, **kwargs)

    wrapper._takes_batches = True
    return wrapper


class Detector(ABC):
    """Base class for all scorers. Subclasses set ``name``, ``version`` and implement ``score``.

    Every subclass's ``score`` and ``score_detailed`` receive their images through ``as_batch``
    (applied when the subclass is defined), so each implementation sees a list of arrays.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("score", "score_detailed"):
            if name in cls.__dict__ and not getattr(cls.__dict__[name], "__isabstractmethod__", False):
                setattr(cls, name, _taking_batches(cls.__dict__[name]))

    #: the spec this detector was created from, e.g. "nss" or "pyiqa:piqe"
    name: str = ""
    #: short hash of weights/parameters; a calibration is only valid for the same name + version
    version: str = ""
    #: how many images ``score`` is happy to take at once
    batch_size: int = 16

    @property
    def description(self) -> str:
        """The registry's one line for this detector's spec (what ``list_detectors`` and
        ``collapseguard detectors`` print): the registry is the one source of it."""
        return describe(self.name)

    @abstractmethod
    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """Return float32 scores, one per image, higher = more degraded (NaN = could not score)."""

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Scores plus optional extra per-image columns (e.g. ``raw`` metric values).

        Always contains ``"score"``. Subclasses that keep a raw value beside the oriented score
        (pyiqa adapters, VLM ratings) override this.
        """
        return {"score": self.score(images)}

    def to(self, device: str) -> "Detector":  # pragma: no cover - trivial default
        """Move to a torch device where that means something; returns self."""
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}@{self.version}>"


def resolve_device(device: object = None) -> str:
    """The torch device to run on, as text: ``device`` checked, or CUDA when present, else CPU.

    A device that does not exist here (``cuda`` on a machine without a GPU, ``cuda:3`` with two
    GPUs, a misspelling) raises :class:`DetectorError` with one readable line instead of torch's
    error from deep inside the first ``.to()`` call.
    """
    import torch

    if device is None or (isinstance(device, str) and not device.strip()):
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device.strip() if isinstance(device, str) else device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise DetectorError(f"unknown torch device {device!r} ({exc})") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise DetectorError(f"device {str(dev)!r} asked for, but CUDA is not available here "
                                "(no GPU, or torch built without CUDA); use --device cpu or leave it unset")
        if dev.index is not None and dev.index >= n:
            raise DetectorError(f"device {str(dev)!r} asked for, but only {n} CUDA device(s) exist")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DetectorError(f"device {str(dev)!r} asked for, but MPS is not available here")
    elif dev.type != "cpu":
        raise DetectorError(f"device {str(dev)!r} is not supported; use cpu or cuda")
    return str(dev)


def params_version(*parts: object) -> str:
    """A short, stable version string from parameters or weight bytes."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
    return h.hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

#: name -> "module:Class" (lazy). A name that takes an argument is written "prefix:" and is called
#: with the text after the colon, e.g. "pyiqa:" + "piqe".
_REGISTRY: dict[str, str | Callable[..., Detector]] = {
    "nss": "collapseguard.detectors.nss:NSSDetector",
    "cnn": "collapseguard.detectors.cnn_family:create_cnn",
    "cnn:": "collapseguard.detectors.cnn_family:create_cnn",
    "pyiqa:": "collapseguard.detectors.iqa:PyIQADetector",
    "vlm:": "collapseguard.detectors.vlm:VLMJudge",
    "rali:": "collapseguard.detectors.rali:RALIDetector",
    "ens:": "collapseguard.detectors.ensemble:EnsembleDetector",
    "compare": "collapseguard.detectors.compare:create_comparator",
    "npr": "collapseguard.detectors.npr:NPRDetector",
    "fixedpoint": "collapseguard.detectors.fixedpoint:FixedPointDetector",
}

_HELP: dict[str, str] = {
    "nss": "hand-written natural-scene, spectral and colour statistics (numpy/scipy, fast)",
    "cnn": "the trained degradation detector shipped with the package",
    "cnn:": "the same network with other weights, e.g. cnn:my.safetensors (from `collapseguard train`; "
    "calibrate it with the same spec)",
    "pyiqa:": "any pyiqa no-reference metric, e.g. pyiqa:piqe (extra [iqa], non-commercial licence)",
    "vlm:": "VLM judge through transformers, e.g. vlm:/models/VisualQuality-R1-7B (extra [vlm]; "
    "a hub id downloads weights unless HF_HUB_OFFLINE=1)",
    "rali:": "RALI scorer from a checkpoint folder, e.g. rali:/models/rali (extra [vlm])",
    "ens:": "ensemble on a common scale (calibrated P(degraded), else quantiles), e.g. ens:cnn+nss",
    "compare": "pairwise comparator: P(one copy of a picture is more degraded than another); its "
    "score ranks copies of one picture only (used by `collapseguard dedup`)",
    "npr": "training-free resampling residual x - up(down(x)): top-octave share and 2x periodicity "
    "(numpy/scipy)",
    "fixedpoint": "training-free fixed-point distance: log of the second over the first change when "
    "re-rendered twice (PIL)",
}

DEFAULT_DETECTOR = "cnn"


def register(name: str, factory: str | Callable[..., Detector], help: str = "") -> None:
    """Register a detector factory under ``name`` (end it with ':' for a parameterised family)."""
    _REGISTRY[name] = factory
    if help:
        _HELP[name] = help


def list_detectors() -> dict[str, str]:
    """Registered names (parameterised ones end with ':') and a one-line description each."""
    return {k: _HELP.get(k, "") for k in _REGISTRY}


def registry_key(name: str) -> str | None:
    """The registry entry a spec is created from: ``"nss"`` -> ``"nss"``, ``"pyiqa:piqe"`` ->
    ``"pyiqa:"``, ``"cnn:w.safetensors"`` -> ``"cnn:"``; None for a name the registry lacks."""
    name = (name or "").strip()
    if name in _REGISTRY and not name.endswith(":"):
        return name
    prefix, sep, _ = name.partition(":")
    return prefix + ":" if sep and prefix + ":" in _REGISTRY else None


def describe(name: str) -> str:
    """The registry's one-line description of a detector spec (``""`` for an unknown one)."""
    return _HELP.get(registry_key(name) or "", "")


def _resolve(factory: str | Callable[..., Detector]) -> Callable[..., Detector]:
    if callable(factory):
        return factory
    module, _, attr = factory.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise DetectorError(
            f"cannot import {module} ({exc}); is the optional extra for this detector installed? "
            "(pip install 'collapseguard[iqa]' for pyiqa:, 'collapseguard[vlm]' for vlm:/rali:)"
        ) from exc
    return getattr(mod, attr)


def create(name: str, **kwargs) -> Detector:
    """Create a detector from its spec, e.g. ``create("nss")`` or ``create("pyiqa:piqe")``."""
    key, arg = check_spec(name)
    name = name.strip()  # " cnn" from a shell quote or a comma-separated list is "cnn"
    det = _resolve(_REGISTRY[key])(**kwargs) if arg is None else _resolve(_REGISTRY[key])(arg, **kwargs)
    if not det.name:
        det.name = name
    return det


def check_spec(name) -> tuple[str, str | None]:
    """The registry entry of a detector spec and its argument (None for a plain name), without
    creating anything; DetectorError for an empty or unknown spec or a family without its argument."""
    if not isinstance(name, str) or not name.strip():
        raise DetectorError("detector name must be a non-empty string")
    name = name.strip()
    if name in _REGISTRY and not name.endswith(":"):  # "vlm:" is a family, not a detector
        return name, None
    prefix, sep, arg = name.partition(":")
    key = prefix + ":"
    if not sep or key not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise DetectorError(f"unknown detector {name!r}; known: {known}")
    if not arg:
        raise DetectorError(f"detector {name!r} needs an argument after the colon")
    return key, arg
