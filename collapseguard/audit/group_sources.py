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
from collapseguard.io.terminal import printable
from collapseguard.io.urls import local_path


def match_sources(rows: list[dict], audited: Collection[str]) -> tuple[list[dict], list[str]]:
    """``rows`` (``dedup.gallery.read_gallery_rows``') with each ``source`` that names an audited
    input replaced by that input's name, and the warnings to print. A row whose source was
    rewritten since the table was made gets ``unreadable`` (why its copy is not shown)."""
    from collapseguard.filter.pipeline import file_digest

    by_key = {path_key(a): a for a in audited}
    by_name: dict[str, dict[str, str]] = {}  # file name -> {path_key: one spelling of it}
    for a in sorted(audited):
        path = local_path(a)
        if path and os.path.isfile(path):
            by_name.setdefault(os.path.basename(path), {}).setdefault(path_key(a), a)
    digests: dict[str, dict] = {}

    def digest(name: str) -> dict:
        if name not in digests:
            digests[name] = file_digest(local_path(name))
        return digests[name]

    first: dict[str, dict] = {}
    for r in rows:
        first.setdefault(r["source"], r)
    mapped: dict[str, str] = {}
    changed: dict[str, str] = {}
    for source, r in first.items():
        sha, size = r.get("source_sha256"), r.get("source_size")
        name = by_key.get(path_key(source))
        if name is None:
            path = local_path(source)
            cands = list(by_name.get(os.path.basename(path), {}).values()) if path and sha else []
            if len(cands) != 1:
                continue
            name = cands[0]  # the same name elsewhere: shown only if the bytes are the same
        path = local_path(name)
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
