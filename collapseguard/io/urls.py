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
``pipe:`` commands come from the command line only (``io.parse.parse_argument`` decides which
argument is one: never a name that exists as a file); names read from files (tables, manifests)
are never opened as ``pipe:``.

A loose file read whole (``read_bytes``: an image given by name or found in a folder) is read only
when it is a regular file (a FIFO, socket, device or folder is refused without being opened in a
way that could block) and only up to ``io.tar.MAX_MEMBER_BYTES``, the cap on a tar member: a file,
link or URL body over it is refused with ``UnreadableFileError``, an ``OSError`` the callers record
against that one file.

http(s) and ``pipe:`` reads have no time limit on a whole transfer, however slow, but fail when the
server or command sends nothing for ``read_timeout()`` seconds (``HTTP_READ_TIMEOUT`` unless
``COLLAPSEGUARD_READ_TIMEOUT`` says otherwise; ``HTTP_CONNECT_TIMEOUT`` to connect); a shard's size
is bounded where it is read (``io.tar.MAX_SHARD_BYTES``). Opening or reading
a URL that fails for the network's or the server's reasons (an error status such as 500 or 403, a
server that cannot be reached, a timeout, a connection that closes before the body it announced is
whole) raises ``NetworkError``, an ``OSError`` with an errno whose message names the URL and what
happened, so shard readers report it as such and not as damaged data; ``list_url`` says the same in
a ``URLError``. Only a 404 (or a store's "not found") is a ``FileNotFoundError``.
"""

from __future__ import annotations

import contextlib

import errno
import io
import os
import posixpath
import subprocess
from urllib.parse import unquote, urlparse, urlsplit
from urllib.request import url2pathname

from collapseguard.errors import CollapseguardError
from collapseguard.io.terminal import printable

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
GZIP_SUFFIXES = (".tar.gz", ".tgz")


#: seconds a read of an http(s) body or a ``pipe:`` command's output may wait for the next bytes
#: before it fails (the environment variable ``COLLAPSEGUARD_READ_TIMEOUT`` overrides it; the
#: size of a whole shard is bounded by ``io.tar.MAX_SHARD_BYTES``)
HTTP_READ_TIMEOUT = 60.0
#: seconds to connect to an http(s) server
HTTP_CONNECT_TIMEOUT = 30.0


def read_timeout() -> float:
    """The read-progress timeout in seconds: ``COLLAPSEGUARD_READ_TIMEOUT`` when it is a positive
    number, else ``HTTP_READ_TIMEOUT``."""
    try:
        value = float(os.environ.get("COLLAPSEGUARD_READ_TIMEOUT", ""))
    except ValueError:
        return HTTP_READ_TIMEOUT
    return value if 0 < value < float("inf") else HTTP_READ_TIMEOUT


class URLError(CollapseguardError, ValueError):
    """A URL that cannot be opened here (unknown protocol, package missing), or a location that
    cannot be listed (``list_url``: an error status from the server, a server that cannot be
    reached)."""


class NetworkError(CollapseguardError, OSError):
    """Opening or reading a URL failed: an error status from the server, a server that cannot be
    reached, a timeout, a connection closed early. It carries an errno, so that readers tell it
    from damaged data (and record it per file where they record OS errors); its message names the
    URL."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)

    def __str__(self) -> str:
        return self.strerror


class PipeError(CollapseguardError, OSError):
    """A ``pipe:`` command exited with a status other than 0 (or SIGPIPE's 141). It carries an
    errno, so that shard readers report it as the command's failure and not as damaged data
    (the bytes it wrote before failing may stop anywhere); its message names the command."""

    def __init__(self, message: str):
        super().__init__(errno.EIO, message)

    def __reduce__(self):  # pickles with its own argument (it crosses worker processes)
        return type(self), (self.strerror,)

    def __str__(self) -> str:
        return self.strerror


class UnreadableFileError(CollapseguardError, OSError):
    """A loose file or URL body ``read_bytes`` refuses: not a regular file, or over the size cap."""


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
    """The path of a URL, to judge a name by: for http(s) without query or fragment (``;`` stays:
    ``shard;v2.tar`` is a shard), for other stores everything after ``scheme://`` (an object key
    may hold ``#`` or ``?``); the name itself for local paths."""
    if not is_fsspec(name):
        return name
    if scheme(name) in ("http", "https"):
        return urlsplit(name).path
    return name.split("://", 1)[1]


def is_shard_name(name: str) -> bool:
    """Does the name end like a tar shard (``.tar``, ``.tar.gz``, ``.tgz``)?"""
    return url_path(name).lower().endswith(SHARD_SUFFIXES)


def is_gzip_name(name: str) -> bool:
    return url_path(name).lower().endswith(GZIP_SUFFIXES)


def _storage_options(url: str) -> dict:
    """fsspec options for ``url``: http(s) gets ``HTTP_READ_TIMEOUT`` between reads and
    ``HTTP_CONNECT_TIMEOUT`` to connect, and no total limit (aiohttp's default ends any transfer
    after 300 s, however steadily its bytes arrive)."""
    if scheme(url) not in ("http", "https"):
        return {}
    import aiohttp
    return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(
        total=None, sock_connect=HTTP_CONNECT_TIMEOUT, sock_read=read_timeout())}}


