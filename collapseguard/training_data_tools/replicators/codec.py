"""Generation loss through real codecs: JPEG or WebP re-encoding with resize jitter.

Each step resizes by a small random factor (so block grids never line up twice), encodes with the
chain's codec and quality (plus a little per-step jitter), decodes, and resizes back.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from collapseguard.training_data_tools.replicators import ops
from collapseguard.training_data_tools.replicators.base import Replicator, log_uniform


class CodecLoss(Replicator):
    family = "codec"
    description = "JPEG/WebP re-encoding with resize jitter (generation loss through real codecs)"

    def draw(self, rng):
        codec = str(rng.choice(["jpeg", "webp"], p=[0.6, 0.4]))
        q = int(rng.integers(60, 94)) if codec == "jpeg" else int(rng.integers(55, 92))
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "codec": codec,
            "quality": q,
            "quality_jitter": int(rng.integers(0, 6)),
            "subsampling": int(rng.choice([0, 1, 2])),       # JPEG 4:4:4 / 4:2:2 / 4:2:0
            "scale_jitter": float(rng.uniform(0.01, 0.12)),  # resize factor spread per step
            "pre_sharpen": float(rng.uniform(0.0, 0.3)),
        }

    def _step(self, image, rng):
        p, s = self.params, self.params["strength"]
        h, w = image.shape[:2]
        f = 1.0 + p["scale_jitter"] * rng.uniform(-1, 1)
        img = image
        if p["pre_sharpen"] > 0:
            img = ops.to_uint8_image(ops.unsharp(img.astype(np.float32), 1.0, p["pre_sharpen"]))
        img = ops.resize_uint8(img, max(8, round(w * f)), max(8, round(h * f)))
        # stronger chains use lower quality; quality never leaves [5, 98]
        q = p["quality"] - (s - 1.0) * 15 + rng.integers(-p["quality_jitter"], p["quality_jitter"] + 1)
        q = int(np.clip(round(q), 5, 98))
        buf = io.BytesIO()
        pil = Image.fromarray(img)
        if p["codec"] == "jpeg":
            pil.save(buf, format="JPEG", quality=q, subsampling=p["subsampling"])
        else:
            pil.save(buf, format="WEBP", quality=q, method=2)
        buf.seek(0)
        with Image.open(buf) as dec:
            out = np.asarray(dec.convert("RGB"))
        return ops.resize_uint8(out, w, h)
