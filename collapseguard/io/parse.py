"""Each input parsed once, into a small frozen value that every command shares.

An ``Input`` says what an input is (``kind``: ``tar``, ``tar.gz``, ``parquet``, ``image``, or before
expansion ``folder`` and ``url``, a location still to be listed), where it is read from (``via``:
``local``, ``url`` or ``pipe``), the name its reader opens (``name``), how the user or a listing
named it (``display``) and the names its outputs take (``basename``, ``stem``). ``io.inputs``
expands folders, patterns and URL locations into such values; ``filter``, ``score`` and ``audit``
consume them.

The rule for ``pipe:`` lives here, in ``parse_argument``:

- an argument that names an existing file (or folder) is that file, whatever it looks like:
  ``pipe:touch X; echo a.tar`` in the current folder is a shard to read, never a command;
- a ``pipe:CMD`` argument that names no file is the user's own command (braces in it expand into
  one command each, webdataset's convention), unless ``allow_pipe`` is false (``--no-pipe``);
- nothing else is ever a command: names found by a folder walk, a URL listing, a local brace or
  glob pattern, or read from a table are files or URLs (``parse_found``), and a local name that
  reads like a URL is written so that no reader takes it for one (``./pipe:x.tar``).
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote

import braceexpand

from collapseguard.errors import CollapseguardError
from collapseguard.images import is_image_name
from collapseguard.io.urls import (
    GZIP_SUFFIXES,
    SHARD_SUFFIXES,
    URLError,
    is_fsspec,
    local_path,
    scheme,
    url_path,
)

PARQUET_SUFFIXES = (".parquet",)
#: tars compressed otherwise than with gzip: not taken for shards (their outputs could not be
#: written in kind), so a folder holding one names it rather than passing over its samples
OTHER_TAR_SUFFIXES = (".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tbz", ".tar.zst", ".tzst", ".tar.lz4")
OTHER_TAR_WHY = ("a tar compressed other than with gzip: shards are .tar, .tar.gz or .tgz "
                 "(decompress it, or recompress it with gzip)")
#: the kinds an expanded input has (``folder`` and ``url`` are expanded away)
DATA_KINDS = ("tar", "tar.gz", "parquet")
KINDS = (*DATA_KINDS, "image", "folder", "url")
VIAS = ("local", "url", "pipe")


class InputError(CollapseguardError, ValueError):
    """An input path or pattern does not name anything usable."""


def kind_of(name: str) -> str | None:
    """The kind a file name says (``tar``, ``tar.gz``, ``parquet``, ``image``), None for others."""
    low = url_path(name).lower()
    if low.endswith(GZIP_SUFFIXES):
        return "tar.gz"
    if low.endswith(SHARD_SUFFIXES):
        return "tar"
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if is_image_name(low):
        return "image"
    return None


def strip_suffix(name: str) -> str:
    """A file name without its shard or Parquet suffix, in any letter case."""
    low = name.lower()
    for suffix in (*SHARD_SUFFIXES, *PARQUET_SUFFIXES):
        if low.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _pipe_basename(command: str) -> str:
    """The last word of a ``pipe:`` command that ends like a shard or Parquet file."""
    for word in reversed(command.split()):
        word = word.strip("'\"")
        if kind_of(word) in DATA_KINDS:
            return posixpath.basename(url_path(word))
    raise URLError(f"pipe:{command}: no word of the command ends in .tar, .tar.gz, .tgz or "
                   ".parquet, so its outputs cannot be named; end the command with the shard's name")


def basename_of(name: str) -> str:
    """The output file name of a name as readers open it (``Input.name``): a local path's or
    URL's last component, a ``pipe:`` command's last word that ends like a shard or Parquet file
    (URLError if none does)."""
    if scheme(name) == "pipe":
        return _pipe_basename(name[len("pipe:"):])
    path = local_path(name)
    if path is not None:
        return os.path.basename(path)
    base = posixpath.basename(url_path(name))
    return _unquoted(base) if scheme(name) in ("http", "https") else base


#: what a percent-decoded http(s) file name may not hold to be used as an output name
_NOT_A_NAME = re.compile(r"[/\\\x00-\x1f\x7f-\x9f]")


def _unquoted(base: str) -> str:
    """An http(s) URL's last path component as the server's file is named (``a%20b.tar`` is the
    file ``a b.tar``, as a local read of the same folder names it). A component that decodes to
    something that is not one safe file name (a slash, a control character, ``..``, bytes that
    are not UTF-8) keeps its encoded form."""
    try:
        decoded = unquote(base, errors="strict")
    except UnicodeDecodeError:
        return base
    return base if decoded in ("", ".", "..") or _NOT_A_NAME.search(decoded) else decoded


@dataclass(frozen=True)
class Input:
    """One input, parsed once. ``name`` is what its reader opens: a local path written so that no
    reader takes it for a URL (``./pipe:x.tar``), an fsspec URL, or ``pipe:CMD``; ``display`` is
    how the user or a walk named it."""

    kind: str
    name: str
    via: str
    display: str

    def __post_init__(self):
        if self.kind not in KINDS or self.via not in VIAS:
            raise ValueError(f"not an input kind and origin: {self.kind!r}, {self.via!r}")

    @property
    def path(self) -> str | None:
        """The local path (None for a URL or command)."""
        return self.name if self.via == "local" else None

    @property
    def basename(self) -> str:
        """The file name its outputs are named after (a command's: its last word that ends like a
        shard or Parquet file)."""
        return basename_of(self.name)

    @property
    def stem(self) -> str:
        """``basename`` without its shard or Parquet suffix (scores and markers are named by it)."""
        return strip_suffix(self.basename)

    def with_name(self, name: str) -> Input:
        """The same input under another spelling of its name (an absolute path for workers)."""
        return Input(self.kind, name, self.via, self.display)

    def __str__(self) -> str:
        return self.name


def local_name(path) -> str:
    """A local path as a name no reader takes for a URL: ``pipe:x.png`` found in the current
    folder (or given as ``file:pipe:x.png``) becomes ``./pipe:x.png``."""
    name = str(path)
    return name if scheme(name) == "" else os.path.join(os.curdir, name)


def parse_found(path) -> Input | None:
    """A local file found by a walk, a pattern or a listing: never a command, never a URL. None
    when its name says no kind (not a shard, Parquet file or image)."""
    kind = kind_of(os.path.basename(str(path)))
    if kind is None:
        return None
    return Input(kind, local_name(path), "local", str(path))


def parse_url(url: str) -> Input | None:
    """An object a URL listing returned: never a command. None when its name says no kind."""
    kind = kind_of(url)
    return None if kind is None else Input(kind, url, "url", url)


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


def is_pipe_argument(raw: str) -> bool:
    """Would ``parse_argument`` take ``raw`` for a command? Only when it starts with ``pipe:`` and
    names no existing file or folder."""
    return scheme(raw) == "pipe" and not os.path.lexists(raw)


def refuse_pipes(arguments, flag: str = "--no-pipe") -> None:
    """InputError naming the first argument that would run as a command (``--no-pipe``)."""
    for raw in arguments:
        if is_pipe_argument(str(raw)):
            raise InputError(f"{raw}: a pipe: command, refused by {flag} (pass a file, folder or URL)")


def parse_argument(raw, *, allow_pipe: bool = True) -> list[Input]:
    """What one command-line argument names, before folders and URL locations are expanded: a
    list of ``Input`` (a pattern or a ``pipe:`` command with braces names several). Kinds
    ``folder`` and ``url`` (a location to list) are expanded by ``io.inputs.expand``. InputError
    for a local name that matches nothing, is not a regular file or folder, or says no kind. See
    the module docstring for the ``pipe:`` rule."""
    raw = str(raw)
    if is_pipe_argument(raw):
        if not allow_pipe:
            refuse_pipes([raw])
        out = []
        for cmd in braceexpand.braceexpand(raw):
            kind = kind_of(_pipe_basename(cmd[len("pipe:"):]))
            out.append(Input(kind or "tar", cmd, "pipe", cmd))
        return out
    if not os.path.lexists(raw) and is_fsspec(raw):
        return [Input("url", url, "url", url) for url in braceexpand.braceexpand(raw)]
    path = raw if os.path.lexists(raw) else (local_path(raw) or raw)
    paths = expand_pattern(path)
    if not paths:
        raise InputError(f"{raw!r} matched nothing")
    out = []
    for p in paths:
        if os.path.isdir(p):
            out.append(Input("folder", local_name(p), "local", p))
        elif os.path.isfile(p):
            found = parse_found(p)
            if found is None:
                if p.lower().endswith(OTHER_TAR_SUFFIXES):
                    raise InputError(f"{p}: {OTHER_TAR_WHY}")
                raise InputError(f"{p}: not a shard (.tar, .tar.gz, .tgz), a Parquet file or an "
                                 "image file")
            out.append(found)
        elif os.path.exists(p):
            raise InputError(f"{p}: not a regular file or folder (a FIFO, socket or device)")
        else:
            raise InputError(f"{p}: no such file or folder")
    return out