def filesystem(url: str):
    """``(fsspec filesystem, path inside it)`` for an fsspec URL; URLError naming what to install
    when the protocol is unknown or its package is missing."""
    import fsspec
    try:
        return fsspec.core.url_to_fs(url, **_storage_options(url))
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
    the end of the stream and on close (0 and SIGPIPE's 141 are fine; any other is a
    ``PipeError``, which closing does not raise again once a read has). A read that waits more
    than ``read_timeout()`` seconds for the next bytes is a ``PipeError`` too, and the command is
    stopped."""

    OK = (0, 141, -13)  # -13: the shell itself was ended by SIGPIPE

    def __init__(self, command: str):
        super().__init__()
        self.command = command
        # unbuffered: select() below must see every byte not yet handed out
        self.proc = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, bufsize=0,
                                     stdout=subprocess.PIPE)  # noqa: S602 - the user's own pipe: URL
        self._eof = False
        self._reported = False
        self._count = 0  # bytes handed out

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        import select
        wait = read_timeout()
        if len(b) and not select.select([self.proc.stdout], [], [], wait)[0]:
            self._reported = True
            self.proc.kill()
            raise PipeError(f"{printable('pipe:' + self.command)}: the command sent nothing for "
                            f"{wait:g} s (after {self._count} bytes); it was stopped")
        n = self.proc.stdout.readinto(b)
        self._count += n or 0
        if not n and len(b):
            self._eof = True
            self._check(self.proc.wait())
        return n

    def _check(self, status: int) -> None:
        if status not in self.OK:
            self._reported = True
            raise PipeError(f"{printable('pipe:' + self.command)}: the command exited with "
                            f"status {status}")

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
        if not self._eof or self._reported:
            # stopped early: the command is told by SIGPIPE, its status says nothing more; or the
            # read that reached the end raised the status already: closing adds nothing
            return
        self._check(status)


def _causes(exc: BaseException):
    """``exc`` and the exceptions it was raised from, outermost first."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status behind a failure (aiohttp's ClientResponseError), None if there is none."""
    for e in _causes(exc):
        status = getattr(e, "status", None)
        if isinstance(status, int) and type(e).__name__.endswith("ResponseError"):
            return status
    return None


def failure_reason(exc: BaseException) -> tuple[int, str] | None:
    """``(errno, what happened)`` for an fsspec failure, from the exceptions it was raised from:
    ``HTTP 500 (Internal Server Error) from the server``, ``the server cannot be reached (...)``, a
    timeout, too many redirects; None when it says nothing more than "not found" (a 404 included)."""
    status = _http_status(exc)
    if status is not None:
        if status == 404:
            return None
        msg = next((getattr(e, "message", "") for e in _causes(exc)
                    if getattr(e, "status", None) == status), "")
        return errno.EIO, f"HTTP {status}" + (f" ({printable(msg)})" if msg else "") + " from the server"
    for e in _causes(exc):
        kind = type(e).__name__
        if kind == "TooManyRedirects":
            return errno.ELOOP, "too many redirects"
        if kind.endswith("RedirectClientError"):
            return errno.EIO, f"a redirect that is not followed ({printable(e)})"
        if kind.startswith("ClientConnector") or isinstance(e, ConnectionError):
            cause = getattr(e, "os_error", e)
            return (getattr(cause, "errno", None) or errno.ECONNREFUSED,
                    f"the server cannot be reached ({printable(cause)})")
        if isinstance(e, TimeoutError):
            return errno.ETIMEDOUT, (f"network timeout: no answer from the server in time ("
                                     f"{HTTP_CONNECT_TIMEOUT:g} s to connect, {read_timeout():g} s "
                                     "to answer)")
    return None


