"""How often dedup's colour-variant rule (``dedup.colour.colour_variants``) tells copies of one
picture from colour variants of one layout.

    python recipes/colour_variants.py [--eval EVAL/stored/manifest.csv] [--steps 5,10]

Pairs, each read through ``pair_features.colour_layout`` as dedup reads a described image:

- damage that must stay a copy: every chain of the evaluation set (``recipes/eval_set.sh``; all
  its families and storages), its step 0 against each of ``--steps``;
- harmless or damaged copies of the bundled photos (scikit-image's and scikit-learn's samples):
  cropped 5% and 10% a side, a 3 px Gaussian blur, saturation x0.5 and x1.5, JPEG q10, a green
  tint of 34 and of 67 levels (opponent chroma);
- colour variants that must part: product shots (one shirt in six colours, every pair; a shaded
  garment in a catalogue's ten colours, every pair, naming the colour pairs not told apart), and
  the photos with their hue turned by 90 and 180 degrees or their red and blue swapped.

Prints, per kind of pair, how many pairs there are and the share the rule parts: by their colours
(``colour_variants``) where both copies hold a colour, by their tones (``tones_apart``) where one
has none; two copies without colour are never parted.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
from collections import defaultdict

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from collapseguard.dedup.colour import colour_variants, has_colour, tones_apart
from collapseguard.detectors.pair_features import colour_layout

SHIRT = [(120, 80), (170, 60), (230, 60), (280, 80), (340, 140), (300, 170), (280, 150), (280, 340),
         (120, 340), (120, 150), (100, 170), (60, 140)]
COLOURS = [(200, 30, 30), (30, 60, 200), (30, 160, 60), (240, 200, 40), (120, 40, 160), (20, 20, 20)]


def shirt(colour) -> Image.Image:
    im = Image.new("RGB", (400, 400), "white")
    ImageDraw.Draw(im).polygon(SHIRT, fill=colour, outline=(20, 20, 20))
    return im


CATALOG = {"red": (200, 30, 30), "blue": (30, 50, 200), "green": (30, 160, 50), "yellow": (230, 200, 30),
           "purple": (130, 40, 160), "navy": (20, 25, 80), "pink": (240, 150, 170), "grey": (128, 128, 128),
           "black": (20, 20, 20), "orange": (240, 120, 20)}


def catalog_shot(colour) -> Image.Image:
    """A shaded garment on white in one colour, as a product catalogue shows each colour."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:320, :320]
    mask = (((xx - 160) / 100) ** 2 + ((yy - 170) / 120) ** 2 < 1) | ((abs(xx - 160) < 150) & (abs(yy - 90) < 30))
    shade = 0.75 + 0.25 * np.sin(xx / 9.0) * np.cos(yy / 13.0) + 0.05 * rng.normal(size=(320, 320))
    a = np.full((320, 320, 3), 245.0)
    for k in range(3):
        a[..., k] = np.where(mask, np.clip(colour[k] * shade, 0, 255), 245)
    return Image.fromarray(a.astype(np.uint8))


def photos() -> list[Image.Image]:
    from skimage import data
    from sklearn.datasets import load_sample_images
    names = ["astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field",
             "retina", "colorwheel"]
    return ([Image.fromarray(getattr(data, n)()).convert("RGB") for n in names]
            + [Image.fromarray(a) for a in load_sample_images().images])


def hue(im: Image.Image, degrees: float) -> Image.Image:
    h, s, v = im.convert("HSV").split()
    h = h.point(lambda x: (x + int(degrees / 360 * 255)) % 256)
    return Image.merge("HSV", (h, s, v)).convert("RGB")


def jpeg(im: Image.Image, quality: int) -> Image.Image:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def shifted(im: Image.Image, rgb) -> Image.Image:
    return Image.fromarray(np.clip(np.asarray(im, np.float32) + np.array(rgb, np.float32), 0, 255).astype(np.uint8))


