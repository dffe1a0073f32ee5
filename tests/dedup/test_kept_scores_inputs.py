"""``kept_score`` is the score ``collapseguard score`` (as ``filter``) gives each group's kept copy,
whatever the kind of input: a shard whose key repeats (the kept copy a later occurrence), a
Parquet file, a folder of image files (the kept copy in the middle of its task), and a sample
of two images, which ``filter`` scores as the highest of its images while the comparator
describes it by another one; on the engine's workers and when the kept copies are read back."""

from __future__ import annotations

import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from cg_testutil import add_member, run_cli

from collapseguard.images import encode_jpeg, encode_png


def _shard(path, samples) -> None:
    with tarfile.open(path, "w") as tf:
        for name, data in samples:
            add_member(tf, name, data)


def _dedup_and_score(inputs, root, *args) -> tuple[list[dict], list[dict]]:
    """``dedup`` (one process) and ``score`` over ``inputs``: (the groups table, the scores table),
    row for row (both in input order)."""
    run_cli(["dedup", *inputs, "--out", root / "dd", "-q", "-w", "1", *args])
    run_cli(["score", *inputs, "-o", root / "scores.parquet", "-q", *args])
    groups = pq.read_table(root / "dd" / "groups.parquet").to_pylist()
    scores = pq.read_table(root / "scores.parquet").to_pylist()
    assert [(r["source"], r["key"]) for r in groups] == [(r["source"], r["key"]) for r in scores]
    return groups, scores


def _assert_kept_scores(groups: list[dict], scores: list[dict]) -> list[int]:
    """Every grouped row's ``kept_score`` is the score of its group's kept row, from the detector
    ``score`` ran; returns the kept rows."""
    kept = [i for i, r in enumerate(groups) if r["group"] and r["rank"] == 0]
    assert kept
    for i in kept:
        want = scores[i]["score"]
        assert np.isfinite(want), scores[i]
        for r in groups:
            if r["group"] == groups[i]["group"]:
                assert r["kept_score"] == pytest.approx(want, abs=1e-4), (r["key"], scores[i])
                assert r["kept_detector"] == f"{scores[i]['detector']}@{scores[i]['detector_version']}"
    return kept


def test_a_repeated_key_kept_copy_is_scored_as_its_own_occurrence(chain_steps, photos, tmp_path):
    """Key ``dup`` names three samples: another picture, then the chain's step 0 and step 5 (both
    set aside as repeated keys, so the group keeps its second occurrence)."""
    shard = tmp_path / "repeat.tar"
    _shard(shard, [("dup.jpg", encode_jpeg(photos[2], 90)), ("mid.jpg", encode_jpeg(photos[3], 90)),
                   ("dup.jpg", encode_jpeg(chain_steps[0], 90)), ("end.jpg", encode_jpeg(photos[1], 90)),
                   ("dup.png", encode_png(chain_steps[5]))])
    groups, scores = _dedup_and_score([shard], tmp_path)
    assert [r["key"] for r in groups] == ["dup", "mid", "dup", "end", "dup"]
    assert _assert_kept_scores(groups, scores) == [2]
    assert groups[2]["group"] == groups[4]["group"] and not groups[0]["group"]
    assert abs(scores[0]["score"] - scores[2]["score"]) > 0.1  # the first occurrence would show


def test_a_parquet_kept_row_is_scored_as_score_scores_it(dedup_parquets, parquet_rows, tmp_path):
    groups, scores = _dedup_and_score([dedup_parquets["pyarrow"]], tmp_path)
    kept = _assert_kept_scores(groups, scores)
    assert [parquet_rows[i][1] for i in kept] == [0]  # the chain's step 0, its fifth row


