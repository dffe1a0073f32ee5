"""A real pretrained super-resolution network as a replicator: downscale by 2, upscale with the net.

The network is the x2 RDN (residual dense network, idealo's image-super-resolution architecture,
222 k parameters, trained on DIV2K) that npm's ``@upscalerjs/esrgan-slim`` 1.0.0 ships as TF.js
weights (MIT licence, Kevin Scott). ``recipes/convert_upscalerjs.py`` turned them into
``collapseguard/weights/replicator_sr_rdn_x2.safetensors``, whose metadata holds the layer graph,
the source package and its licence; this module runs that graph in torch, offline.

Each chain step: an optional sub-pixel shift (a 0/1-pixel edge-replicated offset, so the 2x2 grid
never lines up twice), a 2x downscale with the chain's filter (box, bilinear, bicubic or Lanczos:
what dataset pipelines use), the network's 2x upscale, a crop back to the input's size, and a blend
of the network's output with the input (per-chain ``keep``). What accumulates -- lost fine texture,
invented edges and ringing, smoothed grain -- is what a real SR model does when an image is shrunk
and restored again and again.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
from PIL import Image

from collapseguard.training_data_tools.replicators.base import (
    Replicator,
    ReplicatorError,
    log_uniform,
)

WEIGHTS = Path(__file__).resolve().parents[2] / "weights" / "replicator_sr_rdn_x2.safetensors"

#: downscale filters a chain draws from
FILTERS = {"box": Image.BOX, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}

_CACHE: dict[str, object] = {}


def build_network(layers: list[dict], tensors: dict):
    """A torch module running a converted TF.js layers graph (Conv2D, Activation relu/linear,
    Concatenate, Add, UpSampling2D nearest, one InputLayer, and idealo's RRDN layers:
    ``MultiplyBeta`` (times the ``beta`` the converter stores) and ``PixelShuffleNx``, TF's
    ``depth_to_space`` in NHWC channel order). Other layer types are refused. Float16 kernels
    are widened to float32."""
    import torch
    from torch import nn

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = layers
            self.convs = nn.ModuleDict()
            for layer in layers:
                cls, cfg = layer["class"], layer["config"]
                if cls == "Conv2D":
                    w = tensors[f"{layer['name']}/kernel"]
                    conv = nn.Conv2d(w.shape[1], w.shape[0], tuple(cfg["kernel_size"]), bias=True)
                    if cfg.get("activation", "linear") != "linear":
                        raise ReplicatorError(f"unsupported conv activation {cfg['activation']!r}")
                    if tuple(conv.weight.shape) != tuple(w.shape):
                        raise ReplicatorError(f"{layer['name']}: kernel shape {tuple(w.shape)}")
                    with torch.no_grad():
                        conv.weight.copy_(torch.as_tensor(w.astype(np.float32)))
                        conv.bias.copy_(torch.as_tensor(tensors[f"{layer['name']}/bias"].astype(np.float32)))
                    self.convs[layer["name"].replace(".", "_")] = conv
                elif cls == "Activation" and cfg.get("activation") not in ("relu", "linear"):
                    raise ReplicatorError(f"unsupported activation {cfg.get('activation')!r}")
                elif cls == "UpSampling2D" and cfg.get("interpolation", "nearest") != "nearest":
                    raise ReplicatorError("only nearest upsampling is supported")
                elif cls == "MultiplyBeta" and "beta" not in cfg:
                    raise ReplicatorError(f"{layer['name']}: MultiplyBeta without its beta")
                elif cls.startswith("PixelShuffle") and not isinstance(cfg.get("scale"), int):
                    raise ReplicatorError(f"{layer['name']}: PixelShuffle without an integer scale")
                elif not (cls in ("Conv2D", "Activation", "Concatenate", "Add", "UpSampling2D", "InputLayer",
                                  "MultiplyBeta") or cls.startswith("PixelShuffle")):
                    raise ReplicatorError(f"unsupported layer {cls!r} in the super-resolution graph")

        def forward(self, x):  # (N, 3, H, W), values 0-255
            F = torch.nn.functional
            out = {}
            for layer in self.layers:
                cls, cfg, ins = layer["class"], layer["config"], [out[i] for i in layer["inputs"]]
                if cls == "InputLayer":
                    y = x
                elif cls == "Conv2D":
                    kh, kw = cfg["kernel_size"]
                    z = ins[0]
                    if cfg.get("padding") == "same":
                        z = F.pad(z, (kw // 2, (kw - 1) // 2, kh // 2, (kh - 1) // 2))
                    y = self.convs[layer["name"].replace(".", "_")](z)
                elif cls == "Activation":
                    y = F.relu(ins[0]) if cfg["activation"] == "relu" else ins[0]
                elif cls == "Concatenate":
                    y = torch.cat(ins, dim=1)
                elif cls == "Add":
                    y = ins[0]
                    for z in ins[1:]:
                        y = y + z
                elif cls == "MultiplyBeta":
                    y = ins[0] * cfg["beta"]
                elif cls.startswith("PixelShuffle"):
                    y = depth_to_space(ins[0], cfg["scale"])
                else:  # UpSampling2D
                    y = F.interpolate(ins[0], scale_factor=tuple(cfg["size"]), mode="nearest")
                out[layer["name"]] = y
            return y

    return Graph().eval()


def depth_to_space(x, r: int):
    """TF's ``depth_to_space`` (NHWC channel order: channel ``(i * r + j) * C + c`` goes to
    pixel offset ``(i, j)`` of output channel ``c``) on an (N, C*r*r, H, W) tensor."""
    n, crr, h, w = x.shape
    c = crr // (r * r)
    return x.reshape(n, r, r, c, h, w).permute(0, 3, 4, 1, 5, 2).reshape(n, c, h * r, w * r)


@contextlib.contextmanager
def opened_weights(path: str | Path, remedy: str = "recipes/convert_upscalerjs.py"):
    """``safetensors.safe_open`` of converted network weights (numpy); a file that does not read
    (damaged, cut short, not safetensors) is a ReplicatorError naming it and ``remedy``, how to
    make it again."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            yield f
    except Exception as exc:  # noqa: BLE001 - safetensors' own error types: a damaged file
        raise ReplicatorError(f"{path}: not readable safetensors weights ({type(exc).__name__}: "
                              f"{exc}): damaged or cut short? make them again with: {remedy}") from None


