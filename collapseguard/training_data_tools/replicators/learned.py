"""A learned replicator: a small convolutional autoencoder trained by this project, run in a loop.

The network (``ReplicatorAE``) squeezes the image through a 4x-downsampled, 12-channel bottleneck
and decodes it with transposed convolutions; it was trained as a denoising autoencoder on clean
patches (``python -m collapseguard.training_data_tools.learned_train``). Each chain step perturbs
its input a little (per-chain noise level and a random sub-block shift, so the stride grid never
lines up twice), runs the network, and blends its output with the input by a per-chain strength.
What accumulates (smoothing, texture hallucination, checkerboard from the transposed
convolutions, colour shifts) is genuinely model-induced, not hand-written.

Weights: ``collapseguard/weights/replicator_ae.safetensors`` (safetensors only, never pickle).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collapseguard.training_data_tools.replicators.base import (
    Replicator,
    ReplicatorError,
    log_uniform,
)

WEIGHTS = Path(__file__).resolve().parents[2] / "weights" / "replicator_ae.safetensors"


def build_model():
    """The autoencoder architecture (imports torch lazily)."""
    import torch
    from torch import nn

    class ReplicatorAE(nn.Module):
        """3 -> (stride 2) 24 -> (stride 2) 32 -> 12-channel bottleneck at 1/4 size -> back up to 3."""

        def __init__(self):
            super().__init__()
            act = nn.LeakyReLU(0.1)
            self.enc = nn.Sequential(
                nn.Conv2d(3, 24, 4, stride=2, padding=1), act,
                nn.Conv2d(24, 32, 4, stride=2, padding=1), act,
                nn.Conv2d(32, 12, 1))
            self.dec = nn.Sequential(
                nn.Conv2d(12, 32, 3, padding=1), act,
                nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1), act,
                nn.ConvTranspose2d(16, 3, 4, stride=2, padding=1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x in [0, 1], (N, 3, H, W)
            return self.dec(self.enc(x)) + _skip(x)

    def _skip(x):
        # a blurred skip path: the bottleneck only has to carry detail, colour comes through
        return torch.nn.functional.avg_pool2d(
            torch.nn.functional.interpolate(torch.nn.functional.avg_pool2d(x, 4), scale_factor=4,
                                            mode="bilinear", align_corners=False), 3, 1, 1,
            count_include_pad=False)

    return ReplicatorAE()


_CACHE: dict[str, object] = {}


def load_model(path: str | Path = WEIGHTS):
    """Load (once per process) the trained autoencoder from safetensors, in eval mode on CPU."""
    path = Path(path)
    key = str(path)
    if key not in _CACHE:
        if not path.is_file():
            raise ReplicatorError(f"learned replicator weights missing: {path}; train them with "
                                  "python -m collapseguard.training_data_tools.learned_train")
        from safetensors.torch import load_file
        model = build_model()
        model.load_state_dict(load_file(str(path)))
        model.eval()
        _CACHE[key] = model
    return _CACHE[key]


class LearnedReplicator(Replicator):
    family = "learned"
    description = "a small trained conv autoencoder applied in a loop (model-induced damage)"

    def draw(self, rng):
        return {
            "strength": log_uniform(rng, 0.6, 1.7),
            "blend": float(rng.uniform(0.35, 0.9)),        # share of the network's output kept
            "input_noise": log_uniform(rng, 0.5, 3.0),      # perturbation before each pass (levels)
        }

    def _step(self, image, rng):
        import torch

        p = self.params
        model = load_model()
        h, w = image.shape[:2]
        x = image.astype(np.float32)
        x = x + rng.standard_normal(x.shape, dtype=np.float32) * p["input_noise"] * p["strength"]
        dy, dx = (int(v) for v in rng.integers(0, 4, 2))
        ph, pw = (-(h + dy) % 4), (-(w + dx) % 4)
        t = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))[None] / 255.0
        t = torch.nn.functional.pad(t, (dx, pw, dy, ph), mode="replicate")
        blend = min(1.0, p["blend"] * p["strength"] ** 0.5)
        with torch.inference_mode():
            t = t + blend * (model(t) - t)
        y = t[0, :, dy:dy + h, dx:dx + w].numpy().transpose(1, 2, 0) * 255.0
        return y
