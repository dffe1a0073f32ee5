"""Link every image under some folders into one flat folder, for a clean-image check.

    python recipes/link_images.py ROOT [ROOT ...] --out DIR [--min-side 300]
                                     [--test-out DIR2 --test-fraction 0.3]

Walks each ROOT in sorted order and links every PNG/JPEG whose shorter side is at least
``--min-side`` pixels into DIR as ``<root name>__<path with / -> __>``; a file whose bytes equal an
earlier one is skipped. Then ``python benchmarks/clean_check.py W --folder DIR`` tells how many of
them a detector would drop. Used in BENCHMARKS.md ("Clean kinds never trained on") for software
screenshots and game textures unpacked from Debian packages.

With ``--test-out``, images are split into DIR (training negatives) and DIR2 (a test folder) by
a hash of the name after the last ``__``: the language versions of one screenshot, or a texture
and its copy in a mod folder, stay on one side. ``sha256("kinds:" + that name)``, first 8 hex
digits / 2**32 < ``--test-fraction`` goes to DIR2.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from PIL import Image

from collapseguard.training.negatives import unique_files

EXTS = (".png", ".jpg", ".jpeg")


def in_test(name: str, fraction: float) -> bool:
    """Whether ``name`` goes to the test folder: a stable hash of its part after the last ``__``."""
    group = name.split("__")[-1]
    return int(hashlib.sha256(f"kinds:{group}".encode()).hexdigest()[:8], 16) / 2**32 < fraction


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--min-side", type=int, default=300)
    ap.add_argument("--test-out", type=Path, default=None)
    ap.add_argument("--test-fraction", type=float, default=0.3)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.test_out:
        args.test_out.mkdir(parents=True, exist_ok=True)

    def large_image(p: Path) -> bool:
        if not p.name.lower().endswith(EXTS):
            return False
        try:
            with Image.open(p) as im:
                return min(im.size) >= args.min_side
        except Exception:
            return False

    n = 0
    for p in unique_files(args.roots, large_image):  # one copy of each picture across all roots
        root = next(r for r in args.roots if p.is_relative_to(r))
        name = f"{root.name}__{str(p.relative_to(root)).replace(os.sep, '__')}"
        dst = (args.test_out if args.test_out and in_test(name, args.test_fraction) else args.out) / name
        if not dst.exists():
            dst.symlink_to(p.resolve())
            n += 1
    where = f"{args.out} and {args.test_out}" if args.test_out else f"{args.out}"
    print(f"linked {n} images into {where}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
