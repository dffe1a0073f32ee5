"""Storage as training data: how datasets hold images, drawn at random for every training image.

Web-scale image sets store JPEG with 4:2:0 chroma far more often than anything else; others keep
JPEG 4:4:4, WebP or PNG, often after a resize to a web size. A detector trained on PNG chains
learns damage that lives in full-resolution chroma, which 4:2:0 storage throws away. With
``collapseguard train --delivery-kind web`` every training image -- clean negatives and chain
images alike, from one distribution for both classes -- passes through one storage drawn here
before its crops are cut, so damage has to be recognised through the storage and the storage
itself carries no label (a clean JPEG q75 is as clean as its PNG).

A chain draws one storage for all of its steps (same quality, same resize), so its ranking pairs
compare damage, not codecs, and its crops stay aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from collapseguard.images import decode_image, encode_jpeg, resize_by

#: (kind, probability, quality range): JPEG 4:2:0 is the common case
KINDS = (
    ("png", 0.20, (0, 0)),
    ("jpeg420", 0.50, (60, 95)),
    ("jpeg444", 0.15, (70, 98)),
    ("webp", 0.15, (60, 95)),
)
#: probability of a web-size downscale before encoding, and its scale range
RESIZE_P = 0.25
RESIZE_SCALE = (0.5, 0.9)


@dataclass(frozen=True)
class Storage:
    """One way of storing an image: ``kind`` (png, jpeg420, jpeg444, webp), ``quality`` (0 for
    png) and ``scale`` (1.0 = no resize, else a Lanczos downscale before encoding)."""

    kind: str
    quality: int = 0
    scale: float = 1.0

    @property
    def jpeg_quality(self) -> int:
        """The JPEG quality of a JPEG storage, 0 for any other kind."""
        return self.quality if self.kind.startswith("jpeg") else 0

    def label(self) -> str:
        q = f"q{self.quality}" if self.quality else ""
        return f"{self.kind}{q}" + (f"@{self.scale:.2f}" if self.scale != 1.0 else "")


def draw_storage(rng: np.random.Generator) -> Storage:
    """One random storage (always the same three draws from ``rng``, whatever comes out)."""
    u, q, r = rng.random(), rng.random(), rng.random()
    s = rng.uniform(*RESIZE_SCALE)
    edges = np.cumsum([p for _, p, _ in KINDS])
    i = min(int(np.searchsorted(edges, u * edges[-1], side="right")), len(KINDS) - 1)
    kind, _, (lo, hi) = KINDS[i]
    quality = int(lo + min(hi - lo, int(q * (hi - lo + 1)))) if hi else 0
    return Storage(kind, quality, float(s) if r < RESIZE_P else 1.0)


def apply_storage(img: np.ndarray, st: Storage) -> np.ndarray:
    """``img`` (H, W, 3 uint8) as it reads back after being stored as ``st``."""
    out = np.asarray(img)
    if st.scale != 1.0 and min(out.shape[:2]) * st.scale >= 64:  # small images are not shrunk
        out = resize_by(out, st.scale)
    if st.kind == "png":
        return out
    if st.kind == "jpeg420":
        return decode_image(encode_jpeg(out, st.quality, subsampling=2))
    if st.kind == "jpeg444":
        return decode_image(encode_jpeg(out, st.quality, subsampling=0))
    if st.kind == "webp":
        import io

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(out, dtype=np.uint8)).save(buf, format="WEBP", quality=st.quality)
        return decode_image(buf.getvalue())
    raise ValueError(f"unknown storage kind {st.kind!r}")
