"""Perceptual fingerprints of a picture, for finding copies of it: ``phash``, ``thumbnail`` and
the ``windows``' (for cropped copies).

- ``phash(img)``: a 64-bit DCT hash (the classic pHash): luminance reduced to 32 x 32 (a box
  average by a power of two first, ``box_factor``, then an antialiasing filter), a 2-D DCT, the
  8 x 8 lowest frequencies compared with their median. Only coarse luminance layout enters, so
  re-encoding, resizing, noise, fine texture changes and colour casts move few bits; a small
  crop moves a few more.
- ``thumbnail(img)``: the luminance at 16 x 16, zero mean and unit norm, as ``int8`` (x 127). The
  dot product of two thumbnails is their correlation (x 127^2): the second, independent look
  that confirms a pair the hash proposed, insensitive to brightness, contrast and colour.
- ``windows(img)``: the pHash and thumbnail of the picture's central ``WINDOWS`` (94%, 88% and
  82% of each side). A copy cropped by ``c`` on every side is its original's central ``1 - 2c``:
  its own fingerprint lies near one of the original's windows' for crops of up to about 10% a
  side (``dedup`` looks them up against the other images' full fingerprints), where the full
  fingerprints alone find crops of up to about 2%.

All take RGB ``uint8`` arrays (H, W, 3), or luma arrays (H, W), and need nothing beyond numpy,
scipy and Pillow. The luma is BT.601's (Pillow's ``convert("L")``), the Y that JPEG stores, so a
JPEG decoded reduced and luma only (``images.decode_reduced``: DCT scaling, the 8 x 8 block
averages) gives nearly the fingerprint of its full decoding: the box average by ``box_factor``
comes first either way and an image at most ``2 * REDUCED_SIDE`` on its short side is not reduced
again.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy.fft import dctn

HASH_BITS = 64
THUMB_SIDE = 16
THUMB_SCALE = 127.0
#: the short side a picture is box-averaged down to (at least this, under twice it) before the
#: antialiasing filter
REDUCED_SIDE = 64
#: the central windows (share of each side) whose fingerprints find cropped copies: neighbours
#: 6% apart, because one window's fingerprint stays within the search's tolerance (8 bits, a
#: thumbnail correlation of 0.80) of a crop's for crops about 1.5% a side either way of its own
WINDOWS = (0.94, 0.88, 0.82)
#: what the fingerprints depend on: their values change with it (kept parts name it)
FINGERPRINT_VERSION = f"fp3-box{REDUCED_SIDE}-lanczos-w" + "-".join(str(round(w * 100)) for w in WINDOWS)


def luminance(img: np.ndarray) -> np.ndarray:
    """BT.601 luma of an RGB uint8 array, float32 in [0, 255]."""
    rgb = img.astype(np.float32)
    return 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]


def box_factor(width: int, height: int) -> int:
    """The power of two that box-averages a ``width`` x ``height`` picture to a short side of at
    least ``REDUCED_SIDE`` (1: not reduced). A picture reduced by it gets 1: reducing is done once."""
    f = 1
    while min(width, height) // (2 * f) >= REDUCED_SIDE:
        f *= 2
    return f


def _grey(img: np.ndarray | Image.Image) -> Image.Image:
    """The luma of an RGB (or luma) image, box-averaged by ``box_factor``, as an ``L`` image."""
    if isinstance(img, Image.Image):
        grey = img if img.mode == "L" else img.convert("L")
    else:
        arr = np.ascontiguousarray(img, dtype=np.uint8)
        grey = Image.fromarray(arr, "L") if arr.ndim == 2 else Image.fromarray(arr[..., :3], "RGB").convert("L")
    f = box_factor(*grey.size)
    return grey.reduce(f) if f > 1 else grey


def _reduced(grey: Image.Image, side: int) -> np.ndarray:
    return np.asarray(grey.resize((side, side), Image.Resampling.LANCZOS), dtype=np.float64)


def _window(grey: Image.Image, share: float) -> Image.Image:
    """The central ``share`` of each side of ``grey`` (at sub-pixel precision) at 32 x 32."""
    w, h = grey.size
    mx, my = w * (1 - share) / 2, h * (1 - share) / 2
    return grey.resize((32, 32), Image.Resampling.LANCZOS, box=(mx, my, w - mx, h - my))


def _phash(grey: Image.Image) -> int:
    return _hash_of(_reduced(grey, 32))


def _hash_of(luma32: np.ndarray) -> int:
    coeffs = dctn(luma32, type=2, norm="ortho")[:8, :8].ravel()
    bits = coeffs > np.median(coeffs)
    return int(np.packbits(bits).view(">u8")[0])


def phash(img: np.ndarray | Image.Image) -> int:
    """The 64-bit DCT perceptual hash of an RGB image (or of its luma), as a Python int (bit 63 =
    first coefficient)."""
    return _phash(_grey(img))


def _thumbnail(grey: Image.Image) -> np.ndarray:
    t = _reduced(grey, THUMB_SIDE).ravel()
    t = t - t.mean()
    n = float(np.sqrt((t * t).sum()))
    if n < 1e-6:
        return np.zeros(THUMB_SIDE * THUMB_SIDE, np.int8)
    return np.round(t / n * THUMB_SCALE).astype(np.int8)


def thumbnail(img: np.ndarray | Image.Image) -> np.ndarray:
    """The 16 x 16 luma thumbnail, zero mean, unit norm, scaled to int8 (flat: all zeros)."""
    return _thumbnail(_grey(img))


def fingerprint(img: np.ndarray | Image.Image) -> tuple[int, np.ndarray]:
    """``(phash(img), thumbnail(img))`` from one luma reduction (the same values, half the work)."""
    grey = _grey(img)
    return _phash(grey), _thumbnail(grey)


def _windows(grey: Image.Image) -> list[tuple[int, np.ndarray]]:
    out = []
    for w in WINDOWS:  # the thumbnail from the hash's 32 x 32 (a quarter of the cost of resampling
        win = _window(grey, w)  # the window again; 2 x 2 means would alias fine texture)
        out.append((_hash_of(np.asarray(win, np.float64)), _thumbnail(win)))
    return out


def windows(img: np.ndarray | Image.Image) -> list[tuple[int, np.ndarray]]:
    """``(phash, thumbnail)`` of each of the central ``WINDOWS`` of the picture, in that order
    (the thumbnail resampled from the 32 x 32 luma the hash reads)."""
    return _windows(_grey(img))


def fingerprint_and_windows(img: np.ndarray | Image.Image
                            ) -> tuple[int, np.ndarray, list[tuple[int, np.ndarray]]]:
    """``fingerprint(img)`` and ``windows(img)`` from one luma reduction."""
    grey = _grey(img)
    return _phash(grey), _thumbnail(grey), _windows(grey)


def fingerprint_arrays(images) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``fingerprint_and_windows`` of each image as arrays: hashes (n,) uint64, thumbnails
    (n, 256) int8, the windows' hashes (n, K) and thumbnails (n, K, 256), what
    ``dedup.groups.group_ids`` takes."""
    prints = [fingerprint_and_windows(img) for img in images]
    n, k, side = len(prints), len(WINDOWS), THUMB_SIDE * THUMB_SIDE
    return (np.array([h for h, _, _ in prints], np.uint64).reshape(n),
            np.array([t for _, t, _ in prints], np.int8).reshape(n, side),
            np.array([[h for h, _ in w] for _, _, w in prints], np.uint64).reshape(n, k),
            np.array([[t for _, t in w] for _, _, w in prints], np.int8).reshape(n, k, side))


def correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Correlation of int8 thumbnails (rows of ``a`` with rows of ``b``, or one with one), in [-1, 1]."""
    a16 = np.asarray(a, dtype=np.int32)
    b16 = np.asarray(b, dtype=np.int32)
    return (a16 * b16).sum(axis=-1) / (THUMB_SCALE * THUMB_SCALE)


_BYTE_BITS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each unsigned integer (``np.bitwise_count`` on numpy 2, a byte table before)."""
    x = np.asarray(x)
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    b = np.ascontiguousarray(x).view(np.uint8).reshape(*x.shape, x.dtype.itemsize)
    return _BYTE_BITS[b].sum(axis=-1, dtype=np.uint8)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise Hamming distance of uint64 hashes (elementwise)."""
    return popcount(np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64)))
