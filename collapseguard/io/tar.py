"""Reading WebDataset tar shards as samples of raw bytes (``io.shard_writer`` writes them back).

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
reader could not tell the copies apart. The writer (``io.shard_writer.ShardWriter``) never
writes two neighbouring samples with one key: a sample passed as ``movable`` (rejected for its
names or as a repeat) that would touch a neighbour of the same key (as this reader or webdataset
groups members) is written under ``<key>\\#N`` instead (``ShardWriter.renamed``); every other
sample keeps its names. Within one sample a repeated name (compared as webdataset does, the
extension without case) is kept under ``<name>.dupN`` and the sample counts as unsafe.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from collapseguard.io.shard_errors import (  # noqa: F401 - the reader's errors, named here too
    CorruptShardError,
    NotRegularFileError,
    ShardError,
    ShardTooLargeError,
    TruncatedShardError,
    check_shard_bytes,
)
from collapseguard.io.shard_streams import (
    COMPRESSED_SIGNATURES,
    SHORT_SIGNATURES,
    CountingReader,
    Decompressed,
    DigestingReader,
    PeekableSource,
)
from collapseguard.io.tar_headers import (  # noqa: F401 - MAX_HEADER_BYTES is named here too
    MAX_HEADER_BYTES,
    CappedTarInfo,
    HeaderTooLarge,
)
from collapseguard.io.terminal import printable
from collapseguard.io.urls import local_path, open_stream


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
    or not), set once the shard has been read whole and found complete (None before, and always
    with ``digest=False``: a reader that never asks for it is spared the hashing)."""

    def __init__(self, path: str, max_member_bytes: int = MAX_MEMBER_BYTES,
                 max_sample_bytes: int = MAX_SAMPLE_BYTES,
                 max_shard_bytes: int | None = MAX_SHARD_BYTES, digest: bool = True):
        self.path = path
        self.hashed = digest
        self.max_member_bytes = max_member_bytes
        self.max_sample_bytes = max_sample_bytes
        self.max_shard_bytes = max_shard_bytes
        self.skipped: list[str] = []
        self.digest: dict | None = None
        self._unpacked: Decompressed | None = None

    def _open(self):
        return open_shard(self.path)

    def _unreadable(self, exc: BaseException, offset: int) -> ShardError:
        """The clear error for what tarfile raised while parsing at ``offset``."""
        where = printable(self.path)
        if isinstance(exc, ShardError):  # raised as the stream was read: already clear
            return exc
        if self._unpacked is not None and self._unpacked.truncated:  # what tarfile stumbled on
            return self._unpacked.cut_short()
        if isinstance(exc, HeaderTooLarge):
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

    def _tar_stream(self, raw) -> CountingReader:
        """The shard's tar stream: decompressed (``self._unpacked``) when the bytes start with a
        gzip, bzip2, xz or lzma signature, counted either way."""
        self._unpacked = None
        source = PeekableSource(raw)
        head = source.peek(10)
        kind = next((k for sig, k in COMPRESSED_SIGNATURES if sig.match(head)), None)
        if kind is None and len(head) < 10:  # the whole file: no tar is this short, so a cut-short
            # compressed stream is named by the start of its signature
            kind = next((k for sig, k in SHORT_SIGNATURES if head.startswith(sig)), None)
        if kind == "zstd":
            raise ShardError(f"{printable(self.path)}: a zstd-compressed stream: shards are .tar, "
                             ".tar.gz or .tgz (decompress it, or recompress it with gzip)")
        where = printable(self.path)
        if kind is None:
            return CountingReader(source, self.max_shard_bytes, where)
        self._unpacked = Decompressed(source, kind, where)
        return CountingReader(self._unpacked, self.max_shard_bytes, where)

    def __iter__(self) -> Iterator[Sample]:
        self.digest = None
        with self._open() as opened:
            raw = DigestingReader(opened, self.max_shard_bytes, printable(self.path), self.hashed)
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
        self.digest = digest if self.hashed else None

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


#: webdataset's ``base_plus_ext``: the key is everything before the first dot that follows the
#: last ``/`` reached by ``.*/``, and ``[^.]+`` may itself cross a ``/`` (``a/.x.png`` is key ``a/``)
_WDS_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def visible_key(name: str) -> str | None:
    """The key webdataset groups ``name`` under (its own pattern), None for a name it skips (no
    dot in the file name, or a leading dot): skipped members do not separate its samples."""
    m = _WDS_KEY.match(name)
    return m.group(1) if m else None
