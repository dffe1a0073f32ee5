"""``dedup`` describes a grouped image only at the scale its group compares at (pass 3), and its
decisions are those of full descriptions: groups of copies at several sizes (every rung of the
ladder, a tiny copy below the first), ranked again here from every image's full ladder."""

from __future__ import annotations

import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from cg_testutil import add_member
from PIL import Image

from collapseguard.images import encode_jpeg, encode_png


def _short(img, short: int):
    h, w = img.shape[:2]
    f = short / min(h, w)
    return np.asarray(Image.fromarray(img).resize((round(w * f), round(h * f)), Image.LANCZOS))


@pytest.fixture(scope="module")
def sized_shards(tmp_path_factory, photos, chain_steps):
    """A chain at full size (short side 256: the top rung); the coffee photo (240) with a copy at
    180 (the middle rung); the rocket (256) with copies at 300, 100 (the first rung) and 48 (below
    it: described at its own size)."""
    root = tmp_path_factory.mktemp("sized")
    coffee, rocket = photos[1], photos[3]
    a = [("s0", encode_jpeg(chain_steps[0], 90), "jpg"), ("s10", encode_png(chain_steps[10]), "png"),
         ("coffee", encode_png(coffee), "png"), ("rocket_300", encode_jpeg(_short(rocket, 300), 85), "jpg")]
    b = [("coffee_180", encode_jpeg(_short(coffee, 180), 80), "jpg"), ("s3", encode_png(chain_steps[3]), "png"),
         ("rocket", encode_jpeg(rocket, 92), "jpg"), ("rocket_48", encode_png(_short(rocket, 48)), "png"),
         ("rocket_100", encode_png(_short(rocket, 100)), "png")]
    paths = []
    for name, samples in (("a", a), ("b", b)):
        p = root / f"sized-{name}.tar"
        with tarfile.open(p, "w") as tf:
            for key, data, ext in samples:
                add_member(tf, f"{key}.{ext}", data)
        paths.append(p)
    return paths


def test_groups_decide_from_their_rung_as_from_full_descriptions(sized_shards, tmp_path):
    import torch

    from collapseguard.dedup.run import decide_groups, run_dedup
    from collapseguard.detectors.compare import Comparator, load_weights
    from collapseguard.detectors.fingerprint import fingerprint_and_windows
    from collapseguard.detectors.pair_features import (
        FEATURES,
        SCALES,
        coarse_chroma,
        ladder,
        top_octave,
    )
    from collapseguard.images import decode_image

    threads = torch.get_num_threads()
    summary = run_dedup([str(p) for p in sized_shards], tmp_path / "out", quiet=True)
    assert torch.get_num_threads() == threads  # the caller's setting is restored
    t = pq.read_table(tmp_path / "out" / "groups.parquet").to_pylist()
    rows = {r["key"]: r for r in t}
    assert rows["s0"]["group"] == rows["s3"]["group"] == rows["s10"]["group"] != ""
    assert rows["coffee"]["group"] == rows["coffee_180"]["group"] != ""
    assert rows["rocket"]["group"] == rows["rocket_300"]["group"] == rows["rocket_100"]["group"] != ""
    assert summary["described"] == summary["grouped"] >= 8

    # every image's full ladder, decoded here; the cnn scores as the run gave them
    data = {}
    for p in sized_shards:
        with tarfile.open(p) as tf:
            for m in tf:
                data[m.name.split(".")[0]] = tf.extractfile(m).read()
    used = Comparator().features_used
    keys = [r["key"] for r in t]
    feats = np.array([ladder(decode_image(data[k]), used).ravel() for k in keys], np.float32)
    desc = {"features": feats, "cnn": np.array([r["cnn"] for r in t]),
            "ok": np.array([not r["error"] for r in t]), "set_aside": [""] * len(t),
            "width": np.array([r["width"] for r in t]), "height": np.array([r["height"] for r in t]),
            "octave": np.array([top_octave(decode_image(data[k])) for k in keys], np.float32),
            "chroma": np.array([coarse_chroma(decode_image(data[k])) for k in keys], np.float32)}
    prints = [fingerprint_and_windows(decode_image(data[k])) for k in keys]  # framing: crops
    desc["thumb"] = np.array([t for _, t, _ in prints], np.int8)
    desc["wthumb"] = np.array([[wt for _, wt in w] for _, _, w in prints], np.int8)
    ids = {g: i for i, g in enumerate(sorted({r["group"] for r in t} - {""}))}
    labels = np.array([ids[r["group"]] if r["group"] else -1 for r in t])
    w = load_weights()
    rank, p_worse, decision, _ = decide_groups(desc, labels, w["w"], w["s"], summary["level"])
    assert [r["rank"] for r in t] == rank.tolist()
    assert [r["decision"] for r in t] == decision
    assert np.array_equal(np.array([r["p_worse"] for r in t], np.float64), p_worse, equal_nan=True)

    # the groups compare at three different rungs; pass 3 described each image at its group's
    # rung only, never at one no decision reads
    parts = [np.load(f) for f in (tmp_path / "out" / ".parts" / "full").glob("*.npz")]
    held = {str(k): (~np.isnan(f.reshape(len(SCALES), len(FEATURES))[:, 0])).tolist()
            for part in parts for k, f in zip(part["key"], part["features"])}
    assert held["s10"] == held["s3"] == [False, False, True]  # three copies at 256: the top rung
    assert held["coffee"] == held["coffee_180"] == [False, True, False]  # 240 and 180: the middle rung
    assert held["rocket"] == held["rocket_300"] == [True, False, False]  # a copy at 100: the first


