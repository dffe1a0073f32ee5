"""Opening inputs by URL, with webdataset's conventions and fsspec.

A name is one of:

- a local path (no scheme), or ``file:PATH`` / ``file:///abs/path`` (webdataset's ``file:``);
- ``pipe:CMD``: the standard output of the shell command ``CMD`` (webdataset's ``pipe:``): read as
  it comes, and an exit status other than 0 (or 141, the command stopped by SIGPIPE because the
  reader had what it needed) is an error;
- any URL an installed fsspec protocol opens: ``http(s)://`` (needs aiohttp), ``s3://`` (s3fs),
  ``gs://`` (gcsfs), ``hf://``, ... Credentials and endpoints come from the protocol's usual
  environment (``AWS_ENDPOINT_URL``, ``~/.aws``, ...).

Every reader here streams: a shard is read front to back once, and nothing is downloaded whole.
``pipe:`` commands come from the command line only; names read from files (tables, manifests)
are never opened as ``pipe:``.
"""

from __future__ import annotations

import io
import os
import posixpath
import subprocess
from urllib.parse import urlparse
from urllib.request import url2pathname

from collapseguard.errors import CollapseguardError

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
GZIP_SUFFIXES = (".tar.gz", ".tgz")


class URLError(CollapseguardError, ValueError):
    """A URL that cannot be opened here (unknown protocol, package missing, not found)."""


def scheme(name: str) -> str:
    """``""`` for a local path, else the scheme: ``file``, ``pipe``, ``s3``, ``http``, ..."""
    if name.startswith("pipe:"):
        return "pipe"
    if name.startswith("file:"):
        return "file"
    if "://" not in name:
        return ""
    s = name.split("://", 1)[0]
    # a one-letter "scheme" is a Windows drive (C://); anything not a scheme's characters is a path
    if len(s) < 2 or not all(c.isalnum() or c in "+-." for c in s):
        return ""
    return s.lower()


def local_path(name: str) -> str | None:
    """The local path a name stands for (plain paths and ``file:``), None for other URLs."""
    s = scheme(name)
    if s == "":
        return name
    if s != "file":
        return None
    rest = name[len("file:"):]
    if rest.startswith("//"):
        parsed = urlparse(name)
        if parsed.netloc not in ("", "localhost"):
            raise URLError(f"{name}: file: URLs name files on this machine (host {parsed.netloc!r})")
        return url2pathname(parsed.path)
    return rest


def is_remote(name: str) -> bool:
    """True for ``pipe:`` and fsspec URLs (everything that is not a local file)."""
    return local_path(name) is None


def is_fsspec(name: str) -> bool:
    return scheme(name) not in ("", "file", "pipe")


def url_path(name: str) -> str:
    """The path part of a URL (no query or fragment); the name itself for local paths."""
    return urlparse(name).path if is_fsspec(name) else name


def is_shard_name(name: str) -> bool:
    """Does the name end like a tar shard (``.tar``, ``.tar.gz``, ``.tgz``)?"""
    return url_path(name).lower().endswith(SHARD_SUFFIXES)


def is_gzip_name(name: str) -> bool:
    return url_path(name).lower().endswith(GZIP_SUFFIXES)


def shard_basename(name: str) -> str:
    """The file name a shard's outputs are named after.

    A path or URL: its last path component. ``pipe:CMD``: the last word of the command that ends
    like a shard (``pipe:curl -s https://host/00007.tar`` -> ``00007.tar``); URLError if none does.
    """
    if scheme(name) == "pipe":
        for word in reversed(name[len("pipe:"):].split()):
            word = word.strip("'\"")
            if is_shard_name(word):
                return posixpath.basename(url_path(word))
        raise URLError(f"{name}: no word of the command ends in .tar, .tar.gz or .tgz, so its "
                       "outputs cannot be named; end the command with the shard's name")
    path = local_path(name)
    return os.path.basename(path) if path is not None else posixpath.basename(url_path(name))


def strip_shard_suffix(name: str) -> str:
    low = name.lower()
    for suffix in SHARD_SUFFIXES:
        if low.endswith(suffix):
            return name[: -len(suffix)]
    return name


