"""The scores table a calibration is built from: chain images and extra clean images, scored.

One row per image with columns ``source_image, family, step, kind, path, score`` (``kind`` is
``"chain"`` or ``"clean"`` for extra clean images) and, for ``fr:`` targets, ``fr`` (the
full-reference similarity of the image to its chain's step-0 image). Also ``storage`` (the chain
manifest's ``storage`` cell where it has one, else the file header's ``images.storage_label``:
``png``, ``jpeg q90 4:2:0``, ``webp``) and ``source_kind`` (the manifest's optional ``kind``
column, the clean kind of a chain's source; ``""`` for extra clean images and without one), for
the calibration's per-storage and per-kind tables, and ``error`` (why an image has no score;
``""`` for a scored one).

Extra clean images come from folders (searched recursively for image files) or WebDataset tar
shards (image members only). Files named ``<name>__<anything>.<ext>`` are treated as variants (for
example crops) of one source ``<name>``, so they stay on one side of the split by source.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.images import (
    IMAGE_EXTENSIONS,
    heif_hint,
    is_image_name,
    storage_label,
)
from collapseguard.io.inputs import (
    local_name,
    other_extension,
    other_files_note,
    unread_in,
    unread_text,
)
from collapseguard.io.parse import basename_of
from collapseguard.io.tar import ShardReader
from collapseguard.io.terminal import printable
from collapseguard.io.urls import (
    is_remote,
    is_shard_name,
    read_bytes,
    read_local_bytes,
    url_path,
)
from collapseguard.io.walk import walk
from collapseguard.scoring.records import score_records
from collapseguard.training_data_tools.manifest import bad_steps

#: columns of a scores table
COLUMNS = ("source_image", "family", "step", "kind", "path", "score")

#: family name given to extra clean images
CLEAN_FAMILY = "clean-extra"

#: full-reference measures: name -> (default level, higher-is-more-similar)
FR_MEASURES = {"ssim": 0.90, "psnr": 30.0}


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------

def parse_target(target: str) -> tuple[str, str | None, float | None]:
    """``"step"`` -> ("step", None, None); ``"fr:ssim"`` / ``"fr:ssim<0.85"`` / ``"fr:psnr<28"`` ->
    ("fr", measure, level); ``"fr:ssim:0.85"`` is the same without shell quoting. An image is *degraded* when its measure against the chain's step-0
    image is below the level (defaults: SSIM 0.90, PSNR 30 dB)."""
    t = (target or "step").strip()
    if t == "step":
        return "step", None, None
    m = re.fullmatch(r"fr:(ssim|psnr)(?:[<:]([0-9]*\.?[0-9]+))?", t)
    if not m:
        raise ValueError(f"unknown target {target!r}; use 'step', 'fr:ssim', 'fr:ssim<0.85' or 'fr:psnr<30'")
    measure = m.group(1)
    level = float(m.group(2)) if m.group(2) else FR_MEASURES[measure]
    if measure == "ssim" and not 0 < level <= 1:
        raise ValueError(f"an SSIM level must be in (0, 1], got {level}")
    return "fr", measure, level


def target_label(target: str) -> str:
    kind, measure, level = parse_target(target)
    return "step" if kind == "step" else f"fr:{measure}<{level:g}"


def _gray(img: np.ndarray) -> np.ndarray:
    return img.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def full_reference(ref: np.ndarray, img: np.ndarray, measure: str) -> float:
    """SSIM (grayscale, 7x7 window, data range 255) or PSNR (RGB, dB) of ``img`` against ``ref``.

    When sizes differ (aspect-ratio drift) ``img`` is resized to ``ref``'s size for this measure only.
    SSIM is NaN for an image under 3 pixels a side (no 3 x 3 window fits).
    """
    if img.shape[:2] != ref.shape[:2]:
        from PIL import Image

        img = np.asarray(Image.fromarray(img).resize((ref.shape[1], ref.shape[0]), Image.BICUBIC))
    if measure == "ssim":
        from skimage.metrics import structural_similarity

        a, b = _gray(ref), _gray(img)
        if min(*a.shape, *b.shape) < 3:  # SSIM needs a 3 x 3 window at least
            return float("nan")
        win = min(7, min(a.shape) // 2 * 2 - 1) if min(a.shape) < 7 else 7
        return float(structural_similarity(a, b, data_range=255.0, win_size=max(win, 3)))
    if measure == "psnr":
        mse = float(np.mean((ref.astype(np.float64) - img.astype(np.float64)) ** 2))
        return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))
    raise ValueError(f"unknown full-reference measure {measure!r}")


# ---------------------------------------------------------------------------------------------
# Extra clean sources
# ---------------------------------------------------------------------------------------------

def _variant_source(name: str) -> str:
    stem = Path(name).name.rsplit(".", 1)[0]
    return stem.split("__", 1)[0]


def _no_at(part: str) -> str:
    """A folder or shard name for a source id: '@' escaped, since the split by source reads
    ``<name>@<view>`` as views of one picture (``manifest.source_group``) and would otherwise put
    every image under a folder such as ``me@host/`` on one side as one source."""
    return part.replace("@", "%40")


def iter_clean_images(locations: Iterable[str | Path],
                      unread: list[tuple[str, str]] | None = None) -> Iterator[tuple[str, str, Callable[[], bytes]]]:
    """Yield ``(source_id, path_id, read_bytes)`` for every image in folders and tar shards.

    A location may be a folder (recursive; shards inside are read too), a single image file, a
    shard (``.tar``, ``.tar.gz``, ``.tgz``), or a URL naming any of these (``io.urls``). Only regular
    image members of tars are read. ``unread`` (optional) receives ``(path, why)`` for what a
    folder holds and cannot be read (``_unread``).
    """
    for loc in locations:
        for _, src, path, read in _clean_entries(loc, unread):
            yield src, path, read


def _clean_entries(loc: str | Path, unread: list[tuple[str, str]] | None = None, others=None):
    """``(identity, source_id, path_id, read_bytes)`` for every image of one location. ``identity``
    is the same however the image was reached: the file's real path (a shard member: the shard's
    real path and the member's position), or its URL. ``others`` (a ``Counter``) counts a local
    folder's files that are no image or shard, by extension (``io.inputs.other_extension``)."""
    if is_remote(str(loc)) and not os.path.lexists(str(loc)):  # an existing file is that file
        yield from _iter_url(str(loc))
        return
    loc = Path(loc)
    if not loc.exists():
        raise FileNotFoundError(f"clean location does not exist: {loc}")
    if loc.is_file():
        files = [(loc, loc.resolve())]
    else:  # folder links followed once (io.walk)
        walked = walk(loc, file_links="anywhere")
        if unread is not None:
            unread.extend(_unread(loc, walked))
        files = sorted((seen, real) for seen, real in walked.files if seen.is_file())
    for f, real in files:
        if is_shard_name(f.name):
            parent = "" if loc.is_file() else posixpath.dirname(f.relative_to(loc).as_posix())
            where = "" if loc.is_file() else f"{_no_at(loc.name)}/{_no_at(parent) + '/' if parent else ''}"
            yield from _iter_tar(local_name(f), str(real), where)  # pipe:s.tar in a folder is a file
        elif is_image_name(f.name):
            rel = f.name if loc.is_file() else f.relative_to(loc).as_posix()
            parent = str(Path(rel).parent)
            src = f"{_no_at(loc.name)}/{'' if parent == '.' else _no_at(parent) + '/'}{_variant_source(f.name)}"
            yield str(real), src, str(f), (lambda f=f: read_local_bytes(f))  # regular files only, capped
        elif others is not None and not loc.is_file():
            others[other_extension(f.name)] += 1


