"""Per-image features for comparing two copies of one picture at a common scale.

Two copies of a picture rarely share a size (one was resized, or cropped a little), so each image
is described at a ladder of common scales: its shorter side reduced to each ``SCALES`` entry it
reaches (area-averaging, never enlarged). Two images are compared at the largest scale both reach
(``common_scale``), where the same picture gives the same features unless one copy lost detail,
gained noise, dots or a colour cast. Features per scale (``FEATURES``):

- ``hf``       log Laplacian energy of the luminance (fine detail and noise);
- ``grad``     log mean gradient magnitude (edges and texture);
- ``noise``    log median absolute residual after a 3 x 3 median filter (grain);
- ``impulse``  share of pixels far from their 3 x 3 median (isolated dots);
- ``texture``  log mean local standard deviation over 5 x 5 windows (texture kept or flattened);
- ``flat``     share of pixels whose 4-neighbour gradients are all zero (banding, posterised areas);
- ``sat``      mean saturation (max - min over channels);
- ``cast``     chroma of the mean colour (a growing cast);
- ``block``    8 x 8 grid discontinuity over the image's other discontinuities (codec blocks).

Values are NaN at scales the image does not reach.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy import ndimage

SCALES = (64, 128, 256)
FEATURES = ("hf", "grad", "noise", "impulse", "texture", "flat", "sat", "cast", "block")
_EPS = 1e-4


def reduce_to(img: np.ndarray, side: int, pil: Image.Image | None = None,
              reducing_gap: float | None = None) -> np.ndarray:
    """``img`` with its shorter side reduced to ``side`` px (area filter), float32 in [0, 1]
    (``pil``: ``Image.fromarray(img)`` when the caller already has it; ``reducing_gap``: PIL's)."""
    h, w = img.shape[:2]
    short = min(h, w)
    if short != side:
        size = (max(1, round(w * side / short)), max(1, round(h * side / short)))
        img = np.asarray((pil or Image.fromarray(img)).resize(size, Image.Resampling.BOX,
                                                              reducing_gap=reducing_gap))
    return img.astype(np.float32) / 255.0


def features_at(rgb: np.ndarray, only: frozenset[str] | None = None) -> np.ndarray:
    """The ``FEATURES`` of one float RGB image in [0, 1] (already at its comparison scale); with
    ``only``, just those (the others NaN: a comparator whose weights ignore a feature need not pay
    for it, and ``hf`` is always computed because NaN rows mark unreached scales)."""
    want = set(FEATURES) if only is None else set(only) | {"hf"}
    out = np.full(len(FEATURES), np.nan)
    y = 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]
    lap = ndimage.laplace(y)
    out[0] = np.log(float((lap * lap).mean()) + _EPS)
    if "grad" in want:
        gy, gx = np.gradient(y)
        out[1] = np.log(float(np.hypot(gx, gy).mean()) + _EPS)
    if want & {"noise", "impulse"}:
        resid = np.abs(y - ndimage.median_filter(y, size=3))
        out[2] = np.log(float(np.median(resid)) + _EPS)
        out[3] = float((resid > 0.08).mean())
    if "texture" in want:
        mu = ndimage.uniform_filter(y, 5)
        var = np.maximum(ndimage.uniform_filter(y * y, 5) - mu * mu, 0)
        out[4] = np.log(float(np.sqrt(var).mean()) + _EPS)
    if want & {"flat", "block"}:
        dx = np.abs(np.diff(y, axis=1))
        dy = np.abs(np.diff(y, axis=0))
        flat = np.zeros_like(y, dtype=bool)
        flat[1:-1, 1:-1] = ((dx[1:-1, :-1] < 1e-6) & (dx[1:-1, 1:] < 1e-6)
                            & (dy[:-1, 1:-1] < 1e-6) & (dy[1:, 1:-1] < 1e-6))
        out[5] = float(flat.mean())
        cols = dx.mean(axis=0)
        rows = dy.mean(axis=1)
        grid = np.concatenate([cols[7::8], rows[7::8]])
        other = np.concatenate([cols, rows])
        out[8] = float(grid.mean() / (other.mean() + _EPS)) if grid.size else 1.0
    if "sat" in want:
        out[6] = _sat(rgb)
    if "cast" in want:
        out[7] = _cast(rgb)
    return out


