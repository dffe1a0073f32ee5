"""``filter --groups``' rule (``decisions.apply_group``) and its refusal of a table that is not a
dedup groups table."""

from __future__ import annotations

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