def _unread(root: Path, walked) -> list[tuple[str, str]]:
    """What a walked clean folder holds and cannot be read (``io.inputs.unread_in``, every broken
    link included: calibration has no error rows for them), and each image or shard name that
    is not a regular file (a FIFO, socket or device)."""
    return unread_in(root, walked, every_broken_link=True) + [
        (str(p), "not a regular file (a FIFO, socket or device)") for p in walked.paths
        if p.exists() and not p.is_file() and (is_image_name(p.name) or is_shard_name(p.name))]


def _iter_tar(path: Path | str, identity: str | None = None, where: str = ""):
    """Image members of a shard, read once through the filter's reader (member names cleaned).
    A member's source id names the shard's folder below the location (``where``), the shard and
    the member's folder, so two shards of one name in two folders, or two class folders of one
    shard, never make one picture of different images."""
    name = basename_of(str(path))
    position = 0
    for sample in ShardReader(str(path)):
        for m in sample.members:
            position += 1
            if is_image_name(m.name):
                folder = posixpath.dirname(m.name.removeprefix("./"))
                src = f"{where}{_no_at(name)}:{_no_at(folder) + '/' if folder else ''}{_variant_source(m.name)}"
                yield (identity or str(path), position), src, f"{path}:{m.name}", (lambda d=m.data: d)


