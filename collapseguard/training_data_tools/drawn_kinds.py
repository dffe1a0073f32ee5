"""Clean pictures of kinds that photos and painted art do not cover, drawn from a seed.

Users' data sets hold pixel art (game sprites and tiles, scaled up by whole factors with
nearest-neighbour sampling), and screens (software screenshots, UI mock-ups, diagrams and text on
flat backgrounds). Both are full of hard edges, flat areas and small repeated patterns that a
detector trained on photos and smooth art can read as damage, so they serve as clean negatives
(and as chain sources, so that damage *on* them is seen too). Nothing here is downloaded.

- ``pixel_art(n, seed)``: a small palette picture (tiles, sprites on a backdrop, or a painted
  picture quantised to 4-32 colours, some with ordered or error-diffusion dithering), scaled up by
  2-8 with nearest-neighbour sampling, sometimes with a 1-px grid or outline.
- ``screens(n, seed)``: a window with a title bar, side bar, buttons, text lines in the default
  font (anti-aliased, several sizes), tables, simple charts and box-and-arrow diagrams, in light or
  dark themes.

Each image is named ``pixel/<seed>-<i>`` or ``screen/<seed>-<i>`` and is deterministic for its
seed and index.
"""

from __future__ import annotations

import colorsys

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from collapseguard.training_data_tools.sources import Source, SourceError, procedural_art

_WORDS = ("file edit view help open save settings export image layer filter run cancel apply "
          "name size date type status ok error total value mean index score kept rejected shard "
          "the of and to in is for on with data model train test step chain clean").split()


def _colour(rng: np.random.Generator, sat: tuple[float, float] = (0.2, 1.0),
            val: tuple[float, float] = (0.15, 1.0)) -> tuple[int, int, int]:
    rgb = colorsys.hsv_to_rgb(rng.uniform(0, 1), rng.uniform(*sat), rng.uniform(*val))
    return tuple(int(round(v * 255)) for v in rgb)


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ValueError):  # a Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


# ---------------------------------------------------------------------------------------------
# pixel art
# ---------------------------------------------------------------------------------------------

def _tiles(rng: np.random.Generator, w: int, h: int, pal: list) -> Image.Image:
    """A tile map: t x t tiles, each a flat colour with a few pixels of pattern (bricks, grass)."""
    t = int(rng.choice([4, 8, 8, 16]))
    im = Image.new("RGB", (w, h), pal[0])
    d = ImageDraw.Draw(im)
    kinds = [pal[int(rng.integers(len(pal)))] for _ in range(4)]
    for y in range(0, h, t):
        for x in range(0, w, t):
            base = kinds[int(rng.integers(len(kinds)))]
            d.rectangle([x, y, x + t - 1, y + t - 1], fill=base)
            for _ in range(int(rng.integers(0, t))):
                px, py = x + int(rng.integers(t)), y + int(rng.integers(t))
                d.point((px, py), fill=pal[int(rng.integers(len(pal)))])
            if rng.random() < 0.3:
                d.line([x, y + t - 1, x + t - 1, y + t - 1], fill=pal[-1])
    return im


