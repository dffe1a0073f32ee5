"""Writing a file whole or not at all: the content goes to a temporary file beside the
destination, which replaces the destination only once it is complete (``os.replace``, atomic on one
filesystem), so a run killed mid-write leaves the old file or none, never half of one.

``tempfile.mkstemp`` creates its file readable by its owner only (mode 0600); the finished file is
given the mode a plain ``open(path, "w")`` would have given it (0666 less the process's umask), so
a cache or converted checkpoint shared with a team stays readable as the user's other files are.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask can only be read by setting it)
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def replaced_when_done(dest: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary path beside ``dest`` to write; on leaving without an error it replaces
    ``dest`` (with the umask's mode), otherwise it is removed and ``dest`` is untouched."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
