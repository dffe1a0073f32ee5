"""Reading WebDataset tar shards as samples of raw bytes, and writing them back deterministically.

A sample is a run of consecutive members sharing a key: the member path up to the first dot of
its file name (webdataset's convention), e.g. ``a/0001.jpg`` and ``a/0001.json`` form sample
``a/0001``. Bytes are never decoded or re-encoded here.

Member names are untrusted. Leading slashes and ``.``/``..`` components are removed before a name
is used anywhere; a sample whose names had to be cleaned is marked ``unsafe_name`` so the caller
can set it aside with that reason (its bytes are kept under the clean names). Names that are not
valid UTF-8 are written with ``\\xNN`` escapes and count as cleaned.

Members that cannot be carried through as bytes are *refused*: links (a hard link would smuggle an
earlier member's image past the scorer under another name), devices and FIFOs, sparse members
(whose claimed size can be far beyond their stored bytes) and members over ``max_member_bytes``.
A refused member's bytes are never read; it is attached to the sample its name belongs to
(``Sample.refused``), so the caller can set that sample aside with a reason, and listed in
``ShardReader.skipped``. Directories are ignored. A plain (uncompressed) tar that ends without its
end-of-archive blocks was cut short, possibly exactly between two members; reading it raises
``TruncatedShardError`` after the last complete sample instead of passing as complete.
"""

from __future__ import annotations

import io
import math
import os
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field


from collapseguard.errors import CollapseguardError

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

    @property
    def files(self) -> list[str]:
        return [m.name for m in self.members]


#: members larger than this are refused unread (``ShardReader(max_member_bytes=)``)
MAX_MEMBER_BYTES = 512 * 2**20


class TruncatedShardError(CollapseguardError, tarfile.ReadError):
    """A plain tar shard ends without its end-of-archive blocks: it was cut short."""


def clean_member_name(name: str) -> str:
    """A relative POSIX name with no ``..``/``.``/empty components and no leading slash, in valid
    UTF-8 (bytes that were not, which tarfile hands over as surrogates, become ``\\xNN``)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return valid_text("/".join(parts))


def valid_text(name: str) -> str:
    """``name`` with lone surrogates (undecodable bytes) written as ``\\xNN`` escapes."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that does not stand for a byte
        raw = name.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "backslashreplace")


def member_key(name: str) -> tuple[str, str]:
    """The clean name and the sample key of a raw tar member name (``ShardReader``'s rule)."""
    clean = clean_member_name(name) or "unnamed"
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


def _plain_tar(path: str) -> bool:
    """True when the file does not start with a gzip, bzip2, xz or zstd signature."""
    with open(path, "rb") as f:
        head = f.read(6)
    return not head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd"))


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
    ``"name (why)"``."""

    def __init__(self, path: str, max_member_bytes: int = MAX_MEMBER_BYTES):
        self.path = path
        self.max_member_bytes = max_member_bytes
        self.skipped: list[str] = []

    def __iter__(self) -> Iterator[Sample]:
        current: Sample | None = None
        names: set[str] = set()  # names already in ``current``
        with tarfile.open(self.path, mode="r|*") as tf:
            for info in tf:
                if info.isdir():
                    continue
                clean, key = member_key(info.name)
                if current is None or key != current.key:
                    if current is not None:
                        yield current
                    current, names = Sample(key=key), set()
                why = _refusal(info, self.max_member_bytes)
                if why:
                    self.skipped.append(f"{clean} ({why})")
                    current.refused.append((clean, why))
                    continue
                f = tf.extractfile(info)
                data = f.read() if f is not None else b""
                # a name repeated inside one sample would be lost on extraction; keep both, renamed
                if clean in names:
                    current.unsafe_names.append(info.name)
                    n = 1
                    while f"{clean}.dup{n}" in names:
                        n += 1
                    clean = f"{clean}.dup{n}"
                if (clean != info.name and not (info.name.startswith("./") and info.name[2:] == clean)
                        or posixpath.basename(clean).startswith(".")):  # hidden: set aside for a look
                    current.unsafe_names.append(info.name)
                names.add(clean)
                current.members.append(Member(clean, data, _mtime(info)))
            end = tf.offset
        if current is not None:
            yield current
        if _plain_tar(self.path) and os.path.getsize(self.path) - end < tarfile.BLOCKSIZE:
            raise TruncatedShardError(
                f"{self.path}: no end-of-archive marker after byte {end}: the file was cut short "
                "(its samples up to there were read)")


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


class ShardWriter:
    """Write samples into a tar file with deterministic headers (same input -> same bytes).

    Owner and group are cleared, mode is 0644, the member's own mtime is kept.
    """

    def __init__(self, path: str):
        self.path = path
        self._f = _HashingFile(open(path, "wb"))
        self._tf = tarfile.open(fileobj=self._f, mode="w", format=tarfile.PAX_FORMAT)
        self.count = 0

    @property
    def size(self) -> int:
        """Bytes written so far (the file's size once closed)."""
        return self._f.pos

    @property
    def sha256(self) -> str:
        """SHA-256 of the bytes written so far (of the whole file once closed)."""
        return self._f.hash.hexdigest()

    def write(self, sample: Sample) -> None:
        for m in sample.members:
            info = tarfile.TarInfo(m.name)
            info.size = len(m.data)
            info.mtime = m.mtime
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tf.addfile(info, io.BytesIO(m.data))
        self.count += 1

    def close(self) -> None:
        self._tf.close()
        self._f.flush()
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