def _sprites(rng: np.random.Generator, w: int, h: int, pal: list) -> Image.Image:
    """Symmetric sprites with a dark outline on a flat or banded backdrop."""
    im = Image.new("RGB", (w, h), pal[0])
    d = ImageDraw.Draw(im)
    if rng.random() < 0.5:
        for y in range(0, h, int(rng.integers(2, 6))):
            d.line([0, y, w, y], fill=pal[int(rng.integers(0, 2))])
    for _ in range(int(rng.integers(2, 9))):
        s = int(rng.integers(5, 13))
        half = rng.random((s, (s + 1) // 2)) < 0.5
        mask = np.concatenate([half, half[:, ::-1][:, s % 2:]], axis=1)
        x0, y0 = int(rng.integers(0, max(1, w - s))), int(rng.integers(0, max(1, h - s)))
        fill, edge = pal[int(rng.integers(1, len(pal)))], pal[-1]
        for (yy, xx) in zip(*np.nonzero(mask)):
            d.point((x0 + int(xx), y0 + int(yy)), fill=fill)
        for (yy, xx) in zip(*np.nonzero(mask)):
            for dy, dx in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                ny, nx = yy + dy, xx + dx
                if not (0 <= ny < s and 0 <= nx < s and mask[ny, nx]):
                    d.point((x0 + int(nx), y0 + int(ny)), fill=edge)
    return im


def _quantised(rng: np.random.Generator, w: int, h: int, seed: int, i: int) -> Image.Image:
    """A painted picture reduced to w x h and 4-32 colours, dithered or not."""
    art = procedural_art(1, seed=seed * 1000 + i, min_side=max(w, h) * 2, max_side=max(w, h) * 3)[0][1]
    im = Image.fromarray(art).resize((w, h), Image.Resampling.BOX)
    dither = Image.Dither.FLOYDSTEINBERG if rng.random() < 0.35 else Image.Dither.NONE
    return im.quantize(colors=int(rng.choice([4, 8, 16, 32])), dither=dither).convert("RGB")


def _pixel_one(rng: np.random.Generator, seed: int, i: int) -> np.ndarray:
    scale = int(rng.choice([2, 3, 4, 4, 6, 8]))
    w, h = int(rng.integers(32, 129)), int(rng.integers(32, 129))
    pal = [_colour(rng) for _ in range(int(rng.integers(3, 12)))]
    pal.append(_colour(rng, val=(0.0, 0.25)))  # a dark outline colour
    kind = rng.choice(["tiles", "sprites", "quantised"])
    small = (_tiles(rng, w, h, pal) if kind == "tiles" else _sprites(rng, w, h, pal)
             if kind == "sprites" else _quantised(rng, w, h, seed, i))
    big = small.resize((w * scale, h * scale), Image.Resampling.NEAREST)
    if rng.random() < 0.15 and scale >= 4:  # a 1-px grid between the pixels, as editors show
        a = np.asarray(big).copy()
        a[::scale] = (a[::scale] * 0.8).astype(np.uint8)
        a[:, ::scale] = (a[:, ::scale] * 0.8).astype(np.uint8)
        return a
    return np.asarray(big)


def pixel_art(n: int, seed: int = 0) -> list[Source]:
    """``n`` clean pixel-art pictures (``pixel/<seed>-<i>``); see the module's docstring."""
    if n < 0:
        raise SourceError(f"pixel_art: bad n={n}")
    return [(f"pixel/{seed}-{i}", _pixel_one(np.random.default_rng([seed, i, 4243]), seed, i))
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# screens: screenshots, UI, diagrams and text
# ---------------------------------------------------------------------------------------------

def _text(rng: np.random.Generator, k: int) -> str:
    words = [str(rng.choice(_WORDS)) for _ in range(k)]
    if rng.random() < 0.3:
        words.append(f"{rng.uniform(0, 1000):.{int(rng.integers(0, 4))}f}")
    return " ".join(words).capitalize()


def _panel(rng, d: ImageDraw.ImageDraw, box, fg, bg, accent) -> None:
    """Text lines, a table, a chart or buttons inside box."""
    x0, y0, x1, y1 = box
    size = int(rng.choice([10, 11, 12, 13, 14, 16, 18]))
    font = _font(size)
    kind = rng.choice(["text", "table", "chart", "buttons"])
    if kind == "table":
        cols, row_h = int(rng.integers(2, 6)), size + 8
        cw = max(1, (x1 - x0) // cols)
        for r, y in enumerate(range(y0, y1 - row_h, row_h)):
            if r % 2 and rng.random() < 0.7:
                d.rectangle([x0, y, x1, y + row_h], fill=tuple(int(0.94 * c + 0.06 * a) for c, a in zip(bg, fg)))
            for c in range(cols):
                d.text((x0 + c * cw + 4, y + 4), _text(rng, 1), fill=fg, font=font)
            d.line([x0, y + row_h, x1, y + row_h], fill=tuple((c + a) // 2 for c, a in zip(bg, fg)))
    elif kind == "chart":
        d.line([x0 + 20, y0 + 5, x0 + 20, y1 - 20, x1 - 5, y1 - 20], fill=fg, width=1)
        n = int(rng.integers(4, 20))
        vals = rng.uniform(0.1, 1.0, n)
        bw = max(4, (x1 - x0 - 30) // n)
        for k, v in enumerate(vals):
            top = min(y1 - 21, int(y1 - 20 - v * (y1 - y0 - 30)))
            if rng.random() < 0.5:
                d.rectangle([x0 + 25 + k * bw, top, x0 + 25 + (k + 1) * bw - 3, y1 - 21], fill=accent)
            else:
                d.ellipse([x0 + 25 + k * bw - 2, top - 2, x0 + 25 + k * bw + 2, top + 2], fill=accent)
    elif kind == "buttons":
        x, y = x0 + 6, y0 + 6
        while y < y1 - size - 14:
            label = _text(rng, int(rng.integers(1, 3)))
            tw = int(d.textlength(label, font=font)) + 20
            if x + tw > x1:
                x, y = x0 + 6, y + size + 18
                continue
            d.rounded_rectangle([x, y, x + tw, y + size + 10], radius=int(rng.integers(0, 8)),
                                fill=accent if rng.random() < 0.3 else bg, outline=fg)
            d.text((x + 10, y + 5), label, fill=fg, font=font)
            x += tw + 8
    else:
        for y in range(y0 + 4, y1 - size, size + int(rng.integers(3, 9))):
            d.text((x0 + 6, y), _text(rng, int(rng.integers(2, 12))), fill=fg, font=font)


def _diagram(rng, d: ImageDraw.ImageDraw, w: int, h: int, fg, accent) -> None:
    font = _font(int(rng.choice([11, 12, 14, 16])))
    boxes = []
    for _ in range(int(rng.integers(3, 9))):
        bw, bh = int(rng.integers(60, 160)), int(rng.integers(28, 60))
        x, y = int(rng.integers(10, max(11, w - bw - 10))), int(rng.integers(10, max(11, h - bh - 10)))
        d.rounded_rectangle([x, y, x + bw, y + bh], radius=int(rng.integers(0, 12)),
                            outline=fg, width=int(rng.integers(1, 3)),
                            fill=accent if rng.random() < 0.3 else None)
        d.text((x + 8, y + bh // 2 - 7), _text(rng, 1), fill=fg, font=font)
        boxes.append((x + bw // 2, y + bh // 2))
    for a, b in zip(boxes, boxes[1:]):
        d.line([a, b], fill=fg, width=1)


def _screen_one(rng: np.random.Generator) -> np.ndarray:
    w, h = int(rng.integers(320, 1025)), int(rng.integers(240, 769))
    dark = rng.random() < 0.3
    bg = _colour(rng, sat=(0, 0.15), val=(0.1, 0.22) if dark else (0.9, 1.0))
    fg = _colour(rng, sat=(0, 0.2), val=(0.85, 1.0) if dark else (0.0, 0.25))
    accent = _colour(rng, sat=(0.4, 0.9), val=(0.5, 0.95))
    im = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(im)
    if rng.random() < 0.25:  # a diagram or a page of text, no window chrome
        _diagram(rng, d, w, h, fg, accent) if rng.random() < 0.6 else _panel(rng, d, (0, 0, w, h), fg, bg, accent)
        return np.asarray(im)
    bar = int(rng.integers(20, 36))
    d.rectangle([0, 0, w, bar], fill=accent if rng.random() < 0.4 else tuple(max(0, c - 25) for c in bg))
    d.text((10, bar // 2 - 6), _text(rng, 3), fill=fg, font=_font(12))
    for k in range(3):
        cx = w - 15 - 22 * k
        d.ellipse([cx - 6, bar // 2 - 6, cx + 6, bar // 2 + 6], fill=_colour(rng, sat=(0.3, 0.8)))
    side = int(rng.integers(0, 2)) * int(rng.integers(120, 240))
    if side:
        d.rectangle([0, bar, side, h], fill=tuple(max(0, min(255, c + (12 if dark else -12))) for c in bg))
        _panel(rng, d, (0, bar + 4, side, h), fg, bg, accent)
    cols = int(rng.integers(1, 3))
    cw = (w - side) // cols
    for c in range(cols):
        _panel(rng, d, (side + c * cw + 8, bar + 8, side + (c + 1) * cw - 8, h - 8), fg, bg, accent)
    return np.asarray(im)


def screens(n: int, seed: int = 0) -> list[Source]:
    """``n`` clean screen pictures (``screen/<seed>-<i>``); see the module's docstring."""
    if n < 0:
        raise SourceError(f"screens: bad n={n}")
    return [(f"screen/{seed}-{i}", _screen_one(np.random.default_rng([seed, i, 7741]))) for i in range(n)]


def write_folder(out: str, n: int, seed: int, jpeg: bool = False) -> list[str]:
    """Write ``n`` pixel-art and ``n`` screen pictures into ``out`` as ``<kind>-<seed>-<i>.png``;
    with ``jpeg``, also a JPEG 4:2:0 copy of each at a quality drawn in 60-95 (seeded).
    Returns the file names written."""
    from pathlib import Path

    from PIL import Image

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = []
    for name, img in pixel_art(n, seed=seed) + screens(n, seed=seed):
        stem = name.replace("/", "-")
        Image.fromarray(img).save(folder / f"{stem}.png")
        names.append(f"{stem}.png")
        if jpeg:
            Image.fromarray(img).save(folder / f"{stem}.jpg", quality=int(rng.integers(60, 96)), subsampling=2)
            names.append(f"{stem}.jpg")
    return names


def main(argv=None) -> None:
    """``python -m collapseguard.training_data_tools.drawn_kinds OUT N --seed S [--jpeg]``: the
    folder of drawn clean pictures the training and calibration recipes use."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.split(":", 1)[0])
    ap.add_argument("out")
    ap.add_argument("n", type=int, help="pictures of each kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jpeg", action="store_true", help="also a JPEG 4:2:0 copy of each (q60-95)")
    a = ap.parse_args(argv)
    names = write_folder(a.out, a.n, a.seed, a.jpeg)
    print(f"drawn kinds: {len(names)} files in {a.out}")


if __name__ == "__main__":
    main()
