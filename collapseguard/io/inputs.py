"""Turning command-line inputs into shards and image files.

An input is an image file, a folder (searched recursively for images and shards), a shard
(``.tar``, ``.tar.gz``, ``.tgz``), or a brace pattern such as ``data/shard-{000..009}.tar``
(expanded like the shell and webdataset do, including zero-padded ranges). Glob characters
(``*``, ``?``) are expanded too. Each may also be a URL (``io.urls``): ``file:``, ``pipe:CMD``
(a shard), or an fsspec URL naming an object, a folder/prefix or a glob.
"""

from __future__ import annotations

import glob
import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import braceexpand

from collapseguard.errors import CollapseguardError
from collapseguard.images import is_image_name
from collapseguard.io.tar import valid_text
from collapseguard.io.terminal import first_of, printable
from collapseguard.io.urls import (
    SHARD_SUFFIXES,
    URLError,
    is_remote,
    is_shard_name,
    list_url,
    local_path,
    scheme,
    url_path,
)
from collapseguard.io.walk import Walk, walk

__all__ = ["SHARD_SUFFIXES", "ImageFile", "InputError", "expand_inputs", "expand_shards",
           "expand_pattern", "is_shard", "local_name", "unique_inputs"]


#: tars compressed otherwise than with gzip: not taken for shards (their outputs could not be
#: written in kind), so a folder holding one names it rather than passing over its samples
OTHER_TAR_SUFFIXES = (".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tbz", ".tar.zst", ".tzst", ".tar.lz4")
OTHER_TAR_WHY = ("a tar compressed other than with gzip: shards are .tar, .tar.gz or .tgz "
                 "(decompress it, or recompress it with gzip)")

#: why io.walk skipped something that is read anyway (a loop, a folder reached twice)
LOSSLESS_SKIPS = ("a link loop", "a link to a folder already read")
BROKEN_LINK = "a broken link (or a link loop)"


def unread_in(root: str | os.PathLike, walked: Walk, every_broken_link: bool = False) -> list[tuple[str, str]]:
    """``(path, why)`` for what a walked folder holds and cannot be read: what ``io.walk``
    skipped and lost (not a link loop or a folder reached twice: those are read once), each
    broken link not named like an image or shard (it may have pointed to a folder; a broken image
    link is an error row of its own, unless ``every_broken_link``), and each tar compressed other
    than with gzip."""
    out = [(os.path.join(root, rel), why) for rel, why in walked.skipped if not why.startswith(LOSSLESS_SKIPS)]
    for p in walked.paths:
        if p.is_symlink() and not p.exists():
            if every_broken_link or not (is_shard(p.name) or is_image_name(p.name)):
                out.append((str(p), BROKEN_LINK))
        elif p.name.lower().endswith(OTHER_TAR_SUFFIXES):
            out.append((str(p), OTHER_TAR_WHY))
    return out


def unread_text(unread: list[tuple[str, str]], consequence: str, shown: int = 5) -> str:
    """One line naming what was not read (the first ``shown``, escaped for the terminal) and
    what that would cost."""
    named = first_of([f"{printable(path)}: {why}" for path, why in unread], shown)
    return f"not read: {named}; {consequence}"


class InputError(CollapseguardError, ValueError):
    """An input path or pattern does not name anything usable."""


@dataclass(frozen=True)
class ImageFile:
    """An image file and the key it is reported under (path relative to the folder given).

    ``path`` is the name as the filesystem has it; ``key`` and ``source`` are valid text for
    tables and reports (bytes of a file name that are not UTF-8 are written as ``\\xNN``).
    """

    path: str
    key: str
    source: str


def expand_pattern(pattern: str) -> list[str]:
    """Expand braces (``{000..009}``, ``{a,b}``) then globs; keeps order, drops duplicates. A path
    that exists as written (``part[1].tar``, ``a{b}.tar``) is that path, not a pattern."""
    if os.path.lexists(pattern):
        return [pattern]
    out: list[str] = []
    for p in braceexpand.braceexpand(pattern):
        if any(ch in p for ch in "*?["):
            out.extend(sorted(glob.glob(p)))
        else:
            out.append(p)
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def is_shard(path: str) -> bool:
    return is_shard_name(path)


