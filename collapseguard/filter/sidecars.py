"""Sidecar files of a shard (img2dataset / DataComp layouts), carried to kept/ and rejected/.

img2dataset writes ``00000.tar`` with ``00000.parquet`` (one row per attempted sample, a ``key``
column) and ``00000_stats.json`` beside it. The sidecars of shard ``<stem>.tar`` are the files of
its folder named ``<stem>_stats.json`` or ``<stem>.<anything>``, except tars and ``<stem>.tar*``
(indexes or checksums of the input tar, which would be wrong for a filtered one), and except files
that belong to a longer-named shard of the same folder (``a.b.parquet`` is ``a.b.tar``'s).

Each output shard gets its own copy:

- ``<stem>.parquet`` keeps exactly the rows whose ``key`` is a sample that output holds (same
  schema and row order); a key naming several samples has its rows matched to them in order
  (``row_outputs``), so every row lands in one output. A parquet without a ``key`` column cannot
  be split and is refused.
- the rows whose ``key`` names no sample of the shard (img2dataset's ``failed_to_download`` rows,
  or rows of samples missing from the tar) go to ``orphan_rows/<name>.parquet`` beside kept/ and
  rejected/ (same schema and row order; written only when there are such rows), so every row of
  the input parquet is in exactly one of kept/, rejected/ and orphan_rows/. ``summary.json``
  counts them per shard and names the first keys of those whose ``status`` is not a failure.
- ``<stem>_stats.json`` follows img2dataset's fields: ``count``, ``failed_to_download``,
  ``failed_to_resize``, ``duration`` and the rest stay as the input has them (they describe the
  download); ``successes`` is the number of samples in this output shard; ``status_dict`` keeps
  the input's statuses with ``success`` replaced by that number and the samples now in the other
  output counted as ``collapseguard: <reason>`` and the input's successes that are no sample of
  its tar as ``collapseguard: missing_from_tar``, so the statuses still add up to ``count`` when
  they did; ``collapseguard`` records the filter's result (detector, threshold, kept, rejected,
  reasons, the input's ``successes``). A stats file that is no readable JSON object (cut short,
  not UTF-8) is copied byte for byte, as the input has it, and the shard's record says so
  (``sidecar_notes``): an optional bookkeeping file never keeps a shard from being filtered.
- anything else is copied byte for byte.

A sidecar that is a link to a file outside the shard's folder is refused (the shard fails with
``SidecarError``), never copied.

Output bytes depend only on the inputs and the filter's settings (no times), so a resumed run
writes the same files.
"""

from __future__ import annotations

import functools
import io
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from collapseguard.errors import CollapseguardError
from collapseguard.io.parse import strip_suffix
from collapseguard.io.urls import SHARD_SUFFIXES


class SidecarError(CollapseguardError, ValueError):
    """A sidecar file cannot be carried (an unreadable parquet, one without a key column, a link
    outside the shard's folder)."""


def stem_of(shard: str) -> str:
    """The shard's file name without its shard suffix, in any letter case (``00000.TAR``'s
    sidecars are ``00000.parquet`` and ``00000_stats.json``, as the reader takes it for a shard)."""
    name = os.path.basename(shard)
    return strip_suffix(name) if _is_tar(name) else name  # a Parquet input has no sidecars


def _is_tar(name: str) -> bool:
    return name.lower().endswith(SHARD_SUFFIXES)


@dataclass(frozen=True)
class RemoteFile:
    """A sidecar of a URL shard: what ``write_sidecars`` reads of a local ``Path`` (its name and
    bytes), from the store."""

    url: str
    name: str

    def read_bytes(self) -> bytes:
        from collapseguard.io.urls import read_bytes
        return read_bytes(self.url)