def test_an_image_smaller_than_its_recorded_size_is_described_in_full_and_decides_the_same(sized_shards, tmp_path):
    """Pass 1's kept parts say the coffee photo and its copy are 1024 x 768 (the top rung): pass 3
    asks for a rung they do not reach, describes them at every rung instead, and the group is
    ranked at the rung they do reach, as in a run that was told their sizes."""
    import shutil

    from collapseguard.dedup.run import _load_part, _save_part, run_dedup
    from collapseguard.detectors.pair_features import FEATURES, SCALES

    shards = [str(p) for p in sized_shards]
    ref = run_dedup(shards, tmp_path / "ref", quiet=True)
    run_dedup(shards, tmp_path / "out", quiet=True)
    for f in (tmp_path / "out" / ".parts").glob("*.npz"):
        part = _load_part(f)
        lie = np.isin(part["key"], ["coffee", "coffee_180"])
        if lie.any():
            part["width"][lie], part["height"][lie] = 1024, 768
            _save_part(f, part)
    shutil.rmtree(tmp_path / "out" / ".parts" / "full")
    got = run_dedup(shards, tmp_path / "out", quiet=True)
    assert got["parts_reused"] == len(shards) and got["described"] == ref["described"]
    cols = ["key", "group", "rank", "decision", "p_worse", "reason", "cnn"]
    a = pq.read_table(tmp_path / "ref" / "groups.parquet", columns=cols).to_pylist()
    b = pq.read_table(tmp_path / "out" / "groups.parquet", columns=cols).to_pylist()
    assert [r["key"] for r in a] == [r["key"] for r in b]
    for x, y in zip(a, b):
        assert {k: x[k] for k in cols if k != "p_worse"} == {k: y[k] for k in cols if k != "p_worse"}
        assert x["p_worse"] == y["p_worse"] or (x["p_worse"] != x["p_worse"] and y["p_worse"] != y["p_worse"])
    held = {}
    for f in (tmp_path / "out" / ".parts" / "full").glob("*.npz"):
        part = np.load(f)
        for k, v in zip(part["key"], part["features"]):
            h = ~np.isnan(v.reshape(len(SCALES), len(FEATURES))[:, 0])
            held[str(k)] = held.get(str(k), np.zeros(len(SCALES), bool)) | h
    assert held["coffee"].tolist() == held["coffee_180"].tolist() == [True, True, False]  # every rung it reaches


def test_a_grouped_image_the_comparator_cannot_describe_leaves_its_group(sized_shards, tmp_path, monkeypatch):
    """Pass 3 fails on one of a pair (here: the comparator's task reports coffee_180 unreadable):
    the groups are made again without it, so its partner is a single, and the row keeps the error."""
    import collapseguard.dedup.run as run

    shards = [str(p) for p in sized_shards]
    ref = run.run_dedup(shards, tmp_path / "ref", quiet=True)
    real = run.describe_rungs_task

    def failing(job, detector, progress=None):
        got = real(job, detector, progress)
        bad = np.asarray(got["key"]) == "coffee_180"
        got["ok"] = np.asarray(got["ok"]) & ~bad
        got["error"] = np.where(bad, "decode failed (made up by the test)", np.asarray(got["error"], dtype=object))
        return got

    monkeypatch.setattr(run, "describe_rungs_task", failing)
    got = run.run_dedup(shards, tmp_path / "out", quiet=True)
    rows = {r["key"]: r for r in pq.read_table(tmp_path / "out" / "groups.parquet").to_pylist()}
    before = {r["key"]: r for r in pq.read_table(tmp_path / "ref" / "groups.parquet").to_pylist()}
    assert before["coffee"]["group"] == before["coffee_180"]["group"] != ""
    assert rows["coffee_180"]["group"] == "" and "made up by the test" in rows["coffee_180"]["error"]
    assert rows["coffee"]["group"] == "" and rows["coffee"]["decision"] == "single"
    assert got["groups"] == ref["groups"] - 1
    assert all(rows[k]["group"] != "" for k in ("s0", "s3", "s10", "rocket", "rocket_300"))
