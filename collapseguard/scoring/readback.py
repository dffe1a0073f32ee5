"""Scored samples read back for the HTML galleries (the audit report, dedup's groups), and the
images they show: a thumbnail plus a native-resolution crop (replication damage — grain, dots,
lost texture — is invisible once an image is shrunk to a thumbnail).

Only the samples a gallery needs are read back: each shard is streamed once with the filter's
``ShardReader`` (stopping as soon as its wanted keys are found), loose files are opened directly.
Everything is embedded as ``data:`` URIs so a report stays one self-contained file.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from collapseguard.images import (
    DecodeError,
    decode_detailed,
    encode_png,
    rgba_composite,
)
from collapseguard.io.inputs import is_shard, path_key
from collapseguard.io.parse import basename_of, kind_of
from collapseguard.io.tar import ShardReader, valid_text
from collapseguard.io.urls import (
    URLError,
    is_remote,
    join,
    read_bytes,
    scheme,
)
from collapseguard.scoring.records import MAX_RECORD_PIXELS, image_members

#: member extensions read as captions (shown as text, escaped)
CAPTION_EXTENSIONS = ("txt", "caption", "text")
MAX_CAPTION = 300

#: the Content-Security-Policy of a self-contained page: no script, no fetch; images only as
#: ``data:`` URIs, inline styles
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")

def repeats(items: Iterable[Hashable]) -> np.ndarray:
    """For each item, how many earlier items are the same (0 for its first)."""
    seen: dict[Hashable, int] = {}
    nth = []
    for item in items:
        k = seen.get(item, 0)
        nth.append(k)
        seen[item] = k + 1
    return np.array(nth, np.int64)


def occurrence(sources: Iterable[str], keys: Iterable[str]) -> np.ndarray:
    """For each ``(source, key)``, how many earlier pairs are the same: a key may repeat in a
    shard, each repeat a sample of its own, and ``fetch_samples`` names it by this ``nth``."""
    return repeats(zip(sources, keys))


@dataclass
class Fetched:
    """One sample read back for a gallery: its decoded image (or why not) and caption. Read with
    ``fetch_samples(every_image=True)``, ``image`` is the list of the sample's images and
    ``prepared`` the list of their ``prepare(image)``, in member order."""

    image: np.ndarray | list[np.ndarray] | None = None
    error: str = ""
    caption: str = ""
    #: ``prepare(image)`` when ``fetch_samples`` was given ``prepare`` (``image`` is then None)
    prepared: object = None


def _caption(members: list[tuple[str, bytes]], key: str) -> str:
    for name, data in members:
        ext = name.rpartition(".")[2].lower()
        if ext in CAPTION_EXTENSIONS:
            text = data[: 4 * MAX_CAPTION].decode("utf-8", "replace").strip()
            return text[:MAX_CAPTION] + ("…" if len(text) > MAX_CAPTION else "")
    return ""


def _decode_shown(data: bytes) -> np.ndarray:
    """The image as a gallery shows it: RGB, or RGBA (H, W, 4) when some pixel is transparent."""
    return decode_detailed(data, keep_alpha=True)[0]


def _decode_member(members: list[tuple[str, bytes]], image: str, every_image: bool = False,
                   prepare=None) -> Fetched:
    imgs = image_members(members)
    if every_image:
        return _decode_every(imgs, prepare)
    chosen = next((d for n, d in imgs if n == image), None) if image else None
    if chosen is None and imgs:
        chosen = imgs[0][1]
    if chosen is None:
        return Fetched(error="no image file in the sample")
    try:
        return Fetched(_decode_shown(chosen))
    except DecodeError as exc:
        return Fetched(error=str(exc))


def _decode_every(imgs: list[tuple[str, bytes]], prepare=None) -> Fetched:
    """Every image of a sample, in member order (``Fetched.image`` a list; with ``prepare``,
    ``Fetched.prepared`` the list of ``prepare`` of each, each image handed over as soon as it is
    decoded, so one full image is held at a time). One image that cannot be decoded, or images
    holding over ``MAX_RECORD_PIXELS`` together, make the whole sample an error, as ``filter``
    scores nothing of such a sample."""
    if not imgs:
        return Fetched(error="no image file in the sample")
    out, pixels = [], 0
    for name, data in imgs:
        try:
            img = _decode_shown(data)
        except DecodeError as exc:
            return Fetched(error=f"{name}: {exc}")
        pixels += img.shape[0] * img.shape[1]
        if pixels > MAX_RECORD_PIXELS:
            return Fetched(error=f"{name}: the sample's images hold over {MAX_RECORD_PIXELS} pixels "
                                 "together; the rest were not decoded")
        if prepare is None:
            out.append(img)
            continue
        try:
            out.append(prepare(img))
        except Exception as exc:  # noqa: BLE001 - as _prepared: said for this sample, not fatal
            return Fetched(error=f"cannot show the image: {type(exc).__name__}: {exc}")
    return Fetched(prepared=out) if prepare is not None else Fetched(out)


def _file_path(source: str, key: str) -> str | None:
    """The path of a loose image file from its (source, key) as ``expand_inputs`` made them."""
    if is_remote(source):  # an image URL is its own source; a folder URL's images lie below it
        if source.rstrip("/").endswith("/" + key) or ".." in key.split("/"):
            return source if source.rstrip("/").endswith("/" + key) else None
        return join(source, key)
    if os.path.isfile(source):
        return source
    # judged by name, not by where links lead: a folder of links is read as score read it
    # (io.walk); a key that climbs out of the folder is one expand_inputs never makes
    if key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        return None
    path = os.path.join(source, key)
    if not os.path.exists(path):
        path = _unescaped(source, key)
    return path


def _unescaped(source: str, key: str) -> str:
    """``source/key`` where the key's file name bytes were not UTF-8 (``expand_inputs`` wrote them
    as ``\\xNN``): each part is matched against the folder's entries as they were written."""
    path = source
    for part in key.split("/"):
        if not os.path.exists(os.path.join(path, part)) and os.path.isdir(path):
            part = next((n for n in sorted(os.listdir(path)) if valid_text(n) == part), part)
        path = os.path.join(path, part)
    return path