def find_sidecars(shard: str) -> list:
    """The sidecar files of ``shard`` (see the module docstring), sorted by name: ``Path``s
    beside a local shard, ``RemoteFile``s beside a URL shard whose folder the store lists (an
    object store's prefix, a web server's index page; none where it cannot be listed), none for
    a ``pipe:`` shard."""
    from collapseguard.io.urls import is_remote, scheme
    if is_remote(shard):
        if scheme(shard) == "pipe":
            return []
        urls = dict(_folder_listing(shard.rsplit("/", 1)[0] + "/"))
        return [RemoteFile(urls[n], n) for n in _named_sidecars(shard, sorted(urls))]
    folder = Path(shard).parent
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_file())
    except OSError:
        return []
    return [folder / n for n in _named_sidecars(shard, names)]


@functools.lru_cache(maxsize=16)
def _folder_listing(folder: str) -> tuple[tuple[str, str], ...]:
    """``(name, url)`` of the files directly in a URL folder (one listing per folder and
    process: every shard of a folder reads it); empty when it cannot be listed."""
    from collapseguard.io.urls import filesystem
    try:
        fs, path = filesystem(folder)
        entries = fs.ls(path, detail=True)
    except Exception:  # noqa: BLE001 - no index page, a 403, the network, a store's own error
        return ()  # (aiohttp, botocore): no sidecars found, as for a folder that holds none
    out = []
    for e in entries:
        if e.get("type") == "directory":
            continue
        url = e["name"] if "://" in e["name"] else fs.unstrip_protocol(e["name"])
        name = url.rstrip("/").rsplit("/", 1)[-1]
        if url.rsplit("/", 1)[0] == folder.rstrip("/") and name:  # in this folder, not a link elsewhere
            out.append((name, url))
    return tuple(sorted(out))


def _named_sidecars(shard: str, names: list[str]) -> list[str]:
    """The sidecars among the file ``names`` (sorted) of the shard's folder."""
    stem = stem_of(shard)
    stems = {stem_of(n) for n in names if _is_tar(n)}
    longer = [s for s in stems if s != stem and s.startswith(stem + ".")]
    out = []
    for n in names:
        if _is_tar(n) or n.lower().startswith(stem.lower() + ".tar") or n.endswith(".tmp"):
            continue
        if not (n == f"{stem}_stats.json" or n.startswith(stem + ".")):
            continue
        if any(n == f"{s}_stats.json" or n.startswith(s + ".") for s in longer):
            continue
        out.append(n)
    return out


