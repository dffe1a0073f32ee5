"""Writing samples back into a WebDataset tar shard, deterministically (same input, same bytes)."""

from __future__ import annotations

import io
import tarfile

from collapseguard.io.tar import Member, Sample, split_key, visible_key
from collapseguard.io.urls import is_gzip_name


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