def _prepared(f: Fetched, prepare) -> Fetched:
    """``f`` with its image replaced by ``prepare(image)`` (so the full image is not kept); a list
    of images (``every_image``) by the list of ``prepare`` of each."""
    if prepare is not None and f.image is not None:
        try:
            f.prepared = [prepare(im) for im in f.image] if isinstance(f.image, list) else prepare(f.image)
        except Exception as exc:  # noqa: BLE001 - one image that cannot be shown is not fatal
            f.error = f"cannot show the image: {type(exc).__name__}: {exc}"
        f.image = None
    return f


def _decode_row(row, every_image: bool = False) -> Fetched:
    if row.data is None:
        return Fetched(error=row.missing)
    try:
        img = _decode_shown(row.data)
        return Fetched([img] if every_image else img)
    except DecodeError as exc:
        return Fetched(error=str(exc))


def _fetch_rows(source: str, keys: dict, image_column: str | None, prepare,
                every_image: bool = False) -> dict[tuple, Fetched]:
    """The wanted rows of a Parquet input, read once in order (only its image and key columns)."""
    from collapseguard.io.parquet import find_image_column, parquet_file, read_rows
    out: dict[tuple, Fetched] = {}
    left = dict(keys)
    seen: dict[str, int] = {}
    try:
        with parquet_file(source) as pf:
            for row in read_rows(pf, find_image_column(pf.schema_arrow, image_column, source),
                                 all_columns=False):
                nth = seen.get(row.key, 0)
                seen[row.key] = nth + 1
                if (row.key, nth) in left:
                    left.pop((row.key, nth))
                    out[(source, row.key, nth)] = _prepared(_decode_row(row, every_image), prepare)
                    if not left:
                        break
    except Exception as exc:  # noqa: BLE001 - a file that broke since scoring: said per row
        for k, n in left:
            out[(source, k, n)] = Fetched(error=f"cannot read {source}: {exc}")
        left = {}
    for k, n in left:
        out[(source, k, n)] = Fetched(error="row not found on second read")
    return out


def _source_kind(source: str) -> str | None:
    """The kind of a scored source as ``io.parse`` gave it: a ``pipe:`` command's by the last word
    that ends like a shard or Parquet file (``pipe:cat x.parquet`` is Parquet, as it was scored)."""
    try:
        return kind_of(basename_of(source))
    except URLError:  # a pipe: command naming no such word was never scored
        return None