def test_an_image_file_kept_in_the_middle_of_its_task_is_scored_as_score_scores_it(
        chain_steps, photos, tmp_path):
    from collapseguard.scoring.run import plan_score_tasks

    src = tmp_path / "files"
    src.mkdir()
    for name, data in (("p1_other.jpg", encode_jpeg(photos[2], 90)), ("p2_s5.png", encode_png(chain_steps[5])),
                       ("p3_s0.jpg", encode_jpeg(chain_steps[0], 90)), ("p4_other.jpg", encode_jpeg(photos[3], 90)),
                       ("p5_s3.png", encode_png(chain_steps[3]))):
        (src / name).write_bytes(data)
    tasks = plan_score_tasks([str(src)])
    assert [t[0] for t in tasks] == ["files"] and [f.key for f in tasks[0][1]][2] == "p3_s0.jpg"
    groups, scores = _dedup_and_score([src], tmp_path)
    assert [groups[i]["key"] for i in _assert_kept_scores(groups, scores)] == ["p3_s0.jpg"]


@pytest.fixture(scope="module")
def pair(chain_steps, photos, tmp_path_factory):
    """A shard whose sample ``pair`` holds the chain's step 0 as PNG and as a JPEG q50: the
    comparator describes it by the JPEG (its most degraded image), the default cnn scores the
    PNG higher. It is kept over steps 3 and 5 of the chain. Returns (the shard, the groups
    table, the scores table)."""
    root = tmp_path_factory.mktemp("pair")
    shard = root / "pair.tar"
    _shard(shard, [("pair.a.png", encode_png(chain_steps[0])), ("pair.b.jpg", encode_jpeg(chain_steps[0], 50)),
                   ("s3.png", encode_png(chain_steps[3])), ("s5.png", encode_png(chain_steps[5])),
                   ("other.jpg", encode_jpeg(photos[2], 90))])
    groups, scores = _dedup_and_score([shard], root)
    return shard, groups, scores


def test_a_kept_sample_of_two_images_gets_the_highest_score_of_its_images(pair):
    _, groups, scores = pair
    assert [r["key"] for r in groups] == ["pair", "s3", "s5", "other"]
    # the case itself: the comparator's image is not the one filter's score comes from
    assert groups[0]["image"] == "pair.b.jpg" and scores[0]["image"] == "pair.a.png"
    assert _assert_kept_scores(groups, scores) == [0]


def test_filter_groups_leaves_the_copies_of_a_rejected_two_image_kept_sample_to_themselves(
        chain_steps, tmp_path):
    """End to end: at a threshold between the kept sample's two images, ``filter`` rejects the
    sample on its highest score, so ``filter --groups --drop-duplicates`` leaves the group's other
    copies to their own no-reference decision: a JPEG copy under the threshold is kept, not
    dropped as a duplicate of a sample ``filter`` itself rejects."""
    import pandas as pd
    from cg_testutil import read_members

    shard = tmp_path / "pairs.tar"
    jpeg50 = encode_jpeg(chain_steps[0], 50)
    _shard(shard, [("pair.a.png", encode_png(chain_steps[0])), ("pair.b.jpg", jpeg50),
                   ("copy.jpg", encode_jpeg(chain_steps[0], 30)), ("s3.png", encode_png(chain_steps[3]))])
    groups, scores = _dedup_and_score([shard], tmp_path)
    g = {r["key"]: r for r in groups}
    own = {r["key"]: r["score"] for r in scores}
    assert g["pair"]["rank"] == 0 and g["copy"]["rank"] > 0 and g["copy"]["group"] == g["pair"]["group"]
    _shard(tmp_path / "jpeg.tar", [("j.jpg", jpeg50)])  # the sample's JPEG alone, for its score
    run_cli(["score", tmp_path / "jpeg.tar", "-o", tmp_path / "j.parquet", "-q"])
    jpeg = pq.read_table(tmp_path / "j.parquet").to_pylist()[0]["score"]
    threshold = (jpeg + own["pair"]) / 2
    assert jpeg < threshold < own["pair"] and own["copy"] < threshold, (jpeg, own)
    assert g["copy"]["kept_score"] == pytest.approx(own["pair"], abs=1e-4)
    out = tmp_path / "f"
    run_cli(["filter", shard, "--out", out, "--groups", tmp_path / "dd" / "groups.parquet",
             "--drop-duplicates", "--threshold", f"{threshold:.6f}", "-q"])
    got = pd.read_parquet(out / "scores" / "pairs.parquet").set_index("key")
    assert (got.loc["pair", "decision"], got.loc["pair", "reason"]) == ("rejected", "degraded")
    assert (got.loc["copy", "decision"], got.loc["copy", "reason"]) == ("kept", "kept")
    members = sorted(read_members(out / "kept" / "pairs.tar") + read_members(out / "rejected" / "pairs.tar"))
    assert members == sorted(read_members(shard))


