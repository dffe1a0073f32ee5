"""``npr``: the resampling residual x - up(down(x)) (neighbouring pixel relationships, NPR,
CVPR 2024) on native-resolution crops, training-free (numpy/scipy only).

Each crop's luminance ``y`` is halved (2x2 block means) and brought back (bilinear, aligned on the
block centres); the residual ``r = y - up(down(y))`` is the detail in the top octave, the part
that up-sampling layers, resizes and smoothing rewrite. Two content-normalised statistics:

- ``share``:  residual energy over the energy of the image's first differences (``E[r^2] /
  E[|grad y|^2]``). A sharp edge, a texture and a flat ramp each keep a typical share whatever
  their contrast, so the share reads how the top octave was made rather than how much detail the
  picture has: smoothing, resampling and up-scaling lower it, noise and dots raise it.
- ``grid``:   |log| of the residual energy on the 2x2 block grid over the same on the grid
  shifted by one pixel: an image up-sampled 2x on the pixel grid has an uneven residual between
  the two phases, a natural image none.

The score is ``|log(share / SHARE_REF)| + grid``: how far the top octave sits from that of a
clean photograph, in either direction, plus its periodicity. Medians over crops.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import ndimage

from collapseguard.detectors.base import Detector, params_version
from collapseguard.detectors.crops import CROP_LAYOUT, crop_grid

#: the residual share of clean photographs (0.197: the median over scikit-image's astronaut, coffee,
#: chelsea, rocket and immunohistochemistry and scikit-learn's two sample images); the score is the
#: log-distance to it
SHARE_REF = 0.2


def _luma(rgb: np.ndarray) -> np.ndarray:
    rgb = rgb.astype(np.float32)
    return 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]


def _residual(y: np.ndarray) -> np.ndarray:
    """``y - up(down(y))`` on the 2x2 block grid starting at (0, 0); ``y`` has even sides."""
    h, w = y.shape
    d = y.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
    up = ndimage.zoom(d, 2, order=1, mode="nearest", grid_mode=True)
    return y - up


def crop_features(crop: np.ndarray) -> dict[str, float]:
    """``share`` and ``grid`` of one RGB uint8 crop (see the module docstring)."""
    y = _luma(crop)
    h, w = y.shape
    y0 = y[: h - h % 2, : w - w % 2]
    y1 = y[1 : 1 + (h - 1) // 2 * 2, 1 : 1 + (w - 1) // 2 * 2]
    r0, r1 = _residual(y0), _residual(y1)
    e0 = float((r0 * r0).mean(dtype=np.float64))
    e1 = float((r1 * r1).mean(dtype=np.float64))
    gx, gy = np.diff(y, axis=1), np.diff(y, axis=0)
    g = float((gx * gx).mean(dtype=np.float64) + (gy * gy).mean(dtype=np.float64))
    share = (0.5 * (e0 + e1) + 1e-3) / (g + 1e-2)
    grid = abs(np.log((e0 + 1e-3) / (e1 + 1e-3)))
    return {"share": float(share), "grid": float(grid)}


def as_rgb(img) -> np.ndarray:
    """An (H, W, 3) view of an RGB(A) or single-channel (H, W) image."""
    arr = np.asarray(img)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] < 3 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {arr.shape}")
    return arr[..., :3]


def image_features(img: np.ndarray, crop: int = 128, n_crops: int = 6) -> dict[str, float]:
    arr = as_rgb(img)
    feats = [crop_features(c) for c in crop_grid(arr, crop, n_crops)]
    return {k: float(np.median([f[k] for f in feats])) for k in feats[0]}


def combine(feats: dict[str, float]) -> float:
    return float(abs(np.log(feats["share"] / SHARE_REF)) + feats["grid"])


class NPRDetector(Detector):
    """Resampling-residual statistics; see the module docstring."""

    batch_size = 32

    def __init__(self, crop: int = 128, n_crops: int = 6):
        self.crop, self.n_crops = int(crop), int(n_crops)
        self.name = "npr"
        self.version = params_version("npr-1", CROP_LAYOUT, self.crop, self.n_crops, SHARE_REF)

    def features(self, images: Sequence[np.ndarray]) -> list[dict[str, float]]:
        return [image_features(im, self.crop, self.n_crops) for im in images]

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        feats = self.features(images)
        out = {"score": np.array([combine(f) for f in feats], dtype=np.float32)}
        for k in ("share", "grid"):
            out[k] = np.array([f[k] for f in feats], dtype=np.float32)
        return out

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]
