"""Reading WebDataset tar shards as samples of raw bytes, and writing them back deterministically.

A shard is read front to back as a stream (``open_shard``): a local regular file, or a ``pipe:``
or fsspec URL (``io.urls``); gzip (``.tar.gz``/``.tgz``), bzip2 and xz shards, told by their first
bytes, are decompressed as they are read.

A sample is a run of consecutive members sharing a key: the member path up to the first dot of
its file name (webdataset's convention), e.g. ``a/0001.jpg`` and ``a/0001.json`` form sample
``a/0001``. Bytes are never decoded or re-encoded here.

Member names are untrusted. Leading slashes and ``.``/``..`` components are removed before a name
is used anywhere; a sample whose names had to be cleaned is marked ``unsafe_name`` so the caller
can set it aside with that reason (its bytes are kept under the clean names). Bytes that are not
valid UTF-8 and control characters (a NUL, which a PAX ``path`` record can carry and a tar header
would end the name at, newlines, escapes) are written as ``\\xNN`` escapes and count as cleaning,
so no member is renamed silently.

Members that cannot be carried through as bytes are *refused*: links (a hard link would smuggle an
earlier member's image past the scorer under another name), devices and FIFOs, sparse members
(whose claimed size can be far beyond their stored bytes) and members over ``max_member_bytes``.
A refused member's bytes are never read; it is attached to the sample its name belongs to
(``Sample.refused``), so the caller can set that sample aside with a reason, and listed in
``ShardReader.skipped``. Directories are ignored. A tar that ends without its end-of-archive
blocks was cut short, possibly exactly between two members; reading it raises
``TruncatedShardError`` after the last complete sample instead of passing as complete; one whose
members stop at a damaged header, or that has anything but zeros after its end-of-archive blocks
(another archive appended), raises ``CorruptShardError``: its members after that point would
otherwise be lost without a word. A compressed shard is decompressed here (not by tarfile) and
held to the same rules, on its tar stream and on the compressed stream itself: one that stops
before its end marker (a gzip member without its trailer) raises ``TruncatedShardError``, one
whose data or gzip CRC or length do not check out ``CorruptShardError``. A header tarfile cannot
parse (a crafted PAX sparse map) is a ``CorruptShardError`` too, and so are extended header
records (PAX, GNU long names, sparse maps) claiming more than ``MAX_HEADER_BYTES``: they are
refused before tarfile reads them into memory. Only regular files are opened as shards: a FIFO,
socket, device or folder given as a shard is refused with ``NotRegularFileError`` before it is
read.

Samples are grouped as webdataset groups them: consecutive members whose *raw* names share a key.
A sample's ``key`` is the key of its cleaned names, so ``../k.jpg`` and a following ``k.jpg`` are
two samples (the first unsafe, the second untouched), never one. Repeated keys: a key names one
sample per shard. When a key comes back after other samples (``k, j, k``), the later runs are
separate samples, marked ``Sample.repeat`` (the number of earlier safe samples with that key); the
caller rejects them (``repeated_key``), since once the samples between them are filtered out a
reader could not tell the copies apart. ``ShardWriter`` never writes two neighbouring samples with
one key: a sample passed as ``movable`` (rejected for its names or as a repeat) that would touch a
neighbour of the same key (as this reader or webdataset groups members) is written under
``<key>\\#N`` instead (``ShardWriter.renamed``); every other sample keeps its names. Within one
sample a repeated name (compared as webdataset does, the extension without case) is kept under
``<name>.dupN`` and the sample counts as unsafe.
"""

from __future__ import annotations

import io
import math
import os
import posixpath
import re
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from collapseguard.errors import CollapseguardError
from collapseguard.io.terminal import printable
from collapseguard.io.urls import is_gzip_name, local_path, open_stream


@dataclass
class Member:
    name: str
    data: bytes
    mtime: int = 0


@dataclass
class Sample:
    key: str
    members: list[Member] = field(default_factory=list)
    #: the original names when any had to be cleaned (absolute paths, ``..``)
    unsafe_names: list[str] = field(default_factory=list)
    #: ``(clean name, why)`` of members that were not read (links, devices, sparse, too large)
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: how many earlier samples of the shard (with safe names) had this key: > 0 is a repeated key
    repeat: int = 0

    @property
    def files(self) -> list[str]:
        return [m.name for m in self.members]


