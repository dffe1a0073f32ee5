"""The network behind the ``cnn`` detector: a small conv net over native-resolution crops.

Each crop (``crop_size`` x ``crop_size`` pixels, never resized) is turned into six or nine input
channels: the centred RGB values, a high-pass residual (pixel minus its 3x3 box mean, amplified)
and, with ``bandpass``, a band-pass residual (3x3 mean minus 7x7 mean), so the noise, dots,
ripples and lost texture that replication adds stay visible to the first layer. The
conv body ends in mean and standard-deviation pooling (texture energy), which is joined with the
crop's colour statistics (mean and spread per channel, so a creeping colour cast is visible) and
mapped to one logit per crop. An image's score combines the mean and a soft maximum of its crop
logits, so damage confined to a few crops still counts; higher = more degraded.

The architecture is described by a small JSON-able config stored in the safetensors metadata, so a
weights file is self-describing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

MIN_CROP, MAX_CROP = 8, 256  # crop side in pixels
#: the widest conv body (``NetConfig.width``): 256 is ~16x the shipped parameters' memory per
#: layer squared; a weights file's config is data, and a huge width would be allocated before
#: its tensors are checked against it
MAX_WIDTH = 256
#: the most crops per image (``NetConfig.n_crops``): each is cut and scored on every image
MAX_CROPS = 1024


@dataclass(frozen=True)
class NetConfig:
    """Architecture and crop settings; stored alongside the weights."""

    width: int = 16
    crop_size: int = 48
    #: crops per image at inference (deterministic grid, see detectors.crops.crop_grid); the
    #: shipped weights use 24 (`collapseguard train --n-crops`, default 48; the recipe sets 24)
    n_crops: int = 24
    #: gain applied to the high-pass residual channel (pixels in [0, 1])
    residual_gain: float = 8.0
    #: add three band-pass channels (3x3 mean minus 7x7 mean): the mid frequencies where fine
    #: texture lives. Off by default: tried with 80 px crops (docs/history/model_history.md), better
    #: on the training split's held-out sources but worse on the independent calibration set
    bandpass: bool = False
    #: an image-level term from all crops together (DeepSets: a small MLP on every crop's
    #: features, averaged and spread over the crops, mapped to one logit added to the image
    #: score), so the score can use how crops relate, e.g. whether grain follows brightness as a
    #: camera's does. Off by default (the shipped weights have none)
    context: bool = False
    #: "" (default): the small conv body below; "efficientnet-liteV:N" (V = 0, 1, 2): the stem and
    #: first N MBConv blocks of EfficientNet-LiteV (detectors.lite_stem) as the body, started from
    #: ImageNet weights in training (``collapseguard train --init``); ``width`` is then unused
    stem: str = ""
    #: score the crops of the image and of its left-right mirror image together (2 x n_crops
    #: views aggregated as one set, ``crops.image_crops``), so that an image and its mirror image,
    #: which hold the same damage, get the same score; twice the net's work per image. Off by
    #: default
    mirror: bool = False

    def __post_init__(self):
        if not MIN_CROP <= self.crop_size <= MAX_CROP:
            # crops are cut at native resolution and a training run keeps --bank-crops of them per
            # image in memory (3 bytes a pixel): 256 px is already 28x the default's memory
            raise ValueError(f"crop_size must be between {MIN_CROP} and {MAX_CROP} pixels, got {self.crop_size}")
        if not 1 <= self.n_crops <= MAX_CROPS:
            raise ValueError(f"n_crops must be between 1 and {MAX_CROPS}, got {self.n_crops}")
        if not 1 <= self.width <= MAX_WIDTH:
            raise ValueError(f"width must be between 1 and {MAX_WIDTH}, got {self.width}")
        if self.context and self.n_crops < 2:
            raise ValueError("context needs n_crops >= 2 (it uses the spread over the crops)")
        if self.stem:
            from collapseguard.detectors.lite_stem import parse_stem

            parse_stem(self.stem)

    @property
    def in_channels(self) -> int:
        return 9 if self.bandpass else 6

    def to_dict(self) -> dict:
        d = asdict(self)
        for opt in ("bandpass", "context", "stem", "mirror"):
            if not d[opt]:  # written exactly as before the option existed (same weight bytes)
                d.pop(opt)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> NetConfig:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        # weights written before these options existed have no key for them
        known.setdefault("bandpass", False)
        known.setdefault("context", False)
        known.setdefault("stem", "")
        known.setdefault("mirror", False)
        return cls(**known)


def _box_sum_1d(x: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """Sum over a centred window of ``k`` along ``dim`` (nothing outside the tensor): the shifted
    slices added into one buffer, left to right, without padded copies."""
    r, n = k // 2, x.shape[dim]
    out = torch.zeros_like(x)
    for s in range(-r, r + 1):
        m = n - abs(s)
        if m <= 0:
            continue
        dst, src = out.narrow(dim, max(0, -s), m), x.narrow(dim, max(0, s), m)
        if s == -r:
            dst.copy_(src)
        else:
            dst.add_(src)
    return out


def _box_means(x: torch.Tensor, sizes: tuple[int, ...]) -> list[torch.Tensor]:
    """k x k box means of contiguous (N, C, S, S) float pixels, one per k in ``sizes``.

    The window is clipped at the crop border (mean over the pixels inside the crop, i.e.
    ``avg_pool2d(..., count_include_pad=False)``, to float rounding ~2e-7). Computed as separable
    sums of shifted slices: about 3x faster on CPU than torch's stride-1 pooling, which was the
    slowest part of input preparation. The same code serves
    training, scoring and GPUs.
    """
    out = []
    for k in sizes:
        s = _box_sum_1d(_box_sum_1d(x, k, -1), k, -2)
        ones = torch.ones((1, 1, *x.shape[-2:]), dtype=x.dtype, device=x.device)
        cnt = _box_sum_1d(_box_sum_1d(ones, k, -1), k, -2)
        out.append(s.div_(cnt))
    return out


def _spatial_std(x: torch.Tensor, mean: torch.Tensor | None = None) -> torch.Tensor:
    """Unbiased standard deviation of (N, C, H, W) over H and W, as (N, C), in two passes: the same
    as ``x.std(dim=(2, 3))`` to ~3e-8 and much faster on CPU.
    ``mean`` is ``x.mean(dim=(2, 3), keepdim=True)`` when the caller already has it."""
    d = x - (x.mean(dim=(2, 3), keepdim=True) if mean is None else mean)
    return d.mul_(d).sum(dim=(2, 3)).div_(x.shape[2] * x.shape[3] - 1).sqrt_()


def _conv(cin: int, cout: int, stride: int = 1, k: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride=stride, padding=1), nn.LeakyReLU(0.1))


class DegradationNet(nn.Module):
    """Crops in, one degradation logit per image out.

    ``forward(crops)`` takes uint8 or float crops of shape (B, K, S, S, 3) (pixels 0..255) and
    returns (B,) image logits. ``crop_logits`` gives the (B, K) per-crop logits.
    """

    N_COLOUR = 8

    def __init__(self, config: NetConfig | None = None):
        super().__init__()
        self.config = config or NetConfig()
        w = self.config.width
        if self.config.stem:
            from collapseguard.detectors.lite_stem import LiteStem, parse_stem

            variant, blocks = parse_stem(self.config.stem)
            self.body = LiteStem(self.config.in_channels, blocks, variant)
            body_out = self.body.out_channels
        else:
            self.body = nn.Sequential(
                # 4x4 stride-2 stem: sees every pixel (overlapping windows) at half the cost
                _conv(self.config.in_channels, w, 2, k=4), _conv(w, 2 * w, 2), _conv(2 * w, 2 * w), _conv(2 * w, 3 * w, 2)
            )
            body_out = 3 * w
        feat = 2 * body_out + self.N_COLOUR
        self.head = nn.Sequential(nn.Linear(feat, 32), nn.LeakyReLU(0.1), nn.Linear(32, 1))
        # image score = a * mean(crop logits) + b * softmax-pool(crop logits) + c
        self.agg = nn.Parameter(torch.tensor([0.5, 0.5, 0.0]))
        if self.config.context:
            self.ctx_phi = nn.Sequential(nn.Linear(feat, 32), nn.LeakyReLU(0.1), nn.Linear(32, 32),
                                         nn.LeakyReLU(0.1))
            self.ctx_rho = nn.Linear(64, 1)
            # starts at zero: training begins from the crop-only model's function
            nn.init.zeros_(self.ctx_rho.weight)
            nn.init.zeros_(self.ctx_rho.bias)

    # -- input features ------------------------------------------------------------------------
    def _inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, S, S, 3) pixels -> (N, 6 or 9, S, S) net input and (N, 8) colour statistics."""
        # (N, 3, S, S) in [0, 1]; a new tensor, never the caller's
        x = x.permute(0, 3, 1, 2).contiguous().float().mul(1.0 / 255.0)
        means = _box_means(x, (3, 7) if self.config.bandpass else (3,))
        local = means[0]
        gain = self.config.residual_gain
        # channels written in place into one buffer (input preparation dominates CPU scoring time)
        net_in = torch.empty((x.shape[0], self.config.in_channels, *x.shape[2:]), dtype=x.dtype, device=x.device)
        torch.sub(x, 0.5, out=net_in[:, 0:3])
        if self.config.stem:  # the ImageNet weights expect RGB in [-1, 1]
            net_in[:, 0:3].mul_(2.0)
        torch.sub(x, local, out=net_in[:, 3:6]).mul_(gain)
        if self.config.bandpass:
            torch.sub(local, means[1], out=net_in[:, 6:9]).mul_(gain / 2)
        mean = x.mean(dim=(2, 3), keepdim=True)
        std = _spatial_std(x, mean)
        mean = mean.flatten(1)
        r, g, b = mean[:, 0], mean[:, 1], mean[:, 2]
        chroma = torch.stack([g - (r + b) / 2, b - r], dim=1) * 4.0
        colour = torch.cat([mean - 0.5, std * 4.0, chroma], dim=1)
        return net_in, colour

    def crop_features(self, crops: torch.Tensor) -> torch.Tensor:
        """(B, K, S, S, 3) -> (B, K, F) per-crop features (pooled conv maps + colour statistics)."""
        b, k = crops.shape[:2]
        x, colour = self._inputs(crops.reshape(b * k, *crops.shape[2:]))
        # channels-last convolutions (oneDNN): forward + backward 1.3-1.6x faster on CPU
        h = self.body(x.contiguous(memory_format=torch.channels_last))
        pooled = torch.cat([h.mean(dim=(2, 3)), h.std(dim=(2, 3))], dim=1)
        return torch.cat([pooled, colour], dim=1).reshape(b, k, -1)

    def crop_logits(self, crops: torch.Tensor) -> torch.Tensor:
        """(B, K, S, S, 3) -> (B, K) per-crop logits (what ``forward`` aggregates)."""
        return self.head(self.crop_features(crops)).squeeze(-1)

    def context_logit(self, features: torch.Tensor) -> torch.Tensor:
        """(B, K, F) crop features -> (B,) image-level term (``config.context``): the mean and the
        spread over the crops of a per-crop MLP, mapped to one logit. Needs K >= 2."""
        z = self.ctx_phi(features)
        return self.ctx_rho(torch.cat([z.mean(dim=1), z.std(dim=1)], dim=1)).squeeze(-1)

    def aggregate(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, K) crop logits -> (B,) image logits; insensitive to K for constant logits."""
        k = logits.shape[1]
        soft_max = torch.logsumexp(logits, dim=1) - math.log(k)
        return self.agg[0] * logits.mean(dim=1) + self.agg[1] * soft_max + self.agg[2]

    def score_parts(self, crops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, K, C, S, S) crops -> the (B,) crop part (aggregated crop logits, all a crop-only net
        computes) and the (B,) context term, or None without ``config.context``; the score is
        their sum (``forward``)."""
        f = self.crop_features(crops)
        crop_part = self.aggregate(self.head(f).squeeze(-1))
        return crop_part, (self.context_logit(f) if self.config.context else None)

    def forward(self, crops: torch.Tensor) -> torch.Tensor:
        crop_part, context = self.score_parts(crops)
        return crop_part if context is None else crop_part + context


