"""From a scored sample to a decision: which bucket (kept/rejected) and why.

Reasons:
- ``kept``          scored at or below the threshold;
- ``degraded``      scored above the threshold;
- ``decode_error``  an image in the sample could not be decoded (rejected: nothing to vouch for);
- ``no_image``      the sample holds no image file (kept unless ``reject_no_image``);
- ``score_error``   the detector returned NaN for every image (kept: no evidence of damage);
- ``unsafe_name``   member names had to be changed to be written safely (an absolute path, ``..``,
  a control character, a hidden name, a name repeated within the sample, written as
  ``<name>.dupN``): set aside for a look;
- ``refused_member`` a member was not read (a link, device, sparse or oversized member, see
  ``io.tar``): what the sample really holds is unknown, so it is set aside for a look;
- ``repeated_key``  the sample's key already named an earlier sample of the shard (``k, j, k``):
  the first is decided as usual, each later one is set aside (``io.tar``'s rule for repeated keys);
- ``degraded_copy`` ``filter --groups``: the sample is a copy of a picture that ``dedup`` found in a
  less degraded copy elsewhere in the data (its group's decision ``degraded_copy``);
- ``duplicate``     ``filter --groups --drop-duplicates``: another copy of a picture whose group
  keeps a different copy (classic deduplication: one copy per group).

Neither group reason is given when the group's kept copy is itself rejected by the no-reference
decision (``apply_group``): the group's other copies keep their own decision. A group whose kept
copy is not among the filter's inputs (a loose file, or a shard filtered in another run) has a
stand-in among them, its best-ranked copy there, which no group reason rejects (``stand_ins``),
unless the run filters against the copies kept elsewhere (``KEPT_ELSEWHERE``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection

from collapseguard.errors import CollapseguardError
from collapseguard.io.terminal import printable
from collapseguard.scoring.records import SET_ASIDE_REASONS, Scored, first_set_aside

REASONS = ("kept", "degraded", "decode_error", "no_image", "score_error", *SET_ASIDE_REASONS,
           "degraded_copy", "duplicate")


def decide(scored: Scored, threshold: float, *, unsafe: bool = False, refused: bool = False,
           repeated: bool = False, reject_no_image: bool = False) -> tuple[str, str]:
    """Return ``(decision, reason)`` with decision ``"kept"`` or ``"rejected"``. A sample set
    aside (``unsafe``, ``refused``, ``repeated``: ``records.first_set_aside``, in the order of
    ``records.SET_ASIDE_REASONS``) is rejected for that reason whatever its score."""
    aside = first_set_aside(unsafe=unsafe, refused=refused, repeated=repeated)
    if aside:
        return "rejected", aside
    if scored.status == "decode_error":
        return "rejected", "decode_error"
    if scored.status == "no_image":
        return ("rejected" if reject_no_image else "kept"), "no_image"
    if scored.status == "score_error" or math.isnan(scored.score):
        return "kept", "score_error"
    if scored.score > threshold:
        return "rejected", "degraded"
    return "kept", "kept"


def apply_group(decision: str, reason: str, group_row: dict | None,
                drop_duplicates: bool = False, *, threshold: float | None = None,
                detector: str = "") -> tuple[str, str]:
    """A sample's ``(decision, reason)`` with its row of ``dedup``'s groups.parquet applied: a
    sample this filter keeps is rejected as ``degraded_copy`` when its group says so, or as
    ``duplicate`` (only with ``drop_duplicates``) when its group keeps another copy. A sample
    rejected on its own, or without a group row, keeps its decision. So does every copy of a
    group whose kept copy this filter rejects: its row's ``kept_score`` (the kept copy's score
    by ``kept_detector``, ``name@version``) is above ``threshold`` and ``detector`` (the filter's
    own ``name@version``) is that detector; the picture is then never lost to the group rule.
    Nor is a row that ``stands_in`` for a kept copy outside the filter's inputs."""
    if decision != "kept" or not group_row or not group_row.get("group") or group_row.get("stands_in"):
        return decision, reason
    if int(group_row.get("rank") or 0) > 0 and kept_copy_rejected(group_row, threshold, detector):
        return decision, reason
    if group_row.get("decision") == "degraded_copy":
        return "rejected", "degraded_copy"
    if drop_duplicates and int(group_row.get("rank") or 0) > 0:
        return "rejected", "duplicate"
    return decision, reason


def kept_copy_rejected(group_row: dict, threshold: float | None, detector: str) -> bool:
    """Does the no-reference decision (``decide``'s ``degraded``) reject the group's kept copy?
    Known only when the table scored it with this filter's detector (``kept_detector``)."""
    score = group_row.get("kept_score")
    if threshold is None or not detector or group_row.get("kept_detector") != detector:
        return False
    return score is not None and not math.isnan(score) and score > threshold


_GROUPS_CACHE: dict[str, object] = {}


#: columns of a groups table that ``read_shard_groups`` passes on when the table has them
OPTIONAL_COLUMNS = ("kept_score", "kept_detector")