def _sat(rgb: np.ndarray) -> float:
    """Mean over pixels of the channels' max - min (``sat``)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]  # channel-wise: 25x faster than axis=2
    return float((np.maximum(np.maximum(r, g), b) - np.minimum(np.minimum(r, g), b)).mean())


def _cast(rgb: np.ndarray) -> float:
    """The chroma of the mean colour (``cast``)."""
    # per channel: a reduction over the first axis of an (n, 3) array is 15x slower
    mean_rgb = np.array([rgb[..., 0].mean(), rgb[..., 1].mean(), rgb[..., 2].mean()])
    chroma = mean_rgb - mean_rgb.mean()
    return float(np.sqrt((chroma * chroma).sum()))


def reached_rung(short: int) -> int:
    """The index of the largest scale an image with this shorter side reaches (0 below the first:
    a tiny image is described at its own size, on the first rung)."""
    return max(0, sum(short >= side for side in SCALES) - 1)


def ladder(img: np.ndarray, only: frozenset[str] | None = None,
           rungs: frozenset[int] | None = None, pil: Image.Image | None = None) -> np.ndarray:
    """The features of ``img`` at every scale of ``SCALES``: shape (len(SCALES), len(FEATURES)),
    NaN rows at scales its shorter side does not reach (``only``: as in ``features_at``). With
    ``rungs`` (indices into ``SCALES``), only those rows (the others NaN): each is the same as in
    the full ladder, which reduces every scale from the image itself (``pil``: as in
    ``reduce_to``)."""
    out = np.full((len(SCALES), len(FEATURES)), np.nan)
    short = min(img.shape[:2])
    for i, side in enumerate(SCALES):
        if short >= side and (rungs is None or i in rungs):
            if pil is None and short != side:
                pil = Image.fromarray(img)  # once for every scale it is reduced to
            out[i] = features_at(reduce_to(img, side, pil), only)
    if short < SCALES[0] and (rungs is None or 0 in rungs):  # a tiny image: its own size, first rung
        out[0] = features_at(img.astype(np.float32) / 255.0, only)
    return out


#: the largest window (px a side, centred) ``top_octave`` reads: about 0.6 ms an image whatever its
#: size (512 px: 1.7 ms, and no better apart on the bundled photos' copies; 256 px reads a 60%
#: reduction up to 0.31 over its original); the timing command is in docs/DEDUP.md
OCTAVE_WINDOW = 320


def _laplacian_energy(y: np.ndarray) -> float:
    """Mean squared 4-neighbour Laplacian over the interior of a 2-D array."""
    lap = y[1:-1, :-2] + y[1:-1, 2:] + y[:-2, 1:-1] + y[2:, 1:-1] - 4 * y[1:-1, 1:-1]
    return float((lap * lap).mean())


#: the shorter side (px) ``coarse_chroma`` reduces an image to: colour is a picture's coarse
#: content, chroma noise is not (each pixel there averages a block of the image, and the noise
#: with it)
CHROMA_SIDE = 16


def coarse_chroma(img: np.ndarray, pil: Image.Image | None = None) -> tuple[float, float]:
    """``(sat, cast)`` as ``features_at`` measures them, of ``img`` resized (area filter) to a
    shorter side of ``CHROMA_SIDE`` px: the colour a picture holds, which chroma
    noise added to a grey picture does not reach (``dedup.colour``). ``pil``: as in
    ``reduce_to``."""
    if img.ndim != 3:
        return 0.0, 0.0
    rgb = reduce_to(img, CHROMA_SIDE, pil, reducing_gap=CHROMA_REDUCING_GAP)
    return _sat(rgb), _cast(rgb)


#: PIL's ``reducing_gap`` for ``coarse_chroma``: the image is first box-reduced by a whole factor
#: (block means), then area-resampled the rest of the way, 2-3x faster than one area resample
#: of the whole image and the same ``sat``, ``cast`` within about 2% on the bundled photos
CHROMA_REDUCING_GAP = 2.0


#: ``colour_layout``'s grid (cells a side) over the image reduced to ``LAYOUT_SIDE`` px on its
#: shorter side: fine enough that an object recoloured in a product shot fills whole cells, coarse
#: enough that chroma noise averages out and copies framed alike put each cell on the same place
LAYOUT_GRID = 8
LAYOUT_SIDE = 32


def colour_layout(img: np.ndarray, pil: Image.Image | None = None) -> np.ndarray:
    """The picture's tones and colours by place: in each cell of a ``LAYOUT_GRID`` x
    ``LAYOUT_GRID`` grid over the image reduced to a shorter side of ``LAYOUT_SIDE`` px, its mean
    luma (BT.601 Y, stored as ``round(Y / 2) - 64``) and opponent chroma (``R - G``,
    ``(R + G) / 2 - B``, in levels of 255, stored as int8 halves): cells in row order, three
    values a cell (192). What tells colour variants of one layout apart, and a grey product from
    a greyscale copy of a coloured one (``dedup.colour``); a grey image's chroma is zeros."""
    out = np.zeros((LAYOUT_GRID, LAYOUT_GRID, 3), np.float32)
    rgb = reduce_to(img, LAYOUT_SIDE, pil, reducing_gap=CHROMA_REDUCING_GAP) * 255.0
    if rgb.ndim == 2:
        planes = np.stack([rgb, np.zeros_like(rgb), np.zeros_like(rgb)], -1)
    else:
        r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
        planes = np.stack([0.299 * r + 0.587 * g + 0.114 * b, r - g, (r + g) / 2 - b], -1)
    for i, rows in enumerate(np.array_split(np.arange(planes.shape[0]), LAYOUT_GRID)):
        for j, cols in enumerate(np.array_split(np.arange(planes.shape[1]), LAYOUT_GRID)):
            if rows.size and cols.size:
                out[i, j] = planes[rows[0]: rows[-1] + 1, cols[0]: cols[-1] + 1].mean(axis=(0, 1))
    stored = np.round(out / 2)
    stored[..., 0] -= 64
    return np.clip(stored, -127, 127).astype(np.int8).ravel()


