"""Link every image under some folders into one flat folder, for a clean-image check.

    python benchmarks/link_images.py ROOT [ROOT ...] --out DIR [--min-side 300]

Walks each ROOT in sorted order and links every PNG/JPEG whose shorter side is at least
``--min-side`` pixels into DIR as ``<root name>__<path with / -> __>``; a file whose bytes equal an
earlier one is skipped. Then ``python benchmarks/nightsky_check.py W --folder DIR`` tells how many of
them a detector would drop. Used in BENCHMARKS.md ("Clean kinds never trained on") for software
screenshots and game textures unpacked from Debian packages.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from PIL import Image

EXTS = (".png", ".jpg", ".jpeg")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--min-side", type=int, default=300)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    seen, n = set(), 0
    for root in args.roots:
        for dirpath, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                p = Path(dirpath, f)
                if not f.lower().endswith(EXTS):
                    continue
                try:
                    with Image.open(p) as im:
                        if min(im.size) < args.min_side:
                            continue
                except Exception:
                    continue
                digest = hashlib.md5(p.read_bytes()).hexdigest()
                if digest in seen:
                    continue
                seen.add(digest)
                dst = args.out / f"{root.name}__{str(p.relative_to(root)).replace(os.sep, '__')}"
                if not dst.exists():
                    dst.symlink_to(p.resolve())
                    n += 1
    print(f"linked {n} images into {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
