"""Flat-colour probe: how do weights score clean images with no texture at all?

    python benchmarks/flat_probe.py [WEIGHTS ...] [--threshold T ...]

Solid colours, placeholders, logos and flat vector art are common in scraped image data and carry
no replication damage a detector could see (a tint cannot be told from a chosen colour without the
original). This probe draws 36 such images, deterministically and without any random source shared
with training: 12 named solid colours, 12 two-colour linear gradients between them, and 12
"icons" (a flat background with a few flat shapes, hard edges, no anti-aliasing), all 512 x 512
PNG-exact arrays. It prints each image's score per weights file (the shipped weights when none is
given) and how many lie above each weights' threshold (``--threshold``, one per weights file, in
order; the shipped calibration's when omitted).
"""

from __future__ import annotations

import argparse

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {
    "white": (255, 255, 255), "black": (0, 0, 0), "grey": (128, 128, 128), "red": (220, 30, 30),
    "orange": (255, 160, 20), "yellow": (250, 230, 40), "green": (40, 160, 60), "teal": (20, 150, 150),
    "blue": (30, 70, 200), "navy": (20, 30, 80), "purple": (120, 50, 160), "pink": (240, 170, 190),
}


def probe_images() -> list[tuple[str, np.ndarray]]:
    names = list(COLOURS)
    out = [(f"solid-{n}", np.full((512, 512, 3), COLOURS[n], np.uint8)) for n in names]
    t = np.linspace(0.0, 1.0, 512, dtype=np.float64)
    for i, n in enumerate(names):
        m = names[(i + 5) % len(names)]
        a, b = np.array(COLOURS[n], float), np.array(COLOURS[m], float)
        row = a[None, :] * (1 - t[:, None]) + b[None, :] * t[:, None]
        img = np.rint(np.repeat(row[None], 512, axis=0)).astype(np.uint8)
        out.append((f"gradient-{n}-{m}", img if i % 2 == 0 else np.ascontiguousarray(img.transpose(1, 0, 2))))
    for i, n in enumerate(names):
        im = Image.new("RGB", (512, 512), COLOURS[n])
        d = ImageDraw.Draw(im)
        c1, c2 = COLOURS[names[(i + 3) % 12]], COLOURS[names[(i + 7) % 12]]
        d.ellipse([96 + 8 * i, 96, 320 + 8 * i, 320], fill=c1)
        d.rectangle([260, 240 - 6 * i, 440, 420], fill=c2)
        d.polygon([(60, 460), (200, 330 + 5 * i), (300, 470)], fill=c1)
        d.line([(0, 500 - 10 * i), (511, 380)], fill=c2, width=2 + i % 3)
        out.append((f"icon-{n}", np.asarray(im)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weights", nargs="*", help="weights files (default: the shipped cnn)")
    ap.add_argument("--threshold", type=float, nargs="*", default=None)
    args = ap.parse_args()
    from collapseguard.calibration.files import resolve_threshold
    from collapseguard.detectors import create

    specs = [f"cnn:{w}" for w in args.weights] or ["cnn"]
    if args.threshold is not None and len(args.threshold) != len(specs):
        ap.error("give one --threshold per weights file")
    images = probe_images()
    table = {}
    for j, spec in enumerate(specs):
        det = create(spec)
        thr = args.threshold[j] if args.threshold is not None else resolve_threshold(det)[0]
        scores = det.score([im for _, im in images])
        table[spec] = (det.version, thr, scores)
    print("image".ljust(28) + "".join(v[0].rjust(14) for v in table.values()))
    for i, (name, _) in enumerate(images):
        print(name.ljust(28) + "".join(f"{v[2][i]:14.2f}" for v in table.values()))
    for spec, (version, thr, scores) in table.items():
        kinds = {k: int(np.sum([s > thr for (n, _), s in zip(images, scores) if n.startswith(k)]))
                 for k in ("solid", "gradient", "icon")}
        print(f"{version} above {thr:.6g}: {int(np.sum(scores > thr))} of {len(images)} "
              f"(solid {kinds['solid']}, gradient {kinds['gradient']}, icon {kinds['icon']} of 12 each)")


if __name__ == "__main__":
    main()
