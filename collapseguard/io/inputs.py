"""Turning command-line inputs into shards, Parquet files and image files.

An input is an image file, a folder (searched recursively for images, shards and Parquet files),
a shard (``.tar``, ``.tar.gz``, ``.tgz``), a Parquet file (``.parquet``: images as bytes in a
column, ``io.parquet``), or a brace pattern such as ``data/shard-{000..009}.tar`` (expanded like
the shell and webdataset do, including zero-padded ranges). Glob characters (``*``, ``?``) are
expanded too. Each may also be a URL (``io.urls``): ``file:``, ``pipe:CMD`` (a shard), or an
fsspec URL naming an object, a folder/prefix or a glob. Each argument is parsed once
(``io.parse``, where the rule for ``pipe:`` lives) and each shard or Parquet file comes out as an
``io.parse.Input``.
"""

from __future__ import annotations

import os
import posixpath
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from collapseguard.images import IMAGE_EXTENSIONS, heif_hint, is_image_name
from collapseguard.io.parse import (
    OTHER_TAR_SUFFIXES,
    OTHER_TAR_WHY,
    Input,
    InputError,
    expand_pattern,
    local_name,
    parse_argument,
    parse_found,
    parse_url,
    strip_suffix,
)
from collapseguard.io.tar import valid_text
from collapseguard.io.terminal import first_of, printable
from collapseguard.io.urls import (
    SHARD_SUFFIXES,
    URLError,
    is_remote,
    is_shard_name,
    list_url,
    local_path,
    url_path,
)
from collapseguard.io.walk import Walk, walk

__all__ = [
    "OTHER_TAR_SUFFIXES",
    "OTHER_TAR_WHY",
    "SHARD_SUFFIXES",
    "ImageFile",
    "Input",
    "InputError",
    "expand",
    "expand_inputs",
    "expand_pattern",
    "expand_shards",
    "failed_text",
    "is_shard",
    "local_name",
    "other_files_note",
    "unique_inputs",
]



#: why io.walk skipped something that is read anyway (a loop, a folder reached twice)
LOSSLESS_SKIPS = ("a link loop", "a link to a folder already read")
BROKEN_LINK = "a broken link (or a link loop)"


def unread_in(root: str | os.PathLike, walked: Walk, every_broken_link: bool = False) -> list[tuple[str, str]]:
    """``(path, why)`` for what a walked folder holds and cannot be read: what ``io.walk``
    skipped and lost (not a link loop or a folder reached twice: those are read once), each
    broken link not named like an image (a shard's, or one that may have pointed to a folder; a
    broken image link is an error row of its own, unless ``every_broken_link``), and each tar
    compressed other than with gzip."""
    out = [(os.path.join(root, rel), why) for rel, why in walked.skipped if not why.startswith(LOSSLESS_SKIPS)]
    for p in walked.paths:
        if p.is_symlink() and not p.exists():
            if every_broken_link or not is_image_name(p.name):
                out.append((str(p), BROKEN_LINK))
        elif p.name.lower().endswith(OTHER_TAR_SUFFIXES):
            out.append((str(p), OTHER_TAR_WHY))
    return out


def unread_text(unread: list[tuple[str, str]], consequence: str, shown: int = 5) -> str:
    """One line naming what was not read (the first ``shown``, escaped for the terminal) and
    what that would cost."""
    named = first_of([f"{printable(path)}: {why}" for path, why in unread], shown)
    return f"not read: {named}; {consequence}"


def failed_text(failed: list[tuple[str, str]], consequence: str, shown: int = 5) -> str:
    """One line naming the URL inputs that could not be listed (``expand``'s ``failed``: each
    ``why`` names its URL) and what that costs."""
    return f"cannot read: {first_of([printable(why) for _, why in failed], shown)}; {consequence}"


@dataclass(frozen=True)
class ImageFile:
    """An image file and the key it is reported under (path relative to the folder given).

    ``path`` is the name as the filesystem has it; ``key`` and ``source`` are valid text for
    tables and reports (bytes of a file name that are not UTF-8 are written as ``\\xNN``).
    """

    path: str
    key: str
    source: str


def is_shard(path: str) -> bool:
    return is_shard_name(path)


