"""Classic one-shot distortions of clean images, as extra positives for the ``cnn`` detector.

The replication families (``training_data_tools.replicators``) are what the study saw; a real
generator will damage images in ways none of them imitates exactly. A detector that learned only
those families calls a new family clean when it resembles something its clean negatives allow
(MODEL_CARD.md, "Leave-one-family-out"). This module gives training a broad prior of what damage
looks like, in the spirit of the distortion sets of classic IQA databases (TID2013, KADID-10k):
white noise, colour casts, blur, strong JPEG, over-sharpening, spots, posterisation, median
smoothing, local warps, resampling and saturation shifts, alone or two at a time.

A *damage ladder* takes one clean image and applies one fixed distortion at rising strength; its
rungs are stored like chain steps (0 = clean, then 3, 5, 10 at strength 0.3, 0.5, 1.0), so the
crop bank shares crop positions along it and the ranking loss sees the same content get worse.
The strengths start above the clean negatives' camera variants (sensor grain up to 7 levels,
JPEG q70+, mild unsharp): a distortion at strength 1 is plainly visible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
from PIL import Image, ImageFilter
from scipy import ndimage

from collapseguard.images import DecodeError, load_image, random_window
from collapseguard.training_data_tools.replicators import ops
from collapseguard.training_data_tools.replicators.ops import jpeg, web_size
from collapseguard.training_data_tools.replicators.ops import to_uint8_image as _u8

#: ladder rungs, as chain steps (``bank.step_label`` gives their loss targets), and their strengths
RUNGS = ((0, 0.0), (3, 0.3), (5, 0.5), (10, 1.0))

Damage = Callable[[np.ndarray, float, dict], np.ndarray]


def _f(img: np.ndarray) -> np.ndarray:
    return img.astype(np.float32)


def _noise(img, t, p):
    rng = np.random.default_rng(p["seed"])
    h, w = img.shape[:2]
    lum = rng.standard_normal((h, w, 1), dtype=np.float32)
    chroma = rng.standard_normal((h, w, 3), dtype=np.float32) * p["chroma"]
    return _u8(_f(img) + (lum + chroma) * (p["sigma"] * t))


def _cast(img, t, p):
    x = _f(img) * (1 + t * p["gain"]) + t * p["offset"]
    return _u8(x)


def _blur(img, t, p):
    return _u8(ops.blur(_f(img), p["sigma"] * t))


def _jpeg(img, t, p):
    return jpeg(img, int(round(95 - t * (95 - p["quality"]))))


def _sharpen(img, t, p):
    f = ImageFilter.UnsharpMask(radius=p["radius"], percent=int(t * p["percent"]), threshold=0)
    return np.asarray(Image.fromarray(img).filter(f))


def _spots(img, t, p):
    rng = np.random.default_rng(p["seed"])
    h, w = img.shape[:2]
    n = int(round(t * p["density"] * h * w / 1e4))
    x = _f(img)
    if n == 0:
        return img
    ys, xs = rng.integers(0, h, n), rng.integers(0, w, n)
    layer = np.zeros((h, w), np.float32)
    layer[ys, xs] = 1.0
    layer = ndimage.gaussian_filter(layer, p["radius"]) * (2 * np.pi * p["radius"] ** 2)
    layer = np.clip(layer, 0, 1)[..., None]
    return _u8(x * (1 - layer) + p["colour"] * layer)


def _posterise(img, t, p):
    levels = max(2, int(round(256 / 2 ** (t * p["bits"]))))
    step = 256 / levels
    return _u8(np.floor(_f(img) / step) * step + step / 2)


def _median(img, t, p):
    out = np.asarray(Image.fromarray(img).filter(ImageFilter.MedianFilter(p["size"])))
    return _u8(_f(img) * (1 - t) + _f(out) * t)


def _warp(img, t, p):
    rng = np.random.default_rng(p["seed"])
    h, w = img.shape[:2]
    d = [ndimage.gaussian_filter(rng.standard_normal((h, w)).astype(np.float32), p["scale"])
         for _ in range(2)]
    d = [v / max(1e-6, float(v.std())) * p["amp"] * t for v in d]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    x = _f(img)
    out = [ndimage.map_coordinates(x[..., c], [yy + d[0], xx + d[1]], order=1, mode="reflect")
           for c in range(3)]
    return _u8(np.stack(out, axis=2))


def _resample(img, t, p):
    h, w = img.shape[:2]
    s = 1 + t * p["factor"]
    small = ops.resize_uint8(img, max(8, round(w / s)), max(8, round(h / s)), Image.BILINEAR)
    return ops.resize_uint8(small, w, h, Image.BILINEAR)


def _saturation(img, t, p):
    x = _f(img)
    grey = x.mean(axis=2, keepdims=True)
    return _u8(grey + (x - grey) * (1 + t * p["change"]))


#: name -> (distortion, parameter draw); each draw returns what strength 1 means for one ladder
DAMAGES: dict[str, tuple[Damage, Callable[[np.random.Generator], dict]]] = {
    "noise": (_noise, lambda r: {"sigma": float(r.uniform(8, 24)), "chroma": float(r.uniform(0, 0.8)),
                                 "seed": int(r.integers(2**31))}),
    "cast": (_cast, lambda r: {"gain": r.uniform(-0.12, 0.12, 3).astype(np.float32),
                               "offset": r.uniform(-14, 14, 3).astype(np.float32)}),
    "blur": (_blur, lambda r: {"sigma": float(r.uniform(1.2, 3.0))}),
    "jpeg": (_jpeg, lambda r: {"quality": int(r.integers(8, 35))}),
    "sharpen": (_sharpen, lambda r: {"radius": float(r.uniform(1.0, 3.0)), "percent": int(r.integers(150, 400))}),
    "spots": (_spots, lambda r: {"density": float(r.uniform(2, 12)), "radius": float(r.uniform(0.7, 2.0)),
                                 "colour": r.uniform(0, 255, 3).astype(np.float32), "seed": int(r.integers(2**31))}),
    "posterise": (_posterise, lambda r: {"bits": float(r.uniform(3.0, 5.0))}),
    "median": (_median, lambda r: {"size": int(r.choice([3, 5]))}),
    "warp": (_warp, lambda r: {"amp": float(r.uniform(0.8, 2.5)), "scale": float(r.uniform(2.0, 6.0)),
                               "seed": int(r.integers(2**31))}),
    "resample": (_resample, lambda r: {"factor": float(r.uniform(0.6, 2.0))}),
    "saturation": (_saturation, lambda r: {"change": float(r.choice([-1, 1]) * r.uniform(0.3, 0.7))}),
}


def draw_ladder(rng: np.random.Generator, pair_share: float = 0.3) -> list[tuple[str, dict]]:
    """One ladder's distortions: one kind, or two different kinds with probability ``pair_share``."""
    names = sorted(DAMAGES)
    k = 2 if rng.random() < pair_share else 1
    picks = rng.choice(len(names), k, replace=False)
    return [(names[i], DAMAGES[names[i]][1](rng)) for i in picks]