def _iter_url(url: str):
    """The images of a URL location (``pipe:`` shard, object, folder/prefix), with the same source
    ids as the same files in a local folder would get."""
    from collapseguard.io.inputs import expand_inputs
    shards, files = expand_inputs([url])
    root = url.rstrip("/")
    for shard in shards:
        rel = shard[len(root) + 1:] if shard.startswith(root + "/") else ""
        parent = posixpath.dirname(rel)
        where = f"{_no_at(posixpath.basename(url_path(root)))}/{_no_at(parent) + '/' if parent else ''}" if rel else ""
        yield from _iter_tar(shard, where=where)
    for f in files:
        folder = posixpath.dirname(f.key)
        root = posixpath.basename(url_path(f.source).rstrip("/"))
        base = posixpath.basename(f.key)
        src = f"{_no_at(root)}/{_no_at(folder) + '/' if folder else ''}{_variant_source(base)}"
        yield f.path, src, f.path, (lambda p=f.path: read_bytes(p))


def clean_items(clean: Iterable, others=None) -> tuple[list[tuple[str, str, Callable[[], bytes]]], list[str]]:
    """The ``(source_id, path_id, read_bytes)`` of every image of the ``clean`` locations (each a
    location or a ``(kind, location)`` pair), and each one's kind, listed before anything is scored.

    An image reached through two locations (``DIR`` and ``DIR/sub``, one folder named twice, a
    link to a file of another location) is taken once, under its first name, so that it cannot
    fall on both sides of the split by source; its kind is the one a location names (``--clean
    DIR --clean shots=DIR/sub`` makes DIR/sub's images ``shots``). ValueError naming what a folder
    holds and cannot be read (``_unread``), for a location holding no image file, and for an image
    two locations give different kinds: each would leave out of the calibration, or out of a
    kind's guarantee, clean images it was named for. ``others`` (a ``Counter``) counts the
    folders' files that are no image or shard, by extension.
    """
    listed, unread = [], []
    for loc in clean:
        clean_kind, loc = loc if isinstance(loc, tuple) else ("", loc)
        here: Counter = Counter()
        listed.append((clean_kind, loc, list(_clean_entries(loc, unread, here)), here))
        if others is not None:
            others.update(here)
    if unread:
        raise ValueError(unread_text(unread, "the clean images there would be left out of the "
                                             "calibration: fix or remove it, or name the folders to read with --clean"))
    items, kinds, at = [], [], {}
    for clean_kind, loc, found, here in listed:
        if not found and str(loc).lower().rstrip("/").endswith(".parquet"):
            raise ValueError(f"clean location {printable(loc)} is a Parquet file: --clean reads image "
                             "files in folders and tar shards, not Parquet rows (write the clean "
                             "images out as files, or as a shard)")
        if not found:
            hint = heif_hint(here)  # a folder of iPhone photos without pillow-heif
            raise ValueError(f"clean location {printable(loc)} holds no image file (read: "
                             f"{', '.join(IMAGE_EXTENSIONS)}, in folders and shards)"
                             f"{'; ' + hint if hint else ''}")
        for identity, *item in found:
            if identity not in at:
                at[identity] = len(items)
                items.append(tuple(item))
                kinds.append(clean_kind)
                continue
            i = at[identity]
            if clean_kind and kinds[i] and clean_kind != kinds[i]:
                raise ValueError(f"clean image {printable(items[i][1])} is named as two kinds, "
                                 f"{printable(kinds[i])} and {printable(clean_kind)} (through "
                                 f"{printable(loc)}): give each image one kind")
            kinds[i] = kinds[i] or clean_kind
    return items, kinds


