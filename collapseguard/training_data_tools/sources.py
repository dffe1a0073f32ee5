"""Clean image sources: the "source" currency is an iterable of ``(name, RGB uint8 array)``.

- ``bundled_photos()``: photos that ship inside installed wheels (scikit-image's ``data`` folder,
  scikit-learn's sample images, matplotlib's ``grace_hopper.jpg``); nothing is downloaded.
- ``drawn_kinds.pixel_art`` and ``drawn_kinds.screens``: pixel art and screens (screenshots,
  UI, diagrams, text), drawn from a seed.
- ``procedural_art(n, seed)``: clean "digital art" in the look of AI-generated originals: smooth
  gradients, flat-colour shapes with outlines, soft lighting and shadows, in various sizes and
  aspect ratios.
- ``folder_images(path)``: image files under a folder (recursively, sorted).
- ``shard_images(paths)``: images inside WebDataset ``.tar`` shards (tar members are read as bytes
  and decoded; nothing is unpickled).
- ``photo_views(paths, side)``: one view per large photo, alternating between a native-resolution
  ``side`` x ``side`` window (camera grain and optics intact) and a whole-picture downscale to a web
  size (long side 1.5 x ``side``), so chains start from both kinds of clean photo that training
  sets hold.
- ``photo_windows(paths, side, count)``: more native-resolution windows of each large photo.
- ``resolve_sources(spec)``: the command-line spellings of the above.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from collapseguard.errors import CollapseguardError
from collapseguard.images import (
    ALLOWED_FORMATS,
    DecodeError,
    decode_image,
    is_image_name,
    load_image,
    random_window,
    resize_by,
)
from collapseguard.io.tar import CappedTarInfo, open_regular_file, split_key
from collapseguard.io.urls import is_shard_name

Source = tuple[str, np.ndarray]

#: scikit-image data files that ship inside its wheel (no pooch download), colour or grey
_SKIMAGE_FILES = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
                  "hubble_deep_field.jpg", "retina.jpg", "camera.png", "brick.png", "grass.png",
                  "gravel.png", "moon.png", "coins.png", "page.png", "horse.png", "color.png")


class SourceError(CollapseguardError, ValueError):
    """A source spec or folder that yields no usable images."""


#: the packages whose photos ``bundled_photos`` reads: scikit-image and scikit-learn come with
#: every install, matplotlib with the ``[plots]`` extra
BUNDLED_PACKAGES = ("skimage", "sklearn", "matplotlib")


def _package_photos(package: str) -> list[tuple[str, Path]]:
    """(name, path) of the sample photos inside ``package`` ([] when it is not installed)."""
    try:
        if package == "skimage":
            import skimage
            d = Path(skimage.__file__).parent / "data"
            return [(f"skimage/{Path(n).stem}", d / n) for n in _SKIMAGE_FILES if (d / n).is_file()]
        if package == "sklearn":
            import sklearn.datasets
            d = Path(sklearn.datasets.__file__).parent / "images"
            return [(f"sklearn/{p.stem}", p) for p in sorted(d.glob("*.jpg"))]
        if package == "matplotlib":
            import matplotlib
            p = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
            return [("matplotlib/grace_hopper", p)] if p.is_file() else []
    except ImportError:
        return []
    raise ValueError(f"no bundled photos known in {package!r}; known: {', '.join(BUNDLED_PACKAGES)}")


def _bundled_paths(packages: tuple[str, ...] = BUNDLED_PACKAGES) -> list[tuple[str, Path]]:
    return [item for package in packages for item in _package_photos(package)]


def bundled_photos(min_side: int = 64, packages: tuple[str, ...] = BUNDLED_PACKAGES) -> list[Source]:
    """Photos shipped inside installed packages (no network), as RGB uint8 arrays: those of
    ``packages`` (of ``BUNDLED_PACKAGES``) that are installed.

    Grey images are repeated into three channels. Images smaller than ``min_side`` are skipped.
    """
    out = []
    for name, path in _bundled_paths(packages):
        try:
            arr = load_image(path)
        except (OSError, DecodeError):
            continue
        if min(arr.shape[:2]) >= min_side:
            out.append((name, arr))
    return out


# ---------------------------------------------------------------------------------------------
# procedural digital art
# ---------------------------------------------------------------------------------------------

_ASPECTS = (1.0, 4 / 3, 3 / 4, 16 / 9, 9 / 16, 3 / 2, 2 / 3, 5 / 4)


def _draw_size(rng: np.random.Generator, min_side: int, max_side: int) -> tuple[float, float]:
    """(width, height) of a picture: a long side in [min_side, max_side] and one of ``_ASPECTS``."""
    long_side = int(rng.integers(min_side, max_side + 1))
    aspect = float(rng.choice(_ASPECTS))
    return (long_side, long_side / aspect) if aspect >= 1 else (long_side * aspect, long_side)


def _palette(rng: np.random.Generator, n: int) -> np.ndarray:
    """n harmonious colours: hues around a random base, varied saturation/value (0..255 floats)."""
    import colorsys
    base = rng.uniform(0, 1)
    scheme = rng.choice([0.08, 0.33, 0.5, 0.15])
    cols = []
    for i in range(n):
        hue = (base + scheme * rng.integers(-2, 3) + rng.normal(0, 0.03)) % 1.0
        sat = rng.uniform(0.25, 0.9)
        val = rng.uniform(0.35, 1.0)
        cols.append(colorsys.hsv_to_rgb(hue, sat, val))
    return np.asarray(cols, np.float32) * 255


def _gradient(rng, w, h, cols) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if rng.random() < 0.5:  # linear
        a = rng.uniform(0, 2 * np.pi)
        t = (xx / w - 0.5) * np.cos(a) + (yy / h - 0.5) * np.sin(a)
    else:  # radial
        cx, cy = rng.uniform(0.2, 0.8) * w, rng.uniform(0.2, 0.8) * h
        t = np.hypot(xx - cx, yy - cy) / max(w, h)
    t = (t - t.min()) / (t.max() - t.min() + 1e-6)
    t = t * t * (3 - 2 * t)  # smoothstep
    return cols[0] * (1 - t[..., None]) + cols[1] * t[..., None]


def _art_one(rng: np.random.Generator, w: int, h: int, dither: float = 0.6) -> np.ndarray:
    ss = 2  # supersampling for anti-aliased outlines
    cols = _palette(rng, 8)
    bg = _gradient(rng, w * ss, h * ss, cols[:2])
    canvas = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    shadow = Image.new("L", canvas.size, 0)
    draw, sdraw = ImageDraw.Draw(canvas), ImageDraw.Draw(shadow)
    outline_col = tuple(int(v) for v in np.clip(cols[2] * rng.uniform(0.05, 0.4), 0, 255))
    outline_w = int(rng.integers(0, 5)) * ss
    for _ in range(int(rng.integers(3, 11))):
        kind = rng.choice(["ellipse", "rect", "polygon", "blob"])
        cx, cy = rng.uniform(0, w * ss), rng.uniform(0, h * ss)
        r = rng.uniform(0.05, 0.3) * min(w, h) * ss
        fill = tuple(int(v) for v in cols[int(rng.integers(2, 8))])
        if kind == "ellipse":
            box = [cx - r, cy - r * rng.uniform(0.5, 1.5), cx + r, cy + r * rng.uniform(0.5, 1.5)]
            sdraw.ellipse([box[0] + r * 0.15, box[1] + r * 0.2, box[2] + r * 0.15, box[3] + r * 0.2], fill=110)
            draw.ellipse(box, fill=fill, outline=outline_col, width=outline_w)
        elif kind == "rect":
            box = [cx - r, cy - r * rng.uniform(0.4, 1.2), cx + r, cy + r * rng.uniform(0.4, 1.2)]
            rad = int(r * rng.uniform(0, 0.5))
            sdraw.rounded_rectangle([box[0] + r * 0.15, box[1] + r * 0.2, box[2] + r * 0.15, box[3] + r * 0.2],
                                    radius=rad, fill=110)
            draw.rounded_rectangle(box, radius=rad, fill=fill, outline=outline_col, width=outline_w)
        else:
            k = int(rng.integers(3, 8)) if kind == "polygon" else 24
            ang = np.sort(rng.uniform(0, 2 * np.pi, k)) if kind == "polygon" else np.linspace(0, 2 * np.pi, k, endpoint=False)
            rad = r * (rng.uniform(0.5, 1.0, k) if kind == "polygon"
                       else 1 + 0.25 * np.sin(ang * rng.integers(2, 5) + rng.uniform(0, 6)))
            pts = [(float(cx + q * np.cos(a)), float(cy + q * np.sin(a))) for a, q in zip(ang, rad)]
            sdraw.polygon([(x + r * 0.15, y + r * 0.2) for x, y in pts], fill=110)
            draw.polygon(pts, fill=fill, outline=outline_col, width=outline_w)
    canvas = canvas.resize((w, h), Image.Resampling.LANCZOS)
    shadow = shadow.resize((w, h), Image.Resampling.BILINEAR).filter(
        ImageFilter.GaussianBlur(rng.uniform(0.01, 0.04) * min(w, h)))
    x = np.asarray(canvas, np.float32)
    # soft shadows under shapes (darken background where the blurred shadow is, but not shapes'
    # own fill too strongly), then soft key light + vignette
    x = x * (1 - 0.35 * np.asarray(shadow, np.float32)[..., None] / 255)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    lx, ly = rng.uniform(0, w), rng.uniform(0, h)
    d = np.hypot(xx - lx, yy - ly) / np.hypot(w, h)
    light = 1 + rng.uniform(0.05, 0.3) * np.exp(-(d / rng.uniform(0.2, 0.5)) ** 2)
    vign = 1 - rng.uniform(0.0, 0.3) * (np.hypot(xx / w - 0.5, yy / h - 0.5) / 0.7071) ** 2
    x = x * (light * vign)[..., None]
    # dither against banding; drawn even at dither 0 so the random stream (and the image) is the same
    x = x + rng.normal(0, 0.6, x.shape).astype(np.float32) * (dither / 0.6)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


#: dither levels ``procedural_art(dither="vary")`` draws from (8-bit levels; 0 = banded gradients)
DITHER_LEVELS = (0.0, 0.3, 0.6, 1.0, 1.6)


def _flat_one(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """One textureless picture: a solid colour, a linear or radial two-colour gradient, or flat
    bands and shapes with hard edges and thin lines; colours of any hue and saturation."""
    import colorsys

    def colour() -> np.ndarray:
        hsv = (rng.uniform(0, 1), rng.uniform(0, 1) ** 0.7, rng.uniform(0.15, 1))
        return np.asarray(colorsys.hsv_to_rgb(*hsv), np.float32) * 255

    kind = rng.choice(["solid", "linear", "radial", "shapes"], p=[0.15, 0.3, 0.15, 0.4])
    if kind == "solid":
        x = np.broadcast_to(colour(), (h, w, 3))
    elif kind in ("linear", "radial"):
        x = _gradient_kind(rng, w, h, np.stack([colour(), colour()]), kind)
    else:
        im = Image.new("RGB", (w, h), tuple(int(v) for v in colour()))
        d = ImageDraw.Draw(im)
        for _ in range(int(rng.integers(1, 7))):
            c = tuple(int(v) for v in colour())
            x0, y0 = rng.uniform(-0.2, 1.0) * w, rng.uniform(-0.2, 1.0) * h
            x1, y1 = x0 + rng.uniform(0.1, 0.8) * w, y0 + rng.uniform(0.1, 0.8) * h
            shape = rng.choice(["rect", "ellipse", "band"])
            if shape == "rect":
                d.rectangle([x0, y0, x1, y1], fill=c)
            elif shape == "ellipse":
                d.ellipse([x0, y0, x1, y1], fill=c)
            else:  # a band across the picture between two slanted lines
                ya, yb = rng.uniform(-0.3, 1.3, 2) * h
                t = rng.uniform(0.05, 0.4) * h
                d.polygon([(0, ya), (w, yb), (w, yb + t), (0, ya + t)], fill=c)
        for _ in range(int(rng.integers(0, 5))):  # thin straight lines, 1-3 px
            c = tuple(int(v) for v in colour())
            d.line([tuple(rng.uniform(0, 1, 2) * (w, h)), tuple(rng.uniform(0, 1, 2) * (w, h))],
                   fill=c, width=int(rng.integers(1, 4)))
        x = np.asarray(im, np.float32)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _gradient_kind(rng, w, h, cols, kind: str) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == "linear":
        a = rng.uniform(0, 2 * np.pi)
        t = (xx / w - 0.5) * np.cos(a) + (yy / h - 0.5) * np.sin(a)
    else:
        cx, cy = rng.uniform(0, 1) * w, rng.uniform(0, 1) * h
        t = np.hypot(xx - cx, yy - cy)
    t = (t - t.min()) / (t.max() - t.min() + 1e-6)
    return cols[0] * (1 - t[..., None]) + cols[1] * t[..., None]


def flat_art(n: int, seed: int = 0, min_side: int = 256, max_side: int = 768) -> list[Source]:
    """``n`` clean pictures with no texture at all (``flat/<seed>-<i>``): solid colours, two-colour
    gradients with no dither (8-bit banding as such files have it), flat shapes and thin lines.

    Placeholders, logos, slides and flat vector art look like this and carry no replication damage
    a no-reference detector could see; without examples a detector trained on photos and dithered
    art reads a saturated flat colour as a tint and a smooth area as lost detail (MODEL_CARD.md,
    "Limits"). Deterministic for ``seed``.
    """
    if n < 0 or min_side < 32 or max_side < min_side:
        raise SourceError(f"flat_art: bad n={n}, min_side={min_side}, max_side={max_side}")
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i, 6007])
        w, h = _draw_size(rng, min_side, max_side)
        out.append((f"flat/{seed}-{i}", _flat_one(rng, max(16, int(w)), max(16, int(h)))))
    return out


def procedural_art(n: int, seed: int = 0, min_side: int = 320, max_side: int = 1024,
                   dither: float | str = 0.6) -> list[Source]:
    """``n`` clean procedural "digital art" images, sizes in [min_side, max_side] with varied aspects.

    Deterministic for ``seed``; the names (``art/<seed>-<i>``) are unique per (seed, i).
    ``dither``: the sigma of the fine noise added against banding (0.6, the default, is what every
    image had before; a number or its text, as given on a command line), or ``"vary"``: one of
    ``DITHER_LEVELS`` per image, drawn from its own random stream, so the pictures are those of the
    default and only their noise level differs. A detector trained on art of one dither level
    learns that level as a sign of a clean image.
    """
    if n < 0 or min_side < 32 or max_side < min_side:
        raise SourceError(f"procedural_art: bad n={n}, min_side={min_side}, max_side={max_side}")
    if dither != "vary":
        try:
            sigma = float(dither)
        except (TypeError, ValueError):
            sigma = float("nan")
        if not 0 <= sigma < float("inf"):
            raise SourceError(f"procedural_art: dither must be a sigma >= 0 or 'vary', got {dither!r}")
        dither = sigma
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i, 7919])
        w, h = _draw_size(rng, min_side, max_side)
        w, h = max(min_side // 2, int(w)) // 2 * 2, max(min_side // 2, int(h)) // 2 * 2
        d = (float(np.random.default_rng([seed, i, 104729]).choice(DITHER_LEVELS)) if dither == "vary"
             else dither)
        out.append((f"art/{seed}-{i}", _art_one(rng, w, h, dither=d)))
    return out


# ---------------------------------------------------------------------------------------------
# folders and shards
# ---------------------------------------------------------------------------------------------

def picture_name(name: str) -> str:
    """A picture's name safe for file and chain names: each ``/``-separated part keeps
    ``A-Z a-z 0-9 . _ -``; a part with other characters (a space, non-ASCII, ``@``, which marks a
    view of a picture) has them replaced by ``_`` and gets a short hash of the part as it was
    (``a b`` is ``a_b-<hash>``), so names that clean alike stay distinct pictures, named the same
    whatever other files are there. Empty, ``.`` and ``..`` parts are dropped. ``train`` matches
    chain sources to clean files through this name."""
    out = []
    for part in name.split("/"):
        if part in ("", ".", ".."):
            continue
        cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", part)
        if cleaned != part:
            cleaned += "-" + hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()[:6]
        out.append(cleaned)
    return "/".join(out) or "image"


def _note(skipped: list[str] | None, where, exc: BaseException) -> None:
    """Note an image skipped as undecodable: ``where: reason`` (the reason's first line)."""
    if skipped is not None:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        reason = reason.removeprefix(f"{where}: ")  # load_image's errors name the file already
        skipped.append(f"{where}: {reason}")


def folder_images(path: str | os.PathLike, recursive: bool = True,
                  skipped: list[str] | None = None) -> Iterator[Source]:
    """Yield ``(relative name, array)`` for every decodable image file under ``path`` (sorted).

    Undecodable files are skipped, each noted as ``path: reason`` in ``skipped`` when given.
    Raises SourceError when the folder does not exist.
    """
    root = Path(path)
    if not root.is_dir():
        raise SourceError(f"not a folder: {root}")
    files = sorted(p for p in (root.rglob("*") if recursive else root.iterdir())
                   if p.is_file() and is_image_name(p.name))
    stems = [p.relative_to(root).with_suffix("").as_posix() for p in files]
    shared = {s for s in stems if stems.count(s) > 1}  # x.bmp beside x.tiff: keep both apart
    for p, stem in zip(files, stems):
        try:
            arr = load_image(p)
        except (OSError, DecodeError) as exc:
            _note(skipped, p, exc)
            continue
        yield picture_name(stem + ("_" + p.suffix.lstrip(".").lower() if stem in shared else "")), arr


def photo_views(paths: Iterable[str | os.PathLike], side: int = 512, seed: int = 0,
                both: bool = False, skipped: list[str] | None = None) -> Iterator[Source]:
    """One view per image file in ``paths`` (files, in the order given): even positions give a
    native-resolution ``side`` x ``side`` window at a seeded random place, odd ones the whole
    picture downscaled (Lanczos) to a long side of ``1.5 * side`` (never upscaled). With ``both``
    every file gives both views. Names are ``<file stem>@native`` / ``<file stem>@web`` (splits by
    source keep the views of one picture together). Undecodable files are skipped (and noted in
    ``skipped`` when given)."""
    if side < 32:
        raise SourceError(f"photo_views: side must be >= 32, got {side}")
    rng = np.random.default_rng(seed)
    for i, p in enumerate(Path(x) for x in paths):
        try:
            img = load_image(p)
        except (OSError, DecodeError) as exc:
            _note(skipped, p, exc)
            continue
        if both or i % 2 == 0:
            yield f"{picture_name(p.stem)}@native", np.ascontiguousarray(random_window(img, side, rng))
        if both or i % 2 == 1:
            scale = min(1.0, 1.5 * side / max(img.shape[:2]))
            yield f"{picture_name(p.stem)}@web", img if scale == 1.0 else resize_by(img, scale)


def photo_windows(paths: Iterable[str | os.PathLike], side: int = 512, count: int = 2,
                  seed: int = 0, min_side: int | None = None) -> Iterator[Source]:
    """``count`` more native-resolution ``side`` x ``side`` windows per image file, named
    ``<file stem>@native2``, ``@native3``, ... (so a split by source keeps them with the picture's
    other views). A large photo holds far more distinct content than one window; these windows
    give chains from more of it without new files. Each file's windows come from a generator
    seeded by ``(seed, file name)``, so they do not depend on the order or number of files, nor
    on ``photo_views``. Files whose shorter side is under ``min_side`` (default ``2 * side``: too
    small for windows that differ) and undecodable files are skipped."""
    if side < 32:
        raise SourceError(f"photo_windows: side must be >= 32, got {side}")
    if count < 0:
        raise SourceError(f"photo_windows: count must be >= 0, got {count}")
    floor = 2 * side if min_side is None else min_side
    if count == 0:
        return
    for p in (Path(x) for x in paths):
        try:
            with Image.open(p, formats=ALLOWED_FORMATS) as im:  # the header is enough to skip a small file undecoded
                if min(im.size) < floor:
                    continue
            img = load_image(p)
        except (OSError, DecodeError):
            continue
        name_key = int.from_bytes(hashlib.sha256(p.name.encode()).digest()[:8], "little")
        rng = np.random.default_rng([seed, name_key])
        for j in range(count):
            yield f"{picture_name(p.stem)}@native{j + 2}", np.ascontiguousarray(random_window(img, side, rng))


def shard_images(paths: str | Iterable[str], skipped: list[str] | None = None) -> Iterator[Source]:
    """Yield ``(shard/key, array)`` for the first image of every sample in WebDataset tar shards.

    ``paths`` is a glob pattern or a list of paths. A sample is a run of consecutive members
    sharing a key (``io.tar``'s rule); a key that comes back after other samples (``k, j, k``)
    names another sample, yielded as ``shard/k@repeatN`` (N: the earlier samples with that key).
    Names are distinct over the whole call: a name already given (a real key ``k@repeat1``, keys
    that clean to one name, two shards of one file name) takes the next free ``@repeatN``.
    Members are read as raw bytes and decoded with PIL; undecodable images are skipped (and noted
    in ``skipped`` when given).
    """
    files = sorted(glob.glob(paths)) if isinstance(paths, str) else list(paths)
    if not files:
        raise SourceError(f"no shards match {paths!r}")
    not_shards = [str(f) for f in files if not is_shard_name(str(f))]
    if not_shards:  # a glob of image files is a folder's work
        raise SourceError(f"not tar shards: {', '.join(map(repr, not_shards[:3]))}"
                          f"{' and more' if len(not_shards) > 3 else ''} (give image files as a folder)")
    given: set[str] = set()
    for f in files:
        try:
            yield from _shard_sources(f, given, skipped)
        except (tarfile.TarError, EOFError) as exc:  # a damaged shard is named, not a traceback
            raise SourceError(f"cannot read shard {f!r}: {exc}") from None


def _shard_sources(f, given: set[str], skipped: list[str] | None) -> Iterator[Source]:
    """``shard_images`` for one shard."""
    samples: dict[str, int] = {}  # key -> samples with that key so far
    current, taken = None, False  # key of the sample being read; its image already used?
    # only regular files (a FIFO would wait for a writer forever); no header bombs
    with open_regular_file(f) as raw, tarfile.open(fileobj=raw, mode="r:*", tarinfo=CappedTarInfo) as tar:
        for m in tar:
            if m.isdir():  # as io.tar: a folder is no member; a link still ends a sample
                continue
            key = split_key(m.name)[0]
            if key != current:  # a new sample
                current, taken = key, False
                samples[key] = samples.get(key, 0) + 1
            if taken or not m.isfile() or not is_image_name(m.name):
                continue
            taken = True
            data = tar.extractfile(m).read()
            try:
                arr = decode_image(data)
            except DecodeError as exc:
                _note(skipped, f"{f}:{m.name}", exc)
                continue
            base = picture_name(f"{Path(f).stem}/{key}")
            repeat = samples[key] - 1
            yield _distinct(base + (f"@repeat{repeat}" if repeat else ""), given), arr


def resolve_sources(spec: str, seed: int = 0, skipped: list[str] | None = None) -> Iterator[Source]:
    """Turn a command-line spec into a source.

    ``bundled`` | ``art:N`` (or ``art:N:MIN-MAX`` sides, then optionally ``:dither=SIGMA`` or
    ``:dither=vary``; see ``procedural_art``) | ``pixel:N`` | ``screen:N`` (``drawn_kinds``) |
    ``folder:PATH`` | ``views:PATH`` (or
    ``views:PATH:SIDE``; ``photo_views`` of the image files under a folder) | ``shards:GLOB`` |
    a folder path | a ``.tar`` path or glob. Several specs can be joined with ``,``; a name one of
    them gave already takes the first free ``@repeatN``. Image files that cannot be decoded are
    skipped, each noted as ``where: reason`` in ``skipped`` when given.
    """
    given: set[str] = set()
    for name, arr in _resolve_parts(spec, seed, skipped):
        yield _distinct(name, given), arr


def _distinct(name: str, given: set[str]) -> str:
    """``name``, or where it was given already ``name@repeatN`` with the first free N."""
    out, n = name, 0
    while out in given:
        n += 1
        out = f"{name}@repeat{n}"
    given.add(out)
    return out


def _split_spec(spec: str) -> list[str]:
    """The parts of a spec joined with ``,``; a folder whose name holds a comma (``folder:a,b``,
    ``views:a,b:512`` or a bare path) stays one part when the longer name is an existing folder."""
    pieces, parts, i = spec.split(","), [], 0
    while i < len(pieces):
        take = 1
        for j in range(len(pieces), i + 1, -1):
            whole = ",".join(pieces[i:j]).strip()
            kind, _, arg = whole.partition(":")
            if kind == "views":
                arg = re.sub(r":\d+$", "", arg)
            if (kind in ("folder", "views") and os.path.isdir(arg)) or os.path.isdir(whole):
                take = j - i
                break
        part = ",".join(pieces[i:i + take]).strip()
        if part:
            parts.append(part)
        i += take
    return parts


def _resolve_parts(spec: str, seed: int, skipped: list[str] | None) -> Iterator[Source]:
    for part in _split_spec(spec):
        kind, _, arg = part.partition(":")
        if part == "bundled":
            yield from bundled_photos()
        elif kind == "art":
            m = re.fullmatch(r"(\d+)(?::(\d+)-(\d+))?(?::dither=(vary|\d+(?:\.\d*)?))?", arg)
            if not m:
                raise SourceError(f"bad art spec {part!r}; use art:N[:MIN-MAX][:dither=SIGMA|vary]")
            lo, hi = (int(m.group(2)), int(m.group(3))) if m.group(2) else (320, 1024)
            if int(m.group(1)) < 1:
                raise SourceError(f"{part!r} makes no pictures: N must be 1 or more")
            if not 32 <= lo <= hi:
                raise SourceError(f"{part!r}: the sides MIN-MAX need 32 <= MIN <= MAX")
            yield from procedural_art(int(m.group(1)), seed=seed, min_side=lo, max_side=hi,
                                      dither=m.group(4) or 0.6)
        elif kind in ("pixel", "screen"):
            from collapseguard.training_data_tools import drawn_kinds

            if not arg.isdigit():
                raise SourceError(f"bad {kind} spec {part!r}; use {kind}:N")
            if int(arg) < 1:
                raise SourceError(f"{part!r} makes no pictures: N must be 1 or more")
            draw = drawn_kinds.pixel_art if kind == "pixel" else drawn_kinds.screens
            yield from draw(int(arg), seed=seed)
        elif kind == "folder":
            yield from folder_images(arg, skipped=skipped)
        elif kind == "views":
            folder, _, side = arg.rpartition(":") if re.search(r":\d+$", arg) else (arg, "", "")
            root = Path(folder)
            if not root.is_dir():
                raise SourceError(f"not a folder: {root}")
            files = sorted(p for p in root.rglob("*") if p.is_file() and is_image_name(p.name))
            yield from photo_views(files, int(side or 512), seed=seed, skipped=skipped)
        elif kind == "shards":
            yield from shard_images(arg, skipped=skipped)
        elif os.path.isdir(part):
            yield from folder_images(part, skipped=skipped)
        elif part.endswith(".tar") or glob.glob(part):
            yield from shard_images(part, skipped=skipped)
        else:
            raise SourceError(f"unknown source {part!r}: use bundled, art:N, pixel:N, screen:N, "
                              "folder:PATH, views:PATH, "
                              "shards:GLOB, a folder or a .tar shard")
