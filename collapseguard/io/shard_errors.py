"""The errors of reading a shard whole: each names the shard and what is wrong with it."""

from __future__ import annotations

import tarfile

from collapseguard.errors import CollapseguardError


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