def saturation(im: Image.Image, factor: float) -> Image.Image:
    a = np.asarray(im, np.float32)
    g = a.mean(-1, keepdims=True)
    return Image.fromarray(np.clip(g + factor * (a - g), 0, 255).astype(np.uint8))


def crop(im: Image.Image, share: float) -> Image.Image:
    w, h = im.size
    dx, dy = round(w * share), round(h * share)
    return im.crop((dx, dy, w - dx, h - dy))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", default=None, help="an evaluation set's stored/manifest.csv")
    ap.add_argument("--steps", default="5,10")
    args = ap.parse_args()
    calls: dict[str, list[bool]] = defaultdict(list)

    def pair(kind: str, a: Image.Image, b: Image.Image) -> None:
        la, lb = colour_layout(np.asarray(a.convert("RGB"))), colour_layout(np.asarray(b.convert("RGB")))
        # as ``split_colour_variants`` reads them: two colour copies by their colours, a copy
        # without colour against a colour copy by their tones, two without colour never apart
        ca, cb = has_colour(la), has_colour(lb)
        apart = colour_variants(la, lb) if ca and cb else tones_apart(la, lb) if ca or cb else False
        calls[kind].append(apart)

    names = list(CATALOG)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            a, b = names[i], names[j]
            grey = {"grey", "black"} & {a, b}
            kind = "catalogue pair with grey or black" if grey else "catalogue pair of two colours"
            pair(f"variant: {kind}", catalog_shot(CATALOG[a]), catalog_shot(CATALOG[b]))
            if not grey and not calls[f"variant: {kind}"][-1]:
                calls["  (catalogue colour pairs not told apart: " + f"{a}/{b})"].append(False)
    for i in range(len(COLOURS)):
        for j in range(i + 1, len(COLOURS)):
            pair("variant: shirt in another colour", shirt(COLOURS[i]), shirt(COLOURS[j]))
    for p in photos():
        pair("variant: hue turned 90", p, hue(p, 90))
        pair("variant: hue turned 180", p, hue(p, 180))
        pair("variant: red and blue swapped", p, Image.merge("RGB", p.split()[::-1]))
        pair("copy: cropped 5% a side", p, crop(p, 0.05))
        pair("copy: cropped 10% a side", p, crop(p, 0.10))
        pair("copy: blur 3 px", p, p.filter(ImageFilter.GaussianBlur(3)))
        pair("copy: saturation x0.5", p, saturation(p, 0.5))
        pair("copy: saturation x1.5", p, saturation(p, 1.5))
        pair("copy: JPEG q10", p, jpeg(p, 10))
        pair("copy: greyscale (lost colour, decided by that rule)", p, p.convert("L").convert("RGB"))
        pair("copy: greyscale, 20 levels darker", p, shifted(p.convert("L").convert("RGB"), (-20, -20, -20)))
        pair("copy: green tint 34 levels", p, shifted(p, (-10, 20, -10)))
        pair("copy: green tint 67 levels", p, shifted(p, (-20, 40, -20)))
    if args.eval:
        root = os.path.dirname(os.path.abspath(args.eval))
        steps = [int(s) for s in args.steps.split(",")]
        chains: dict[str, dict[int, dict]] = defaultdict(dict)
        with open(args.eval, newline="") as fh:
            for row in csv.DictReader(fh):
                chains[row["chain_id"]][int(row["step"])] = row
        for rows in chains.values():
            if 0 not in rows:
                continue
            first = Image.open(os.path.join(root, rows[0]["path"]))
            for s in steps:
                if s in rows:
                    pair(f"chain step 0 vs {s}: {rows[0]['family']}", first,
                         Image.open(os.path.join(root, rows[s]["path"])))
    width = max(len(k) for k in calls)
    for kind in sorted(calls):
        v = np.array(calls[kind])
        print(f"{kind:<{width}}  pairs {len(v):5d}  colour variants {v.mean():.3f}")


if __name__ == "__main__":
    main()