def _expand_url(raw: str, shards: list[str], files: list[ImageFile],
                failed: list[tuple[str, str]] | None = None) -> None:
    """Shards and image files named by a ``pipe:`` or fsspec URL (braces expanded). A URL that
    cannot be listed raises InputError, or, given ``failed``, is appended there as ``(url, why)``
    and the other inputs go on."""
    for url in braceexpand.braceexpand(raw):
        if scheme(url) == "pipe":
            shards.append(url)
            continue
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
            continue
        if not entries:
            raise InputError(f"{url!r} matched nothing")
        for u, key in entries:
            if is_shard_name(u):
                shards.append(u)
            elif is_image_name(url_path(u)):
                files.append(ImageFile(u, valid_text(key or posixpath.basename(url_path(u))),
                                       valid_text(url if key else u)))
            elif key is None:
                raise InputError(f"{u}: not a .tar shard or an image file")


def local_name(path) -> str:
    """A local path as a name no reader takes for a URL: ``pipe:x.png`` found in the current
    folder (or given as ``file:pipe:x.png``) becomes ``./pipe:x.png``."""
    name = str(path)
    return name if scheme(name) == "" else os.path.join(os.curdir, name)


def expand_inputs(inputs: Iterable[str], unread: list[tuple[str, str]] | None = None,
                  failed: list[tuple[str, str]] | None = None) -> tuple[list[str], list[ImageFile]]:
    """Shards and image files named by ``inputs``, each in a stable order.

    ``unread`` (optional) receives ``(path, why)`` for what a folder holds and cannot be read: a
    subfolder that cannot be listed, an entry that cannot be examined, a broken link that is not
    named like an image or shard (it may have pointed to a folder). A link loop or a second link
    to a folder already read loses nothing (the folder is read once) and is not listed.

    ``failed`` (optional) receives ``(url, why)`` for a URL that cannot be listed (a 404, an error
    status, a redirect loop, a subfolder whose page cannot be read): that input fails and the
    others are expanded; without it, such a URL raises InputError.

    Raises InputError for a path that does not exist or is neither a shard, an image nor a folder.
    """
    shards: list[str] = []
    files: list[ImageFile] = []
    for raw in inputs:
        raw = str(raw)
        if is_remote(raw):
            _expand_url(raw, shards, files, failed)
            continue
        paths = expand_pattern(local_path(raw) or raw)
        if not paths:
            raise InputError(f"{raw!r} matched nothing")
        for p in paths:
            if os.path.isdir(p):
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
                    name = full.name
                    if is_shard(name):
                        shards.append(local_name(full))
                    elif is_image_name(name):
                        files.append(ImageFile(local_name(full), valid_text(full.relative_to(root).as_posix()),
                                           valid_text(str(root))))
            elif os.path.isfile(p):
                if is_shard(p):
                    shards.append(local_name(p))
                elif is_image_name(p):
                    files.append(ImageFile(local_name(p), valid_text(os.path.basename(p)), valid_text(p)))
                elif p.lower().endswith(OTHER_TAR_SUFFIXES):
                    raise InputError(f"{p}: {OTHER_TAR_WHY}")
                else:
                    raise InputError(f"{p}: not a shard (.tar, .tar.gz, .tgz) or an image file")
            elif os.path.exists(p):
                raise InputError(f"{p}: not a regular file or folder (a FIFO, socket or device)")
            else:
                raise InputError(f"{p}: no such file or folder")
    return shards, files


def expand_shards(inputs: Iterable[str]) -> list[str]:
    """Only the shards named by ``inputs`` (folders searched for ``*.tar``); errors if none."""
    shards, files = expand_inputs(inputs)
    if files and not shards:
        raise InputError("no .tar shards among the inputs (filter works on WebDataset shards; "
                         "use `collapseguard score` for loose image files)")
    if not shards:
        raise InputError("no .tar shards found in the inputs")
    return shards


def unique_inputs(shards: list[str], files: list[ImageFile]) -> tuple[list[str], list[ImageFile]]:
    """``shards`` and ``files`` with each file kept once, under its first name: a file named twice,
    under two spellings, or also found inside a folder given (``score``, ``audit``)."""
    seen: set[str] = set()

    def first(path: str) -> bool:
        real = path if is_remote(path) else os.path.realpath(local_path(path) or path)
        return not (real in seen or seen.add(real))
    return [s for s in shards if first(s)], [f for f in files if first(f.path)]