#: ``filter --kept-elsewhere``: what a group whose kept copy is not among the filter's inputs does.
#: ``stand-in``: its best-ranked copy among the inputs takes the kept copy's place (no group reason
#: rejects it, so the filtered data never loses the picture to the group rule); ``reference``:
#: the inputs are filtered against the copies kept elsewhere (a reference collection), so every
#: copy of such a picture here may be rejected.
KEPT_ELSEWHERE = ("stand-in", "reference")


def stand_ins(path: str, inputs: Collection[str]) -> dict[str, object]:
    """The groups of table ``path`` with a copy among the input stems ``inputs`` whose kept copy
    (rank 0) is not among them: ``{"groups": [group ids], "by_stem": {stem: ((key, row index or
    None), ...)}}``,
    the second the stand-ins among the inputs, one per such group that has a copy there: its
    lowest rank (the first row of the lowest) among the rows ``filter`` applies a group row to,
    so not a later sample of a key that repeats in a tar shard (matched by key, the first one
    only; a Parquet row is matched by its index). Read once, by the run's parent process."""
    import pyarrow.parquet as pq

    names = set(pq.read_schema(path).names)
    cols = ["shard", "key", "group", "rank", *(["row"] if "row" in names else [])]
    t = pq.read_table(path, columns=cols)
    mine = set(inputs)
    best: dict[str, tuple] = {}  # group -> (rank, stem, key, row) of its best copy overall
    here: dict[str, tuple] = {}  # ... and among the rows of the inputs a group row applies to
    seen: set[tuple[str, str]] = set()  # (stem, key) of the samples matched by key so far
    present: set[str] = set()  # groups with a copy among the inputs
    rows = t.column("row").to_pylist() if "row" in names else [None] * t.num_rows
    for stem, key, group, rank, row in zip(*(t.column(c).to_pylist() for c in cols[:4]), rows):
        stem = stem or ""
        first = row is not None or (stem, key) not in seen
        seen.add((stem, key))
        if not group:
            continue
        entry = (int(rank or 0), stem, key, None if row is None else int(row))
        if group not in best or entry[0] < best[group][0]:
            best[group] = entry
        if stem in mine:
            present.add(group)
        if first and stem in mine and (group not in here or entry[0] < here[group][0]):
            here[group] = entry
    away = sorted(g for g, e in best.items() if e[1] not in mine and g in present)
    by_stem: dict[str, list] = {}
    for g in away:
        if g in here:
            by_stem.setdefault(here[g][1], []).append(here[g][2:])
    return {"groups": away, "by_stem": {k: tuple(sorted(v, key=repr)) for k, v in by_stem.items()}}


def kept_elsewhere_note(n: int, mode: str) -> str:
    """A line for the ``n`` groups whose kept copy is not among the filter's inputs."""
    if mode == "reference":
        return (f"note: {n} group(s) keep a copy outside these inputs (--kept-elsewhere reference): "
                "their copies here are decided against it, so a picture may keep no copy in kept/")
    return (f"note: {n} group(s) keep a copy outside these inputs: each keeps its best-ranked copy "
            "among them in its place (--kept-elsewhere reference filters against the copy kept "
            "elsewhere instead)")


def _groups_of(path: str, digest: str) -> dict[str, dict]:
    """``stem -> {"keys": {key: row}, "rows": {row index: row}}`` of a groups table's grouped rows
    (``rows`` for Parquet rows, from its ``row`` column), read once per process and table
    (``digest``: its SHA-256, with its path and modification time, names it). A row is
    ``{"group", "decision", "rank"[, "kept_score", "kept_detector"]}``; under ``keys``, the first
    row of a key that repeats."""
    import os

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    ident = (path, digest, os.stat(path).st_mtime_ns)
    if _GROUPS_CACHE.get("ident") != ident:
        names = set(pq.read_schema(path).names)
        extra = [c for c in (*OPTIONAL_COLUMNS, "row") if c in names]
        columns = ["shard", "key", "group", "decision", "rank", *extra]
        made_cols = (["source", "source_size", "source_sha256"]
                     if {"source_size", "source_sha256"} <= names else [])
        table = pq.read_table(path, columns=[*columns, *made_cols])  # the table read once
        by_shard: dict[str, dict] = {}
        if made_cols:  # the bytes each stem's rows were read from
            made = table.select(["shard", *made_cols])
            table = table.select(columns)
            for stem, source, size, sha in set(zip(*(made.column(c).to_pylist() for c in made.column_names))):
                if stem and sha:
                    by_shard.setdefault(stem, {"keys": {}, "rows": {}}).setdefault(
                        "made_from", []).append({"source": source, "size": size, "sha256": sha})
        # a shard's keys that have a grouped row: their rows, the first of each key decides
        grouped = table.filter(pc.not_equal(table.column("group"), ""))
        wanted = set(zip(grouped.column("shard").to_pylist(), grouped.column("key").to_pylist()))
        table = table.filter(pc.is_in(table.column("key"), grouped.column("key").unique()))
        for values in zip(*(table.column(c).to_pylist() for c in columns)):
            row = dict(zip(columns, values))
            stem, key, index = row.pop("shard"), row.pop("key"), row.pop("row", None)
            row["group"] = row["group"] or ""
            mine = by_shard.setdefault(stem, {"keys": {}, "rows": {}})
            if (stem, key) in wanted:
                mine["keys"].setdefault(key, row)
            if index is not None and row["group"]:
                mine["rows"][int(index)] = row
        _GROUPS_CACHE.clear()
        _GROUPS_CACHE.update(ident=ident, by_shard=by_shard, has_rows="row" in names)
    return _GROUPS_CACHE["by_shard"]


