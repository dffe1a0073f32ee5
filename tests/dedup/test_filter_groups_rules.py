"""``filter --groups``' rule (``decisions.apply_group``) and its refusal of a table that is not a
dedup groups table."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from cg_testutil import run_cli

from collapseguard.filter.decisions import apply_group

KEPT = ("kept", "kept")


@pytest.mark.parametrize("row, drop, want", [
    (None, False, KEPT),  # no row: the no-reference decision stands
    ({"group": "", "decision": "single", "rank": 0}, True, KEPT),
    ({"group": "g1", "decision": "keep", "rank": 0}, True, KEPT),  # the copy a group keeps
    ({"group": "g1", "decision": "keep", "rank": 2}, False, KEPT),  # a duplicate, kept by default
    ({"group": "g1", "decision": "keep", "rank": 2}, True, ("rejected", "duplicate")),
    ({"group": "g1", "decision": "degraded_copy", "rank": 3}, False, ("rejected", "degraded_copy")),
])
def test_apply_group(row, drop, want):
    assert apply_group(*KEPT, row, drop) == want


def test_a_sample_rejected_on_its_own_keeps_its_reason():
    row = {"group": "g1", "decision": "keep", "rank": 0}
    assert apply_group("rejected", "decode_error", row, True) == ("rejected", "decode_error")
    assert apply_group("rejected", "degraded", {**row, "decision": "degraded_copy"}) == ("rejected", "degraded")


def test_a_table_that_is_not_a_groups_table_is_refused_in_one_line(dedup_shards, tmp_path):
    other = tmp_path / "scores.parquet"
    pd.DataFrame({"key": ["a"], "score": [1.0]}).to_parquet(other)
    res = run_cli(["filter", dedup_shards[0], "--out", tmp_path / "o", "--groups", other,
                   "--threshold", "3", "-q"], expect=1)
    assert "not a dedup groups.parquet" in res.output and len(res.output.strip().splitlines()) == 1


def test_a_copy_filter_sets_aside_is_never_the_kept_one(photos, tmp_path):
    """A shard holds one picture twice: as PNG under an unsafe member name (``../a.png``, which
    ``filter`` rejects as ``unsafe_name`` whatever its score) and as a JPEG q75. ``dedup`` ranks
    the set-aside copy after the other, so ``filter --groups --drop-duplicates`` keeps the JPEG:
    the picture does not lose every copy."""
    import tarfile

    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg, encode_png

    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "../a.png", encode_png(photos[1]))
        add_member(tf, "b.jpg", encode_jpeg(photos[1], 75))
    run_cli(["dedup", shard, "--out", tmp_path / "d", "-w", "1", "-q"])
    groups = pd.read_parquet(tmp_path / "d" / "groups.parquet").set_index("key")
    assert groups.loc["a", "group"] and groups.loc["a", "group"] == groups.loc["b", "group"]
    assert groups.loc["b", "rank"] == 0 and groups.loc["a", "rank"] == 1
    run_cli(["filter", shard, "--out", tmp_path / "f", "--groups", tmp_path / "d" / "groups.parquet",
             "--drop-duplicates", "-w", "1", "-q"])
    scores = pd.read_parquet(tmp_path / "f" / "scores" / "s.parquet").set_index("key")
    assert scores.loc["a", "reason"] == "unsafe_name"
    assert scores.loc["b", "decision"] == "kept", scores[["decision", "reason"]]


def test_a_group_kept_outside_the_inputs_keeps_a_stand_in_unless_filtered_as_a_reference(
        dedup_shards, tmp_path):
    """``dedup`` over three shards, ``filter`` over two of them: the groups whose kept copy lies in
    the third keep their best-ranked copy among the two (by default), so no picture loses every
    copy to the group rule; ``--kept-elsewhere reference`` filters the two against the copies kept
    in the third, which drops every copy of those pictures here."""
    run_cli(["dedup", *dedup_shards, "--out", tmp_path / "d", "-w", "1", "-q"])
    table = tmp_path / "d" / "groups.parquet"
    rows = pd.read_parquet(table)
    grouped = rows[rows["group"] != ""]
    kept_in_b = set(grouped.loc[(grouped["rank"] == 0) & (grouped["shard"] == "shard-b"), "group"])
    here = grouped[grouped["shard"].isin(["shard-a", "shard-c"]) & grouped["group"].isin(kept_in_b)]
    assert len(kept_in_b) >= 2 and here["group"].nunique() == len(kept_in_b)  # the chain and the clean picture
    inputs = [dedup_shards[0], dedup_shards[2]]

    def decided(mode):
        out = tmp_path / mode
        res = run_cli(["filter", *inputs, "--out", out, "--groups", table, "--drop-duplicates",
                       "--threshold", "1e9", "--kept-elsewhere", mode, "-w", "1"])
        assert f"{len(kept_in_b)} group(s) keep a copy outside these inputs" in res.output
        scores = pd.concat([pd.read_parquet(out / "scores" / f"shard-{s}.parquet") for s in "ac"])
        summary = json.loads((out / "summary.json").read_text())
        assert summary["groups"]["groups_kept_elsewhere"] == len(kept_in_b)
        assert summary["groups"]["kept_elsewhere"] == mode
        return scores.set_index("key").loc[here["key"]]

    stand = decided("stand-in")  # one copy per picture, the best-ranked one here
    best = here.sort_values("rank").drop_duplicates("group")["key"]
    assert sorted(stand.index[stand["decision"] == "kept"]) == sorted(best)
    assert set(stand.loc[~stand.index.isin(best), "reason"]) <= {"duplicate", "degraded_copy"}
    ref = decided("reference")  # every copy decided against the one kept in shard-b
    assert (ref["decision"] == "rejected").all(), ref[["decision", "reason"]]
    # a stand-in the detector rejects leaves its picture no copy here: counted and said, not silent
    res = run_cli(["filter", *inputs, "--out", tmp_path / "low", "--groups", table, "--drop-duplicates",
                   "--threshold", "-1e9", "-w", "1", "-q"])
    summary = json.loads((tmp_path / "low" / "summary.json").read_text())
    assert summary["groups"]["kept_elsewhere_without_kept_copy"] == len(kept_in_b)
    assert f"warning: {len(kept_in_b)} group(s) kept outside these inputs have no copy in kept/" in res.output
    assert json.loads((tmp_path / "stand-in" / "summary.json").read_text())["groups"][
        "kept_elsewhere_without_kept_copy"] == 0
    # resume: a shard whose stand-ins the added input does not move is reused; one whose do is refused
    base = ["--groups", table, "--drop-duplicates", "--threshold", "1e9", "-w", "1", "-q"]
    run_cli(["filter", dedup_shards[0], "--out", tmp_path / "o1", *base])
    res = run_cli(["filter", *inputs, "--out", tmp_path / "o1", *base[:-1]])
    assert "resuming: 1 of 2 shard(s) already complete" in res.output, res.output
    run_cli(["filter", dedup_shards[2], "--out", tmp_path / "o2", *base])
    res = run_cli(["filter", *inputs, "--out", tmp_path / "o2", *base], expect=1)
    assert "shard-c.tar was completed" in res.output and "groups_stand_ins" in res.output, res.output
    res = run_cli(["filter", *inputs, "--out", tmp_path / "x", "--kept-elsewhere", "reference"], expect=2)
    assert "--kept-elsewhere needs --groups" in res.output  # as --drop-duplicates does
    # over all three shards no group is kept elsewhere
    res = run_cli(["filter", *dedup_shards, "--out", tmp_path / "all", "--groups", table,
                   "--drop-duplicates", "--threshold", "1e9", "-w", "1"])
    assert "outside these inputs" not in res.output


def test_stand_ins_are_the_rows_filter_applies_a_group_row_to(tmp_path):
    """Groups tables written by hand: g1 is kept in a loose file (no stem), g2 in ``p2``. Filtering
    ``p1`` alone, each has a stand-in in ``p1``, its lowest rank there. With row indices (a
    Parquet file) the second row of the repeated key ``k`` can stand in and is marked by its
    index; without them (matched by key, as a tar shard's samples are) only a key's first row
    takes a group row, so the stand-in is the next best row, ``y``."""
    from collapseguard.filter.decisions import read_row_groups, read_shard_groups, stand_ins

    rows = pd.DataFrame({
        "shard": ["", "p1", "p1", "p2", "p1", "p1"],
        "key": ["loose.png", "k", "k", "x", "y", "z"],
        "row": [None, 0, 1, 0, 2, 3],
        "group": ["g1", "g1", "g1", "g2", "g2", ""],
        "rank": [0, 2, 1, 0, 1, 0],
        "decision": ["keep", "degraded_copy", "keep", "keep", "degraded_copy", "single"],
    })
    indexed, by_key = tmp_path / "indexed.parquet", tmp_path / "by_key.parquet"
    rows.to_parquet(indexed)
    rows.assign(group=["g1", "g1", "g1", "g2", "g1", ""]).drop(columns="row").to_parquet(by_key)
    found = stand_ins(str(indexed), {"p1"})
    assert found == {"groups": ["g1", "g2"], "by_stem": {"p1": (("k", 1), ("y", 2))}}
    assert stand_ins(str(indexed), {"p1", "p2"})["groups"] == ["g1"]  # g2 is kept among them
    marked = read_row_groups(str(indexed), "p1", "d1", found["by_stem"]["p1"])
    assert [i for i, r in sorted(marked.items()) if r.get("stands_in")] == [1, 2]
    assert not any(r.get("stands_in") for r in read_row_groups(str(indexed), "p1", "d1").values())
    assert apply_group(*KEPT, marked[2], True) == KEPT  # a degraded copy, standing in
    assert apply_group(*KEPT, marked[0], True) == ("rejected", "degraded_copy")

    keyed = stand_ins(str(by_key), {"p1"})  # k's second row is no candidate: y (rank 1) stands in
    assert keyed == {"groups": ["g1"], "by_stem": {"p1": (("y", None),)}}
    got = read_shard_groups(str(by_key), "p1", "d2", keyed["by_stem"]["p1"])
    assert got["y"].get("stands_in") and not got["k"].get("stands_in")


def test_filter_with_stand_ins_exits_0_every_time(photos, tmp_path):
    """The stand-in check reads the scores tables back in the parent process. Read through Python
    file objects, Arrow kept Python buffers that a thread of its pool freed while the interpreter
    shut down, aborting the finished process now and then (exit 134, ``terminate called without
    an active exception``): a real process, run several times, must exit 0 each time. The kept
    copies lie in a folder outside the filtered shard, which holds a JPEG q40 and a noisy copy of
    each."""
    import subprocess
    import sys
    import tarfile

    import numpy as np
    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg, encode_png

    held, shard = tmp_path / "held", tmp_path / "new" / "new-000.tar"
    held.mkdir()
    shard.parent.mkdir()
    rng = np.random.default_rng(0)
    with tarfile.open(shard, "w") as tf:
        for i, p in enumerate(photos):
            (held / f"p{i}.png").write_bytes(encode_png(p))
            add_member(tf, f"p{i}_q40.jpg", encode_jpeg(p, 40))
            noisy = np.clip(p + rng.normal(0, 15, p.shape), 0, 255).astype(np.uint8)
            add_member(tf, f"p{i}_noisy.png", encode_png(noisy))
    run_cli(["dedup", held, shard, "--out", tmp_path / "d", "-w", "1", "-q"])
    for i in range(8):
        res = subprocess.run([sys.executable, "-m", "collapseguard", "filter", str(shard), "--out",
                              str(tmp_path / f"f{i}"), "--groups", str(tmp_path / "d" / "groups.parquet"), "-q"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and "terminate called" not in res.stderr, (i, res.returncode, res.stderr[-2000:])
