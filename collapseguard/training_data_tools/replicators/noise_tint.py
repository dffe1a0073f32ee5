"""Static noise that each re-render sharpens and accumulates, with a slowly growing colour cast.

Imitates the Nano Banana Pro trajectory of the Banana100 study: every re-rendering synthesises a
little fresh grain (a per-chain spectrum and colour), slightly re-smooths the image and then
sharpens it, so grain from earlier steps is treated as detail and amplified; a per-chain channel
gain (green-ish by default, but any direction) compounds step after step.
"""

from __future__ import annotations

import numpy as np

from collapseguard.training_data_tools.replicators import ops
from collapseguard.training_data_tools.replicators.base import Replicator, log_uniform


class NoiseTint(Replicator):
    family = "noise_tint"
    description = "re-synthesised grain sharpened every step + slowly growing colour cast (Nano Banana Pro-like)"

    def draw(self, rng):
        # tint direction: a hue angle (0 red, 120 green, 240 blue), mostly around green
        hue = rng.normal(115.0, 35.0) if rng.random() < 0.75 else rng.uniform(0.0, 360.0)
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "noise_sigma": log_uniform(rng, 0.8, 2.4),     # fresh grain per step (8-bit levels)
            "grain": float(rng.choice([0.0, rng.uniform(0.3, 1.4)])),  # grain blur (px)
            "low_freq": float(rng.uniform(0.0, 0.6) if rng.random() < 0.4 else 0.0),
            "chroma": float(rng.uniform(0.0, 0.7)),
            "noise_colour": [float(v) for v in np.clip(1 + rng.normal(0, 0.25, 3), 0.4, 1.6)],
            "resmooth": float(rng.uniform(0.0, 0.4)),       # re-render softening (px), restored below
            "sharpen_radius": float(rng.uniform(0.5, 1.4)),
            "halo_limit": log_uniform(rng, 6.0, 40.0),     # edges' halos grow only this far
            "sharpen_amount": log_uniform(rng, 0.15, 0.45),
            "tint_hue_deg": float(hue % 360),
            "tint_rate": log_uniform(rng, 0.0008, 0.004),   # per-step channel-gain change
            "contrast_rate": float(rng.uniform(-0.002, 0.004)),
        }

    def _step(self, image, rng):
        p, s = self.params, self.params["strength"]
        x = image.astype(np.float32)
        h, w = x.shape[:2]
        if p["resmooth"] > 0:  # the re-render softens, then restores edges (not grain)
            soft = ops.blur(x, p["resmooth"])
            x = soft + (x - soft) * (1 - np.exp(-np.abs(x - soft) / 3.0))
        x = ops.unsharp(x, p["sharpen_radius"], p["sharpen_amount"] * s, limit=p["halo_limit"])
        noise = ops.coloured_noise(rng, (h, w), p["grain"], p["chroma"],
                                   np.asarray(p["noise_colour"]), p["low_freq"])
        x = x + noise * (p["noise_sigma"] * s)
        direction = hue_direction(p["tint_hue_deg"])
        x = x * (1 + p["tint_rate"] * s * direction)[None, None, :]
        mean = x.mean()
        x = mean + (x - mean) * (1 + p["contrast_rate"] * s)
        return x


def hue_direction(hue_deg: float) -> np.ndarray:
    """Zero-sum RGB direction of a hue (0 red, 120 green, 240 blue), largest component 1."""
    h = np.deg2rad(hue_deg)
    return np.cos(h - np.deg2rad([0.0, 120.0, 240.0])).astype(np.float32)
