"""``cnn``: the trained degradation detector shipped with the package (the default detector).

It scores a fixed grid of native-resolution crops per image (``crops.crop_grid``; nothing is
resized) with a small conv net (``cnn_model.DegradationNet``) and combines the crop logits into one
score, higher = more degraded. Weights are safetensors inside the package
(``collapseguard/weights/cnn.safetensors``, see MODEL_CARD.md for how they were made); the
version is a hash of the weights' tensors, config and crop count. Inference is deterministic:
eval mode, fixed crops.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from collapseguard.detectors.base import (
    Detector,
    DetectorError,
    params_version,
    resolve_device,
)
from collapseguard.detectors.cnn_family import (  # noqa: F401 (names this module has exported)
    WEIGHTS_NAME,
    default_weights_bytes,
    weights_bytes,
)
from collapseguard.detectors.cnn_model import DegradationNet, load_weights
from collapseguard.detectors.crops import CROP_LAYOUT, image_crops


def weights_version(net: DegradationNet, n_crops: int) -> str:
    """A hash of what decides the scores: the architecture config, the crops per image and every
    tensor (name, dtype, shape, values) in sorted order, and the crop layout's revision. Unlike a hash of the file bytes it does
    not change when the same weights are saved again (safetensors writes its metadata keys in an
    arbitrary order per process)."""
    parts: list[object] = ["cnn", json.dumps(net.config.to_dict(), sort_keys=True), int(n_crops),
                           CROP_LAYOUT]
    for name, t in sorted(net.state_dict().items()):
        t = t.detach().cpu().contiguous()
        parts += [name, str(t.dtype), tuple(t.shape), t.numpy().tobytes()]
    return params_version(*parts)


def crops_for(net: DegradationNet, n_crops: int | None) -> int:
    """The crops per image to score with: ``n_crops``, or the weights' own when None. A
    DetectorError for fewer than one, or for fewer than two where the weights' context term
    reads the spread over the crops (one crop would make every score NaN)."""
    k = net.config.n_crops if n_crops is None else int(n_crops)
    if k < 1:
        raise DetectorError(f"n_crops must be >= 1, got {k}")
    if net.config.context and k < 2:
        raise DetectorError(f"n_crops {k}: these weights' context term needs at least 2 crops per image")
    return k


@contextmanager
def _full_fp32(device: torch.device):
    """Full fp32 convolutions on CUDA (cuDNN uses TF32 on Ampere and later by default, which moved
    scores by up to 0.006 against the CPU on an H200; ``benchmarks/gpu_check.py``), so that a
    threshold calibrated on the CPU drops the same images on a GPU. Restores the setting after."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    before = cudnn.allow_tf32
    cudnn.allow_tf32 = False
    try:
        yield
    finally:
        cudnn.allow_tf32 = before


class CNNDetector(Detector):
    """The trained crop-based degradation detector.

    Parameters: ``weights`` (path to a .safetensors file; default: the packaged weights),
    ``device`` ("cuda", "cpu" or None = CUDA when available), ``n_crops`` (override the number of
    crops per image stored with the weights).
    """

    runtime = "torch"

    batch_size = 32

    def __init__(self, weights: str | Path | None = None, device: str | None = None,
                 n_crops: int | None = None):
        data = weights_bytes(weights)
        net, meta = load_weights(data)
        self.metadata = meta
        self.net: DegradationNet = net
        self.n_crops = crops_for(net, n_crops)
        self.version = weights_version(net, self.n_crops)
        #: the crops of the image's mirror image are scored too (``NetConfig.mirror``)
        self.mirror = net.config.mirror
        self.device = torch.device(resolve_device(device))
        self.net.to(self.device).eval()

    def to(self, device: str) -> CNNDetector:
        self.device = torch.device(resolve_device(device))
        self.net.to(self.device)
        return self

    @torch.inference_mode()
    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """One float32 score per image, higher = more degraded."""
        out = np.empty(len(images), dtype=np.float32)
        size = self.net.config.crop_size
        with _full_fp32(self.device):  # once per call, not per batch
            for start in range(0, len(images), self.batch_size):
                chunk = images[start : start + self.batch_size]
                crops = np.stack([image_crops(im, size, self.n_crops, self.mirror) for im in chunk])
                x = torch.from_numpy(crops).to(self.device)
                out[start : start + len(chunk)] = self.net(x).float().cpu().numpy()
        return out