def input_identity(paths: list) -> dict:
    """Name -> size and mtime of the sidecar inputs, a remote one's as ``io.urls.identity``
    states it (a changed sidecar redoes the shard)."""
    from collapseguard.io.urls import identity
    out = {}
    for p in paths:
        if isinstance(p, RemoteFile):
            out[p.name] = identity(p.url)
            continue
        st = p.stat()
        out[p.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return out


#: ``status_dict``'s entry for the successes of the input's stats that are no sample of its tar
MISSING_STATUS = "collapseguard: missing_from_tar"


class UnreadableStats(SidecarError):
    """A stats file that is no JSON object (the caller copies it unchanged)."""


def _stats(src: Path, output: str, held: int, other: Counter, reasons: Counter, summary: dict) -> bytes:
    try:
        stats = json.loads(src.read_bytes())
    except ValueError as exc:  # not JSON, not UTF-8
        raise UnreadableStats(f"{src.name}: not a readable stats file ({exc})") from None
    except RecursionError:  # data from elsewhere: nested deeper than the parser goes
        raise UnreadableStats(f"{src.name}: not a readable stats file (JSON nested too deeply)") from None
    if not isinstance(stats, dict):
        raise UnreadableStats(f"{src.name}: not a readable stats file (not a JSON object)")
    out = dict(stats)
    input_successes = stats.get("successes")
    out["successes"] = held
    status = stats.get("status_dict")
    if status is not None and not isinstance(status, dict):  # not img2dataset's: kept as it is
        raise UnreadableStats(f"{src.name}: not a readable stats file (its status_dict is no object)")
    status = dict(status or {})
    claimed = status.get("success")
    status["success"] = held
    for reason, n in sorted(other.items()):
        status[f"collapseguard: {reason}"] = n
    # successes the tar does not hold (their rows are orphan rows): counted, so the statuses add
    # up to ``count`` in both outputs as they did in the input
    missing = claimed - held - sum(other.values()) if type(claimed) is int else 0
    if missing > 0:
        status[MISSING_STATUS] = missing
    out["status_dict"] = status
    out["collapseguard"] = {**summary, "output": output, "input_successes": input_successes,
                            "reasons": dict(sorted(reasons.items()))}
    try:  # a value JSON cannot hold (1e999999 read as inf): the file is copied as it is
        return (json.dumps(out, indent=4, sort_keys=False, allow_nan=False) + "\n").encode()
    except ValueError as exc:
        raise UnreadableStats(f"{src.name}: not a readable stats file ({exc})") from None


def row_outputs(row_keys: list, decisions: list[tuple[str, str, str]]) -> list[str | None]:
    """The output (``"kept"``/``"rejected"``) each parquet row goes to, ``None`` for a row whose
    key names no sample of the shard (img2dataset's failed downloads).

    A key that names several samples (``k, j, k``: the later ones are rejected as
    ``repeated_key``) has its rows matched to its samples in order, the n-th row to the n-th
    sample, so each row goes to exactly one output; rows beyond the key's samples follow its first
    sample. Samples set aside for their names (``unsafe_name``: ``/k.jpg`` cleaned to key ``k``)
    come after the key's samples with safe names: img2dataset wrote its row for the real ``k``.
    A shard re-packed with ``tar cf shard.tar .`` names its samples ``./k``: they match row ``k``."""
    by_key: dict[str, list[str]] = {}
    for unsafe in (False, True):
        for key, decision, reason in decisions:
            if (reason == "unsafe_name") == unsafe:
                by_key.setdefault(key.removeprefix("./"), []).append(decision)
    seen: Counter = Counter()
    out: list[str | None] = []
    for raw in row_keys:
        key = None if raw is None else str(raw).removeprefix("./")
        outs = by_key.get(key)
        if not outs:
            out.append(None)
            continue
        n = seen[key]
        seen[key] += 1
        out.append(outs[n] if n < len(outs) else outs[0])
    return out


#: the folder of ``--out`` holding the parquet rows that match no sample of their shard
ORPHAN_FOLDER = "orphan_rows"
#: keys of unmatched rows named in the summary, per shard
ORPHAN_KEYS_NAMED = 5


def _read_parquet(src: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        table = pq.read_table(src if isinstance(src, Path) else io.BytesIO(src.read_bytes()))
    except (OSError, pa.ArrowException) as exc:
        raise SidecarError(f"{src}: cannot read the parquet sidecar ({exc})") from None
    if "key" not in table.column_names:
        raise SidecarError(f"{src}: a shard's parquet needs a 'key' column (img2dataset's) to be "
                           f"split between kept/ and rejected/; columns: {table.column_names}")
    return table


def _write_rows(table, goes: list[str | None], output: str | None, tmp: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(table.filter(pa.array([g == output for g in goes], pa.bool_())), tmp)


def _orphan_record(table, goes: list[str | None], name: str) -> dict:
    """What the summary says of a parquet's rows that match no sample: how many, by ``status``
    (img2dataset's column, when there is one), and the first keys of those whose status is not a
    failure (rows that claim a sample the shard does not hold)."""
    keys = table.column("key").to_pylist()
    status = (table.column("status").to_pylist() if "status" in table.column_names
              else [None] * len(keys))
    lost = [(k, s) for k, s, g in zip(keys, status, goes) if g is None]
    by_status = Counter("(none)" if s is None else str(s) for _, s in lost)
    unexpected = [k for k, s in lost if not (isinstance(s, str) and s.startswith("failed"))]
    return {"file": f"{ORPHAN_FOLDER}/{name}", "rows": len(lost),
            "by_status": dict(sorted(by_status.items())),
            "not_failed": len(unexpected),
            "not_failed_keys": [str(k) for k in unexpected[:ORPHAN_KEYS_NAMED]]}


def _check_inside(src: Path, folder: Path) -> None:
    """Refuse a sidecar that is a link to a file outside the shard's folder: a downloaded archive
    can carry ``00000.meta -> /etc/passwd``, which would be copied into kept/ and rejected/."""
    if src.is_symlink() and not src.resolve().is_relative_to(folder.resolve()):
        raise SidecarError(f"{src}: a sidecar that links outside the shard's folder is not copied; "
                           "replace the link with the file, or remove it")


def write_sidecars(shard: str, decisions: list[tuple[str, str, str]], *,
                   outputs: tuple[str, ...], summary: dict, stage,
                   orphans: list[dict] | None = None, notes: list[str] | None = None
                   ) -> list[tuple[str, str]]:
    """Write each output's sidecars under staged names; returns ``(staged, name)`` pairs (name
    relative to ``--out``) for the caller to commit with the shard.

    ``decisions`` is ``(key, decision, reason)`` per sample of the shard; ``outputs`` the outputs
    written (``"kept"``, and ``"rejected"`` unless it is not); ``stage(name)`` the local path to
    write an output to before it is committed (``io.outdir``). ``orphans`` (optional) receives,
    per parquet with rows that match no sample, what ``_orphan_record`` says of them; those rows
    are written to ``orphan_rows/<name>`` when any output is. ``notes`` (optional) receives a
    line for each sidecar copied unchanged because it could not be read as its kind.
    """
    sidecars = find_sidecars(shard)
    if not sidecars:
        return []
    for src in sidecars:
        if isinstance(src, Path):  # a store's object is no link
            _check_inside(src, Path(shard).parent)
    held = Counter(d for _, d, _ in decisions)  # samples per output (a repeated key counts each time)
    reasons = {o: Counter(r for _, d, r in decisions if d == o) for o in ("kept", "rejected")}
    pairs: list[tuple[str, str]] = []
    tables = {}
    try:
        for src in sidecars:
            if src.name.endswith(".parquet") and outputs:
                table = _read_parquet(src)
                goes = row_outputs(table.column("key").to_pylist(), decisions)
                tables[src.name] = (table, goes)
                if None in goes:
                    name = f"{ORPHAN_FOLDER}/{src.name}"
                    staged = stage(name)
                    pairs.append((staged, name))
                    _write_rows(table, goes, None, Path(staged))
                    if orphans is not None:
                        orphans.append(_orphan_record(table, goes, src.name))
        for output in outputs:
            other = "rejected" if output == "kept" else "kept"
            for src in sidecars:
                name = f"{output}/{src.name}"
                staged = stage(name)
                pairs.append((staged, name))
                if src.name.endswith(".parquet"):
                    _write_rows(*tables[src.name], output, Path(staged))
                elif src.name == f"{stem_of(shard)}_stats.json":
                    try:
                        data = _stats(src, output, held[output], reasons[other], reasons[output], summary)
                    except UnreadableStats as exc:
                        data = src.read_bytes()
                        if notes is not None and output == outputs[0]:
                            notes.append(f"{exc}: copied unchanged")
                    Path(staged).write_bytes(data)
                else:
                    Path(staged).write_bytes(src.read_bytes())
    except BaseException:
        for staged, _ in pairs:
            Path(staged).unlink(missing_ok=True)
        raise
    return pairs


def output_names(shard: str) -> list[str]:
    """The names (relative to ``--out``) a shard's sidecars can have among the outputs."""
    found = find_sidecars(shard)
    return [f"{o}/{src.name}" for src in found for o in ("kept", "rejected")] + [
        f"{ORPHAN_FOLDER}/{src.name}" for src in found if src.name.endswith(".parquet")]


def still_valid(marker: dict, shard: str, out) -> bool:
    """Do the sidecars recorded in a completion marker match the inputs now and the outputs in
    ``out`` (an ``io.outdir`` store)?"""
    recorded = marker.get("sidecars") or {"inputs": {}, "outputs": {}}
    if recorded.get("inputs", {}) != input_identity(find_sidecars(shard)):
        return False
    return all(out.digest(name) == want for name, want in (recorded.get("outputs") or {}).items())