# ---------------------------------------------------------------------------------------------
# Weights I/O (safetensors only; the architecture config travels in the file's metadata)
# ---------------------------------------------------------------------------------------------

def save_net(net: DegradationNet, path, metadata: dict[str, str] | None = None) -> None:
    """Write ``net`` as safetensors with its config (and optional string metadata) embedded."""
    import json

    from safetensors.torch import save_file

    from collapseguard.io.atomic import replaced_when_done
    from collapseguard.io.safetensors_header import sort_metadata

    meta = {"format": "collapseguard-cnn", "config": json.dumps(net.config.to_dict())}
    for k, v in (metadata or {}).items():
        meta[str(k)] = v if isinstance(v, str) else json.dumps(v)
    tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    # safetensors writes its file readable by its owner only; replaced_when_done gives it the
    # umask's mode (and writes it whole or not at all)
    with replaced_when_done(path, suffix=".safetensors.tmp") as tmp:
        save_file(tensors, tmp, metadata=meta)
        sort_metadata(tmp)  # the same weights, the same bytes


def load_weights(data: bytes) -> tuple[DegradationNet, dict[str, str]]:
    """``load_net``, its failures as one ``DetectorError`` (the cnn detectors on both runtimes)."""
    from safetensors import SafetensorError

    from collapseguard.detectors.base import DetectorError
    try:
        return load_net(data)
    except (ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as exc:
        raise DetectorError(f"cannot load cnn weights: {exc} (cnn:PATH takes a .safetensors file "
                            "written by collapseguard train)") from None


def load_net(data: bytes) -> tuple[DegradationNet, dict[str, str]]:
    """Build a DegradationNet from safetensors bytes; returns (net in eval mode, metadata)."""
    import json

    from safetensors.torch import load as load_bytes

    tensors = load_bytes(data)
    # safetensors.torch.load does not return metadata; read the header directly.
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    meta = header.get("__metadata__") or {}
    if meta.get("format") != "collapseguard-cnn":
        raise ValueError("not a collapseguard cnn weights file (metadata format missing)")
    cfg = json.loads(meta["config"])
    if not isinstance(cfg, dict):
        raise ValueError(f"the weights' config must be a JSON object, got {type(cfg).__name__}")
    config = NetConfig.from_dict(cfg)
    net = DegradationNet(config)
    missing, unexpected = net.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not fit the network: missing {missing}, unexpected {unexpected}")
    net.eval()
    return net, meta
