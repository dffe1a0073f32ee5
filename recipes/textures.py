"""Material textures (sand, grass, bark, rock, wood, metal) as clean images, from a Debian package.

    python recipes/textures.py DEB_DIR OUT_DIR

Downloads Debian's supertuxkart-data into DEB_DIR (once; 628 MB) and links its colour textures into
OUT_DIR, named by their path under ``data/`` with ``/`` -> ``__``. Kept: RGB JPEGs of at least
512 px a side whose name is not a normal, gloss, mask, light or sky map (those are not pictures),
not kart skins, not flat (pixel spread >= 8 levels), one file per identical content (the first in
sorted path order). About 200 files: photographic and painted material close-ups.

Why: seen at native resolution, sand looks like noise, wood grain like contour wrinkles and
synthetic grass like a green cast with dots: a cnn trained without such images drops more of
them than its stated 1% (`python benchmarks/clean_check.py --folder OUT_DIR` tells how many).
`recipes/train_cnn.sh` uses them as clean negatives; `collapseguard train` holds a quarter out by
file name, which `clean_check.py --heldout-split` scores.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from collapseguard.training.negatives import unique_files

NOT_A_PICTURE = re.compile(r"(_nm|_n\b|normal|gloss|spec|mask|alpha|height|bump|_ao|light|rough|metal"
                           r"|dirt|emit|skybox|sky|icon|logo|font|gui|arrow|sign|particle|lightning"
                           r"|shadow|env)", re.I)


def _colour_texture(p: Path) -> bool:
    """An RGB JPEG of at least 512 px a side that is not a map, a kart skin or a UI picture."""
    if p.suffix.lower() != ".jpg" or NOT_A_PICTURE.search(p.name) or "/karts/" in str(p.parent):
        return False
    try:
        with Image.open(p) as im:
            return min(im.size) >= 512 and im.mode == "RGB"
    except Exception:
        return False


def _not_flat(p: Path) -> bool:
    with Image.open(p) as im:
        return np.asarray(im.convert("RGB"), np.float32).std() >= 8


def select(data: Path) -> list[Path]:
    return [p for p in unique_files([data], _colour_texture) if _not_flat(p)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("deb_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    args = ap.parse_args(argv)
    data = args.deb_dir / "x/usr/share/games/supertuxkart/data"
    if not data.is_dir():
        args.deb_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", "supertuxkart-data"], cwd=args.deb_dir, check=True)
        deb = sorted(args.deb_dir.glob("supertuxkart-data_*.deb"))[-1]
        subprocess.run(["dpkg", "-x", deb.name, "x"], cwd=args.deb_dir, check=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for old in args.out_dir.iterdir():
        old.unlink()
    files = select(data)
    for p in files:
        (args.out_dir / str(p.relative_to(data)).replace("/", "__")).symlink_to(p.resolve())
    print(f"textures: {len(files)} files in {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