def size_extras(img: np.ndarray, pil: Image.Image | None = None) -> dict:
    """What ``dedup``'s rules read of an image beside its description, at its own size: the
    larger-copy rule's ``octave`` (``top_octave``) and the colour rules' ``chroma``
    (``coarse_chroma``) and ``layout`` (``colour_layout``)."""
    return {"octave": top_octave(img), "chroma": coarse_chroma(img, pil), "layout": colour_layout(img, pil)}


def described(img: np.ndarray, only: frozenset[str] | None = None,
              rungs: frozenset[int] | None = None) -> dict:
    """``{"ladder": ladder(...), **size_extras(img)}`` of one RGB uint8 image, every reduction
    made from one PIL copy of it."""
    pil = Image.fromarray(img)
    return {"ladder": ladder(img, only, rungs, pil), **size_extras(img, pil)}


def top_octave(img: np.ndarray) -> float:
    """How much fine detail an image holds at its own size: the log ratio of its luminance's
    Laplacian energy to that of its 2x box reduction (the mean over the reduction's two grid
    phases), on its central ``OCTAVE_WINDOW`` px a side.
    Natural detail fills the top octave, so a photo and its Lanczos reduction lie close together,
    while an enlargement, whose top octave the interpolation left empty, lies well under its
    original (``benchmarks/dedup_scale.py --copy-kinds`` prints both; ``dedup``'s larger-copy
    rule reads it). NaN for an image under 8 px a side."""
    h, w = img.shape[:2]
    if min(h, w) < 8:
        return float("nan")
    top, left = max(0, (h - OCTAVE_WINDOW) // 2), max(0, (w - OCTAVE_WINDOW) // 2)
    x = img[top: top + OCTAVE_WINDOW, left: left + OCTAVE_WINDOW]
    if x.ndim == 3:
        x = x[..., 0] * np.float32(0.299) + x[..., 1] * np.float32(0.587) + x[..., 2] * np.float32(0.114)
    x = x.astype(np.float32) / 255.0
    coarse = []
    for o in (0, 1):  # both grid phases: a copy shifted by one pixel reads the same
        y = x[o:, o:]
        y = y[: y.shape[0] // 2 * 2, : y.shape[1] // 2 * 2]
        # the 2x2 box means as four strided sums: 14x faster than a reshaped mean over two axes
        coarse.append(_laplacian_energy((y[0::2, 0::2] + y[0::2, 1::2] + y[1::2, 0::2] + y[1::2, 1::2])
                                        * np.float32(0.25)))
    return float(np.log(_laplacian_energy(x) + 1e-8) - np.log(np.mean(coarse) + 1e-8))


def common_scale(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the largest scale at which both ladders have features (0 at least)."""
    both = ~np.isnan(a[:, 0]) & ~np.isnan(b[:, 0])
    idx = np.flatnonzero(both)
    return int(idx[-1]) if idx.size else 0