def test_kept_copies_read_back_score_every_image_of_a_sample(pair, dedup_parquets, tmp_path):
    """The kept copies ``score_rows`` leaves unread are read back, every image of a sample scored."""
    from collapseguard.dedup.kept_scores import kept_copy_scores
    from collapseguard.scoring.readback import fetch_samples

    shard, groups, scores = pair
    desc = {k: [r[k] for r in groups] for k in ("source", "key", "image")}
    labels = np.array([int(r["group"][1:]) if r["group"] else -1 for r in groups])
    rank = np.array([r["rank"] for r in groups])

    def unread(rows):
        return np.full(len(rows), np.nan), np.ones(len(rows), bool)

    got, named = kept_copy_scores(desc, labels, rank, score_rows=unread)
    assert got[:3] == pytest.approx([scores[0]["score"]] * 3, abs=1e-4) and np.isnan(got[3])
    assert named[:3] == [groups[0]["kept_detector"]] * 3 and named[3] == ""
    # every image, in member order (one for a file or a Parquet row); one image that cannot be
    # decoded spoils its sample
    broken = tmp_path / "broken.tar"
    _shard(broken, [("x.a.png", encode_png(np.zeros((8, 8, 3), np.uint8))), ("x.b.jpg", b"not a jpeg")])
    (tmp_path / "one.png").write_bytes(encode_png(np.zeros((8, 6, 3), np.uint8)))
    parquet = str(dedup_parquets["pyarrow"])
    got = fetch_samples([(str(shard), "pair", "pair.b.jpg"), (str(broken), "x", ""),
                         (str(tmp_path), "one.png", ""), (parquet, "chain_s0", "")],
                        prepare=lambda im: im.shape[:2], every_image=True)
    assert got[(str(shard), "pair", 0)].prepared == [(256, 320)] * 2
    assert got[(str(broken), "x", 0)].prepared is None and "x.b.jpg" in got[(str(broken), "x", 0)].error
    assert got[(str(tmp_path), "one.png", 0)].prepared == [(8, 6)]
    assert got[(parquet, "chain_s0", 0)].prepared == [(256, 320)]


def test_reading_back_every_image_holds_one_at_a_time_and_stops_at_the_record_cap(
        pair, monkeypatch):
    """As ``filter``: a sample whose images hold over the record cap together is an error; each
    image is handed to ``prepare`` as soon as it is decoded, before the next is decoded."""
    import collapseguard.scoring.readback as readback

    shard = str(pair[0])
    held = []

    def prepare(im):
        held.append(im.shape[:2])
        return float(im.mean())

    monkeypatch.setattr(readback, "MAX_RECORD_PIXELS", 256 * 320 * 2 - 1)  # the pair: 2 x 256x320
    got = readback.fetch_samples([(shard, "pair", "")], prepare=prepare, every_image=True)
    f = got[(shard, "pair", 0)]
    assert f.prepared is None and f.image is None and "hold over 163839 pixels" in f.error
    assert held == [(256, 320)]  # the first image was prepared before the second broke the cap
    monkeypatch.setattr(readback, "MAX_RECORD_PIXELS", 256 * 320 * 2)
    held.clear()
    f = readback.fetch_samples([(shard, "pair", "")], prepare=prepare, every_image=True)[(shard, "pair", 0)]
    assert f.error == "" and len(f.prepared) == 2 and held == [(256, 320)] * 2


def test_one_and_two_workers_write_the_same_table(pair, tmp_path):
    shard, _, _ = pair
    run_cli(["dedup", shard, "--out", tmp_path / "w2", "-q", "-w", "2"])
    assert (tmp_path / "w2" / "groups.parquet").read_bytes() == \
        (shard.parent / "dd" / "groups.parquet").read_bytes()
