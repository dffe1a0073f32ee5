"""``fixedpoint``: how little an image changes when re-rendered once more (AEROBLADE, CVPR 2024),
training-free, with a cheap deterministic re-rendering instead of a network (PIL/numpy only).

An image that a loop has re-rendered many times sits near the fixed point of re-rendering: one
more pass changes it less than it changes a fresh picture. With ``T`` one re-rendering
(``render``):

- ``"resample"`` (the default): down to half size and back up (PIL bicubic), the step that
  resizing and up-scaling loops repeat;
- ``"jpeg"``: a JPEG save and load at quality 75, 4:2:0 (PIL).

``e1 = mean|x - T(x)|`` and ``e2 = mean|T(x) - T(T(x))|`` on the luminance of native-resolution
crops. ``e1`` alone mostly measures how much fine detail the picture has; the ratio ``e2 / e1``
cancels that: a fresh image loses much in its first pass and little in its second (ratio well
under 1), one near the fixed point loses about as little in both (ratio near 1). The score is
``log(e2 / e1)``, the median over crops: higher means nearer the fixed point.
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np
from PIL import Image

from collapseguard.detectors.base import Detector, DetectorError, params_version
from collapseguard.detectors.crops import CROP_LAYOUT, crop_grid
from collapseguard.detectors.npr import as_rgb

RENDERS = ("resample", "jpeg")
JPEG_QUALITY = 75


def _luma(rgb: np.ndarray) -> np.ndarray:
    rgb = rgb.astype(np.float32)
    return 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]


def rerender(crop: np.ndarray, render: str) -> np.ndarray:
    """One deterministic re-rendering of an RGB uint8 crop, same size, uint8."""
    im = Image.fromarray(np.ascontiguousarray(crop))
    if render == "resample":
        w, h = im.size
        small = im.resize((max(1, w // 2), max(1, h // 2)), Image.BICUBIC)
        return np.asarray(small.resize((w, h), Image.BICUBIC))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=2)
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"))


def crop_features(crop: np.ndarray, render: str) -> dict[str, float]:
    x1 = rerender(crop, render)
    x2 = rerender(x1, render)
    y0, y1, y2 = _luma(crop), _luma(x1), _luma(x2)
    e1 = float(np.abs(y0 - y1).mean(dtype=np.float64))
    e2 = float(np.abs(y1 - y2).mean(dtype=np.float64))
    return {"e1": e1, "e2": e2, "ratio": float(np.log((e2 + 0.05) / (e1 + 0.05)))}


class FixedPointDetector(Detector):
    """Re-rendering fixed-point distance; see the module docstring."""

    batch_size = 32

    def __init__(self, render: str = "resample", crop: int = 128, n_crops: int = 6):
        if render not in RENDERS:
            raise DetectorError(f"fixedpoint render must be one of {', '.join(RENDERS)}; got {render!r}")
        self.render, self.crop, self.n_crops = render, int(crop), int(n_crops)
        self.name = "fixedpoint"
        self.version = params_version("fixedpoint-1", CROP_LAYOUT, render, JPEG_QUALITY, self.crop,
                                      self.n_crops)

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        rows = []
        for im in images:
            feats = [crop_features(c, self.render) for c in crop_grid(as_rgb(im), self.crop, self.n_crops)]
            rows.append({k: float(np.median([f[k] for f in feats])) for k in feats[0]})
        return {"score": np.array([r["ratio"] for r in rows], dtype=np.float32),
                "e1": np.array([r["e1"] for r in rows], dtype=np.float32),
                "e2": np.array([r["e2"] for r in rows], dtype=np.float32)}

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]