def other_extension(name: str) -> str:
    """How ``other_files_note`` names the type of a file no reader takes: its extension in lower
    case with the dot (``.heic``), ``"(no extension)"`` for a name without one."""
    base = posixpath.basename(name)
    return "." + base.rsplit(".", 1)[1].lower() if "." in base.lstrip(".") else "(no extension)"


def other_files_note(others: Counter, shown: int = 6, parquet: bool = True,
                     where: str = "the folders given") -> str:
    """One line on the files ``where`` holds that are no image, shard or Parquet file by name
    (``expand``'s ``others``: extension -> count) and were left out, "" for none
    (``parquet=False``: for a reader of images and shards only, which counts Parquet files too).
    HEIC/HEIF files among them (pillow-heif not installed) come with what to install to read them
    (``images.heif_hint``)."""
    if not others:
        return ""
    top = sorted(others.items(), key=lambda kv: (-kv[1], kv[0]))
    named = ", ".join(f"{printable(ext)} ({n})" for ext, n in top[:shown])
    more = f" and {len(top) - shown} more type(s)" if len(top) > shown else ""
    n = sum(others.values())
    hint = heif_hint(others)
    return (f"{n} file(s) in {where} were not read, not being an image type: {named}{more} "
            f"(images are .{', .'.join(IMAGE_EXTENSIONS)}; shards .tar, .tar.gz, .tgz"
            f"{'; .parquet' if parquet else ''}){'; ' + hint if hint else ''}")


