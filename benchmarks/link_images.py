"""Link every image under some folders into one flat folder, for a clean-image check.

    python benchmarks/link_images.py ROOT [ROOT ...] --out DIR [--min-side 300]
                                     [--test-out DIR2 --test-fraction 0.3]

Walks each ROOT in sorted order and links every PNG/JPEG whose shorter side is at least
``--min-side`` pixels into DIR as ``<root name>__<path with / -> __>``; a file whose bytes equal an
earlier one is skipped. Then ``python benchmarks/nightsky_check.py W --folder DIR`` tells how many of
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