def apply_ladder(img: np.ndarray, ladder: list[tuple[str, dict]], strength: float) -> np.ndarray:
    """``img`` with every distortion of ``ladder`` at ``strength`` (0 returns ``img`` itself)."""
    if strength <= 0:
        return img
    out = img
    for name, params in ladder:
        out = DAMAGES[name][0](out, strength, params)
    return out


def damage_ladders(images: Iterable[tuple[str, np.ndarray]], per_image: int, seed: int
                   ) -> Iterator[tuple[str, str, int, np.ndarray]]:
    """For every (name, clean image): ``per_image`` ladders. Yields (ladder id, kind, step, image)
    for each rung of ``RUNGS``; the kind names the distortions, e.g. ``generic:blur+noise``."""
    rng = np.random.default_rng(seed)
    for name, img in images:
        for j in range(per_image):
            ladder = draw_ladder(rng)
            kind = "generic:" + "+".join(sorted(n for n, _ in ladder))
            for step, strength in RUNGS:
                yield f"generic/{name}/{j}", kind, step, apply_ladder(img, ladder, strength)


def ladder_sources(paths: Iterable, seed: int, side: int = 512) -> Iterator[tuple[str, np.ndarray]]:
    """One ``side`` px window of every clean file at a random web size (long side 640-2048 px),
    as ladder sources. Unreadable files are skipped."""
    rng = np.random.default_rng(seed)
    seen: dict[str, int] = {}
    for p in paths:
        try:
            img = load_image(p)
        except (OSError, DecodeError):
            continue
        name = str(getattr(p, "name", p))
        # two files of one name (in two --clean folders) must not share a ladder id: the ladders
        # would be one chain to the ranking loss, pairing one picture's rungs with the other's
        seen[name] = seen.get(name, 0) + 1
        yield (name if seen[name] == 1 else f"{name}#{seen[name]}"), random_window(web_size(img, rng), side, rng)
