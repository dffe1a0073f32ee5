"""Clean negatives that are *not* smooth renders: real photos and camera-like variants of them.

A degradation filter that drops every grainy photograph is useless, so the training set's clean
side holds photos with natural grain and fine texture, and realistic capture/processing variants of
clean images, all labelled clean: signal-dependent sensor noise (ISO grain, slightly correlated
like demosaiced noise, with a little chroma noise), JPEG at quality 70-95, mild unsharp masking,
small upscales, and web-size downscales of large photos.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from collapseguard.images import (
    DecodeError,
    is_image_name,
    load_image,
    random_window,
    resize_by,
)
from collapseguard.io.walk import walk
from collapseguard.training_data_tools.manifest import source_bucket
from collapseguard.training_data_tools.replicators.ops import jpeg, web_size


def list_images(folders: Sequence[str | Path]) -> list[Path]:
    """Image files under ``folders`` (recursive), sorted by full path, so the order is reproducible.

    The order (and so a training run's draws) follows the full paths: the same files in folders
    under another parent can come out in another order and train different weights. Keep the
    ``--clean`` folders of one recipe under one parent, as ``recipes/train_cnn.sh`` does."""
    out: list[Path] = []
    for folder in folders:
        folder = Path(folder)
        if folder.is_file() and is_image_name(folder.name):
            out.append(folder)
            continue
        if not folder.is_dir():  # --clean and --images name folders or image files
            what = "not a folder or an image file" if folder.exists() else "no such file or folder"
            raise FileNotFoundError(f"{folder}: {what}")
        # folder links followed once, file links wherever they point (io.walk's rule for readers
        # of data: clean images are read, never packed or shared)
        out.extend(p for p in walk(folder, file_links="anywhere").paths if is_image_name(p.name))
    return sorted(set(out))


def unique_files(roots: Iterable[str | Path], accept: Callable[[Path], bool]) -> Iterator[Path]:
    """Files under ``roots`` that ``accept`` takes, in a reproducible order (each root walked with
    sorted folders and names), skipping any whose bytes equal an earlier accepted file: the
    same picture shipped twice in a package becomes one clean image, not two correlated ones."""
    seen: set[str] = set()
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                p = Path(dirpath, name)
                if not accept(p):
                    continue
                digest = file_digest(p)
                if digest not in seen:
                    seen.add(digest)
                    yield p


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (``io.outdir.digest_stream``)."""
    from collapseguard.io.outdir import digest_stream

    with open(path, "rb") as f:
        return digest_stream(f)["sha256"]


def drop_identical(paths: Sequence[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """``paths`` in their order without files whose bytes equal an earlier one's, and the
    (dropped, kept) pairs. ``split_clean`` splits by file name, so one picture under two names
    could be a training negative and a held-out clean image at once."""
    first: dict[str, Path] = {}
    kept: list[Path] = []
    dropped: list[tuple[Path, Path]] = []
    for p in paths:
        digest = file_digest(p)
        if digest in first:
            dropped.append((Path(p), first[digest]))
        else:
            first[digest] = Path(p)
            kept.append(p)
    return kept, dropped


def split_clean(paths: Sequence[Path], holdout: float = 0.25, salt: str = "clean") -> tuple[list[Path], list[Path]]:
    """Split clean files into (train, held-out) by a stable hash of the file name."""
    train, held = [], []
    for p in paths:
        (held if source_bucket(Path(p).name, salt) < holdout else train).append(p)
    return train, held


def sensor_noise(img: np.ndarray, rng: np.random.Generator, iso_sigma: float) -> np.ndarray:
    """Signal-dependent (Poisson-Gaussian) grain at ``iso_sigma`` (8-bit units at mid-grey),
    mostly luminance with some chroma, spatially softened like demosaiced sensor noise."""
    x = img.astype(np.float32)
    h, w = x.shape[:2]
    level = np.sqrt(0.25 + 0.75 * x.mean(axis=2, keepdims=True) / 128.0)  # brighter = more shot noise
    lum = rng.standard_normal((h, w, 1)).astype(np.float32)
    chroma = rng.standard_normal((h, w, 3)).astype(np.float32) * rng.uniform(0.2, 0.5)
    n = lum + chroma
    if rng.random() < 0.7:  # demosaic-like correlation
        from scipy.ndimage import gaussian_filter

        sig = (rng.uniform(0.4, 0.9), rng.uniform(0.4, 0.9))
        n = np.stack([gaussian_filter(n[..., c], sigma=sig, truncate=3.0) for c in range(3)], axis=2)
        n /= max(1e-6, float(n.std()))
    return np.clip(x + n * iso_sigma * level, 0, 255).astype(np.uint8)


def unsharp(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    f = ImageFilter.UnsharpMask(radius=rng.uniform(0.8, 2.0), percent=int(rng.uniform(30, 90)), threshold=2)
    return np.asarray(Image.fromarray(img).filter(f))


def camera_augment(img: np.ndarray, rng: np.random.Generator, jpeg_p: float = 0.6) -> np.ndarray:
    """One random, realistic capture/processing variant of a clean image (still clean).
    ``jpeg_p``: the chance of a JPEG round trip at the end (0 when a storage is drawn after it,
    ``training.storage``: the same draws from ``rng`` either way)."""
    out = img
    if rng.random() < 0.25:
        out = resize_by(out, rng.uniform(1.1, 1.6))  # small upscale
    if rng.random() < 0.6:
        out = sensor_noise(out, rng, iso_sigma=float(rng.uniform(1.0, 7.0)))
    if rng.random() < 0.3:
        out = unsharp(out, rng)
    if rng.random() < jpeg_p:
        out = jpeg(out, int(rng.integers(70, 96)))
    return out


def clean_labels(paths: Sequence[Path]):
    """The name a clean file's images carry (``clean_variants``): its file name, or its path as
    given when another file of ``paths`` has the same file name."""
    from collections import Counter

    shared = {n for n, c in Counter(Path(p).name for p in paths).items() if c > 1}
    return lambda p: str(p) if Path(p).name in shared else Path(p).name


def clean_variants(paths: Sequence[Path], variants: int, seed: int, long_side=(640, 2048),
                   window_side: int | None = 640, native_windows: bool = False,
                   storage: bool = False, web_history: float = 0.0) -> Iterator[tuple[str, np.ndarray]]:
    """For each clean file: one web-sized copy as it is, plus ``variants - 1`` camera-augmented
    copies (each at its own web size). Yields (name, image), the name ``clean_label(path)#VARIANT``:
    the file name, or the path as given where two files share a name (``run.unused_clean_files``
    tells by it which files gave no image; the names of a set without such files, which resumed
    runs' data fingerprints hash, stay file names).

    With ``window_side`` set, each augmented copy is a random window of that size (augmenting the
    whole of a 4K photo only to cut a few crops from it is wasted time); None keeps whole images.
    With ``native_windows``, every odd variant is instead a window at the file's native resolution
    (camera-augmented half of the time), so large photos are also seen unscaled.
    With ``storage``, every variant (the as-is copy too) is finally stored one random way
    (``training.storage.draw_storage``, its own random stream) and the camera variants get no JPEG
    step of their own, so clean images meet storage exactly as chain images do.
    With ``web_history`` > 0, that share of the variants first goes through a web history
    (``training_data_tools.web_history``: 1-4 JPEG saves, resizes, upload sharpening, screenshots;
    its own random stream, so the other draws are those of a run without it): still clean.
    """
    label = clean_labels(paths)
    rng = np.random.default_rng(seed)
    srng = np.random.default_rng([seed, 4099])
    hrng = np.random.default_rng([seed, 8191])
    jpeg_p = 0.0 if storage else 0.6
    for p in paths:
        try:
            native = load_image(p)
        except (OSError, DecodeError):  # unreadable files are skipped, not fatal
            continue
        # one shared downscale to the largest web size first: later variants resize from it
        base = web_size(native, rng, (long_side[1], long_side[1]))
        for v in range(max(1, variants)):
            if native_windows and v % 2 == 1:
                img = random_window(native, window_side or 640, rng)
                if rng.random() < 0.5:
                    img = camera_augment(img, rng, jpeg_p)
            else:
                img = web_size(base, rng, long_side)
                if v > 0:
                    if window_side:
                        img = random_window(img, window_side, rng)
                    img = camera_augment(img, rng, jpeg_p)
            if web_history > 0 and hrng.random() < web_history:
                from collapseguard.training_data_tools.web_history import (
                    web_history as history,
                )

                img = history(img, hrng)[0]
            if storage:
                from collapseguard.training.storage import apply_storage, draw_storage

                img = apply_storage(img, draw_storage(srng))
            yield f"{label(p)}#{v}", img
