"""Progress bars, one style for every command: a tqdm bar on stderr with a total (and so an ETA)
when the amount of work is known, shown only when stderr is a terminal and the command was not
given ``-q``; logs and pipes get no bar lines."""

from __future__ import annotations

import sys
import tarfile

from tqdm import tqdm


def bar_enabled(quiet: bool = False) -> bool:
    """Show a bar? Not with ``-q``, and not when stderr is not a terminal (a log, a pipe)."""
    if quiet:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(total: int | None = None, *, desc: str, unit: str = "img", quiet: bool = False,
                 **kwargs) -> tqdm:
    """A tqdm bar on stderr in the package's style (see the module docstring)."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not bar_enabled(quiet), file=sys.stderr,
                dynamic_ncols=True, **kwargs)


class PhaseBars:
    """A ``progress(done, total)`` callback that draws one bar per phase of work (chain images,
    then clean images): a phase starts when ``done`` goes back or ``total`` changes. ``close()``
    ends the last bar."""

    def __init__(self, desc: str, quiet: bool = False, unit: str = "img"):
        self.desc, self.quiet, self.unit = desc, quiet, unit
        self.bar, self.done = None, 0

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None or done < self.done or self.bar.total != total:
            self.close()
            self.bar = progress_bar(total, desc=self.desc, unit=self.unit, quiet=self.quiet)
            self.done = 0
        self.bar.update(done - self.done)
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def count_samples(shard: str) -> int | None:
    """The number of samples of a local uncompressed tar shard, from its member headers alone
    (seeks past the data), by ``io.tar``'s key rule; None for compressed, remote or unreadable
    shards, whose count would cost a full read, and for anything but a regular file."""
    from collapseguard.errors import CollapseguardError
    from collapseguard.io.tar import CappedTarInfo, member_key, open_regular_file
    from collapseguard.io.urls import is_remote
    if is_remote(shard) or not str(shard).lower().endswith(".tar"):
        return None
    n, last = 0, None
    try:
        # a FIFO named .tar is refused, not waited on; no header bombs
        with open_regular_file(shard) as f, tarfile.open(fileobj=f, mode="r:", tarinfo=CappedTarInfo) as tf:
            for info in tf:
                if info.isdir():
                    continue
                key = member_key(info.name)[1]
                if key != last:
                    n, last = n + 1, key
    except (OSError, tarfile.TarError, CollapseguardError):
        return None
    return n
