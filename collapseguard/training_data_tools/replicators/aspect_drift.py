"""Aspect-ratio drift through repeated crop-and-resize.

Each re-render crops a few pixels (per-chain axis bias and side) and resizes the rest back to the
input size, the way a model that re-frames its input slightly drifts the content. The output size
never changes; the content's stretch is recorded in ``state``: ``content_scale_x`` and
``content_scale_y`` (how much the step-0 content has been magnified along each axis) and
``content_aspect_drift`` (their ratio; 1 = no drift), which ``make_chains`` writes into the
manifest.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from collapseguard.training_data_tools.replicators import ops
from collapseguard.training_data_tools.replicators.base import Replicator, log_uniform

_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
            "lanczos": Image.Resampling.LANCZOS}


class AspectDrift(Replicator):
    family = "aspect_drift"
    description = "repeated crop-and-resize back to size: content aspect drifts, resampling softens"

    def draw(self, rng):
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "crop_frac": log_uniform(rng, 0.0015, 0.008),      # mean crop per step (fraction of side)
            "axis_bias": float(rng.uniform(-1, 1)),          # -1: crop height only, +1: width only
            "side": str(rng.choice(["centre", "start", "end", "random"])),
            "jitter": float(rng.uniform(0.0, 0.6)),          # relative randomness of the crop
            "filter": str(rng.choice(list(_FILTERS))),
            "sharpen": float(rng.uniform(0.0, 0.2)),
        }

    def _step(self, image, rng):
        p, s = self.params, self.params["strength"]
        h, w = image.shape[:2]
        frac = p["crop_frac"] * s * max(0.0, 1 + p["jitter"] * rng.standard_normal())
        bx = (1 + p["axis_bias"]) / 2
        cw = frac * w * 2 * bx
        ch = frac * h * 2 * (1 - bx)
        # fractional crop box, then resize to (w, h): PIL's box argument keeps sub-pixel precision
        def start(total_cut):
            side = p["side"] if p["side"] != "random" else rng.choice(["centre", "start", "end"])
            return {"centre": total_cut / 2, "start": 0.0, "end": total_cut}[side]
        x0, y0 = start(cw), start(ch)
        box = (x0, y0, w - (cw - x0), h - (ch - y0))
        out = np.asarray(Image.fromarray(image).resize((w, h), _FILTERS[p["filter"]], box=box))
        st = self.state
        st["content_scale_x"] = float(st.get("content_scale_x", 1.0) * w / (w - cw))
        st["content_scale_y"] = float(st.get("content_scale_y", 1.0) * h / (h - ch))
        st["content_aspect_drift"] = st["content_scale_x"] / st["content_scale_y"]
        if p["sharpen"] > 0:
            return ops.unsharp(out.astype(np.float32), 1.0, p["sharpen"] * min(s, 1.0), limit=6.0)
        return out
