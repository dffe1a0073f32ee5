"""Which audited input each source of a ``dedup`` groups table names (``audit --groups``).

A groups table records each source as ``dedup`` was given it (``data/s1.tar``) and, for a shard
or Parquet file, the size and SHA-256 of the bytes its rows were made from. An audit may name the
same file otherwise (``./data/s1.tar``, an absolute path, from another folder), so a source is
matched by where it is (``io.inputs.path_key``), else, for a local path, by its file name when
exactly one audited local file has that name and the recorded bytes (so a ``pipe:`` command, a
URL or a folder the table names is never matched by name, and nothing the audit was not given
is read). A matched local file whose bytes are not the recorded ones (rewritten since ``dedup``
ran) shows none of its copies: its rows would name other pictures.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from collapseguard.io.inputs import path_key
from collapseguard.io.parse import URLError
from collapseguard.io.terminal import printable
from collapseguard.io.urls import local_path


def _local(name: str) -> str | None:
    try:
        return local_path(name)
    except URLError:  # a file: URL naming another host (the table is data): no local file
        return None


def match_sources(rows: list[dict], audited: Collection[str],
                  shown: Collection[str] | None = None) -> tuple[list[dict], list[str]]:
    """``rows`` (``dedup.gallery.read_gallery_rows``') with each ``source`` that names an audited
    input replaced by that input's name, and the warnings to print. A row whose source was
    rewritten since the table was made gets ``unreadable`` (why its copy is not shown).
    ``shown``: the table sources whose copies the report shows (None: all); only those are
    matched by file name and have their bytes checked (a file is hashed whole), the others by
    where they are alone."""
    from collapseguard.filter.pipeline import file_digest

    by_key = {path_key(a): a for a in audited}
    by_name: dict[str, dict[str, str]] = {}  # file name -> {path_key: one spelling of it}
    for a in sorted(audited):
        path = _local(a)
        if path and os.path.isfile(path):
            by_name.setdefault(os.path.basename(path), {}).setdefault(path_key(a), a)
    digests: dict[str, dict] = {}

    def digest(name: str) -> dict:
        if name not in digests:
            digests[name] = file_digest(_local(name))
        return digests[name]

    first: dict[str, dict] = {}
    for r in rows:
        first.setdefault(r["source"], r)
    mapped: dict[str, str] = {}
    changed: dict[str, str] = {}
    for source, r in first.items():
        sha, size = r.get("source_sha256"), r.get("source_size")
        name = by_key.get(path_key(source))
        if shown is not None and source not in shown:
            if name is not None:  # counted as audited; nothing of it is shown, so not hashed
                mapped[source] = name
            continue
        if name is None:
            path = _local(source)
            cands = list(by_name.get(os.path.basename(path), {}).values()) if path and sha else []
            if len(cands) != 1:
                continue
            name = cands[0]  # the same name elsewhere: shown only if the bytes are the same
        path = _local(name)
        if sha and path and os.path.isfile(path):
            got = digest(name)
            if got["sha256"] != sha or (size is not None and got["size"] != size):
                changed[source] = (f"{printable(name)} is not the file the groups were made from "
                                   f"({size} bytes, SHA-256 {sha[:12]}...; now {got['size']} bytes, "
                                   f"{got['sha256'][:12]}...)")
                continue
        mapped[source] = name
    out = []
    for r in rows:
        r = dict(r)
        if r["source"] in changed:
            r["unreadable"] = "not shown: " + changed[r["source"]]
        elif r["source"] in mapped:
            r["source"] = mapped[r["source"]]
        out.append(r)
    warnings = [f"warning: --groups: {why}: its copies are not shown" for why in changed.values()]
    return out, warnings
