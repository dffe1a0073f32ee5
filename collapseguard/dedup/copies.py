"""Harmless copies of a picture: recompressed, resized, slightly cropped.

What web-scale sets hold many of, and what dedup must never count as damage by default: they make
the clean-only groups the comparator's level is calibrated on, the random storage and size on
either side of the comparator's training pairs, and the clean copies in the tests.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from collapseguard.images import decode_image
from collapseguard.training_data_tools.storage import parse_storage

#: storages a copy may be saved in (the issue's "every storage")
STORAGES = ("png", "jpeg:90:420", "jpeg:75:420", "webp:80", "jpeg:95:444")


def resized(img: np.ndarray, scale: float) -> np.ndarray:
    h, w = img.shape[:2]
    size = (max(8, round(w * scale)), max(8, round(h * scale)))
    return np.asarray(Image.fromarray(img).resize(size, Image.Resampling.LANCZOS))


def cropped(img: np.ndarray, frac: float, rng: np.random.Generator) -> np.ndarray:
    """``img`` with up to ``frac`` of each side cut away, unevenly."""
    h, w = img.shape[:2]
    top, bottom = (int(rng.uniform(0, frac) * h) for _ in range(2))
    left, right = (int(rng.uniform(0, frac) * w) for _ in range(2))
    return img[top: h - bottom, left: w - right]


def stored(img: np.ndarray, spec: str) -> tuple[bytes, np.ndarray]:
    """``img`` encoded with a storage spec (``training_data_tools.storage``): (bytes, decoded)."""
    data = parse_storage(spec).encode(img)
    return data, decode_image(data)


def random_copy(img: np.ndarray, rng: np.random.Generator, *, crop: float = 0.05,
                p_resize: float = 0.5, p_crop: float = 0.3) -> tuple[str, bytes, np.ndarray]:
    """One harmless copy: maybe resized (x0.5-0.9), maybe cropped (up to ``crop`` per side), then
    stored in one of ``STORAGES``. Returns (label, bytes, decoded array)."""
    label = []
    out = img
    if rng.random() < p_resize:
        scale = float(rng.uniform(0.5, 0.9))
        out = resized(out, scale)
        label.append(f"x{scale:.2f}")
    if rng.random() < p_crop:
        out = cropped(out, crop, rng)
        label.append("crop")
    spec = STORAGES[int(rng.integers(len(STORAGES)))]
    data, arr = stored(out, spec)
    label.append(spec)
    return " ".join(label), data, arr