def load_network(path: str | Path = WEIGHTS):
    """The converted network (once per process), eval mode, CPU; it takes and returns 0-255
    whatever range the network was trained on (the file's ``input_range``)."""
    key = str(path)
    if key not in _CACHE:
        path = Path(path)
        if not path.is_file():
            raise ReplicatorError(f"super-resolution weights missing: {path}; make them with "
                                  "recipes/convert_upscalerjs.py")
        with opened_weights(path) as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open, not a dict
        try:
            layers = json.loads(meta["layers"])
        except (KeyError, ValueError):
            raise ReplicatorError(f"{path}: no layer graph in the metadata") from None
        net = build_network(layers, tensors)
        _CACHE[key] = net if meta.get("input_range", "0-255") == "0-255" else _Scaled(net)
    return _CACHE[key]


class _Scaled:
    """A 0-1 network called with and returning 0-255 values."""

    def __init__(self, net):
        self.net = net

    def __call__(self, x):
        return self.net(x / 255.0) * 255.0


def upscale2(image: np.ndarray) -> np.ndarray:
    """The network's 2x upscale of an (H, W, 3) uint8 image, as float (0-255 scale), (2H, 2W, 3)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32))[None]
    with torch.inference_mode():
        y = load_network()(t)
    return y[0].numpy().transpose(1, 2, 0)


class SuperResolution(Replicator):
    family = "super_resolution"
    description = "2x downscale, then a pretrained RDN super-resolution network (npm @upscalerjs/esrgan-slim)"

    def draw(self, rng):
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "filter": str(rng.choice(list(FILTERS))),
            "shift": bool(rng.random() < 0.7),          # a random 0/1-pixel offset before downscaling
            "keep": float(rng.uniform(0.6, 1.0)),       # share of the network's output kept
        }

    def _step(self, image, rng):
        p = self.params
        h, w = image.shape[:2]
        dy, dx = (int(v) for v in rng.integers(0, 2, 2)) if p["shift"] else (0, 0)
        ph, pw = dy + (h + dy) % 2, dx + (w + dx) % 2  # even sides after the offset
        x = np.pad(image, ((dy, ph - dy), (dx, pw - dx), (0, 0)), mode="edge")
        small = Image.fromarray(x).resize((x.shape[1] // 2, x.shape[0] // 2), FILTERS[p["filter"]])
        up = upscale2(np.asarray(small))[dy:dy + h, dx:dx + w]
        keep = min(1.0, p["keep"] * p["strength"] ** 0.5)
        return image.astype(np.float32) + keep * (up - image.astype(np.float32))
