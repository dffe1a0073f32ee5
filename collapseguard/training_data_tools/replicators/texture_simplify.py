"""Texture simplification and detail loss (Qwen Image Edit-like).

Each re-render keeps the big contours but redraws fine texture a little flatter: an
edge-preserving (self-guided) filter flattens low-contrast texture while keeping strong edges,
the image is optionally resampled through a slightly lower resolution, colours are softly pulled
toward a per-chain palette grid (banding, flat patches), edges are crisped, and saturation and
contrast creep up (the "plastic", illustrated look).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

from collapseguard.training_data_tools.replicators import ops
from collapseguard.training_data_tools.replicators.base import Replicator, log_uniform


class TextureSimplify(Replicator):
    family = "texture_simplify"
    description = "fine texture flattened, colours banded, saturation up each re-render (Qwen-like)"

    def draw(self, rng):
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "radius": int(rng.integers(1, 5)),               # texture scale flattened (px)
            "flatness": log_uniform(rng, 30.0, 600.0),       # texture variance treated as flat
            "detail_loss": log_uniform(rng, 0.15, 0.5),      # share of the flattening per step
            "median": bool(rng.random() < 0.35),             # a 3x3 median now and then
            "median_every": int(rng.integers(3, 9)),
            "resample": float(rng.uniform(0.8, 0.97) if rng.random() < 0.5 else 1.0),
            "quant_step": float(rng.uniform(6.0, 24.0)),     # palette grid spacing (levels)
            "quant_pull": float(rng.uniform(0.0, 0.1)),     # pull toward the grid per step
            "saturation_rate": float(rng.uniform(0.0, 0.012)),
            "contrast_rate": float(rng.uniform(-0.002, 0.008)),
            "edge_sharpen": float(rng.uniform(0.0, 0.25)),
        }

    def _step(self, image, rng):
        p, s = self.params, self.params["strength"]
        if p["median"] and (self.n_steps % p["median_every"]) == p["median_every"] - 1:
            image = np.asarray(Image.fromarray(image).filter(ImageFilter.MedianFilter(3)))
        x = image.astype(np.float32)
        h, w = x.shape[:2]
        flat = ops.guided_smooth(x, p["radius"], p["flatness"])
        x = x + min(1.0, p["detail_loss"] * s) * (flat - x)
        if p["resample"] < 1.0:
            f = 1.0 - (1.0 - p["resample"]) * min(1.0, s)
            small = ops.resize(x, max(8, round(w * f)), max(8, round(h * f)))
            x = ops.resize(small, w, h)
        q = p["quant_step"]
        # jitter the grid's offset per chain-step so banding wanders a little
        off = rng.uniform(0, q)
        grid = np.round((x - off) / q) * q + off
        x = x + min(0.5, p["quant_pull"] * s) * (grid - x)
        x = ops.shift_hue_saturation(x, 1 + p["saturation_rate"] * s)
        mean = x.mean()
        x = mean + (x - mean) * (1 + p["contrast_rate"] * s)
        x = ops.unsharp(x, 1.2, p["edge_sharpen"] * s, limit=12.0)
        return x