def _expand_url(url: str, data: list[Input], files: list[ImageFile],
                failed: list[tuple[str, str]] | None = None, others: Counter | None = None,
                image_column: str | None = None) -> None:
    """Shards, Parquet files and image files named by an fsspec URL location (an object, a
    folder/prefix, a glob). Nothing a listing returns is ever a command. A URL that cannot be
    listed raises InputError, or, given ``failed``, is appended there as ``(url, why)`` and the
    other inputs go on."""
    try:
        entries = list_url(url)
    except (URLError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            # a server that cannot be reached is a URLError from list_url, named as such
            why = f"{printable(url)}: no such object or folder"
        elif isinstance(exc, URLError):
            why = str(exc)
        else:
            why = f"{printable(url)}: cannot be read: {type(exc).__name__}: {printable(exc)}"
        if failed is None:
            raise InputError(why) from None
        failed.append((url, why))
        return
    if not entries:
        raise InputError(f"{url!r} matched nothing")
    for u, key in entries:
        found = parse_url(u)
        if found is None:
            if key is None:
                hint = "" if "." in posixpath.basename(url_path(u)) else " (a folder URL ends in /)"
                raise InputError(f"{u}: not a .tar shard, a Parquet file or an image file{hint}")
            if others is not None and not u.lower().endswith(OTHER_TAR_SUFFIXES):
                others[other_extension(url_path(u))] += 1
        elif found.kind == "image":
            files.append(ImageFile(u, valid_text(key or posixpath.basename(url_path(u))),
                                   valid_text(url if key else u)))
        elif found.kind != "parquet" or key is None or (not _is_sidecar_url(u, entries)
                                                         and may_hold_images(u, image_column)):
            data.append(found)


def may_hold_images(name: str, image_column: str | None = None) -> bool:
    """``io.parquet.may_hold_images``, imported when a Parquet file is found (pyarrow loads then)."""
    from collapseguard.io.parquet import may_hold_images as check
    return check(name, image_column)


def _is_sidecar_url(u: str, entries) -> bool:
    """Is the listed Parquet object ``u`` an img2dataset sidecar of a shard listed beside it?"""
    folder, name = u.rsplit("/", 1)
    stems = {strip_suffix(e.rsplit("/", 1)[1]) for e, _ in entries
             if e.startswith(folder + "/") and "/" not in e[len(folder) + 1:] and is_shard_name(e)}
    return any(name.startswith(st + ".") for st in stems)


def _is_sidecar(path: Path) -> bool:
    """Is the Parquet file ``path``, found in a folder, an img2dataset sidecar (a shard beside it
    whose stem starts its name: ``00000.parquet`` beside ``00000.tar``)? A sidecar travels with
    its shard (``filter.sidecars``) and is no input of its own."""
    try:
        names = [e.name for e in os.scandir(path.parent)]
    except OSError:
        return False
    return any(path.name.startswith(strip_suffix(n) + ".") for n in names if is_shard(n))


def _expand_folder(p: str, data: list[Input], files: list[ImageFile],
                   unread: list[tuple[str, str]] | None, others: Counter | None = None,
                   image_column: str | None = None) -> None:
    root = Path(p)
    try:
        os.scandir(p).close()
    except OSError as exc:
        raise InputError(f"{p}: cannot list the folder ({exc.strerror or exc})") from None
    # folder links followed once, loops skipped; file links read (io.walk's rule)
    walked = walk(root, file_links="anywhere")
    if unread is not None:
        unread.extend(unread_in(p, walked))
    for full in walked.paths:
        found = parse_found(full)
        if found is not None and found.kind != "image" and unread is not None \
                and full.is_symlink() and not full.exists():
            continue  # a broken link named like a shard or Parquet file: among ``unread``
        if found is None:
            # a tar compressed otherwise is among ``unread`` (an error); a broken link is no file
            if others is not None and not full.name.lower().endswith(OTHER_TAR_SUFFIXES) and full.is_file():
                others[other_extension(full.name)] += 1
            continue
        if found.kind == "image":
            files.append(ImageFile(found.name, valid_text(full.relative_to(root).as_posix()),
                                   valid_text(str(root))))
        elif found.kind != "parquet" or (not _is_sidecar(full)
                                         and may_hold_images(found.name, image_column)):
            data.append(found)


def expand(inputs: Iterable[str], unread: list[tuple[str, str]] | None = None,
           failed: list[tuple[str, str]] | None = None, *,
           allow_pipe: bool = True, others: Counter | None = None,
           image_column: str | None = None) -> tuple[list[Input], list[ImageFile]]:
    """The data inputs (tar shards and Parquet files, each an ``io.parse.Input``) and the image
    files named by ``inputs`` (command-line arguments, parsed by ``io.parse.parse_argument``),
    each in a stable order.

    A folder is searched recursively: its shards, Parquet files and image files; an fsspec URL
    location is listed the same way. A Parquet file found there is an input unless it is an
    img2dataset sidecar (beside a shard whose stem starts its name, ``00000.parquet`` beside
    ``00000.tar``: it travels with its shard) or a table with no column that could hold image
    bytes (``io.parquet.may_hold_images``: a scores table, say; the column ``image_column`` names,
    ``--image-column``, counts as an image-named one); a Parquet file named on the command line is
    always an input. ``unread``
    (optional) receives ``(path, why)`` for what a folder holds and cannot be read: a subfolder
    that cannot be listed, an entry that cannot be examined, a broken link that is not named like
    an image or shard (it may have pointed to a folder). A link loop or a second link to a folder
    already read loses nothing (the folder is read once) and is not listed. ``allow_pipe=False``
    refuses ``pipe:`` commands (``--no-pipe``).

    ``failed`` (optional) receives ``(url, why)`` for a URL that cannot be listed (a 404, an error
    status, a redirect loop, a subfolder whose page cannot be read): that input fails and the
    others are expanded; without it, such a URL raises InputError.

    ``others`` (optional) counts, by extension (``other_extension``), the files the folders and
    URL locations hold that are no shard, Parquet file or image by name (``images.IMAGE_EXTENSIONS``)
    and are left out (``other_files_note`` says it in one line).

    Raises InputError for a path that does not exist or is neither a shard, a Parquet file, an
    image nor a folder.
    """
    data: list[Input] = []
    files: list[ImageFile] = []
    for raw in inputs:
        for item in parse_argument(raw, allow_pipe=allow_pipe):
            if item.kind == "url":
                _expand_url(item.name, data, files, failed, others, image_column)
            elif item.kind == "folder":
                _expand_folder(item.display, data, files, unread, others, image_column)
            elif item.kind == "image":
                files.append(ImageFile(item.name, valid_text(os.path.basename(item.display)),
                                       valid_text(item.display)))
            else:
                data.append(item)
    return data, files


def expand_inputs(inputs: Iterable[str], unread: list[tuple[str, str]] | None = None,
                  failed: list[tuple[str, str]] | None = None) -> tuple[list[str], list[ImageFile]]:
    """``expand`` with the tar shards as the names their readers open (Parquet files left out):
    for readers of shards alone."""
    data, files = expand(inputs, unread, failed)
    return [d.name for d in data if d.kind != "parquet"], files


def expand_shards(inputs: Iterable[str]) -> list[Input]:
    """Only the shards and Parquet files named by ``inputs`` (folders searched); errors if none."""
    shards, files = expand(inputs)
    if files and not shards:
        raise InputError("no .tar shards or Parquet files among the inputs (filter works on "
                         "WebDataset shards and Parquet files; use `collapseguard score` for loose "
                         "image files)")
    if not shards:
        raise InputError("no .tar shards found in the inputs (and no Parquet files)")
    return shards


def path_key(name: str) -> str:
    """A name as compared with other spellings of it: a local path by where it is (``./a.tar``
    and ``/abs/a.tar`` are one), an http(s) URL with its scheme and host in lower case and its
    path's percent-escapes decoded (``a b.tar`` and ``a%20b.tar`` are one request), anything else
    (object-store keys, where ``a b`` and ``a%20b`` are two keys; ``pipe:`` commands) as spelled."""
    try:
        return _http_key(name) if is_remote(name) else os.path.realpath(local_path(name) or name)
    except URLError:  # a file: URL naming another host: as spelled
        return name


def _http_key(url: str) -> str:
    """An http(s) URL as the server receives it, decoded: the same object under any spelling.
    An escaped ``/``, escapes that are not UTF-8, the query and the fragment stay as spelled,
    so two different objects never share a key."""
    from urllib.parse import quote, unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.netloc:
        return url
    try:
        path = unquote(parts.path.replace("%2F", "\0").replace("%2f", "\0"), errors="strict")
    except UnicodeDecodeError:
        return url
    path = quote(path, safe="/\0").replace("\0", "%2F")
    host = parts.netloc if "@" in parts.netloc else parts.netloc.lower()  # user info as given
    return urlunsplit((scheme, host, path, parts.query, parts.fragment))


def unique_inputs(shards: list, files: list[ImageFile]) -> tuple[list, list[ImageFile]]:
    """``shards`` (names or ``io.parse.Input``) and ``files`` with each file kept once, under its
    first name: a file named twice, under two spellings, or also found inside a folder given
    (``score``, ``audit``)."""
    seen: set[str] = set()

    def first(path: str) -> bool:
        real = path_key(str(path))
        return not (real in seen or seen.add(real))
    return [s for s in shards if first(s)], [f for f in files if first(f.path)]


def refuse_overwriting_inputs(outputs: Iterable[str | os.PathLike], inputs: Iterable[str],
                              option: str = "--out") -> None:
    """InputError, before anything is read, when a file the command writes would replace one of
    its inputs: a local input named itself (``score data.parquet -o data.parquet``), or an
    existing file inside a local input folder that the folder's walk reads as input (``audit DIR
    -o DIR`` over a ``DIR/scores.parquet`` holding images; an earlier scores table, which the walk
    passes over, may be replaced). The outputs are written whole at the end, so nothing else
    would stop them from replacing the data they were made from. URLs are not compared."""
    parsed = [i for raw in inputs for i in parse_argument(raw)]  # nothing is listed or run here
    for out in outputs:
        out = str(out)
        if is_remote(out) or not os.path.exists(out):
            continue  # a new file replaces nothing
        real = os.path.realpath(local_path(out) or out)
        for i in parsed:
            if i.via != "local":
                continue
            where = os.path.realpath(local_path(i.name) or i.name)
            if i.kind == "folder":  # a file the folder's walk reads (not an earlier scores table)
                found = parse_found(real)
                hit = real.startswith(where.rstrip(os.sep) + os.sep) and found is not None and (
                    found.kind != "parquet" or may_hold_images(real))
            else:
                hit = real == where
            if hit:
                raise InputError(f"{option} {printable(out)} would replace the input "
                                 f"{printable(real)} ({printable(i.display)}): choose another {option}")