def _open_failed(name: str, exc: BaseException, error=None) -> Exception:
    """The error to raise when fsspec cannot open or list ``name``: FileNotFoundError for "not
    found"; otherwise ``error`` (``NetworkError``, an OSError, by default; ``URLError`` for
    listing) naming the cause (an HTTP status, a server that cannot be reached, ...)."""
    found = failure_reason(exc)
    if found is None and isinstance(exc, FileNotFoundError):
        return FileNotFoundError(f"{name}: no such object")
    code, why = found or (errno.EIO, f"{type(exc).__name__}: {printable(exc)}")
    if error is URLError:
        return URLError(f"{printable(name)}: {why}")
    return NetworkError(code, f"{printable(name)}: {why}")


def _network_errors() -> tuple[type[BaseException], ...]:
    """The exception types of a transfer failing on the way: timeouts, and aiohttp's client errors
    when aiohttp is installed."""
    try:
        import aiohttp
    except ImportError:
        return (TimeoutError,)
    return (TimeoutError, aiohttp.ClientError)


def _store_errors() -> tuple[type[BaseException], ...]:
    """The exception types an object store's client raises that are no OSError: botocore's (no
    credentials, an endpoint that cannot be reached, a bad region) when it is installed."""
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return ()
    return (BotoCoreError,)


@contextlib.contextmanager
def store_call(name: str):
    """Run an object store's call: its failures on the way (a store that cannot be reached or
    died, no credentials, a timeout) come out as ``NetworkError`` naming ``name``, an OSError as
    every reader and writer of outputs expects, not botocore's or aiohttp's own exceptions."""
    try:
        yield
    except _network_errors() + _store_errors() as exc:
        raise _open_failed(name, exc) from None


class _NetworkStream:
    """An http(s) body as a read-only stream whose failures on the way are ``NetworkError``s: a
    read that waits more than ``HTTP_READ_TIMEOUT`` seconds, a connection that closes before the
    length the server announced. Everything else is the wrapped fsspec file's."""

    def __init__(self, name: str, f):
        self._name = name
        self._f = f
        self._count = 0  # bytes handed out
        self._eof = False

    def read(self, n: int = -1) -> bytes:
        # past the end, the body is not read again: readers probe there more than once (gzip
        # for a further member), and aiohttp logs each probe past the fifth with a stack trace
        if self._eof:
            return b""
        try:
            b = self._f.read(n)
        except _network_errors() as exc:
            raise self._failed(exc) from None
        self._count += len(b)
        self._eof = not b and n != 0
        return b

    def _failed(self, exc: BaseException) -> NetworkError:
        response = getattr(self._f, "r", None)  # aiohttp's response, for what arrived
        received = getattr(getattr(response, "content", None), "total_bytes", None)
        received = self._count if not isinstance(received, int) else max(received, self._count)
        if any(isinstance(e, TimeoutError) for e in _causes(exc)):
            return NetworkError(errno.ETIMEDOUT, f"{printable(self._name)}: network timeout: the "
                                f"server sent nothing for {read_timeout():g} s (after "
                                f"{received} bytes)")
        if any(type(e).__name__ in ("ClientPayloadError", "ContentLengthError")
               for e in _causes(exc)):
            announced = getattr(response, "content_length", None)
            of = f" of the {announced} announced" if announced is not None else ""
            return NetworkError(errno.ECONNRESET, f"{printable(self._name)}: the connection "
                                f"closed after {received} bytes{of}")
        return NetworkError(getattr(exc, "errno", None) or errno.EIO,
                            f"{printable(self._name)}: the transfer failed after {received} bytes "
                            f"({type(exc).__name__}: {printable(exc)})")

    @property
    def size(self) -> int | None:
        """The body's length as the server announced it (Content-Length), None if it did not."""
        announced = getattr(getattr(self._f, "r", None), "content_length", None)
        return announced if isinstance(announced, int) else None

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, attr):
        return getattr(self._f, attr)


def open_stream(name: str, *, allow_pipe: bool = True):
    """A binary stream reading ``name`` front to back (local file, ``pipe:``, fsspec URL).

    FileNotFoundError for a missing file or object; URLError for a URL that cannot be opened here
    (unknown protocol, package missing); NetworkError for an error status, a server that cannot be
    reached, and (http(s)) a read timeout or a connection closed early.
    """
    path = local_path(name)
    if path is not None:
        return open(path, "rb")
    if scheme(name) == "pipe":
        if not allow_pipe:
            raise URLError(f"{name}: pipe: is accepted on the command line only")
        return io.BufferedReader(PipeStream(name[len("pipe:"):]), buffer_size=1 << 16)
    fs, path = filesystem(name)
    web = scheme(name) in ("http", "https")
    kwargs = {"block_size": 0} if web else {}  # no Range needed
    try:
        f = fs.open(path, "rb", **kwargs)
    except FileNotFoundError as exc:
        raise _open_failed(name, exc) from None
    except _network_errors() as exc:
        if not web:
            raise
        raise _open_failed(name, exc) from None
    return _NetworkStream(name, f) if web else f


