"""Reading WebDataset tar shards as samples of raw bytes, and writing them back deterministically.

A sample is a run of consecutive members sharing a key: the member path up to the first dot of
its file name (webdataset's convention), e.g. ``a/0001.jpg`` and ``a/0001.json`` form sample
``a/0001``. Bytes are never decoded or re-encoded here.

Member names are untrusted. Leading slashes and ``.``/``..`` components are removed before a name
is used anywhere; a sample whose names had to be cleaned is marked ``unsafe_name`` so the caller
can set it aside with that reason (its bytes are kept under the clean names). Links, devices and
other non-file members carry no bytes and are reported in ``ShardReader.skipped``.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field


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

    @property
    def files(self) -> list[str]:
        return [m.name for m in self.members]


def clean_member_name(name: str) -> str:
    """A relative POSIX name with no ``..``/``.``/empty components and no leading slash."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return "/".join(parts)


def split_key(name: str) -> tuple[str, str]:
    """(key, extension) of a clean member name: key is everything up to the first dot of the
    file name, keeping its folder; extension is the rest (may be empty)."""
    folder, base = posixpath.split(name)
    stem, _, ext = base.partition(".")
    key = posixpath.join(folder, stem) if folder else stem
    return key, ext


class ShardReader:
    """Iterate the samples of one tar shard in order. ``skipped`` lists non-file members."""

    def __init__(self, path: str):
        self.path = path
        self.skipped: list[str] = []

    def __iter__(self) -> Iterator[Sample]:
        current: Sample | None = None
        with tarfile.open(self.path, mode="r|*") as tf:
            for info in tf:
                if info.isdir():
                    continue
                if not info.isfile():
                    self.skipped.append(clean_member_name(info.name) or repr(info.name))
                    continue
                clean = clean_member_name(info.name)
                if not clean:
                    clean = "unnamed"
                f = tf.extractfile(info)
                data = f.read() if f is not None else b""
                key, _ = split_key(clean)
                if current is None or key != current.key:
                    if current is not None:
                        yield current
                    current = Sample(key=key)
                # a name repeated inside one sample would be lost on extraction; keep both, renamed
                if clean in current.files:
                    current.unsafe_names.append(info.name)
                    n = 1
                    while f"{clean}.dup{n}" in current.files:
                        n += 1
                    clean = f"{clean}.dup{n}"
                if clean != info.name and not (info.name.startswith("./") and info.name[2:] == clean):
                    current.unsafe_names.append(info.name)
                current.members.append(Member(clean, data, int(info.mtime)))
        if current is not None:
            yield current


def iter_samples(path: str) -> Iterator[Sample]:
    """Shorthand for ``iter(ShardReader(path))``."""
    return iter(ShardReader(path))


class ShardWriter:
    """Write samples into a tar file with deterministic headers (same input -> same bytes).

    Owner and group are cleared, mode is 0644, the member's own mtime is kept.
    """

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "wb")
        self._tf = tarfile.open(fileobj=self._f, mode="w", format=tarfile.PAX_FORMAT)
        self.count = 0

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