def read_shard_groups(path: str, shard_stem: str, digest: str = "",
                      standing: tuple = ()) -> dict[str, dict]:
    """``key -> {"group", "decision", "rank"[, "kept_score", "kept_detector", "stands_in"]}`` of
    one shard's rows in a groups.parquet (the first row of a key that repeats); singles change no
    decision and are left out. ``standing``: the shard's stand-ins (``stand_ins``' ``by_stem``
    entry: ``(key, row)`` pairs), whose rows carry ``"stands_in": True``."""
    keys = _groups_of(path, digest).get(shard_stem, {}).get("keys", {})
    marked = [k for k, row in standing if row is None and k in keys]
    return {**keys, **{k: {**keys[k], "stands_in": True} for k in marked}} if marked else keys


def read_row_groups(path: str, stem: str, digest: str = "",
                    standing: tuple = ()) -> dict[int, dict] | None:
    """``row index -> row`` (as ``read_shard_groups``'s) of one Parquet file's grouped rows, by
    the table's ``row`` column: a key that repeats in the file cannot name the row. None for a
    table without that column (then rows are matched by key, ``read_shard_groups``)."""
    by_shard = _groups_of(path, digest)
    if not _GROUPS_CACHE.get("has_rows"):
        return None
    rows = by_shard.get(stem, {}).get("rows", {})
    marked = [i for _, i in standing if i is not None and i in rows]
    return {**rows, **{i: {**rows[i], "stands_in": True} for i in marked}} if marked else rows


def table_stems(path: str) -> list[str]:
    """The input stems (``shard`` column) a groups table holds rows for, sorted."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    stems = pc.unique(pq.read_table(path, columns=["shard"]).column("shard")).to_pylist()
    return sorted(str(s) for s in stems if s is not None)


def unmatched_inputs(inputs: list[tuple[str, str]], stems: list[str]) -> list[str]:
    """The names of ``inputs`` (``(name, stem)``) whose stem is not among a table's ``stems``."""
    have = set(stems)
    return [name for name, stem in inputs if stem not in have]


def unmatched_inputs_note(path: str, inputs: list[tuple[str, str]], stems: list[str]) -> str:
    """A line for the inputs (``(name, stem)``) the groups table ``path`` has no rows for, ""
    when every input has rows: a table made from other data would otherwise change nothing,
    silently."""
    missing = unmatched_inputs(inputs, stems)
    if not missing:
        return ""
    if len(missing) == len(inputs):
        seen = ", ".join(repr(printable(s)) for s in stems[:3]) or "none"
        return (f"warning: --groups {printable(path)} holds no rows for any of these {len(inputs)} "
                f"input(s) (it names input(s) {seen}{', ...' if len(stems) > 3 else ''}): no group "
                "decision is applied; was it made by `collapseguard dedup` over these inputs?")
    return (f"note: --groups {printable(path)} holds no rows for {len(missing)} of {len(inputs)} "
            f"input(s) (e.g. {printable(missing[0])}): they are decided without groups")


class GroupsOfAnotherInput(CollapseguardError, ValueError):
    """The groups table's rows for an input's stem were made from other bytes (one line)."""


def check_made_from(path: str, stem: str, digest: str, name: str, size: int | None = None,
                    sha256: str | None = None) -> None:
    """Refuse (``GroupsOfAnotherInput``) to apply the table's rows of ``stem`` to the input
    ``name`` when the table recorded the bytes they were made from (``source_size``,
    ``source_sha256``) and the input's ``size`` or ``sha256`` (each None: not known yet) is not
    that of any of them. A table without those columns, or without rows of the stem, passes."""
    made = _groups_of(path, digest).get(stem, {}).get("made_from")
    if not made:
        return
    if any((size is None or m["size"] == size) and (sha256 is None or m["sha256"] == sha256)
           for m in made):
        return
    m = made[0]
    got = (f"{size} bytes" if size is not None else "") + (
        f"{', ' if size is not None else ''}SHA-256 {sha256[:12]}..." if sha256 else "")
    then = f"{m['size']} bytes, SHA-256 {m['sha256'][:12]}..."
    if os.path.realpath(str(m["source"])) == os.path.realpath(str(name)):  # the file, rewritten
        raise GroupsOfAnotherInput(
            f"{printable(name)} has changed since dedup made --groups {printable(path)} from it "
            f"(then {then}; now {got}): its groups are not applied to it; run dedup again")
    raise GroupsOfAnotherInput(
        f"--groups {printable(path)} was made from {printable(m['source'])} ({then}), not from "
        f"{printable(name)} ({got}): its groups are not applied to it")
