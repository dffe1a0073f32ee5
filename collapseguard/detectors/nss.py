"""``nss``: hand-written natural-scene, spectral and colour statistics (numpy/scipy only).

A fast, transparent baseline. Each image is looked at through a few native-resolution crops (never
resized) and described by features that move when a generator re-renders its own output:

- ``noise``      noise level (Immerkaer's fast estimator on luminance), median over crops;
- ``hf``         high-frequency energy share: Laplacian energy over local contrast energy;
- ``mscn_k1/2``  kurtosis of MSCN coefficients (BRISQUE-style) at two scales;
- ``mscn_pair``  mean of horizontal MSCN neighbour products (structure left in the residual);
- ``impulse``    density of isolated dots: strong responses of the 3x3 second-difference kernel;
- ``cast``       colour cast: chroma of the mean colour after gray-world, with a green emphasis.

The score is a fixed, documented combination (``_WEIGHTS``) of these features, each squashed
against a reference level typical of clean photographs. It is not trained; the trained detector is
``cnn``. Like the classic IQA metrics the Banana100 study examined, it sees noise and dots well and
texture loss poorly — ``collapseguard evaluate`` shows where.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import ndimage

from collapseguard.detectors.base import Detector, params_version
from collapseguard.detectors.crops import CROP_LAYOUT, crop_grid

_IMMERKAER = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=np.float32)

#: feature -> (reference level of clean photos, weight). Score = sum w * log(1 + f / ref).
_WEIGHTS = {
    "noise": (2.0, 1.0),
    "hf": (0.1, 0.5),
    "impulse": (0.002, 0.6),
    "cast": (0.04, 0.4),
    "mscn_gauss": (1.0, 0.6),
}


def _luma(rgb: np.ndarray) -> np.ndarray:
    rgb = rgb.astype(np.float32)
    return 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]


def _mscn(y: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """MSCN coefficients and the local variance they were normalised by."""
    mu = ndimage.gaussian_filter(y, sigma, truncate=3.0)
    var = np.maximum(ndimage.gaussian_filter(y * y, sigma, truncate=3.0) - mu * mu, 0)
    return (y - mu) / (np.sqrt(var) + 1.0), var


def _kurtosis(x: np.ndarray) -> float:
    x = x.ravel()
    x = x - x.mean(dtype=np.float64)
    x2 = x * x
    v = float(x2.mean(dtype=np.float64))
    return float((x2 * x2).mean(dtype=np.float64) / (v * v + 1e-12))


def crop_features(crop: np.ndarray) -> dict[str, float]:
    """Features of one native-resolution RGB crop (uint8, H, W, 3)."""
    y = _luma(crop)
    h, w = y.shape
    conv = ndimage.convolve(y, _IMMERKAER, mode="reflect")
    noise = float(np.sqrt(np.pi / 2) / (6.0 * (w - 2) * (h - 2)) * np.abs(conv[1:-1, 1:-1]).sum())
    m1, var = _mscn(y, 7 / 6)
    m2, _ = _mscn(y[::2, ::2], 7 / 6)
    hf = float((conv * conv).mean() / (36.0 * var.mean() + 1e-6))
    pair = float((m1[:, :-1] * m1[:, 1:]).mean())
    # an isolated dot of contrast A gives 4A under the Immerkaer kernel, edges and ramps far less
    impulse = float((np.abs(conv) > 160.0).mean())
    mean = crop.reshape(-1, 3).astype(np.float64).mean(0)
    gray = mean.mean() + 1e-6
    chroma = mean / gray - 1.0
    green = max(0.0, chroma[1] - 0.5 * (chroma[0] + chroma[2]))
    cast = float(np.sqrt((chroma**2).sum()) * 0.5 + green)
    return {"noise": noise, "hf": hf, "mscn_k1": _kurtosis(m1), "mscn_k2": _kurtosis(m2),
            "mscn_pair": pair, "impulse": impulse, "cast": cast}


def image_features(img: np.ndarray, crop: int = 192, n_crops: int = 3) -> dict[str, float]:
    """Median of crop features over ``n_crops`` native-resolution crops of one image."""
    feats = [crop_features(c) for c in crop_grid(img, crop, n_crops)]
    out = {k: float(np.median([f[k] for f in feats])) for k in feats[0]}
    # Gaussian-like MSCN (kurtosis near 3 rather than heavy-tailed) means noise replaced structure.
    k = 0.5 * (out["mscn_k1"] + out["mscn_k2"])
    out["mscn_gauss"] = float(max(0.0, 6.0 - k) * max(0.0, 0.6 - abs(out["mscn_pair"])))
    return out


def combine(feats: dict[str, float]) -> float:
    """The nss degradation score from features: sum of weighted log-ratios to clean levels."""
    return float(sum(w * np.log1p(max(feats[k], 0.0) / ref) for k, (ref, w) in _WEIGHTS.items()))


class NSSDetector(Detector):
    """Natural-scene statistics baseline; see the module docstring."""

    batch_size = 32

    def __init__(self, crop: int = 192, n_crops: int = 3):
        self.crop, self.n_crops = int(crop), int(n_crops)
        self.name = "nss"
        self.version = params_version("nss-3", CROP_LAYOUT, self.crop, self.n_crops, sorted(_WEIGHTS.items()))

    def features(self, images: Sequence[np.ndarray]) -> list[dict[str, float]]:
        return [image_features(np.asarray(im), self.crop, self.n_crops) for im in images]

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return np.array([combine(f) for f in self.features(images)], dtype=np.float32)
