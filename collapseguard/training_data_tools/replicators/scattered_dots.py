"""Scattered dots (FLUX.2-like): small specks that appear with every re-render and stay.

Each step sprinkles a few new dots (per-chain size, density, polarity, colour, contrast and
placement preference: anywhere, flat areas, or textured areas). The dots of earlier steps are
re-drawn too, a little stronger (``reinforce``), as a model that takes its own specks for image
content would; a light softening keeps them from being perfectly crisp.
"""

from __future__ import annotations

import numpy as np

from collapseguard.training_data_tools.replicators import ops
from collapseguard.training_data_tools.replicators.base import Replicator, log_uniform


class ScatteredDots(Replicator):
    family = "scattered_dots"
    description = "dots sprinkled every re-render and reinforced afterwards (FLUX.2-like)"

    def draw(self, rng):
        colour = (np.ones(3) if rng.random() < 0.5 else np.clip(rng.uniform(0.2, 1.0, 3), 0, 1))
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "density": log_uniform(rng, 100.0, 1000.0),        # new dots per megapixel per step
            "radius": log_uniform(rng, 0.6, 2.5),            # gaussian sigma of a dot (px)
            "contrast": log_uniform(rng, 35.0, 110.0),        # peak amplitude (8-bit levels)
            "polarity": str(rng.choice(["dark", "light", "both"])),
            "colour": [float(v) for v in colour / colour.max()],
            "placement": str(rng.choice(["uniform", "flat", "textured"])),
            "reinforce": float(rng.uniform(0.02, 0.12)),      # per-step growth of older dots
            "soften": float(rng.uniform(0.0, 0.35)),
        }

    def _step(self, image, rng):
        p, s = self.params, self.params["strength"]
        x = image.astype(np.float32)
        h, w = x.shape[:2]
        x = ops.blur(x, p["soften"])
        x = ops.unsharp(x, 0.8, p["soften"], limit=4.0)  # the re-render keeps its sharpness
        layer = getattr(self, "_layer", None)
        if layer is not None and layer.shape == (h, w, 3):
            x = x + layer * (p["reinforce"] * s)  # older dots grow a little
        else:
            layer = np.zeros((h, w, 3), np.float32)
        n = rng.poisson(p["density"] * s * h * w / 1e6)
        if n:
            if p["placement"] == "uniform":
                idx = rng.integers(0, h * w, n)
            else:
                e = ops.edge_strength(x[::2, ::2], 1.0)
                e = np.repeat(np.repeat(e, 2, 0), 2, 1)[:h, :w]
                weight = (1.05 - e) if p["placement"] == "flat" else (e + 0.05)
                weight = weight.ravel() / weight.sum()
                idx = rng.choice(h * w, n, p=weight)
            sign = {"dark": -1.0, "light": 1.0}.get(p["polarity"])
            signs = np.full(n, sign, np.float32) if sign else rng.choice([-1.0, 1.0], n).astype(np.float32)
            amp = signs * rng.uniform(0.5, 1.0, n).astype(np.float32) * p["contrast"]
            imp = np.zeros(h * w, np.float32)
            np.add.at(imp, idx, amp)
            sig = p["radius"]
            dots = ops.blur(imp.reshape(h, w), sig) * (2 * np.pi * sig * sig)
            new = dots[..., None] * np.asarray(p["colour"], np.float32)[None, None, :]
            x = x + new
            layer = layer + new
        self._layer = layer
        return x