def _max_file_bytes() -> int:
    from collapseguard.io import tar  # imported here: io.tar imports this module
    return tar.MAX_MEMBER_BYTES


def _open_regular(path: str):
    """``path`` opened by ``io.tar.open_regular_file`` (never blocking on a FIFO), with its refusals
    as ``UnreadableFileError`` naming what the path is (a FIFO, a character device, ...)."""
    from collapseguard.io import tar
    try:
        return tar.open_regular_file(path)
    except tar.NotRegularFileError as exc:
        raise UnreadableFileError(str(exc)) from None


def _too_large(name: str, size: int | str, limit: int) -> UnreadableFileError:
    return UnreadableFileError(f"{printable(name)}: {size} bytes, over the {limit}-byte limit for "
                               "one file")


def read_bytes(name: str, *, allow_pipe: bool = False) -> bytes:
    """The whole content of a loose file, ``pipe:`` or fsspec URL (an image read by name).

    A local name must be a regular file (links followed): anything else is refused with
    ``UnreadableFileError`` and never opened in a way that could block. At most
    ``io.tar.MAX_MEMBER_BYTES`` are read: a file or body over that is refused with
    ``UnreadableFileError``, unread when its size is known beforehand (a local file, an object
    whose store or server states its length), else as soon as the cap is passed.
    """
    path = local_path(name)
    if path is not None:
        return read_local_bytes(path)
    with open_stream(name, allow_pipe=allow_pipe) as f:
        return _read_capped(name, f, getattr(f, "size", None))


def read_local_bytes(path) -> bytes:
    """``read_bytes`` for a path on this machine, never taken for a URL: a file found by walking a
    folder may be named ``pipe:x.png`` or ``s3:y.jpg``."""
    path = os.fspath(path)
    with _open_regular(path) as f:
        return _read_capped(path, f, os.fstat(f.fileno()).st_size)


def _read_capped(name: str, f, size) -> bytes:
    """All of ``f``, refused unread when ``size`` (if known) is over the cap, else as soon as the
    cap is passed."""
    limit = _max_file_bytes()
    if isinstance(size, int) and size > limit:
        raise _too_large(name, size, limit)
    chunks, total = [], 0
    while total <= limit and (b := f.read(min(1 << 20, limit + 1 - total))):
        chunks.append(b)
        total += len(b)
    if total > limit:
        raise _too_large(name, f"more than {limit}", limit)
    return b"".join(chunks)


def identity(name: str) -> dict:
    """What a filter completion marker records of an input, to tell on resume whether it changed.

    Local files: size, mtime, inode and change time (a file replaced by one of the same size and
    mtime, as ``cp -p`` or ``rsync -a`` leave it, still differs; ``filter``'s resume then compares
    the bytes with the SHA-256 its marker recorded). fsspec URLs: size and whichever of ETag and last-modified time the
    store reports. ``pipe:`` cannot be checked: ``{"pipe": CMD, "checked": False}``; a marker made
    from the same command is trusted (``--overwrite`` redoes it).
    """
    path = local_path(name)
    if path is not None:
        st = os.stat(path)
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}
    if scheme(name) == "pipe":
        return {"pipe": name[len("pipe:"):], "checked": False}
    fs, p = filesystem(name)
    try:
        info = fs.info(p)
    except FileNotFoundError as exc:
        raise _open_failed(name, exc) from None
    out = {"size": info.get("size")}
    for field, keys in (("etag", ("ETag", "etag", "md5Hash", "Content-MD5")),
                        ("last_modified", ("LastModified", "Last-Modified", "last_modified",
                                           "mtime", "updated"))):
        value = next((info[k] for k in keys if info.get(k) is not None), None)
        if value is not None:
            out[field] = str(value)
    return out


def _below(child: str, folder: str) -> bool:
    """Does URL ``child`` lie below URL ``folder`` (same scheme and host), judged on the paths
    decoded (``%2e%2e``, ``%2f``) and normalised as the server sees them? A decoded ``..``
    component anywhere in ``child`` is refused."""
    c, f = urlparse(child), urlparse(folder)
    if (c.scheme.lower(), c.netloc.lower()) != (f.scheme.lower(), f.netloc.lower()):
        return False
    decoded = unquote(c.path).replace("\\", "/")
    if ".." in decoded.split("/"):
        return False
    base = posixpath.normpath("/" + unquote(f.path).replace("\\", "/")).rstrip("/") + "/"
    return posixpath.normpath("/" + decoded).startswith(base)


