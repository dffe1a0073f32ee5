"""Real clean pictures of the kinds users hold, for the default calibration's clean set (run by
recipes/make_default_calibration.sh; ``python recipes/calibration_kinds.py OUT``).

From Debian packages that no training, evaluation or fresh-set recipe reads, ``RULES`` pick
native-resolution ``SIDE`` x ``SIDE`` windows (``recipes/package_images.py`` says how) of photos,
illustrations, screenshots, game textures and pixel art. Each picture is written twice, as
``OUT/<kind>/<name>__png.png`` and as ``OUT/<kind>/<name>__qNN.jpg`` (JPEG 4:2:0 at a quality
drawn in 60-95, seeded), the ways datasets store images; the ``__`` suffix keeps both copies one
source in the calibration's split. ``OUT/sources.csv`` lists name, kind, package and file;
``OUT/packages.tsv`` each package's version and licences. ``OUT/.done`` marks a finished set.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))  # package_images, beside this file
import package_images  # noqa: E402

SIDE = 384
#: smaller than the evaluation set's 128: Scratch's costumes are small sprites
MIN_SIDE = 96
SEED = 20261203
PACKAGES = ("scratch", "gnumeric-doc", "crawl-tiles-data", "freedink-data")

#: ``package_images.Rule``: (kind, package, pattern, at most how many, window)
RULES = (
    ("photo", "scratch", "*/Media/Backgrounds/*/*", 60, "centre"),
    ("illustration", "scratch", "*/Media/Costumes/People/*|*/Media/Costumes/Animals/*"
                                "|*/Media/Costumes/Fantasy/*", 40, "top"),
    ("illustration", "crawl-tiles-data", "*/dat/tiles/title_*.png", 30, "centre"),
    ("screenshot", "scratch", "*/Help/en/*", 40, "centre"),
    ("screenshot", "gnumeric-doc", "*/help/C/gnumeric/figures/*.png", 50, "centre"),
    ("game_texture", "freedink-data", "*/dink/Tiles/*", 40, "centre"),
    ("pixel_art", "crawl-tiles-data", "*/dat/tiles/[!t]*.png", 12, "centre"),
)


def write_stored(src: Path, sources: list[tuple[str, str]], out: Path, seed: int) -> int:
    """Each source as ``OUT/<kind>/<name>__png.png`` and ``__qNN.jpg`` (4:2:0); returns images."""
    rng = np.random.default_rng(seed)
    n = 0
    for name, kind in sources:
        img = Image.open(src / f"{name}.png").convert("RGB")
        folder = out / kind
        folder.mkdir(parents=True, exist_ok=True)
        img.save(folder / f"{name}__png.png", compress_level=3)
        q = int(rng.integers(60, 96))
        img.save(folder / f"{name}__q{q}.jpg", quality=q, subsampling=2)
        n += 2
    return n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    out = a.out.resolve()
    if (out / ".done").exists():
        package_images.log(f"{out} is done (delete it to redo)")
        return
    debs = out.parent / f"{out.name}_debs"
    package_images.fetch_packages(debs, PACKAGES)
    for stale in [p for p in out.glob("*") if p.is_dir()]:
        shutil.rmtree(stale)
    out.mkdir(parents=True, exist_ok=True)
    package_images.package_table(debs, PACKAGES, out / "packages.tsv")
    sources = package_images.pick_sources(debs / "x", debs / "windows", out / "sources.csv", RULES,
                                          SIDE, MIN_SIDE)
    n = write_stored(debs / "windows", sources, out, SEED)
    counts: dict[str, int] = {}
    for _, k in sources:
        counts[k] = counts.get(k, 0) + 1
    (out / ".done").write_text("ok\n")
    package_images.log(f"{len(sources)} pictures, {n} images in {out}: "
                       + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