#: members larger than this are refused unread (``ShardReader(max_member_bytes=)``)
MAX_MEMBER_BYTES = 512 * 2**20
#: members that would take one sample's bytes past this are refused unread, so a reader holds at
#: most this much of a shard's data at once (``filter --max-sample-bytes``): a worker's memory is
#: the detector's, plus about twice this while the largest member is read
MAX_SAMPLE_BYTES = 512 * 2**20
#: the most bytes read of one shard, counted both as they come (file, ``pipe:``, URL) and as the
#: tar stream inside a compressed shard (``filter --max-shard-bytes``): a source that never ends
#: (endless zeros after the archive, ``pipe:cat /dev/zero``, a small gzip bomb) fails its shard
#: with ``ShardTooLargeError`` instead of being read for as long as it sends
MAX_SHARD_BYTES = 64 * 2**30


class ShardError(CollapseguardError, tarfile.ReadError):
    """A shard cannot be read whole (its message names the shard and what is wrong)."""


class TruncatedShardError(ShardError):
    """A shard's tar stream ends without its end-of-archive blocks or inside a member, or its
    compressed stream ends before its end marker: it was cut short."""


class CorruptShardError(ShardError):
    """A shard holds a header that cannot be parsed or whose records are over
    ``MAX_HEADER_BYTES``, data after its members that is not an end of archive, or compressed data
    that is damaged (for gzip: a CRC or length that does not match)."""


class ShardTooLargeError(ShardError):
    """More bytes than the limit on one shard (``MAX_SHARD_BYTES``) were read from it."""


def check_shard_bytes(count: int, limit: int | None, where: str, what: str) -> None:
    if limit is not None and count > limit:
        raise ShardTooLargeError(f"{where}: more than {limit} bytes {what}, over the limit on one "
                                 "shard (--max-shard-bytes): a source that does not end? the "
                                 "shard is refused")


class NotRegularFileError(ShardError):
    """A path given as a shard is a FIFO, socket, device or folder: it is not opened."""


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular_file(path: str):
    """Open a local file (a shard, or a loose image through ``io.urls.read_local_bytes``) for
    reading, refusing anything that is not a regular file.

    The type is checked before opening (opening a FIFO would wait for a writer forever, a device
    can have effects) and again on the opened descriptor, which is opened without blocking, so a
    path swapped for a FIFO in between cannot hang the reader either.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{printable(path)}: {_file_kind(st.st_mode)}, not a regular file: "
                                  "only regular files are read")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{printable(path)}: {_file_kind(st.st_mode)}, not a regular "
                                      "file: only regular files are read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_shard(name: str):
    """A shard's bytes as a stream: a local regular file (``open_regular_file``), or a ``pipe:``
    or fsspec URL (``io.urls.open_stream``)."""
    local = local_path(name)
    return open_regular_file(local) if local is not None else open_stream(name)


#: control characters (C0, DEL, C1): a NUL ends a name in a tar header, others reach terminals
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def clean_member_name(name: str) -> str:
    """A relative POSIX name with no ``..``/``.``/empty components and no leading slash, in valid
    UTF-8 (bytes that were not, which tarfile hands over as surrogates, become ``\\xNN``) and with
    no control characters (a NUL, which a PAX ``path`` record can hold and a tar header would cut
    the name at, a newline, an escape: each becomes ``\\xNN`` too)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", valid_text("/".join(parts)))