def filesystem(url: str):
    """``(fsspec filesystem, path inside it)`` for an fsspec URL; URLError naming what to install
    when the protocol is unknown or its package is missing."""
    import fsspec
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise URLError(f"{url}: reading {scheme(url)}:// needs a package that is not installed "
                       f"({exc}); e.g. pip install s3fs (s3://), gcsfs (gs://), aiohttp (http://)") from None
    except ValueError as exc:
        raise URLError(f"{url}: {exc}") from None


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for a local folder or a URL (URLs keep their ``//``)."""
    if local_path(base) is not None and scheme(base) == "":
        return os.path.join(base, *parts)
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


def inside(child: str, parent: str) -> bool:
    """Is URL ``child`` ``parent`` itself or below it (same protocol)? For refusing an --out inside
    an input folder."""
    c, p = child.rstrip("/"), parent.rstrip("/")
    return c == p or c.startswith(p + "/")


class PipeStream(io.RawIOBase):
    """The standard output of ``sh -c CMD`` as a readable stream; the exit status is checked at
    the end of the stream and on close (0 and SIGPIPE's 141 are fine)."""

    OK = (0, 141, -13)  # -13: the shell itself was ended by SIGPIPE

    def __init__(self, command: str):
        super().__init__()
        self.command = command
        self.proc = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE)  # noqa: S602 - the user's own pipe: URL
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.proc.stdout.readinto(b)
        if not n and len(b):
            self._eof = True
            self._check(self.proc.wait())
        return n

    def _check(self, status: int) -> None:
        if status not in self.OK:
            raise OSError(f"pipe:{self.command}: the command exited with status {status}")

    def close(self) -> None:
        if self.closed:
            return
        self.proc.stdout.close()
        try:
            status = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        super().close()
        if not self._eof:
            return  # stopped early: the command is told by SIGPIPE; its status says nothing more
        self._check(status)


def open_stream(name: str, *, allow_pipe: bool = True):
    """A binary stream reading ``name`` front to back (local file, ``pipe:``, fsspec URL).

    FileNotFoundError for a missing file or object; URLError for a URL that cannot be opened here.
    """
    path = local_path(name)
    if path is not None:
        return open(path, "rb")
    if scheme(name) == "pipe":
        if not allow_pipe:
            raise URLError(f"{name}: pipe: is accepted on the command line only")
        return io.BufferedReader(PipeStream(name[len("pipe:"):]), buffer_size=1 << 16)
    fs, path = filesystem(name)
    kwargs = {"block_size": 0} if scheme(name) in ("http", "https") else {}  # no Range needed
    try:
        return fs.open(path, "rb", **kwargs)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such object") from None


def read_bytes(name: str, *, allow_pipe: bool = False) -> bytes:
    with open_stream(name, allow_pipe=allow_pipe) as f:
        return f.read()


def identity(name: str) -> dict:
    """What a filter completion marker records of an input, to tell on resume whether it changed.

    Local files: size and mtime. fsspec URLs: size and whichever of ETag and last-modified time the
    store reports. ``pipe:`` cannot be checked: ``{"pipe": CMD, "checked": False}``; a marker made
    from the same command is trusted (``--overwrite`` redoes it).
    """
    path = local_path(name)
    if path is not None:
        st = os.stat(path)
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if scheme(name) == "pipe":
        return {"pipe": name[len("pipe:"):], "checked": False}
    fs, p = filesystem(name)
    try:
        info = fs.info(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such object") from None
    out = {"size": info.get("size")}
    for field, keys in (("etag", ("ETag", "etag", "md5Hash", "Content-MD5")),
                        ("last_modified", ("LastModified", "Last-Modified", "last_modified",
                                           "mtime", "updated"))):
        value = next((info[k] for k in keys if info.get(k) is not None), None)
        if value is not None:
            out[field] = str(value)
    return out


def list_url(url: str) -> list[tuple[str, str | None]]:
    """The objects an fsspec URL names: ``[(url, None)]`` for one object, ``[(url, key), ...]``
    (key: the path below the folder) for a folder or prefix, searched recursively, and every match
    of a glob (``*``, ``?``, ``[``; not for http(s), whose query strings use ``?``). Sorted; empty
    when a glob matches nothing; FileNotFoundError when nothing is there."""
    fs, path = filesystem(url)
    web = scheme(url) in ("http", "https")
    if not web and any(ch in path for ch in "*?["):
        return [(fs.unstrip_protocol(p), None) for p in sorted(fs.glob(path))
                if fs.isfile(p)]
    folder = path.endswith("/") if web else fs.isdir(path)
    if folder:
        root = path.rstrip("/")
        found = sorted(fs.find(root if not web else path))
        if web:  # an index page may link anywhere: only what lies below the folder is in it
            found = [p for p in found if p.startswith(path) and ".." not in p[len(path):].split("/")]
        return [(p if web else fs.unstrip_protocol(p),
                 (p[len(path):] if web else p[len(root) + 1:]).lstrip("/")) for p in found]
    fs.info(path)  # FileNotFoundError when nothing is there; the store's own error otherwise
    return [(url, None)]
