"""Crop banks: native-resolution crops cut once from every training image and kept in memory.

A bank holds ``P`` random ``S`` x ``S`` crops per image (uint8) plus one metadata row per image
(``target`` and ``weight`` for the classification loss, ``chain_id``/``step`` for the ranking
loss). All steps of a chain whose images keep the size of step 0 share crop positions, so a
ranking pair compares the same content before and after degradation. Nothing is ever resized.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.images import DecodeError, load_image


def step_label(step: int, degraded_from: int = 4) -> tuple[float, float]:
    """(target, weight) of a chain image for the clean-vs-degraded loss.

    Step 0 is clean (target 0). Steps 1-2 are too subtle to call either way (weight 0: only the
    ranking loss sees them); step 3 counts as degraded with a low weight; steps >= ``degraded_from``
    are degraded with full weight.
    """
    if step <= 0:
        return 0.0, 1.0
    if step < 3:
        return 1.0, 0.0
    if step < degraded_from:
        return 1.0, 0.3
    return 1.0, 1.0


def crop_positions(h: int, w: int, size: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 2) random top-left corners of ``size`` crops inside an h x w image (0 when smaller)."""
    ys = rng.integers(0, max(1, h - size + 1), n)
    xs = rng.integers(0, max(1, w - size + 1), n)
    return np.stack([ys, xs], axis=1)


def cut_crops(img: np.ndarray, pos: np.ndarray, size: int) -> np.ndarray:
    """Cut (n, size, size, 3) crops at ``pos``; images smaller than ``size`` are reflect-padded."""
    h, w = img.shape[:2]
    if h < size or w < size:
        ph, pw = max(0, size - h), max(0, size - w)
        mode = "reflect" if (h > ph and w > pw) else "edge"
        img = np.pad(img, ((0, ph), (0, pw), (0, 0)), mode=mode)
    return np.stack([img[y : y + size, x : x + size] for y, x in pos])


