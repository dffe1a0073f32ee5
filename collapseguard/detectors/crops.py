"""Native-resolution crops: detectors look at pixels as they are, never at a downscaled image."""

from __future__ import annotations

import numpy as np


def crop_grid(img: np.ndarray, size: int, n: int) -> list[np.ndarray]:
    """Up to ``n`` deterministic ``size`` x ``size`` crops spread over the image.

    Crops are placed on an even grid (centre first when n is odd), so the same image always gives
    the same crops. Images smaller than ``size`` in a dimension are reflect-padded to ``size``.
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
    rows = max(1, int(round(np.sqrt(n * h / w))))
    cols = max(1, int(np.ceil(n / rows)))
    ys = np.linspace(0, h - size, rows).round().astype(int) if rows > 1 else [(h - size) // 2]
    xs = np.linspace(0, w - size, cols).round().astype(int) if cols > 1 else [(w - size) // 2]
    out = [img[y : y + size, x : x + size] for y in ys for x in xs]
    return out[:n]
