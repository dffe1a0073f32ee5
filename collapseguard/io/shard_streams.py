"""The byte streams under a shard's tar reader: counted, hashed, and decompressed.

A shard's bytes pass through ``DigestingReader`` (their size and SHA-256 as read),
``PeekableSource`` (the first bytes looked at to tell a compressed stream), ``Decompressed`` when
they start with a gzip, bzip2, xz or lzma signature, and ``CountingReader`` (the tar stream's
length and last bytes, to check its end of archive). Each enforces the limit on one shard's
bytes; a compressed stream that stops before its end marker is cut short, damaged data is a
``CorruptShardError``, and an error of the disk or the network is never mistaken for either.
"""

from __future__ import annotations

import re

from collapseguard.io.shard_errors import (
    CorruptShardError,
    TruncatedShardError,
    check_shard_bytes,
)
from collapseguard.io.terminal import printable


class CountingReader:
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


class DigestingReader:
    """The shard's raw bytes as read, counted and hashed (SHA-256): what ``ShardReader.digest``
    reports once the shard has been read whole. ``hashed=False`` counts without hashing (a reader
    that never asks for the digest spares about 1 ms of CPU per MB)."""

    def __init__(self, f, limit: int | None = None, where: str = "", hashed: bool = True):
        import hashlib
        self._f = f
        self._h = hashlib.sha256() if hashed else None
        self.size = 0
        self._limit, self._where = limit, where

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        if self._h is not None:
            self._h.update(b)
        self.size += len(b)
        check_shard_bytes(self.size, self._limit, self._where, "read")
        return b

    def finish(self) -> dict:
        """Read what is left to the end (nothing, for a shard read whole) and return
        ``{"size", "sha256"}`` of every byte (``sha256`` None when not hashed)."""
        while self.read(1 << 16):
            pass
        return {"size": self.size, "sha256": self._h.hexdigest() if self._h is not None else None}


class PeekableSource:
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
COMPRESSED_SIGNATURES = ((re.compile(rb"\x1f\x8b\x08"), "gzip"),
               (re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", re.DOTALL), "bzip2"),
               (re.compile(rb"\xfd7zXZ\x00"), "xz"), (re.compile(rb"\x5d\x00\x00\x80"), "lzma"),
               (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd"))
#: the first bytes of each signature, for a file shorter than a full one
SHORT_SIGNATURES = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ", "xz"))


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


class Decompressed:
    """The tar stream inside a gzip, bzip2, xz or lzma shard (concatenated gzip members, bzip2 and
    xz streams are read one after the other, as ``gzip -d`` reads them). Every compressed stream
    must end with its end marker and, for gzip, a matching CRC and length. One that stops early
    reads as the end of the tar stream and sets ``truncated`` (tarfile then ends the archive
    there, so the samples before the cut are read, and the reader raises ``cut_short()``);
    damaged data or anything but zeros after the last gzip member raise ``CorruptShardError``."""

    def __init__(self, source: PeekableSource, kind: str, where: str):
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