def fetch_samples(wanted: Iterable[tuple], prepare=None, image_column: str | None = None,
                  sources: Collection[str] | None = None, every_image: bool = False
                  ) -> dict[tuple, Fetched]:
    """Read back ``(source, key, image member name[, nth])`` samples; returns ``{(source, key, nth):
    Fetched}``. ``nth`` (default 0) is which of the samples with that key in that shard: a key can
    repeat in a shard, and each repeat is a sample of its own.

    Each shard is streamed at most once; a sample that cannot be found or decoded gets an error.
    With ``prepare``, each decoded image is handed to ``prepare`` as soon as it is read and only
    the result is kept (``Fetched.prepared``): a gallery of hundreds of large images then holds one
    full-resolution image at a time, not all of them.

    ``sources``: the sources that may be read (None: any). A caller whose sources come from a
    file (a groups table) passes the ones it read as its own inputs, so a ``pipe:`` command, a URL
    or a local folder written into the file is never run, fetched or opened; its samples get an
    error instead.

    ``every_image``: each sample's every image is read, in member order (the image member name
    is not used): ``Fetched.image`` (``prepared`` with ``prepare``) is a list, of one image for an
    image file or a Parquet row. One image of a sample that cannot be decoded makes the sample an
    error, as ``filter`` scores nothing of such a sample.
    """
    allowed = None if sources is None else {path_key(s) for s in sources}
    by_source: dict[str, dict[tuple[str, int], str]] = {}
    for source, key, image, *nth in wanted:
        by_source.setdefault(source, {})[(key, int(nth[0]) if nth else 0)] = image or ""
    out: dict[tuple, Fetched] = {}
    for source, keys in by_source.items():
        if allowed is not None and path_key(source) not in allowed:
            for k, n in keys:
                out[(source, k, n)] = Fetched(error="not read: not a source this command read")
            continue
        kind = _source_kind(source)
        if kind == "parquet":
            out.update(_fetch_rows(source, keys, image_column, prepare, every_image))
            continue
        if scheme(source) == "pipe" or (is_shard(source) and (is_remote(source) or os.path.isfile(source))):
            left = dict(keys)
            seen: dict[str, int] = {}
            try:
                for sample in ShardReader(source):
                    nth = seen.get(sample.key, 0)
                    seen[sample.key] = nth + 1
                    if (sample.key, nth) in left:
                        members = [(m.name, m.data) for m in sample.members]
                        f = _prepared(_decode_member(members, left.pop((sample.key, nth)), every_image,
                                                     prepare), prepare)
                        f.caption = _caption(members, sample.key)
                        out[(source, sample.key, nth)] = f
                        if not left:
                            break
            except Exception as exc:  # a shard that broke since scoring: say so per sample
                for k, n in left:
                    out[(source, k, n)] = Fetched(error=f"cannot read {source}: {exc}")
                left = {}
            for k, n in left:
                out[(source, k, n)] = Fetched(error="sample not found on second read")
        else:
            for key, n in keys:
                path = _file_path(source, key)
                if path is None:
                    out[(source, key, n)] = Fetched(error="path outside its input folder")
                    continue
                try:
                    img = _decode_shown(read_bytes(path))
                    out[(source, key, n)] = _prepared(Fetched([img] if every_image else img), prepare)
                except (OSError, DecodeError, ValueError) as exc:  # ValueError: a refused URL
                    out[(source, key, n)] = Fetched(error=str(exc))
    return out


def thumbnail(img: np.ndarray, max_side: int = 200) -> np.ndarray:
    """A downscaled copy (longest side ``max_side``) for the overview only."""
    h, w = img.shape[:2]
    scale = min(1.0, max_side / max(h, w))
    if scale >= 1.0:
        return img
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(img).resize(size, Image.Resampling.LANCZOS))


def detail_window(img: np.ndarray, size: int = 256) -> tuple[int, int, int, int]:
    """``(y, x, h, w)`` of a ``size`` x ``size`` window (smaller if the image is) in the most
    textured part of the image, with a mild preference for the centre. An RGBA image is judged
    as it was scored, composited (``images.rgba_composite``)."""
    if img.ndim == 3 and img.shape[2] == 4:
        img = rgba_composite(img)
    h, w = img.shape[:2]
    ch, cw = min(size, h), min(size, w)
    if ch == h and cw == w:
        return 0, 0, h, w
    y = img.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    g = np.zeros_like(y)
    g[:, 1:] += np.abs(np.diff(y, axis=1))
    g[1:, :] += np.abs(np.diff(y, axis=0))
    ii = np.pad(g.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    stride = max(8, size // 8)
    ys = np.unique(np.r_[np.arange(0, h - ch + 1, stride), h - ch])
    xs = np.unique(np.r_[np.arange(0, w - cw + 1, stride), w - cw])
    Y, X = np.meshgrid(ys, xs, indexing="ij")
    energy = ii[Y + ch, X + cw] - ii[Y, X + cw] - ii[Y + ch, X] + ii[Y, X]
    cy, cx = (h - ch) / 2, (w - cw) / 2
    dist = np.hypot((Y - cy) / max(h, 1), (X - cx) / max(w, 1))
    score = energy * (1.0 - 0.6 * dist)
    i, j = np.unravel_index(int(np.argmax(score)), score.shape)
    return int(Y[i, j]), int(X[i, j]), ch, cw


def detail_crop(img: np.ndarray, size: int = 256) -> tuple[np.ndarray, tuple[int, int]]:
    """The native-resolution (1:1, not resampled) crop of ``detail_window`` and its ``(y, x)``."""
    y, x, ch, cw = detail_window(img, size)
    return img[y: y + ch, x: x + cw], (y, x)


def jpeg_bytes(img: np.ndarray, quality: int = 85) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.asarray(img, np.uint8)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def data_uri(data: bytes, mime: str) -> str:
    """A ``data:`` URI for embedding (base64 has no characters that need HTML escaping)."""
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def png_uri(img: np.ndarray) -> str:
    """Lossless PNG data URI (for crops: compression must not add or hide damage)."""
    return data_uri(encode_png(img), "image/png")


def jpeg_uri(img: np.ndarray, quality: int = 85) -> str:
    return data_uri(jpeg_bytes(img, quality), "image/jpeg")


def thumb_uri(img: np.ndarray) -> str:
    """The overview image: JPEG, or PNG for an RGBA image (JPEG has no transparency)."""
    return png_uri(img) if img.ndim == 3 and img.shape[2] == 4 else jpeg_uri(img)