#: a chain step's file name that says it is one (``step_005.png``, ``iter12.jpg``): bare numbers
#: (``00012.jpg``) name clean dataset dumps as often as chains, so they are not taken for steps
_STEP_NAME = re.compile(r"(?i)(?:step|steps|iter|iteration|round|gen|generation)[_-]?(\d+)")


def _local_real(path_id: str) -> str | None:
    """The real path of a clean item's file, None for a URL or a shard member."""
    if is_remote(path_id) or not os.path.isfile(path_id):
        return None
    return os.path.realpath(path_id)


def _walk_manifests(folder: Path) -> list[Path]:
    """The chains manifests in ``folder`` and its subfolders, in one walk (folder links are not
    followed, as ``Path.rglob`` does not): those of each name of ``MANIFEST_NAMES`` in turn,
    each name's sorted by path."""
    from collapseguard.training_data_tools.manifest import MANIFEST_NAMES

    by_name: dict[str, list[Path]] = {name: [] for name in MANIFEST_NAMES}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if name in by_name and os.path.isfile(os.path.join(dirpath, name)):
                by_name[name].append(Path(dirpath, name))
    return [f for name in MANIFEST_NAMES for f in sorted(by_name[name])]


def _manifests_under(folder: Path, walked: dict[Path, list[Path]]) -> list[Path]:
    """``_walk_manifests(folder)`` (a resolved folder), taken from the walk of a folder in
    ``walked`` (walked root -> its manifests) that holds it where there is one, else walked now
    and added to ``walked``: a tree is walked once however many of its folders are asked for."""
    for root, found in walked.items():
        if folder == root or root in folder.parents:
            return [f for f in found if folder in f.parents]
    walked[folder] = _walk_manifests(folder)
    return walked[folder]


def _manifests_near(loc, walked: dict[Path, list[Path]] | None = None) -> list[Path]:
    """The chains manifests (``manifest.csv``/``.parquet``) that may name a local clean
    location's images: in the location and its subfolders, and in the folders above it (a
    ``chains make`` output's family folder named alone). ``walked`` (``_manifests_under``'s)
    shares the walks of folders between calls."""
    from collapseguard.training_data_tools.manifest import MANIFEST_NAMES

    if is_remote(str(loc)) and not os.path.lexists(str(loc)):
        return []
    p = Path(loc).resolve()
    found = []
    for folder in [p if p.is_dir() else p.parent, *(p if p.is_dir() else p.parent).parents]:
        found += [folder / n for n in MANIFEST_NAMES if (folder / n).is_file()]
    if p.is_dir():
        found += _manifests_under(p, {} if walked is None else walked)
    return list(dict.fromkeys(found))


def chain_steps_in_clean(locations, items) -> list[tuple[Path, list[str]]]:
    """Each chains manifest near the clean ``locations`` (``_manifests_near``) that names clean
    ``items`` as chain images at steps after 0, with those items' path ids: degraded copies that
    would count as clean pictures. A file that is no readable manifest is passed over. Each
    folder tree is walked once: the outermost location folders first, and a location inside one
    of them takes its part of that walk (a folder and its subfolder both given, or one given
    twice); each manifest is read once."""
    from collapseguard.training_data_tools.manifest import ManifestError, read_manifest

    real = {}
    for _, path_id, _ in items:
        r = _local_real(path_id)
        if r is not None:
            real.setdefault(r, path_id)
    paths = [loc[1] if isinstance(loc, tuple) else loc for loc in locations]
    walked: dict[Path, list[Path]] = {}
    folders = {Path(p).resolve() for p in paths if not is_remote(str(p)) or os.path.lexists(str(p))}
    for folder in sorted((f for f in folders if f.is_dir()), key=lambda f: len(f.parts)):
        _manifests_under(folder, walked)  # outermost first: nested ones find their tree walked
    out, seen = [], set()
    for loc in paths:
        for m in _manifests_near(loc, walked):
            if m in seen:
                continue
            seen.add(m)
            try:
                t = read_manifest(m, check_files=False, outside_ok=True)
            except (ManifestError, OSError, ValueError):
                continue
            later = {os.path.realpath(p) for p in t.loc[t["step"].astype(int) > 0, "path"].astype(str)}
            hits = [real[r] for r in real if r in later]
            if hits:
                out.append((m, hits))
    return out