#: how deep an http(s) folder's index pages are followed: deeper is taken for a link loop
MAX_HTTP_DEPTH = 32


def _http_find(fs, path: str) -> list[str]:
    """The files below the http(s) folder ``path`` (ending in ``/``), read from its index pages
    breadth-first: each folder once; only links that lie below ``path`` (``_below``); a folder
    whose page lists the same names as an enclosing folder's (a link loop on the server, such as
    ``loop -> .``) is not read again. A page that cannot be read (404, a reset, a timeout) raises,
    naming that folder; so do folders nested deeper than ``MAX_HTTP_DEPTH``."""
    files: list[str] = []
    seen: set[str] = set()
    queue: list[tuple[str, tuple[frozenset, ...]]] = [(path, ())]
    while queue:
        folder, ancestors = queue.pop(0)
        if folder in seen:
            continue
        seen.add(folder)
        if len(ancestors) > MAX_HTTP_DEPTH:
            raise URLError(f"{printable(folder)}: folders nested more than {MAX_HTTP_DEPTH} deep "
                           "below the folder given (a link loop on the server?)")
        try:
            entries = fs.ls(folder, detail=True)
        except FileNotFoundError:
            if folder == path:
                raise
            raise URLError(f"{printable(folder)}: a folder its index page links to cannot be listed "
                           "(not found): what it holds would be left out") from None
        except _network_errors() as exc:
            raise _open_failed(folder, exc, URLError) from None
        inside = [e for e in entries if e["name"].startswith(path) and _below(e["name"], path)]
        names = frozenset(e["name"][len(folder):] for e in inside if e["name"].startswith(folder))
        if names in ancestors:  # this page repeats an enclosing folder's: a loop, read already
            continue
        for e in inside:
            if e.get("type") == "directory":
                name = e["name"] if e["name"].endswith("/") else e["name"] + "/"
                queue.append((name, (*ancestors, names)))
            else:
                files.append(e["name"])
    return sorted(set(files))


def _find_all(fs, root: str) -> list[str]:
    """Every object below ``root``, sorted; a folder that cannot be listed raises. fsspec's own
    walk passes over such folders unless told (``on_error``); a store whose ``find`` is one
    listing call (s3, gcs) takes no such option and raises anyway."""
    try:
        return sorted(fs.find(root, on_error="raise"))
    except TypeError as exc:
        if "on_error" not in str(exc):
            raise
        return sorted(fs.find(root))


def list_url(url: str) -> list[tuple[str, str | None]]:
    """The objects an fsspec URL names: ``[(url, None)]`` for one object, ``[(url, key), ...]``
    (key: the path below the folder) for a folder or prefix, searched recursively, and every match
    of a glob (``*``, ``?``, ``[``; not for http(s), whose query strings use ``?``). Sorted; empty
    when a glob matches nothing; FileNotFoundError when nothing is there (a 404); URLError when the
    server answers with an error status or cannot be reached.

    An http(s) folder is its index page's links that lie below it, judged on the decoded and
    normalised path (a link ``sub/%2e%2e/%2e%2e/up.tar`` is outside), and its subfolders' the same
    way (``_http_find``). A subfolder that cannot be listed raises, there as in any store."""
    fs, path = filesystem(url)
    web = scheme(url) in ("http", "https")
    try:
        if not web and any(ch in path for ch in "*?["):
            return [(fs.unstrip_protocol(p), None) for p in sorted(fs.glob(path))
                    if fs.isfile(p)]
        folder = path.endswith("/") if web else fs.isdir(path)
        if folder:
            root = path.rstrip("/")
            # a subfolder that cannot be listed is an error, never a quiet gap in the input
            found = _http_find(fs, path) if web else _find_all(fs, root)
            return [(p if web else fs.unstrip_protocol(p),
                     (p[len(path):] if web else p[len(root) + 1:]).lstrip("/")) for p in found]
        fs.info(path)  # FileNotFoundError when nothing is there; the store's own error otherwise
    except FileNotFoundError as exc:
        raise _open_failed(url, exc, URLError) from None
    except _network_errors() + _store_errors() as exc:
        raise _open_failed(url, exc, URLError) from None
    return [(url, None)]
