"""An output folder that is a local directory or a prefix on object storage (``s3://``, ``gs://``...).

Outputs are written in two steps: into a *staged* local file, then *committed* under their final
name. How a commit is made atomic depends on the store:

- local folder: the staged file lies beside its final name (``NAME.<run>.tmp``) and is renamed
  over it (``os.replace``, atomic on one filesystem);
- object storage: rename is a copy there, not atomic, so the staged file lies in a local temporary
  folder and is uploaded whole under its final name. A PUT (and a multipart upload, completed in
  one call) makes an object appear whole or not at all, so no reader ever sees half an output.

Ownership of the folder while a run writes it:

- local: ``<out>/.lock`` is held with ``flock`` for the run and holds the run's id;
- object storage has no lock. ``<out>/.lock`` is an object holding the run's id; a run that
  starts writes its own id there, taking over from any earlier run (killed, or still going: it
  says so on stderr). Every commit first reads ``.lock`` and goes on only while it still holds
  this run's id, so a superseded run commits nothing more after its next check. A check and the
  PUT after it are two requests, so a superseded writer can still land one output in between;
  that output is never vouched for: completion markers are written last and record the size and
  SHA-256 of the outputs they vouch for, and a resume reads those outputs back and redoes the
  shard when one differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
from pathlib import Path

from collapseguard.io.terminal import printable
from collapseguard.io.urls import filesystem, is_fsspec, join, local_path, store_call


def digest_stream(f) -> dict:
    h = hashlib.sha256()
    size = 0
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
        size += len(block)
    return {"size": size, "sha256": h.hexdigest()}


class LocalOutDir:
    remote = False

    def __init__(self, root: str):
        self.root = local_path(root) or root

    def url(self, name: str) -> str:
        return os.path.join(self.root, name)

    def stage(self, name: str, run_id: str = "") -> str:
        p = Path(self.url(name))
        p.parent.mkdir(parents=True, exist_ok=True)
        return str(p.with_name(f"{p.name}.{run_id}.tmp" if run_id else f"{p.name}.tmp"))

    def commit(self, staged: str, name: str) -> None:
        os.replace(staged, self.url(name))

    def discard(self, staged: str) -> None:
        Path(staged).unlink(missing_ok=True)

    def read_text(self, name: str) -> str | None:
        try:
            return Path(self.url(name)).read_text()
        except OSError:
            return None

    def write_text(self, name: str, text: str) -> None:
        staged = self.stage(name)
        Path(staged).write_text(text)
        self.commit(staged, name)

    def size(self, name: str) -> int | None:
        p = Path(self.url(name))
        return p.stat().st_size if p.is_file() else None

    def digest(self, name: str) -> dict | None:
        if self.size(name) is None:
            return None
        with open(self.url(name), "rb") as f:
            return digest_stream(f)

    def remove(self, name: str) -> None:
        p = Path(self.url(name))
        p.unlink(missing_ok=True)
        if p.parent.is_dir():  # temporary files a killed run left
            import glob
            for q in p.parent.glob(glob.escape(p.name) + ".*tmp"):
                q.unlink(missing_ok=True)

    def open_read(self, name: str):
        return open(self.url(name), "rb")

    def read_table(self, name: str, columns: list[str]):
        """Columns of the Parquet output ``name``, read by path (Arrow's own file reading). Read
        through a Python file object, Arrow holds Python buffers that a worker thread of its pool
        could free while the interpreter shut down, which aborted the process after its work
        was done (``terminate called without an active exception``, exit 134)."""
        import pyarrow.parquet as pq

        return pq.read_table(self.url(name), columns=columns)


def _kind(path: str) -> str:
    """What a path that is not what it should be is, in words."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken link" if os.path.islink(path) else "unreadable"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a folder"


def wrong_entries(root: str, folders: tuple[str, ...], files: tuple[str, ...]) -> list[str]:
    """``NAME is KIND`` for each entry of the local folder ``root`` that exists with the wrong
    type: one of ``folders`` that is not a folder (links to folders are folders), one of
    ``files`` that is a folder."""
    out = []
    for name in folders:
        p = os.path.join(root, name)
        if os.path.lexists(p) and not os.path.isdir(p):
            out.append(f"{name} is {_kind(p)}")
    for name in files:
        p = os.path.join(root, name)
        if os.path.isdir(p):
            out.append(f"{name} is a folder")
    return out


class ObjectOutDir:
    """An --out prefix on an fsspec object store (see the module's notes for the rules)."""

    remote = True

    def __init__(self, root: str):
        self.root = root.rstrip("/")
        self.fs, self.path = filesystem(self.root)

    def url(self, name: str) -> str:
        return join(self.root, name)

    def _key(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    def stage(self, name: str, run_id: str = "") -> str:
        # one folder per process: a worker removes its folder once empty, never another's
        folder = Path(tempfile.gettempdir(), f"collapseguard-stage-{run_id}-{os.getpid()}")
        folder.mkdir(parents=True, exist_ok=True)
        staged = folder / f"{name.replace('/', '__')}.tmp"
        staged.touch()  # the folder stays until every staged file is committed or discarded
        return str(staged)

    def commit(self, staged: str, name: str) -> None:
        with store_call(self.url(name)):
            self.fs.put_file(staged, self._key(name))  # one whole-object upload
        self.discard(staged)

    def discard(self, staged: str) -> None:
        Path(staged).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            Path(staged).parent.rmdir()  # when empty

    def read_text(self, name: str) -> str | None:
        try:
            with store_call(self.url(name)):
                return self.fs.cat_file(self._key(name)).decode("utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def write_text(self, name: str, text: str) -> None:
        with store_call(self.url(name)):
            self.fs.pipe_file(self._key(name), text.encode("utf-8"))

    def size(self, name: str) -> int | None:
        try:
            with store_call(self.url(name)):
                info = self.fs.info(self._key(name))
        except FileNotFoundError:
            return None
        return info.get("size") if info.get("type", "file") == "file" else None

    def digest(self, name: str) -> dict | None:
        if self.size(name) is None:
            return None
        with store_call(self.url(name)), self.fs.open(self._key(name), "rb") as f:
            return digest_stream(f)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError), store_call(self.url(name)):
            self.fs.rm_file(self._key(name))

    def open_read(self, name: str):
        """The object's stream; its opening's failures are ``NetworkError``s, its reads' are the
        store's own (a caller reads inside ``urls.store_call``, as ``read_table`` does)."""
        with store_call(self.url(name)):
            return self.fs.open(self._key(name), "rb")

    def read_table(self, name: str, columns: list[str]):
        """Columns of the Parquet output ``name``, from its bytes read whole (see the local
        folder's ``read_table``)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        with store_call(self.url(name)), self.fs.open(self._key(name), "rb") as f:
            data = f.read()
        return pq.read_table(pa.BufferReader(data), columns=columns, use_threads=False, pre_buffer=False)

    def invalidate(self) -> None:
        self.fs.invalidate_cache()

    @contextlib.contextmanager
    def lock(self, run_id: str, quiet: bool = False):
        """Own the prefix for a run: write ``.lock`` = run id (taking over, see the module notes);
        remove it at the end if it still holds this run's id."""
        before = (self.read_text(".lock") or "").strip()
        if before and not quiet:
            # the lock object is data from a shared store: escaped, and cut short
            print(f"note: {printable(self.url('.lock'))} held run {printable(before[:64])} (killed, or still running); this run "
                  "takes over and that run commits nothing more", file=sys.stderr)
        self.write_text(".lock", run_id + "\n")
        try:
            yield run_id
        finally:
            try:
                if (self.read_text(".lock") or "").strip() == run_id:
                    self.remove(".lock")
            except OSError as exc:  # the store went away: the run's own error says what failed
                print(f"note: could not remove {printable(self.url('.lock'))} ({printable(exc)}); the next "
                      "run takes over from it", file=sys.stderr)


def out_dir(root: str) -> LocalOutDir | ObjectOutDir:
    """The output folder ``root`` names: a local folder, or an fsspec URL (object storage)."""
    return ObjectOutDir(root) if is_fsspec(root) else LocalOutDir(root)