def chain_step_names(items) -> list[str]:
    """The path ids of local clean items named as a chain step after 0 (``step_005.png``) in a
    folder that also holds that name's step 0 (``step_000.png``): the layout of a chain folder
    without a manifest. Names alone prove nothing, so the caller warns rather than refuses."""
    by_folder: dict[str, list[tuple[int, str]]] = {}
    for _, path_id, _ in items:
        if is_remote(path_id) or not os.path.isfile(path_id):
            continue
        m = _STEP_NAME.fullmatch(Path(path_id).name.rsplit(".", 1)[0])
        if m:
            by_folder.setdefault(os.path.dirname(path_id), []).append((int(m.group(1)), path_id))
    return [p for steps in by_folder.values() if any(n == 0 for n, _ in steps)
            for n, p in steps if n > 0]


def same_bytes_same_source(sources: list[str], digests: list[str]) -> tuple[list[str], int]:
    """``sources`` with each clean image whose digest (``_score_batches``': of its decoded pixels,
    else of its bytes) equals an earlier one's given that image's source id, and how many were:
    byte-identical files, and files of identical pixels (one picture re-saved with other metadata,
    or losslessly in another format), are one picture however they are named, so copies of one
    picture cannot pass for independent evidence in the bound (nor fall on both sides of the split
    by source). Unreadable images (digest ``""``) keep their own."""
    first: dict[str, str] = {}
    out, n = [], 0
    for src, digest in zip(sources, digests):
        if digest and digest in first:
            n += 1
            out.append(first[digest])
        else:
            if digest:
                first[digest] = src
            out.append(src)
    return out, n


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def _score_batches(detector, readers: list[Callable[[], bytes]], batch_size: int, progress=None,
                   digests: list[str] | None = None):
    """Scores for each reader (NaN when it cannot be read, decoded or scored), each one's reason
    (``""`` when scored), and each image's storage as its header says (``""`` when unreadable),
    through the one scoring loop (``scoring.records.score_records``). A detector that raises stops
    the calibration. With ``digests`` (a list as long as ``readers``), each image's digest is
    written into it: of its decoded pixels (and their shape) where it decodes, so that one picture
    re-saved with other metadata or in another lossless format has one digest; of its bytes where
    it does not; ``""`` when unreadable. The pixels are hashed where the scoring loop decodes them
    (its ``transform``), so nothing is decoded twice.

    Each result is paired with its reader by the record ``score_records`` yields it with, which is
    the reader's index (the records are ``range(len(readers))``), never by the order results come
    in. The pixel digest cannot be paired that way, since ``transform`` is given only an array: it
    goes to the record whose ``members`` ran last (``current``). That is the right record by
    construction: ``score_records`` handles one record at a time in one thread, calling
    ``transform`` on a record's images in the same step as ``members_of`` for it, before any other
    record's ``members_of`` and before any result is yielded (its docstring holds it to this),
    and the calibration scores all its clean images, shard members and files alike, in one such
    loop in this process (no engine, no workers)."""
    out = np.full(len(readers), np.nan, dtype=np.float64)
    errors = [""] * len(readers)
    storage = [""] * len(readers)
    current = [0]  # the record being decoded: score_records decodes each right after members()

    def members(i):
        current[0] = i
        try:
            data = readers[i]()
        except OSError as exc:  # unreadable: empty bytes (a decode error), the reason kept
            errors[i] = f"cannot read the file: {exc.strerror or exc}"
            return [(f"image {i}", b"")]
        storage[i] = storage_label(data)
        if digests is not None:
            digests[i] = "bytes:" + hashlib.sha256(data).hexdigest()
        return [(f"image {i}", data)]

    def pixel_digest(arr: np.ndarray) -> np.ndarray:
        h = hashlib.blake2b(f"{arr.shape}{arr.dtype}".encode(), digest_size=20)
        h.update(np.ascontiguousarray(arr).data)
        digests[current[0]] = "pixels:" + h.hexdigest()
        return arr

    for i, res in score_records(range(len(readers)), detector, members_of=members,
                                batch_size=batch_size, images_only=False,
                                transform=pixel_digest if digests is not None else None):
        if res.status == "ok":
            out[i] = res.score
        else:
            if res.status == "decode_error":
                storage[i] = ""
            errors[i] = errors[i] or res.error.removeprefix(f"image {i}: ")  # one image: no name needed
        if progress is not None and ((i + 1) % batch_size == 0 or i + 1 == len(readers)):
            progress(i + 1, len(readers))
    return out, errors, storage


