"""A ``tarfile.TarInfo`` that refuses oversized extended headers before reading them."""

from __future__ import annotations

import tarfile

from collapseguard.errors import CollapseguardError

#: the most bytes a member's extended headers (PAX records, GNU long names and links, sparse maps)
#: and the archive's global PAX records may hold together: tarfile reads them whole into memory
#: before a member's size is known, and real ones are a few hundred bytes
MAX_HEADER_BYTES = 1 << 20

_HEADER_KINDS = {tarfile.XHDTYPE: "PAX extended header", tarfile.XGLTYPE: "PAX global header",
                 tarfile.SOLARIS_XHDTYPE: "Solaris extended header",
                 tarfile.GNUTYPE_LONGNAME: "GNU long-name header",
                 tarfile.GNUTYPE_LONGLINK: "GNU long-link header"}


class HeaderTooLarge(CollapseguardError):
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
            raise HeaderTooLarge(self._kind, self._read, self._offset, at_least=True)
        return self._f.read(n)

    def __getattr__(self, name):
        return getattr(self._f, name)


class CappedTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` (``tarfile.open(..., tarinfo=CappedTarInfo)``) that refuses extended header
    records claiming more than ``MAX_HEADER_BYTES`` before reading them: a PAX or GNU long-name
    header claiming a GiB of zeros, which compresses to a MiB, would otherwise be read whole into
    memory. The limit counts the records of one member's chain of headers together with the
    archive's global PAX records, so a long chain of headers cannot add up either; what is over it
    raises ``HeaderTooLarge``."""

    def _held(self, tarfile_) -> int:
        held = getattr(tarfile_, "_cg_header_bytes", 0)
        return held + sum(len(k) + len(v) for k, v in tarfile_.pax_headers.items())

    def _within(self, tarfile_, proc):
        """``proc()`` with this header's records counted against the limit while it runs."""
        if self._held(tarfile_) + self.size > MAX_HEADER_BYTES:
            raise HeaderTooLarge(_HEADER_KINDS.get(self.type, "extended header"), self.size,
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
