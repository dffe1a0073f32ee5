"""Write a folder of extra clean images for ``collapseguard calibrate --clean``.

Photos are cut into native-resolution crops (never resized: resizing would wash out the grain and
texture a detector must learn to accept) and optionally re-encoded as JPEG, the way clean images
usually arrive in training data. Variants of one photo are named ``<source>__<variant>.<ext>`` so
that calibration keeps them on one side of its split by source and counts them as one source (they
are *not* independent samples; the calibration file says so when they are used).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from collapseguard.detectors.crops import crop_grid
from collapseguard.images import ALLOWED_FORMATS, DecodeError, is_image_name, load_image


def safe_stem(name: str) -> str:
    """A flat, safe file stem from a source name (no separators, no '__', which marks variants)."""
    s = re.sub(r"[^A-Za-z0-9.-]+", "_", str(name)).strip("._") or "image"
    return re.sub(r"_{2,}", "_", s)[:120]


def largest_per_folder(root: str | Path) -> list[Path]:
    """The largest-area image file in each folder under ``root`` (multi-resolution wallpaper packs
    ship one picture at several sizes: keep it once). Files named like previews are skipped."""
    best: dict[Path, tuple[int, Path]] = {}
    for p in sorted(Path(root).rglob("*")):
        if not p.is_file() or not is_image_name(p.name) or "screenshot" in p.name.lower():
            continue
        try:
            with Image.open(p, formats=ALLOWED_FORMATS) as im:
                area = im.size[0] * im.size[1]
        except Exception:  # noqa: BLE001, S112 - unreadable files are simply not candidates
            continue
        if p.parent not in best or area > best[p.parent][0]:
            best[p.parent] = (area, p)
    return [v[1] for _, v in sorted(best.items())]


def write_variants(sources: Iterable[tuple[str, np.ndarray]], out_dir: str | Path, *, crops: int = 3,
                   crop_size: int = 768, jpeg_quality: int | None = 85, png: bool = True) -> list[Path]:
    """For each ``(name, image)``: ``crops`` native-resolution crops as PNG (unless ``png`` is
    False), plus (if ``jpeg_quality``) the first crop re-encoded as JPEG. Returns the written paths.

    Images smaller than ``crop_size`` are written whole (one "crop"). Names must be distinct.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, seen = [], set()
    for name, img in sources:
        stem = safe_stem(name)
        if stem in seen:
            raise ValueError(f"two sources map to the same file stem {stem!r}")
        seen.add(stem)
        img = np.asarray(img, dtype=np.uint8)
        h, w = img.shape[:2]
        if min(h, w) <= crop_size:
            parts = [img[: crop_size, : crop_size]] if max(h, w) > 2 * crop_size else [img]
        else:
            parts = crop_grid(img, crop_size, crops)
        for i, c in enumerate(parts if png else []):
            p = out / f"{stem}__c{i}.png"
            Image.fromarray(np.ascontiguousarray(c)).save(p)
            written.append(p)
        if jpeg_quality:
            buf = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(parts[0])).save(buf, format="JPEG", quality=int(jpeg_quality))
            p = out / f"{stem}__c0_q{int(jpeg_quality)}.jpg"
            p.write_bytes(buf.getvalue())
            written.append(p)
    return written


def load_files(paths: Iterable[str | Path], root: str | Path | None = None):
    """Yield ``(name, image)`` for image files (undecodable ones skipped); names relative to ``root``."""
    for p in paths:
        p = Path(p)
        try:
            img = load_image(p)
        except (OSError, DecodeError):
            continue
        name = p.relative_to(root).as_posix() if root is not None else p.stem
        yield name, img
