"""Native-resolution crops: detectors look at pixels as they are, never at a downscaled image."""

from __future__ import annotations

import numpy as np

#: the revision of ``crop_grid``'s layout, part of every version it decides scores for: 2 reads
#: the bottom row of tall images, which revision 1 (a grid cut to its first n cells) left out
CROP_LAYOUT = "crop-grid-2"


def crop_grid(img: np.ndarray, size: int, n: int) -> list[np.ndarray]:
    """Up to ``n`` deterministic ``size`` x ``size`` crops spread over the whole image.

    Crops are placed row by row on an even grid of about ``n`` cells shaped like the image, whose
    first and last rows and columns touch its edges; when the grid has more cells than ``n``, only
    the last row is short (filled from the left), so every image is looked at down to its bottom
    edge. ``n == 1`` is the centre crop. The same image always gives the same crops. Images
    smaller than ``size`` in a dimension are reflect-padded to ``size``.
    """
    h, w = img.shape[:2]
    if h < size or w < size:
        ph, pw = max(0, size - h), max(0, size - w)
        mode = "reflect" if (h > ph and w > pw) else "edge"
        img = np.pad(img, ((0, ph), (0, pw)) + ((0, 0),) * (img.ndim - 2), mode=mode)
        h, w = img.shape[:2]
    if n <= 1:
        y, x = (h - size) // 2, (w - size) // 2
        return [img[y : y + size, x : x + size]]
    rows = min(n, max(1, int(round(np.sqrt(n * h / w)))))
    cols = max(1, int(np.ceil(n / rows)))
    rows = max(1, int(np.ceil(n / cols)))  # no whole row past n: the bottom row is always read
    ys = np.linspace(0, h - size, rows).round().astype(int) if rows > 1 else [(h - size) // 2]
    xs = np.linspace(0, w - size, cols).round().astype(int) if cols > 1 else [(w - size) // 2]
    out = [img[y : y + size, x : x + size] for y in ys for x in xs]
    return out[:n]


def image_crops(img: np.ndarray, size: int, n: int, mirror: bool = False) -> np.ndarray:
    """(n, size, size, 3) uint8 crops of one RGB image on the deterministic crop grid: what the
    cnn family reads of an image (small images repeat their crops to keep n). With ``mirror``,
    (2n, ...): these, then the crops of the image mirrored left to right (cut on its own grid, so
    that an image and its mirror image give the same set of views; ``NetConfig.mirror``)."""
    arr = np.asarray(img)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {arr.dtype}")
    arr = arr[..., :3]
    crops = crop_grid(arr, size, n)
    while len(crops) < n:  # small images give fewer distinct crops; repeat to keep K fixed
        crops = crops + crops[: n - len(crops)]
    if mirror:
        crops = crops + list(image_crops(arr[:, ::-1], size, n))
    return np.stack(crops)
