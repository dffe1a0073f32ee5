"""Small, fast image operations shared by the replicators (float32 images on a 0..255 scale)."""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy import ndimage

from collapseguard.images import decode_image, encode_jpeg, resize_by

_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur over the two spatial axes of an (H, W) or (H, W, C) float array."""
    if sigma <= 0:
        return x
    sig = (sigma, sigma) + (0,) * (x.ndim - 2)
    return ndimage.gaussian_filter(x, sig, mode="reflect", truncate=3.0)


def unsharp(x: np.ndarray, radius: float, amount: float, limit: float | None = None) -> np.ndarray:
    """Unsharp mask: ``x + amount * (x - blur(x, radius))``.

    ``limit`` (8-bit levels) soft-clips the detail term, ``d / (1 + |d| / limit)``, so small
    detail (grain, dots) is amplified fully while large edges do not grow ever-wider halos.
    """
    if amount == 0:
        return x
    d = x - blur(x, radius)
    if limit:
        d = d / (1 + np.abs(d) / limit)
    return x + amount * d


def luma(x: np.ndarray) -> np.ndarray:
    """Luminance (H, W) of an (H, W, 3) float image."""
    return x @ _LUMA


def resize(x: np.ndarray, width: int, height: int, resample=Image.Resampling.BICUBIC) -> np.ndarray:
    """Resize a float (H, W, 3) image with PIL per channel in float mode (no 8-bit rounding)."""
    chans = [np.asarray(Image.fromarray(np.ascontiguousarray(x[..., c], dtype=np.float32), mode="F")
                        .resize((int(width), int(height)), resample)) for c in range(x.shape[2])]
    return np.stack(chans, axis=2)


def resize_uint8(img: np.ndarray, width: int, height: int,
                 resample=Image.Resampling.BICUBIC) -> np.ndarray:
    """Resize an (H, W, 3) uint8 image with PIL."""
    return np.asarray(Image.fromarray(img).resize((int(width), int(height)), resample))


def coloured_noise(rng: np.random.Generator, shape: tuple[int, int], grain: float,
                   chroma: float, colour: np.ndarray | None = None,
                   low_freq: float = 0.0) -> np.ndarray:
    """Zero-mean noise of unit luminance std with a chosen spectrum and colour.

    ``grain`` is the blur (pixels) that sets the grain size (0 = white), ``low_freq`` mixes in
    a coarser blotchy component, ``chroma`` in [0, 1] is the share of independent per-channel
    noise (0 = grey grain), and ``colour`` (3,) weights the grey grain per channel.
    """
    h, w = shape
    base = rng.standard_normal((h, w), dtype=np.float32)
    g = blur(base, grain) if grain > 0 else base
    if low_freq > 0:
        g = g / (g.std() + 1e-6) + low_freq * _norm(blur(rng.standard_normal((h, w), dtype=np.float32),
                                                         max(3.0, grain * 6)))
    g = _norm(g)
    col = np.ones(3, np.float32) if colour is None else np.asarray(colour, np.float32)
    out = g[..., None] * col[None, None, :] * (1 - chroma)
    if chroma > 0:
        c = rng.standard_normal((h, w, 3), dtype=np.float32)
        c = blur(c, grain) if grain > 0 else c
        out = out + chroma * (c / (c.std() + 1e-6))
    return out


def _norm(a: np.ndarray) -> np.ndarray:
    return (a - a.mean()) / (a.std() + 1e-6)


def edge_strength(x: np.ndarray, sigma: float = 1.5) -> np.ndarray:
    """Gradient magnitude of the blurred luminance, scaled to [0, 1] by its 99th percentile."""
    y = blur(luma(x), sigma)
    gy, gx = np.gradient(y)
    mag = np.hypot(gx, gy)
    hi = float(np.percentile(mag, 99)) + 1e-6
    return np.clip(mag / hi, 0, 1)


def shift_hue_saturation(x: np.ndarray, saturation: float) -> np.ndarray:
    """Scale chroma around the luminance (saturation 1 = unchanged)."""
    y = luma(x)[..., None]
    return y + saturation * (x - y)


def to_uint8_image(x: np.ndarray) -> np.ndarray:
    """Round and clip a float image (0..255 scale) to uint8."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def guided_smooth(x: np.ndarray, radius: int, eps: float) -> np.ndarray:
    """Self-guided filter (He et al.) per channel: flattens texture whose local variance is below
    ``eps`` (8-bit levels squared) within a ``(2 radius + 1)`` window, keeps strong edges."""
    size = (2 * radius + 1, 2 * radius + 1) + (1,) * (x.ndim - 2)

    def box(a):
        return ndimage.uniform_filter(a, size, mode="reflect")

    mean = box(x)
    var = np.maximum(box(x * x) - mean * mean, 0)
    a = var / (var + eps)
    b = mean - a * mean
    return box(a) * x + box(b)

def jpeg(img: np.ndarray, quality: int, subsampling: int | None = None) -> np.ndarray:
    """Round-trip through JPEG (``images.encode_jpeg``, same ``subsampling`` codes and default)."""
    return decode_image(encode_jpeg(img, quality, subsampling))


def web_size(img: np.ndarray, rng: np.random.Generator, long_side=(640, 2048)) -> np.ndarray:
    """Downscale a large image to a random web size (long side in ``long_side``); small ones pass."""
    h, w = img.shape[:2]
    target = rng.uniform(*long_side)
    if max(h, w) <= target:
        return img
    return resize_by(img, target / max(h, w))