def valid_text(name: str) -> str:
    """``name`` with lone surrogates (undecodable bytes) written as ``\\xNN`` escapes."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that does not stand for a byte
        raw = name.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "backslashreplace")


def member_key(name: str) -> tuple[str, str]:
    """The clean name and the sample key of a raw tar member name (``ShardReader``'s rule). A
    name's leading ``./`` (``tar cf shard.tar .`` writes such names) is kept before the cleaned
    rest: webdataset's key keeps it too (``./000`` for ``./000.jpg``), a key joined on elsewhere
    must come out as it went in, and the members of one sample keep one key (``./000.png`` and
    ``.//000.txt`` are ``./000``)."""
    rest = clean_member_name(name[2:]) if name.startswith("./") else ""
    clean = f"./{rest}" if rest else clean_member_name(name) or "unnamed"
    return clean, split_key(clean)[0]


def _refusal(info: tarfile.TarInfo, max_bytes: int) -> str:
    """Why a non-directory member cannot be carried through as bytes ("" when it can)."""
    if info.issym():
        return "symbolic link"
    if info.islnk():
        return "hard link"
    if not info.isfile():
        return "not a regular file"
    if info.sparse is not None or any(k.startswith("GNU.sparse") for k in info.pax_headers):
        return "sparse member"
    if info.size > max_bytes:
        return f"{info.size} bytes, over the {max_bytes}-byte limit"
    return ""


def _mtime(info: tarfile.TarInfo) -> int:
    """The member's mtime as an int that fits a tar header; 0 when unusable (NaN, huge)."""
    try:
        t = float(info.mtime)
    except (TypeError, ValueError):
        return 0
    return int(t) if math.isfinite(t) and abs(t) < 8**11 else 0


class _CountingReader:
    """A read-only stream that counts the bytes read through it and keeps the last ones, so the
    tar stream of a shard read from anywhere (file, pipe, URL, decompressed) can be checked for a
    missing end of archive."""

    #: bytes kept of the end of what was read: tarfile reads ahead in 10 KiB records
    TAIL = 1 << 16

    def __init__(self, f, limit: int | None = None, where: str = ""):
        self._f = f
        self.count = 0
        self.tail = bytearray()
        self.nonzero_drained = False
        self._limit, self._where = limit, where

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        self.count += len(b)
        check_shard_bytes(self.count, self._limit, self._where, "of tar data")
        self.tail += b
        if len(self.tail) > 2 * self.TAIL:
            del self.tail[: -self.TAIL]
        return b

    def since(self, offset: int) -> bytes | None:
        """The bytes from stream offset ``offset`` to what was read so far (None if not kept)."""
        back = self.count - offset
        return bytes(self.tail[len(self.tail) - back:]) if 0 <= back <= len(self.tail) else None

    def drain(self) -> int:
        """Read to the end (noting whether any byte read was not zero); the total number of
        bytes in the stream."""
        while b := self.read(1 << 16):
            if b.count(0) != len(b):
                self.nonzero_drained = True
        return self.count


class _Digesting:
    """The shard's raw bytes as read, counted and hashed (SHA-256): what ``ShardReader.digest``
    reports once the shard has been read whole."""

    def __init__(self, f, limit: int | None = None, where: str = ""):
        import hashlib
        self._f = f
        self._h = hashlib.sha256()
        self.size = 0
        self._limit, self._where = limit, where

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        self._h.update(b)
        self.size += len(b)
        check_shard_bytes(self.size, self._limit, self._where, "read")
        return b

    def finish(self) -> dict:
        """Read what is left to the end (nothing, for a shard read whole) and return
        ``{"size", "sha256"}`` of every byte."""
        while self.read(1 << 16):
            pass
        return {"size": self.size, "sha256": self._h.hexdigest()}


class _Source:
    """The shard's raw bytes, whose first few can be looked at before they are read. An error
    raised by the underlying stream (the disk, the network) is kept in ``error``, so it is never
    mistaken for damaged compressed data."""

    def __init__(self, f):
        self._f = f
        self._buf = b""
        self.error: BaseException | None = None

    def _read(self, n: int) -> bytes:
        try:
            return self._f.read(n)
        except BaseException as exc:
            self.error = exc
            raise

    def peek(self, n: int) -> bytes:
        while len(self._buf) < n and (b := self._read(n - len(self._buf))):
            self._buf += b
        return self._buf[:n]

    def read(self, n: int = -1) -> bytes:
        if not self._buf:
            return self._read(n)
        if n is None or n < 0:
            b, self._buf = self._buf + self._read(-1), b""
        else:
            b, self._buf = self._buf[:n], self._buf[n:]
        return b


#: (signature, name) of the compressed streams a shard may be; all else is read as a plain tar. A
#: tar starts with its first member's name, so the signatures are the formats' full magic numbers
#: (a plain tar whose first member is ``BZh001.jpg`` is not a bzip2 stream)
_COMPRESSED = ((re.compile(rb"\x1f\x8b\x08"), "gzip"),
               (re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", re.DOTALL), "bzip2"),
               (re.compile(rb"\xfd7zXZ\x00"), "xz"), (re.compile(rb"\x5d\x00\x00\x80"), "lzma"),
               (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd"))
#: the first bytes of each signature, for a file shorter than a full one
_SHORT_SIGNATURES = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ", "xz"))


_XZ_MAGIC = b"\xfd7zXZ\x00"


class _XzStreams:
    """The data of the xz streams in ``source``, one after the other, as ``xz -d`` reads them:
    zero bytes between and after streams are the stream padding the format allows.
    ``lzma.LZMAFile`` stops at padding between streams (it reads what follows as a damaged
    stream and ignores it) and takes trailing data for a cut-short stream, so the streams are
    walked here. A file that ends inside a stream raises ``EOFError``; bytes after a stream that
    are neither padding nor another stream raise ``lzma.LZMAError``."""

    def __init__(self, source):
        import lzma
        self._lzma, self._src = lzma, source
        self._dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        self._in = b""  # compressed bytes read but not yet given to the decompressor
        self._done = False

    def _next_stream(self) -> bool:
        """After a stream's end: skip padding; True when another stream starts, False at the end."""
        rest = self._dec.unused_data + self._in
        while True:
            rest = rest.lstrip(b"\0")
            if len(rest) >= len(_XZ_MAGIC) or (rest and not _XZ_MAGIC.startswith(rest)):
                break
            more = self._src.read(1 << 16)
            if not more:
                if rest:
                    raise EOFError("the file ends inside an xz stream header")
                return False
            rest += more
        if not rest.startswith(_XZ_MAGIC):
            raise self._lzma.LZMAError("the bytes after an xz stream are neither stream padding nor "
                                       "another xz stream")
        self._dec = self._lzma.LZMADecompressor(format=self._lzma.FORMAT_XZ)
        self._in = rest
        return True

    def read(self, n: int = -1) -> bytes:
        out, got = [], 0
        while not self._done and (n is None or n < 0 or got < n):
            if self._dec.eof:
                self._done = not self._next_stream()
                continue
            if self._dec.needs_input and not self._in:
                self._in = self._src.read(1 << 16)
                if not self._in:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            data, self._in = (self._in, b"") if self._dec.needs_input else (b"", self._in)
            b = self._dec.decompress(data, n - got if n is not None and n > 0 else -1)
            out.append(b)
            got += len(b)
        return b"".join(out)

    def close(self) -> None:  # ``source`` is closed by whoever opened it
        pass


class _Decompressed:
    """The tar stream inside a gzip, bzip2, xz or lzma shard (concatenated gzip members, bzip2 and
    xz streams are read one after the other, as ``gzip -d`` reads them). Every compressed stream
    must end with its end marker and, for gzip, a matching CRC and length. One that stops early
    reads as the end of the tar stream and sets ``truncated`` (tarfile then ends the archive
    there, so the samples before the cut are read, and the reader raises ``cut_short()``);
    damaged data or anything but zeros after the last gzip member raise ``CorruptShardError``."""

    def __init__(self, source: _Source, kind: str, where: str):
        import bz2
        import gzip
        import lzma
        self._source, self.kind, self._where = source, kind, where
        # none of them closes ``source``: the shard's stream is closed by whoever opened it
        if kind == "gzip":
            self._f = gzip.GzipFile(fileobj=source, mode="rb")
        elif kind == "bzip2":
            self._f = bz2.BZ2File(source, "rb")
        elif kind == "xz":
            self._f = _XzStreams(source)
        else:  # legacy lzma: one stream
            self._f = lzma.LZMAFile(source, "rb", format=lzma.FORMAT_ALONE)  # noqa: SIM115
        self.count = 0
        self.truncated = False

    def cut_short(self) -> TruncatedShardError:
        return TruncatedShardError(
            f"{self._where}: the {self.kind} stream ends before its end marker (after {self.count} "
            "bytes of tar data): the file was cut short")

    def read(self, n: int = -1) -> bytes:
        if self.truncated:
            return b""
        try:
            b = self._f.read(n)
        except Exception as exc:
            if exc is self._source.error or (isinstance(exc, OSError) and exc.errno is not None):
                raise  # the disk or the network, not the data
            if isinstance(exc, EOFError):
                self.truncated = True
                return b""
            raise CorruptShardError(
                f"{self._where}: the {self.kind} stream is damaged after {self.count} bytes of tar "
                f"data ({type(exc).__name__}: {printable(exc)})") from None
        self.count += len(b)
        return b


#: the most bytes a member's extended headers (PAX records, GNU long names and links, sparse maps)
#: and the archive's global PAX records may hold together: tarfile reads them whole into memory
#: before a member's size is known, and real ones are a few hundred bytes
MAX_HEADER_BYTES = 1 << 20

_HEADER_KINDS = {tarfile.XHDTYPE: "PAX extended header", tarfile.XGLTYPE: "PAX global header",
                 tarfile.SOLARIS_XHDTYPE: "Solaris extended header",
                 tarfile.GNUTYPE_LONGNAME: "GNU long-name header",
                 tarfile.GNUTYPE_LONGLINK: "GNU long-link header"}


class _HeaderTooLarge(CollapseguardError):
    """Extended header records over ``MAX_HEADER_BYTES`` (``ShardReader`` reports a
    ``CorruptShardError``)."""

    def __init__(self, kind: str, size: int, offset: int, at_least: bool = False):
        # a readable message of its own, for readers that let it through (tarfile used directly)
        super().__init__(f"a {kind} at byte {offset} claims {'at least ' * at_least}{size} bytes, over "
                         f"the {MAX_HEADER_BYTES}-byte limit for header records")
        self.kind, self.size, self.offset, self.at_least = kind, size, offset, at_least

    def __reduce__(self):  # pickles with its own arguments (it can cross worker processes)
        return type(self), (self.kind, self.size, self.offset, self.at_least)


class _LimitedReads:
    """``tarfile.fileobj`` while a sparse map is read: the reads may not pass ``limit`` bytes."""

    def __init__(self, f, limit: int, kind: str, offset: int):
        self._f, self._left, self._kind, self._offset = f, limit, kind, offset
        self._read = 0

    def read(self, n: int) -> bytes:
        self._read += n
        if self._read > self._left:
            raise _HeaderTooLarge(self._kind, self._read, self._offset, at_least=True)
        return self._f.read(n)

    def __getattr__(self, name):
        return getattr(self._f, name)


class CappedTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` (``tarfile.open(..., tarinfo=CappedTarInfo)``) that refuses extended header
    records claiming more than ``MAX_HEADER_BYTES`` before reading them: a PAX or GNU long-name
    header claiming a GiB of zeros, which compresses to a MiB, would otherwise be read whole into
    memory. The limit counts the records of one member's chain of headers together with the
    archive's global PAX records, so a long chain of headers cannot add up either; what is over it
    raises ``_HeaderTooLarge``."""

    def _held(self, tarfile_) -> int:
        held = getattr(tarfile_, "_cg_header_bytes", 0)
        return held + sum(len(k) + len(v) for k, v in tarfile_.pax_headers.items())

    def _within(self, tarfile_, proc):
        """``proc()`` with this header's records counted against the limit while it runs."""
        if self._held(tarfile_) + self.size > MAX_HEADER_BYTES:
            raise _HeaderTooLarge(_HEADER_KINDS.get(self.type, "extended header"), self.size,
                                  self.offset)
        before = getattr(tarfile_, "_cg_header_bytes", 0)
        tarfile_._cg_header_bytes = before + self.size
        try:
            return proc(tarfile_)
        finally:
            tarfile_._cg_header_bytes = before

    def _proc_pax(self, tarfile_):
        return self._within(tarfile_, super()._proc_pax)

    def _proc_gnulong(self, tarfile_):
        return self._within(tarfile_, super()._proc_gnulong)

    def _limited(self, tarfile_, kind: str, proc):
        f = tarfile_.fileobj
        tarfile_.fileobj = _LimitedReads(f, MAX_HEADER_BYTES - self._held(tarfile_), kind,
                                         self.offset)
        try:
            return proc()
        finally:
            tarfile_.fileobj = f

    def _proc_sparse(self, tarfile_):
        return self._limited(tarfile_, "GNU sparse header",
                             lambda: super(CappedTarInfo, self)._proc_sparse(tarfile_))

    def _proc_gnusparse_10(self, next, pax_headers, tarfile_):
        return self._limited(tarfile_, "PAX sparse map", lambda: super(
            CappedTarInfo, self)._proc_gnusparse_10(next, pax_headers, tarfile_))


def split_key(name: str) -> tuple[str, str]:
    """(key, extension) of a clean member name: key is everything up to the first dot of the
    file name, keeping its folder; extension is the rest (may be empty)."""
    folder, base = posixpath.split(name)
    stem, _, ext = base.partition(".")
    if not stem:  # a hidden file (".x.png") has no key by that rule: it is its own sample
        stem, ext = base, ""
    key = posixpath.join(folder, stem) if folder else stem
    return key, ext


class ShardReader:
    """Iterate the samples of one tar shard in order. ``skipped`` lists refused members as
    ``"name (why)"``; ``digest`` is ``{"size", "sha256"}`` of the shard's bytes as read (compressed
    or not), set once the shard has been read whole and found complete (None before)."""

    def __init__(self, path: str, max_member_bytes: int = MAX_MEMBER_BYTES,
                 max_sample_bytes: int = MAX_SAMPLE_BYTES,
                 max_shard_bytes: int | None = MAX_SHARD_BYTES):
        self.path = path
        self.max_member_bytes = max_member_bytes
        self.max_sample_bytes = max_sample_bytes
        self.max_shard_bytes = max_shard_bytes
        self.skipped: list[str] = []
        self.digest: dict | None = None
        self._unpacked: _Decompressed | None = None

    def _open(self):
        return open_shard(self.path)

    def _unreadable(self, exc: BaseException, offset: int) -> ShardError:
        """The clear error for what tarfile raised while parsing at ``offset``."""
        where = printable(self.path)
        if isinstance(exc, ShardError):  # raised as the stream was read: already clear
            return exc
        if self._unpacked is not None and self._unpacked.truncated:  # what tarfile stumbled on
            return self._unpacked.cut_short()
        if isinstance(exc, _HeaderTooLarge):
            return CorruptShardError(f"{where}: {exc}: the shard is refused from there")
        if isinstance(exc, RecursionError):
            return CorruptShardError(f"{where}: a chain of extended headers at byte {offset} too "
                                     "long to read: the shard is refused from there")
        if isinstance(exc, tarfile.ReadError) and "unexpected end of data" in str(exc):
            return TruncatedShardError(f"{where}: the file ends inside the member at byte {offset}: "
                                       "it was cut short")
        if isinstance(exc, tarfile.ReadError):
            return ShardError(f"{where}: not a readable tar at byte {offset} ({printable(exc)})")
        return CorruptShardError(f"{where}: a damaged tar header at byte {offset} cannot be read "
                                 f"({type(exc).__name__}: {printable(exc)})")

    def _tar_stream(self, raw) -> _CountingReader:
        """The shard's tar stream: decompressed (``self._unpacked``) when the bytes start with a
        gzip, bzip2, xz or lzma signature, counted either way."""
        self._unpacked = None
        source = _Source(raw)
        head = source.peek(10)
        kind = next((k for sig, k in _COMPRESSED if sig.match(head)), None)
        if kind is None and len(head) < 10:  # the whole file: no tar is this short, so a cut-short
            # compressed stream is named by the start of its signature
            kind = next((k for sig, k in _SHORT_SIGNATURES if head.startswith(sig)), None)
        if kind == "zstd":
            raise ShardError(f"{printable(self.path)}: a zstd-compressed stream: shards are read as "
                             "plain tars or gzip, bzip2 or xz-compressed ones")
        where = printable(self.path)
        if kind is None:
            return _CountingReader(source, self.max_shard_bytes, where)
        self._unpacked = _Decompressed(source, kind, where)
        return _CountingReader(self._unpacked, self.max_shard_bytes, where)

    def __iter__(self) -> Iterator[Sample]:
        self.digest = None
        with self._open() as opened:
            raw = _Digesting(opened, self.max_shard_bytes, printable(self.path))
            stream = self._tar_stream(raw)
            try:
                tf = tarfile.open(fileobj=stream, mode="r|", tarinfo=CappedTarInfo)
            except Exception as exc:  # tarfile's parsing errors, made one clear error
                if isinstance(exc, OSError) and exc.errno is not None:
                    raise
                raise self._unreadable(exc, 0) from None
            with tf:
                yield from self._samples(tf)
                end = self._end
                consumed = stream.since(end)
                rest_nonzero = self._rest_is_not_zeros(tf)
            total = stream.drain()  # bytes after the end-of-archive blocks: padding, or none
            digest = raw.finish()
        if self._unpacked is not None and self._unpacked.truncated:
            raise self._unpacked.cut_short()
        if total - end < tarfile.BLOCKSIZE:
            raise TruncatedShardError(
                f"{printable(self.path)}: no end-of-archive marker after byte {end}: the file was "
                "cut short")
        if rest_nonzero or (consumed is not None and consumed.count(0) != len(consumed)) or (
                stream.nonzero_drained):
            raise CorruptShardError(
                f"{printable(self.path)}: the members stop at byte {end}, but what follows is not "
                "an end of archive (a damaged header, or another archive appended): the rest of "
                "the file cannot be read")
        self.digest = digest

    def _rest_is_not_zeros(self, tf: tarfile.TarFile) -> bool:
        """Read the (decompressed) archive stream to its end: True if any byte is not zero."""
        found = False
        try:
            while b := tf.fileobj.read(1 << 16):
                found = found or b.count(0) != len(b)
        except OSError as exc:
            if exc.errno is not None:  # the disk or the network, not the data
                raise
            raise self._unreadable(exc, tf.offset) from None
        except Exception as exc:  # noqa: BLE001 - a damaged compressed stream after the members
            raise self._unreadable(exc, tf.offset) from None
        return found

    def _next(self, tf: tarfile.TarFile) -> tarfile.TarInfo | None:
        try:
            info = tf.next()
        except OSError as exc:
            if exc.errno is not None:  # the disk or the network, not the data
                raise
            raise self._unreadable(exc, tf.offset) from None
        except Exception as exc:  # noqa: BLE001 - tarfile raises ValueError & co. for crafted headers
            raise self._unreadable(exc, tf.offset) from None
        tf.members.clear()  # a streamed tarfile keeps every header: memory would grow with members
        return info

    def _samples(self, tf: tarfile.TarFile) -> Iterator[Sample]:
        current: Sample | None = None
        group = ""  # the raw key of ``current``'s members
        names: set[str] = set()  # name identities (key, extension without case) in ``current``
        dups: dict[str, int] = {}  # next .dupN to try per repeated name identity
        size = 0  # bytes read into ``current``
        keys: dict[str, int] = {}  # safe samples seen per key
        held: list[Sample] = []  # keyless members met inside ``current``, yielded after it
        while (info := self._next(tf)) is not None:
            if info.isdir():
                continue
            clean, key = member_key(info.name)
            if visible_key(info.name) is None:
                # webdataset skips a member it finds no key in (macOS's ._NAME, a LICENSE) and
                # goes on with the sample around it: so does this reader, which keeps the member
                # as a sample of its own, set aside (nothing is lost), after that sample
                alone = Sample(key=key, unsafe_names=[info.name])
                why = _refusal(info, min(self.max_member_bytes, self.max_sample_bytes))
                if why:
                    self.skipped.append(f"{clean} ({why})")
                    alone.refused.append((clean, why))
                else:
                    alone.members.append(Member(clean, self._read(tf, info), _mtime(info)))
                if current is None:
                    yield alone
                else:
                    held.append(alone)
                continue
            raw_key = split_key(info.name)[0]
            if current is None or raw_key != group:
                if current is not None:
                    yield _counted(current, keys)
                    yield from held
                    held = []
                current, group, names, dups, size = Sample(key=key), raw_key, set(), {}, 0
            why = _refusal(info, self.max_member_bytes)
            if not why and size + info.size > self.max_sample_bytes:
                why = f"the sample would pass the {self.max_sample_bytes}-byte limit"
            if why:
                self.skipped.append(f"{clean} ({why})")
                current.refused.append((clean, why))
                continue
            data = self._read(tf, info)
            size += len(data)
            # a name repeated inside one sample would be lost on extraction; keep both, renamed
            ident = _name_id(clean)
            if ident in names:
                current.unsafe_names.append(info.name)
                n = dups.get(ident, 1)
                while _name_id(f"{clean}.dup{n}") in names:
                    n += 1
                dups[ident] = n + 1
                clean = f"{clean}.dup{n}"
                ident = _name_id(clean)
            if clean != info.name or posixpath.basename(clean).startswith("."):  # hidden: set aside
                current.unsafe_names.append(info.name)
            names.add(ident)
            current.members.append(Member(clean, data, _mtime(info)))
        self._end = tf.offset
        if current is not None:
            yield _counted(current, keys)
        yield from held

    def _read(self, tf: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
        """A regular member's bytes; a damaged member is one clear error."""
        try:
            f = tf.extractfile(info)
            return f.read() if f is not None else b""
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise
            raise self._unreadable(exc, info.offset) from None


def _name_id(clean: str) -> str:
    """What two member names of one sample must not share: webdataset keeps a sample's files by
    extension without case (``k.JPG`` and ``k.jpg`` collide there)."""
    key, ext = split_key(clean)
    return f"{key}\0{ext.lower()}"


def _counted(sample: Sample, keys: dict[str, int]) -> Sample:
    """Set ``sample.repeat`` from the safe samples with its key seen so far in the shard."""
    if not sample.unsafe_names:
        sample.repeat = keys.get(sample.key, 0)
        keys[sample.key] = sample.repeat + 1
    return sample


def iter_samples(path: str) -> Iterator[Sample]:
    """Shorthand for ``iter(ShardReader(path))``."""
    return iter(ShardReader(path))


class _HashingFile:
    """A write-only file that keeps the SHA-256 and the size of what passes through it, so a
    shard's checksum costs no second read."""

    def __init__(self, f):
        import hashlib
        self._f = f
        self.hash = hashlib.sha256()
        self.pos = 0

    def write(self, b) -> int:
        self.hash.update(b)
        self.pos += len(b)
        return self._f.write(b)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


#: webdataset's ``base_plus_ext``: the key is everything before the first dot that follows the
#: last ``/`` reached by ``.*/``, and ``[^.]+`` may itself cross a ``/`` (``a/.x.png`` is key ``a/``)
_WDS_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def visible_key(name: str) -> str | None:
    """The key webdataset groups ``name`` under (its own pattern), None for a name it skips (no
    dot in the file name, or a leading dot): skipped members do not separate its samples."""
    m = _WDS_KEY.match(name)
    return m.group(1) if m else None


def _end_keys(sample: Sample) -> tuple:
    """(first, last) key of ``sample``'s members as ``ShardReader`` groups them, and (first,
    last) as webdataset does (None where there is none)."""
    ours = [split_key(m.name)[0] for m in sample.members]
    seen = [k for k in (visible_key(m.name) for m in sample.members) if k is not None]
    return (ours[0] if ours else None, ours[-1] if ours else None,
            seen[0] if seen else None, seen[-1] if seen else None)


def _with_key(sample: Sample, key: str) -> Sample:
    """``sample`` with its members renamed from its key to ``key`` (a member whose name has
    another key, possible only for cleaned names, is put under ``key`` whole)."""
    members = []
    for m in sample.members:
        k = split_key(m.name)[0]
        name = key + m.name[len(k):] if k == sample.key else f"{key}.{m.name.replace('/', '_')}"
        members.append(Member(name, m.data, m.mtime))
    return Sample(key=key, members=members, unsafe_names=sample.unsafe_names,
                  refused=sample.refused, repeat=sample.repeat)


class ShardWriter:
    """Write samples into a tar file with deterministic headers (same input -> same bytes).

    No two neighbouring samples share a key (a reader would merge them): ``write(sample,
    movable=True)`` marks a sample that may be written under ``<key>\\#N`` when it would touch a
    neighbour of its key; such a sample is held until the next one is known, and ``renamed`` maps
    its ``tag`` to the key it was written under. Other samples are always written as they are.

    Owner and group are cleared, mode is 0644, the member's own mtime is kept. A path ending in
    ``.tar.gz`` or ``.tgz`` (or ``gzip=True``) is gzip-compressed with a fixed header (mtime 0, no
    file name) and level, so reruns give identical bytes too.
    """

    def __init__(self, path: str, gzip: bool | None = None):
        self.path = path
        self._f = _HashingFile(open(path, "wb"))
        self._gz = None
        target = self._f
        if is_gzip_name(path) if gzip is None else gzip:
            import gzip as gz
            self._gz = target = gz.GzipFile(filename="", mode="wb", fileobj=self._f, mtime=0,
                                            compresslevel=6)
        self._tf = tarfile.open(fileobj=target, mode="w", format=tarfile.PAX_FORMAT)
        self.count = 0
        self._last_key: str | None = None  # key of the last member written
        self._last_seen: str | None = None  # webdataset's key of the last member it would see
        self._moved = 0
        self._pending: tuple[Sample, object] | None = None
        #: ``tag -> key`` of movable samples written under another key
        self.renamed: dict = {}

    @property
    def size(self) -> int:
        """Bytes written so far (the file's size once closed)."""
        return self._f.pos

    @property
    def sha256(self) -> str:
        """SHA-256 of the bytes written so far (of the whole file once closed)."""
        return self._f.hash.hexdigest()

    def write(self, sample: Sample, movable: bool = False, tag: object = None) -> None:
        if self._pending is not None:
            self._flush_pending(sample)
        if movable:
            self._pending = (sample, tag)
        else:
            self._write_now(sample)

    def _flush_pending(self, following: Sample | None) -> None:
        """Write the held movable sample, under another key if it would touch a neighbour of its
        key. The new key, ``<key>\\#N``, holds a backslash, which no safe name holds (cleaning
        turns backslashes into folders), and N counts this file's moved samples: it is unique."""
        sample, tag = self._pending
        self._pending = None
        first, last, first_seen, last_seen = _end_keys(sample)
        touches = first is not None and (first == self._last_key or (
            first_seen is not None and first_seen == self._last_seen))
        if following is not None and last is not None:
            nxt, _, nxt_seen, _ = _end_keys(following)
            touches = touches or last == nxt or (
                # webdataset skips a following sample without a key it sees: what comes after it
                # is not known yet, so a sample it would see must not keep a key anyone may have
                last_seen is not None and (nxt_seen is None or nxt_seen == last_seen))
        if touches:
            self._moved += 1
            sample = _with_key(sample, f"{sample.key}\\#{self._moved}")
            self.renamed[tag] = sample.key
        self._write_now(sample)

    def _write_now(self, sample: Sample) -> None:
        for m in sample.members:
            info = tarfile.TarInfo(m.name)
            info.size = len(m.data)
            info.mtime = m.mtime
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tf.addfile(info, io.BytesIO(m.data))
            self._last_key = split_key(m.name)[0]
            self._last_seen = visible_key(m.name) or self._last_seen
        self.count += 1

    def close(self) -> None:
        if self._pending is not None:
            self._flush_pending(None)
        self._tf.close()
        if self._gz is not None:
            self._gz.close()  # writes the gzip trailer; leaves the file open
        self._f.flush()
        self._f.close()

    def abort(self) -> None:
        """Close the file without finishing the archive, ignoring errors (a full or vanished
        disk): the caller removes the file."""
        self._pending = None
        for close in (getattr(self._tf.fileobj, "close", None), self._f._f.close):
            try:
                if close is not None:
                    close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
