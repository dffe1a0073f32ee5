"""Wrinkles and ripples along object contours (Nano Banana 2-like).

Each re-render slightly re-draws every contour: pixels near edges are displaced by a smooth random
field (part of it fixed for the chain, so contours drift consistently, part fresh each step), and
band-pass "echoes" at a few distances from each edge are added with alternating sign, so ripples
parallel to the contours build up step after step.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from collapseguard.training_data_tools.replicators import ops
from collapseguard.training_data_tools.replicators.base import Replicator, log_uniform


class ContourWrinkles(Replicator):
    family = "contour_wrinkles"
    description = "contours wiggle and grow parallel ripples each re-render (Nano Banana 2-like)"

    def draw(self, rng):
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "edge_sigma": float(rng.uniform(0.8, 2.5)),      # scale at which contours are found
            "band": float(rng.uniform(1.5, 6.0)),            # how far from a contour damage reaches
            "warp_px": log_uniform(rng, 0.1, 0.45),         # displacement per step near edges
            "warp_scale": float(rng.uniform(2.0, 12.0)),     # wavelength of the wiggle (px)
            "warp_persist": float(rng.uniform(0.3, 0.9)),    # share of the displacement fixed per chain
            "ripple_amount": log_uniform(rng, 0.08, 0.3),   # echo gain per step
            "ripple_scale": float(rng.uniform(0.8, 2.5)),    # spacing of the echoes (px)
            "ripple_count": int(rng.integers(2, 5)),
            "sharpen": float(rng.uniform(0.0, 0.1)),
        }

    def _field(self, rng, h, w):
        """A smooth 2-D displacement field of unit std, drawn at half resolution for speed."""
        p = self.params
        hh, ww = (h + 1) // 2, (w + 1) // 2
        f = rng.standard_normal((hh, ww, 2), dtype=np.float32)
        f = ops.blur(f, p["warp_scale"] / 4)
        f = np.repeat(np.repeat(f, 2, 0), 2, 1)[:h, :w]
        return np.moveaxis(f / (f.std() + 1e-6), 2, 0)

    def _step(self, image, rng):
        p, s = self.params, self.params["strength"]
        x = image.astype(np.float32)
        h, w = x.shape[:2]
        fixed = getattr(self, "_fixed", None)
        if fixed is None or fixed.shape[1:] != (h, w):
            fixed = self._fixed = self._field(rng, h, w)
        field = p["warp_persist"] * fixed + (1 - p["warp_persist"]) * self._field(rng, h, w)
        mask = ops.blur(ops.edge_strength(x, p["edge_sigma"]), p["band"] / 2)
        mask = mask / (mask.max() + 1e-6)
        disp = field * (mask * p["warp_px"] * s)[None]
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        coords = [yy + disp[0], xx + disp[1]]
        x = np.stack([ndimage.map_coordinates(x[..., c], coords, order=1, mode="reflect")
                      for c in range(3)], axis=2)
        # echoes: alternating-sign band-pass responses (of luminance) at growing distances from
        # each edge; blurs are cascaded, each level from the previous one
        r = p["ripple_scale"]
        y = ops.luma(x)
        levels, prev = [y], 0.0
        for k in range(p["ripple_count"] + 1):
            sig = r * (k + 1)
            levels.append(ops.blur(levels[-1], np.sqrt(sig * sig - prev * prev)))
            prev = sig
        ripple = np.zeros_like(y)
        for k in range(p["ripple_count"]):
            ripple += (-1) ** k * (levels[k + 1] - levels[k + 2]) / (k + 1)
        x = x + (ripple * (p["ripple_amount"] * s) * np.sqrt(mask))[..., None]
        x = ops.unsharp(x, 1.0, p["sharpen"] * s)
        return x
