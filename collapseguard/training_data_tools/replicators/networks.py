"""Real re-rendering networks as replicator families (``replicators.ncnn_nets`` runs them).

Every step keeps the image's size, as a generator asked for an "exact replica" does: an upscaler
gets the image shrunk by a drawn factor (with a drawn filter and a 0/1-pixel shift, so no grid
lines up twice) and its output is resized back to the exact size; a denoiser runs at native
resolution. The chain keeps ``keep`` of each step's change (drawn wide), so chains run from faint
to heavy. What builds up is what these networks do: textures painted over, grain wiped, edges
sharpened and haloed, flat areas posterised.

- ``realesrgan``: Real-ESRGAN x4plus or x4plus-anime (GAN-trained RRDB), 3-4x shrink per step;
- ``animevideov3``: realesr-animevideov3 x2/x3/x4 (compact network), shrink by its scale;
- ``waifu2x``: waifu2x CUnet, each step either a denoise pass (level 0-3) or a 2x shrink and its
  2x upscale with denoising, mixed within a chain;
- ``waifu2x_upconv7``: waifu2x UpConv7 (photo or art weights), 2x shrink and upscale, denoise
  level -1..3.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from collapseguard.training_data_tools.replicators import ncnn_nets
from collapseguard.training_data_tools.replicators.base import (
    Replicator,
    ReplicatorError,
    log_uniform,
)

#: shrink filters a chain draws from (what dataset pipelines use)
FILTERS = {"box": Image.BOX, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}


def shrink_and_restore(image: np.ndarray, net: str, factor: float, filt: str, shift: tuple[int, int],
                       run=None) -> np.ndarray:
    """``image`` shrunk by ``factor`` (after a ``shift`` of edge-replicated rows/columns),
    upscaled by ``net`` (through ``run(net, small)``, ncnn's by default), resized back to the
    exact size: float32, 0-255."""
    h, w = image.shape[:2]
    dy, dx = shift
    x = np.pad(image, ((dy, 0), (dx, 0), (0, 0)), mode="edge") if dy or dx else image
    sh, sw = max(8, round(x.shape[0] / factor)), max(8, round(x.shape[1] / factor))
    small = np.asarray(Image.fromarray(x).resize((sw, sh), FILTERS[filt]))
    up = (run or ncnn_nets.run)(net, small)
    th, tw = x.shape[:2]
    if up.shape[:2] != (th, tw):
        # back to the padded size, one float channel at a time (PIL keeps float32 for mode "F")
        up = np.stack([np.asarray(Image.fromarray(up[..., c]).resize((tw, th), Image.LANCZOS)) for c in range(3)],
                      axis=2)
    return up[dy: dy + h, dx: dx + w]


class _NetworkReplicator(Replicator):
    """Shared step: the drawn network change, of which ``keep`` is kept."""

    #: the networks this family runs (every one must be installed for the family to be listed)
    networks: tuple[str, ...] = ()

    def __init__(self, rng, **overrides):
        if not ncnn_nets.available(*self.networks):
            raise ReplicatorError(f"the {self.family} family runs networks from PyPI wheels: {ncnn_nets.EXTRA}")
        super().__init__(rng, **overrides)

    def _blend(self, image: np.ndarray, out: np.ndarray) -> np.ndarray:
        keep = min(1.0, self.params["keep"] * self.params["strength"] ** 0.5)
        x = image.astype(np.float32)
        return x + keep * (out - x)

    def _shift(self, rng) -> tuple[int, int]:
        if not self.params.get("shift", True):
            return (0, 0)
        return tuple(int(v) for v in rng.integers(0, 2, 2))


class RealESRGAN(_NetworkReplicator):
    family = "realesrgan"
    description = "3-4x shrink, then Real-ESRGAN x4plus / x4plus-anime (GAN upscaler) back to size"
    networks = ("realesrgan-x4plus", "realesrgan-x4plus-anime")

    def draw(self, rng):
        return {"strength": log_uniform(rng, 0.6, 1.7), "net": str(rng.choice(self.networks, p=[0.6, 0.4])),
                "factor": float(rng.uniform(3.0, 4.0)), "filter": str(rng.choice(list(FILTERS))),
                "shift": bool(rng.random() < 0.7), "keep": float(rng.uniform(0.5, 1.0))}

    def _step(self, image, rng):
        p = self.params
        return self._blend(image, shrink_and_restore(image, p["net"], p["factor"], p["filter"], self._shift(rng)))


class AnimeVideoV3(_NetworkReplicator):
    family = "animevideov3"
    description = "shrink by 2-4, then Real-ESRGAN's compact realesr-animevideov3 upscaler back to size"
    networks = tuple(f"realesr-animevideov3-x{s}" for s in (2, 3, 4))

    def draw(self, rng):
        scale = int(rng.choice([2, 3, 4]))
        return {"strength": log_uniform(rng, 0.6, 1.7), "scale": scale,
                "factor": float(rng.uniform(0.75, 1.0) * scale), "filter": str(rng.choice(list(FILTERS))),
                "shift": bool(rng.random() < 0.7), "keep": float(rng.uniform(0.5, 1.0))}

    def _step(self, image, rng):
        p = self.params
        net = f"realesr-animevideov3-x{p['scale']}"
        return self._blend(image, shrink_and_restore(image, net, p["factor"], p["filter"], self._shift(rng)))


class Waifu2x(_NetworkReplicator):
    family = "waifu2x"
    description = "waifu2x CUnet: denoise passes (level 0-3) and 2x shrink + 2x upscale, mixed within a chain"
    networks = (*(f"waifu2x-cunet-noise{n}" for n in range(4)), *(f"waifu2x-cunet-noise{n}-x2" for n in range(4)),
                "waifu2x-cunet-x2")

    def draw(self, rng):
        return {"strength": log_uniform(rng, 0.6, 1.7), "p_denoise": float(rng.uniform(0.0, 1.0)),
                "noise": int(rng.integers(0, 4)), "filter": str(rng.choice(list(FILTERS))),
                "shift": bool(rng.random() < 0.7), "keep": float(rng.uniform(0.5, 1.0))}

    def _step(self, image, rng):
        p = self.params
        noise = int(np.clip(p["noise"] + rng.integers(-1, 2), -1, 3))  # the level wanders a little
        if rng.random() < p["p_denoise"]:
            out = ncnn_nets.run(f"waifu2x-cunet-noise{max(noise, 0)}", image)
        else:
            net = "waifu2x-cunet-x2" if noise < 0 else f"waifu2x-cunet-noise{noise}-x2"
            out = shrink_and_restore(image, net, 2.0, p["filter"], self._shift(rng))
        return self._blend(image, out)


class Waifu2xUpconv7(_NetworkReplicator):
    family = "waifu2x_upconv7"
    description = "2x shrink, then waifu2x UpConv7 (photo or art weights, denoise level -1..3) back to size"
    networks = tuple(f"waifu2x-upconv7-{k}-{n}x2" for k in ("photo", "art") for n in ("", "noise0-", "noise1-",
                                                                                           "noise2-", "noise3-"))

    def draw(self, rng):
        return {"strength": log_uniform(rng, 0.6, 1.7), "weights": str(rng.choice(["photo", "art"])),
                "noise": int(rng.integers(-1, 4)), "filter": str(rng.choice(list(FILTERS))),
                "shift": bool(rng.random() < 0.7), "keep": float(rng.uniform(0.5, 1.0))}

    def _step(self, image, rng):
        p = self.params
        level = "" if p["noise"] < 0 else f"noise{p['noise']}-"
        net = f"waifu2x-upconv7-{p['weights']}-{level}x2"
        return self._blend(image, shrink_and_restore(image, net, 2.0, p["filter"], self._shift(rng)))