@dataclass
class CropBank:
    """``crops``: (N, P, S, S, 3) uint8; ``meta``: N rows (target, weight, kind, chain_id, step...)."""

    crops: np.ndarray
    meta: pd.DataFrame

    def __len__(self) -> int:
        return len(self.meta)

    def subset(self, mask) -> CropBank:
        """The images where ``mask`` (boolean, one per image) is true."""
        mask = np.asarray(mask, dtype=bool)
        return CropBank(self.crops[mask], self.meta[mask].reset_index(drop=True))

    def save(self, folder: str | Path) -> None:
        """Write ``crops.npy`` + ``meta.parquet`` into ``folder`` (no pickle)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "crops.npy", self.crops, allow_pickle=False)
        self.meta.to_parquet(folder / "meta.parquet", index=False)

    @staticmethod
    def load(folder: str | Path) -> CropBank:
        folder = Path(folder)
        return CropBank(np.load(folder / "crops.npy", allow_pickle=False),
                        pd.read_parquet(folder / "meta.parquet"))

    @staticmethod
    def concat(banks: Iterable[CropBank]) -> CropBank:
        banks = [b for b in banks if len(b)]
        if not banks:
            raise ValueError("no crops to concatenate")
        return CropBank(np.concatenate([b.crops for b in banks]),
                        pd.concat([b.meta for b in banks], ignore_index=True))


#: JPEG qualities of the delivery re-encoding (see ``chain_bank``)
DELIVERY_QUALITY = (70, 98)


def chain_bank(manifest: pd.DataFrame, size: int, per_image: int, seed: int,
               loader: Callable[[str], np.ndarray] = load_image,
               progress: Callable[[int, int], None] | None = None,
               delivery_jpeg: float = 0.0, delivery_per: str = "chain",
               delivery_kind: str = "jpeg") -> CropBank:
    """Crops of every row of a chain manifest (see module docstring for shared positions).

    ``delivery_jpeg``: the share of chains whose images (every step, step 0 included) are
    JPEG-encoded once at one quality in ``DELIVERY_QUALITY`` before the crops are cut, as a web
    dataset delivers them. Chains are written as PNG while the clean negatives' camera variants are
    often JPEG; without this, "has JPEG blocks" would be a shortcut for "clean", and degraded
    images would score as clean once a dataset stores them as JPEG. The choice uses its own random
    stream, so crop positions do not depend on it. ``delivery_per="image"`` decides (and draws the
    quality) for every image on its own instead, so the two images of a ranking pair often differ in
    storage and the ranking loss itself asks for scores that JPEG does not move.

    ``delivery_kind="web"``: a delivered image is instead stored one random way
    (``training.storage.draw_storage``: JPEG 4:2:0 q60-95 mostly, JPEG 4:4:4, WebP, PNG, and
    web-size downscales), drawn once per chain (or per image), as the clean bank's images are with
    ``clean_variants(storage=True)``; a ``storage`` column names it.
    """
    from collapseguard.training.negatives import jpeg

    if not 0.0 <= delivery_jpeg <= 1.0:
        raise ValueError(f"delivery_jpeg must be in [0, 1], got {delivery_jpeg}")
    if delivery_per not in ("chain", "image"):
        raise ValueError(f"delivery_per must be 'chain' or 'image', got {delivery_per!r}")
    if delivery_kind not in ("jpeg", "web"):
        raise ValueError(f"delivery_kind must be 'jpeg' or 'web', got {delivery_kind!r}")
    from collapseguard.training.storage import Storage, apply_storage, draw_storage

    web = delivery_kind == "web"
    srng = np.random.default_rng([seed, 4099])
    png = Storage("png")
    rng = np.random.default_rng(seed)
    jrng = np.random.default_rng([seed, 7919])
    # filled in place: a list of crops stacked at the end would hold the bank twice at its peak
    crops = np.empty((len(manifest), per_image, size, size, 3), np.uint8)
    rows = []
    done = 0
    for chain_id, g in manifest.sort_values(["chain_id", "step"]).groupby("chain_id", sort=True):
        ref_shape, ref_pos = None, None
        # drawn per chain in both modes (per image, "image" mode overrides it), so the random
        # stream and the weights trained with either mode stay reproducible
        quality = int(jrng.integers(DELIVERY_QUALITY[0], DELIVERY_QUALITY[1] + 1))
        delivered = bool(jrng.random() < delivery_jpeg)
        stored = draw_storage(srng) if web else png
        for r in g.itertuples(index=False):
            try:
                img = loader(r.path)
            except DecodeError as exc:  # name the file: one bad image in thousands is hard to find
                raise DecodeError(f"{r.path}: {exc}") from None
            if delivery_per == "image":
                quality = int(jrng.integers(DELIVERY_QUALITY[0], DELIVERY_QUALITY[1] + 1))
                delivered = bool(jrng.random() < delivery_jpeg)
                stored = draw_storage(srng) if web else png
            if delivered and web:
                img = apply_storage(img, stored)
            elif delivered:
                img = jpeg(img, quality)
            if ref_shape is None:
                ref_shape = img.shape
                ref_pos = crop_positions(img.shape[0], img.shape[1], size, per_image, rng)
            pos = ref_pos if img.shape == ref_shape else crop_positions(
                img.shape[0], img.shape[1], size, per_image, rng)
            crops[done] = cut_crops(img, pos, size)
            target, weight = step_label(int(r.step))
            rows.append({"kind": "chain", "chain_id": str(chain_id), "family": str(r.family),
                         "source_image": str(r.source_image), "step": int(r.step),
                         "target": target, "weight": weight, "path": str(r.path),
                         "aligned": bool(img.shape == ref_shape),
                         "jpeg_quality": (stored.jpeg_quality if web else quality) if delivered else 0,
                         **({"storage": stored.label() if delivered else "png"} if web else {})})
            done += 1
            if progress:
                progress(done, len(manifest))
    return CropBank(crops, pd.DataFrame(rows))


def image_bank(images: Iterable[tuple[str, np.ndarray]], size: int, per_image: int, seed: int,
               target: float = 0.0, weight: float = 1.0, kind: str = "clean") -> CropBank:
    """Crops of loose (name, image) pairs, all with the same target (0 = clean)."""
    rng = np.random.default_rng(seed)
    crops, rows = [], []
    for name, img in images:
        pos = crop_positions(img.shape[0], img.shape[1], size, per_image, rng)
        crops.append(cut_crops(img, pos, size))
        rows.append({"kind": kind, "chain_id": "", "family": kind, "source_image": name, "step": -1,
                     "target": float(target), "weight": float(weight), "path": name,
                     "aligned": False})
    return CropBank(np.stack(crops) if crops else np.zeros((0, per_image, size, size, 3), np.uint8),
                    pd.DataFrame(rows))


def ladder_bank(rungs: Iterable[tuple[str, str, int, np.ndarray]], size: int, per_image: int,
                seed: int) -> CropBank:
    """Crops of damage ladders (``training.generic_damage.damage_ladders``), stored like chains:
    one ``chain_id`` per ladder, its rung as ``step``, crop positions shared along the ladder."""
    rng = np.random.default_rng(seed)
    crops, rows = [], []
    pos, last = None, None
    for ladder_id, kind, step, img in rungs:
        if ladder_id != last:
            pos, last = crop_positions(img.shape[0], img.shape[1], size, per_image, rng), ladder_id
        crops.append(cut_crops(img, pos, size))
        target, weight = step_label(int(step))
        rows.append({"kind": "generic", "chain_id": ladder_id, "family": kind,
                     "source_image": ladder_id.split("/")[1], "step": int(step), "target": target,
                     "weight": weight, "path": "", "aligned": True, "jpeg_quality": 0})
    return CropBank(np.stack(crops) if crops else np.zeros((0, per_image, size, size, 3), np.uint8),
                    pd.DataFrame(rows))


def cache_key(paths: Iterable[str | Path], **settings) -> str:
    """A key for a cached bank: file names, sizes and modification times, plus settings."""
    items = []
    for p in paths:
        st = Path(p).stat()
        items.append([str(p), st.st_size, int(st.st_mtime)])
    blob = json.dumps({"files": items, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached(cache_dir: str | Path | None, key: str, build: Callable[[], CropBank]) -> CropBank:
    """Load the bank stored under ``cache_dir/key`` or build and store it (no cache when None)."""
    if cache_dir is None:
        return build()
    folder = Path(cache_dir) / key
    if (folder / "meta.parquet").is_file() and (folder / "crops.npy").is_file():
        return CropBank.load(folder)
    bank = build()
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    try:
        bank.save(tmp)
    except BaseException:  # e.g. a full disk: leave no half-written bank (several GB) behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, folder)  # atomic; a concurrent run that finished first wins
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return bank