def score_table(detector, manifest: pd.DataFrame | None = None, clean: Iterable[str | Path] = (),
                *, target: str = "step", batch_size: int | None = None, progress=None,
                warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Score every chain image of ``manifest`` and every image under ``clean`` with ``detector``.

    A ``clean`` entry is a location or a ``(kind, location)`` pair; the kind goes into the
    ``source_kind`` column (as a chains manifest's ``kind`` does for its sources). The clean
    images are listed first (``clean_items``: each image once; a folder holding what cannot be
    read, or a location holding no image file, is refused with a ValueError before any scoring).
    A ``clean`` image that is also one of the manifest's files is scored once, as its chain row;
    ``table.attrs["clean_in_chains"]`` counts them. A ``clean`` image of the pixels of a chain's
    step 0 (chains made from the clean folder) takes that chain's ``source_image``, one picture
    with it (``clean_chain_pixels`` counts them); one of only a later step's pixels is refused with
    a ValueError after scoring. A ``clean`` image that a chains manifest in,
    under or above its location names at a step after 0 (and that is not one of ``manifest``'s
    images) is refused with a ValueError before any scoring: it is a degraded copy, and as a clean
    picture it would raise the threshold. Images only *named* like chain steps after 0
    (``CHAIN/step_005.png`` beside ``step_000.png``) are passed to ``warn`` (a message), since a
    name alone proves nothing. Files of a ``clean`` folder that are no image or shard (``.heic``,
    ``.txt``) are counted by extension in one ``warn`` message.

    With an ``fr:`` target, also computes each chain image's full-reference similarity to its
    chain's step-0 image (column ``fr``). Rows whose image cannot be read, decoded or scored keep
    score NaN and say why in the ``error`` column (``""`` for a scored image).
    """
    kind, measure, _ = parse_target(target)
    bs = int(batch_size or getattr(detector, "batch_size", 16) or 16)
    clean = list(clean)
    others: Counter = Counter()
    items, item_kinds = clean_items(clean, others)  # listed, and refused if need be, before any scoring
    if others and warn is not None:  # never left out without a word
        warn(other_files_note(others, parquet=False, where="the --clean folders"))
    n_in_chains = 0
    if manifest is not None and len(manifest) and items:
        # a chain's own image also named under --clean (the originals' folder, say) is the chain
        # row only: scored twice it would count twice and fall on both sides of the split
        in_chains = {os.path.realpath(p) for p in manifest["path"].astype(str)}
        keep = [not is_remote(p) and os.path.realpath(p) in in_chains for _, p, _ in items]
        n_in_chains = sum(keep)
        items = [it for it, drop in zip(items, keep) if not drop]
        item_kinds = [k for k, drop in zip(item_kinds, keep) if not drop]
    _refuse_chain_steps(clean, items, warn)
    parts = []
    if manifest is not None and len(manifest):
        m = manifest.reset_index(drop=True)
        readers = [(lambda p=p: read_local_bytes(p)) for p in m["path"]]  # regular files only, capped
        chain_digests = [""] * len(m)
        scores, errors, header = _score_batches(detector, readers, bs, progress, chain_digests)
        given = m["storage"].fillna("").astype(str) if "storage" in m.columns else [""] * len(m)
        t = pd.DataFrame({"source_image": m["source_image"].astype(str), "family": m["family"].astype(str),
                          "step": m["step"].astype(int), "kind": "chain", "path": m["path"].astype(str),
                          "score": scores, "chain_id": m["chain_id"].astype(str),
                          "storage": [g or h for g, h in zip(given, header)],
                          "source_kind": m["kind"].fillna("").astype(str) if "kind" in m.columns else "",
                          "error": errors})
        if kind == "fr":
            t["fr"] = full_reference_column(m, measure)
        parts.append(t)
    n_identical = n_chain_pixels = 0
    if items:
        digests = [""] * len(items)
        scores, errors, header = _score_batches(detector, [r for _, _, r in items], bs, progress,
                                                digests)
        sources, n_identical = same_bytes_same_source([s for s, _, _ in items], digests)
        if parts:
            sources, n_chain_pixels = _chain_pictures(parts[0], chain_digests, items, sources, digests)
        parts.append(pd.DataFrame({"source_image": sources, "family": CLEAN_FAMILY,
                                   "step": 0, "kind": "clean", "path": [p for _, p, _ in items],
                                   "score": scores, "chain_id": "", "storage": header,
                                   "source_kind": item_kinds, "error": errors}))
    if not parts:
        raise ValueError("nothing to score: give chains and/or clean folders")
    table = pd.concat(parts, ignore_index=True)
    table.attrs["clean_in_chains"] = n_in_chains
    table.attrs["clean_identical"] = n_identical
    table.attrs["clean_chain_pixels"] = n_chain_pixels
    table.attrs["detector"] = getattr(detector, "name", "")
    table.attrs["detector_version"] = str(getattr(detector, "version", ""))
    return table


def _chain_pictures(chains: pd.DataFrame, chain_digests: list[str], items, sources: list[str],
                    digests: list[str]) -> tuple[list[str], int]:
    """``sources`` with each clean image of a chain step 0's pixels (or bytes) given that chain's
    picture, and how many were: the chains made from a clean folder, calibrated beside it, would
    count each picture twice and put its copies on both sides of the split. A clean image of only a
    later step's pixels is a degraded copy under another name: ValueError."""
    first_step: dict[str, tuple[int, int]] = {}  # digest -> (lowest step, its chain row)
    for i, (d, step) in enumerate(zip(chain_digests, chains["step"])):
        if d and (d not in first_step or step < first_step[d][0]):
            first_step[d] = (int(step), i)
    out, n = list(sources), 0
    for j, d in enumerate(digests):
        if d in first_step:
            step, i = first_step[d]
            if step > 0:
                raise ValueError(
                    f"the --clean image {printable(items[j][1])} has the pixels of the chain image "
                    f"{printable(chains['path'].iloc[i])} (step {step}): a degraded copy, which would "
                    "count as a clean picture and raise the threshold; leave it out of --clean")
            out[j] = chains["source_image"].iloc[i]
            n += 1
    return out, n


def _refuse_chain_steps(clean, items, warn) -> None:
    """``score_table``'s check of the clean images for chain steps after 0 (see there)."""
    found = chain_steps_in_clean(clean, items)
    if found:
        n = sum(len(hits) for _, hits in found)
        m, hits = found[0]
        raise ValueError(
            f"{n} --clean image(s) are chain images at steps after 0 of the chains manifest "
            f"{printable(str(m))} (e.g. {printable(hits[0])}): degraded copies, which would count as "
            f"clean pictures and raise the threshold. Pass that chains folder as --chains "
            f"{printable(str(m.parent))} (its step-0 originals are clean), or name only step-0 images "
            "with --clean")
    named = chain_step_names(items)
    if named and warn is not None:
        warn(f"{len(named)} --clean image(s) are named like chain steps after 0 beside a step 0 in "
             f"their folder (e.g. {printable(named[0])}), with no chains manifest naming them: if they "
             "are replication-chain images they are degraded, not clean; pass the chains as --chains "
             "(`collapseguard chains ls` reads such folders), or name only step-0 images with --clean")


def full_reference_column(manifest: pd.DataFrame, measure: str) -> np.ndarray:
    """Per row, the full-reference measure against the row's chain step-0 image (NaN if unreadable)."""
    from collapseguard.images import DecodeError, load_image

    out = np.full(len(manifest), np.nan)
    m = manifest.reset_index(drop=True)
    for _, rows in m.groupby("chain_id", sort=False):
        ref_rows = rows[rows["step"] == 0]
        try:
            ref = load_image(ref_rows["path"].iloc[0])
        except (DecodeError, OSError):
            continue
        for i, p in zip(rows.index, rows["path"]):
            try:
                out[i] = 1.0 if measure == "ssim" and p == ref_rows["path"].iloc[0] else \
                    full_reference(ref, load_image(p), measure)
            except (DecodeError, OSError):
                pass
    return out


def _exact_floats(values) -> np.ndarray:
    """Parse CSV text cells with Python's float (exact for every value ``to_csv`` writes); empty
    or unparsable cells become NaN. pandas' own CSV float parser missed the written value by one
    ulp on about a fifth of the values under pandas 2.2 and 3.0, not 3.1, which moved a threshold recomputed with
    ``--from-scores`` (seen on a GPU machine's pandas 3.0.6)."""
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            pass
    return out


def save_scores(table: pd.DataFrame, path: str | Path, detector: str, version: str) -> Path:
    """Write a scores table as CSV with the detector name and version in every row. Text that a
    spreadsheet would run as a formula (a source id or path under a folder named ``=...``), or
    that starts with ``'``, gets a leading ``'`` (``io.csv_cells.csv_cell``), which
    ``read_scores`` takes off again."""
    from collapseguard.io.csv_cells import csv_cell

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t = table.copy()
    t["detector"], t["detector_version"] = detector, version
    text = [c for c in t.columns if not pd.api.types.is_numeric_dtype(t[c])]
    t.assign(**{c: t[c].map(csv_cell) for c in text}).to_csv(path, index=False)
    return path


def read_scores(path: str | Path) -> tuple[pd.DataFrame, str, str]:
    """Read a scores CSV written by ``save_scores``; returns (table, detector, version)."""
    from collapseguard.io.csv_cells import csv_uncell

    text = {"source_image": str, "family": str, "kind": str, "path": str, "chain_id": str,
            "detector": str, "detector_version": str, "storage": str, "source_kind": str, "error": str}
    try:
        t = pd.read_csv(path, dtype={**text, "score": str, "fr": str}, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a scores table written by `calibrate --scores-out` "
                         f"({str(exc).strip()})") from None
    t = t.assign(**{c: t[c].map(csv_uncell) for c in text if c in t.columns})
    missing = [c for c in COLUMNS + ("detector", "detector_version") if c not in t.columns]
    if missing:
        raise ValueError(f"{path}: not a scores table, missing {missing}")
    pairs = set(zip(t["detector"], t["detector_version"]))
    if len(pairs) != 1:
        shown = sorted(f"{d}@{v}" for d, v in pairs)[:4]
        raise ValueError(f"{path}: scores must come from exactly one detector/version, found {shown}")
    (det, ver), = pairs
    t["score"] = _exact_floats(t["score"])
    steps, bad = bad_steps(t["step"])
    if bad.any():
        raise ValueError(f"{path}: step must be an integer >= 0; bad rows {list(t.index[bad][:5])}")
    t["step"] = steps.astype(int)
    kinds = set(t["kind"]) - {"chain", "clean"}
    if kinds:
        raise ValueError(f"{path}: kind must be 'chain' or 'clean', found {sorted(kinds)[:4]}")
    if "fr" in t.columns:
        t["fr"] = _exact_floats(t["fr"])
    return t.drop(columns=["detector", "detector_version"]), det, ver
