"""Web histories: what the web does to a clean image before anyone scores it, and it stays clean.

An image found online has usually been saved as JPEG several times (each site re-encodes
uploads, 4:2:0 chroma, quality 60-95), resized down and up with whatever filter a site or an
editor uses, sharpened on upload, and now and then captured as a screenshot of a screenshot (a
resample at the display's scale, a slight colour-management shift, a lossless save). None of that
is the damage of re-rendering by a model: a detector that reads it as damage drops real images
people keep. ``draw_history`` draws one such history (1-4 JPEG saves and what happens between
them) and ``apply_history`` applies it; both are deterministic for a seeded generator.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageFilter

#: resampling filters of sites, browsers and editors
FILTERS = {"nearest": Image.NEAREST, "box": Image.BOX, "bilinear": Image.BILINEAR,
           "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}
#: a downscale never makes the short side smaller than this
MIN_SIDE = 96


@dataclass(frozen=True)
class Op:
    """One event of a history: ``kind`` is jpeg, resize, sharpen or screenshot."""

    kind: str
    params: dict = field(default_factory=dict)

    def label(self) -> str:
        p = self.params
        if self.kind == "jpeg":
            return f"jpeg{p['quality']}"
        if self.kind == "resize":
            return f"{p['filter']}x{p['scale']:.2f}"
        if self.kind == "sharpen":
            return f"sharpen{p['percent']}"
        return f"screenshot{p['scale']:.2f}"


def draw_history(rng: np.random.Generator, n_jpeg: tuple[int, int] = (1, 4)) -> list[Op]:
    """A random history: ``n_jpeg`` JPEG saves (quality 60-95, 4:2:0), each possibly after a
    resize (down 0.4-0.9x or up 1.1-2x, a drawn filter), upload sharpening or a screenshot."""
    ops: list[Op] = []
    for _ in range(int(rng.integers(n_jpeg[0], n_jpeg[1] + 1))):
        u = rng.random(4)
        if u[0] < 0.5:
            scale = float(rng.uniform(0.4, 0.9) if rng.random() < 0.7 else rng.uniform(1.1, 2.0))
            filt = str(rng.choice(list(FILTERS), p=[0.05, 0.15, 0.3, 0.3, 0.2]))
            ops.append(Op("resize", {"scale": round(scale, 3), "filter": filt}))
        if u[1] < 0.25:
            ops.append(Op("sharpen", {"radius": round(float(rng.uniform(0.5, 1.5)), 2),
                                      "percent": int(rng.integers(30, 121))}))
        if u[2] < 0.12:
            ops.append(Op("screenshot", {"scale": round(float(rng.choice([0.8, 0.9, 1.25, 1.5, 2.0])
                                                              * rng.uniform(0.97, 1.03)), 3),
                                         "gamma": round(float(rng.uniform(0.95, 1.05)), 3)}))
        ops.append(Op("jpeg", {"quality": int(rng.integers(60, 96))}))
    return ops


def _resize(img: np.ndarray, scale: float, filt: str) -> np.ndarray:
    h, w = img.shape[:2]
    if scale < 1 and min(h, w) * scale < MIN_SIDE:  # small images are not shrunk further
        scale = min(1.0, MIN_SIDE / min(h, w))
    nh, nw = max(8, round(h * scale)), max(8, round(w * scale))
    if (nh, nw) == (h, w):
        return img
    return np.asarray(Image.fromarray(img).resize((nw, nh), FILTERS[filt]))


def apply_op(img: np.ndarray, op: Op) -> np.ndarray:
    p = op.params
    if op.kind == "jpeg":
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=int(p["quality"]), subsampling=2)
        with Image.open(io.BytesIO(buf.getvalue())) as dec:
            return np.asarray(dec.convert("RGB"))
    if op.kind == "resize":
        return _resize(img, p["scale"], p["filter"])
    if op.kind == "sharpen":
        f = ImageFilter.UnsharpMask(radius=p["radius"], percent=int(p["percent"]), threshold=2)
        return np.asarray(Image.fromarray(img).filter(f))
    if op.kind == "screenshot":  # shown at the display's scale (bilinear), colour-managed, captured
        out = _resize(img, p["scale"], "bilinear")
        lut = np.clip(np.rint(255.0 * (np.arange(256) / 255.0) ** p["gamma"]), 0, 255).astype(np.uint8)
        return lut[out]
    raise ValueError(f"unknown web-history event {op.kind!r}")


def apply_history(img: np.ndarray, ops: list[Op]) -> np.ndarray:
    """``img`` (H, W, 3 uint8) after every event of ``ops`` in order (the size may change)."""
    out = np.ascontiguousarray(np.asarray(img, dtype=np.uint8))
    for op in ops:
        out = np.ascontiguousarray(apply_op(out, op))
    return out


def history_label(ops: list[Op]) -> str:
    """A short, readable name of a history, e.g. ``bicubicx0.70>jpeg85>jpeg80``."""
    return ">".join(op.label() for op in ops)


def history_json(ops: list[Op]) -> str:
    return json.dumps([{"kind": op.kind, **op.params} for op in ops])


def web_history(img: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[Op]]:
    """One drawn history applied to ``img``: (the image, the history)."""
    ops = draw_history(rng)
    return apply_history(img, ops), ops
