"""How ``filter --groups`` finds a sample's row of dedup's groups.parquet: a Parquet row by its row
index (a key may repeat in a file), and only in the input the table was made from."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import skimage.data as sd
from cg_testutil import run_cli
from PIL import Image


def _enc(a, fmt="PNG", **kw) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, fmt, **kw)
    return b.getvalue()


@pytest.fixture(scope="module")
def repeated_keys(tmp_path_factory):
    """Four rows, the key k1 twice: row 0 an unrelated photo, row 2 a PNG copy of row 1."""
    root = tmp_path_factory.mktemp("dupkeys")
    astro = sd.astronaut()
    rows = [("k1", _enc(sd.coffee())), ("k0", _enc(astro, "JPEG", quality=90)), ("k1", _enc(astro)),
            ("k2", _enc(sd.chelsea()))]
    pq.write_table(pa.table({"key": [r[0] for r in rows], "image": [r[1] for r in rows]}),
                   root / "dupkeys.parquet")
    run_cli(["dedup", root / "dupkeys.parquet", "--out", root / "dd", "-q"])
    return root


def test_the_groups_table_names_parquet_rows_by_index(repeated_keys):
    g = pd.read_parquet(repeated_keys / "dd" / "groups.parquet")
    assert g["row"].tolist() == [0, 1, 2, 3] and g["key"].tolist() == ["k1", "k0", "k1", "k2"]
    assert g["group"].tolist()[1] == g["group"].tolist()[2] != "" and g["group"][0] == g["group"][3] == ""


def test_a_duplicate_under_a_repeated_key_is_matched_by_its_row(repeated_keys, tmp_path):
    root = repeated_keys
    g = pd.read_parquet(root / "dd" / "groups.parquet")
    dup = int(g.loc[(g["group"] != "") & (g["rank"] > 0), "row"].iloc[0])
    out = tmp_path / "f"
    run_cli(["filter", root / "dupkeys.parquet", "--out", out, "--groups", root / "dd" / "groups.parquet",
             "--drop-duplicates", "-q"])
    s = pd.read_parquet(out / "scores" / "dupkeys.parquet").set_index("row")
    assert (s.loc[dup, "decision"], s.loc[dup, "reason"]) == ("rejected", "duplicate")
    assert s.loc[0, "group"] == "" and s.loc[0, "decision"] == "kept"  # the other k1: a single
    kept = pq.read_table(out / "kept" / "dupkeys.parquet")
    rejected = pq.read_table(out / "rejected" / "dupkeys.parquet")
    src = pq.read_table(root / "dupkeys.parquet")
    assert rejected.column("image").to_pylist() == [src.column("image")[dup].as_py()]
    assert sorted(kept.column("image").to_pylist() + rejected.column("image").to_pylist()) == \
        sorted(src.column("image").to_pylist())


def test_a_table_without_row_indices_matches_by_key(repeated_keys, tmp_path):
    root = repeated_keys
    t = pq.read_table(root / "dd" / "groups.parquet")
    old = tmp_path / "groups_old.parquet"
    pq.write_table(t.drop(["row"]), old)
    out = tmp_path / "f"
    run_cli(["filter", root / "dupkeys.parquet", "--out", out, "--groups", old, "--drop-duplicates", "-q"])
    s = pd.read_parquet(out / "scores" / "dupkeys.parquet").set_index("row")
    # by key, as such tables always were: k1's first row in the table (a single) is applied to
    # k1's first row in the file, so the duplicate under k1 is not matched
    assert s["decision"].tolist() == ["kept"] * 4
    assert s.loc[1, "group"] != "" and s.loc[0, "group"] == s.loc[2, "group"] == ""


def _tar(path, images) -> None:
    import tarfile

    from cg_testutil import add_member
    with tarfile.open(path, "w") as tf:
        for i, d in enumerate(images):
            add_member(tf, f"{i:09d}.jpg", d)


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    """Two folders with a ``00000.tar`` each, img2dataset-style keys: gA three copies of one photo,
    gB three different photos; gC gA's shard with one byte of an image changed (same size)."""
    root = tmp_path_factory.mktemp("two_datasets")
    astro = sd.astronaut()
    a = [_enc(astro), _enc(astro, "JPEG", quality=90),
         _enc(np.asarray(Image.fromarray(astro).resize((256, 256))), "JPEG", quality=70)]
    b = [_enc(x) for x in (sd.coffee(), sd.chelsea(), sd.rocket())]
    for name, images in (("gA", a), ("gB", b)):
        (root / name).mkdir()
        _tar(root / name / "00000.tar", images)
    (root / "gC").mkdir()
    data = bytearray((root / "gA" / "00000.tar").read_bytes())
    data[-20000] ^= 0xFF  # inside the last image's bytes: same size, other SHA-256
    (root / "gC" / "00000.tar").write_bytes(bytes(data))
    run_cli(["dedup", root / "gA", "--out", root / "dd", "-q"])
    return root


def test_the_groups_table_records_the_bytes_each_shard_was_made_from(two_datasets):
    import hashlib
    g = pd.read_parquet(two_datasets / "dd" / "groups.parquet")
    data = (two_datasets / "gA" / "00000.tar").read_bytes()
    assert set(g["source_size"]) == {len(data)}
    assert set(g["source_sha256"]) == {hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("other", ["gB", "gC"])
def test_groups_of_another_dataset_are_refused_for_a_shard_of_the_same_name(two_datasets, tmp_path, other):
    root = two_datasets
    out = tmp_path / "f"
    res = run_cli(["filter", root / other / "00000.tar", "--out", out, "--groups", root / "dd" / "groups.parquet",
                   "--drop-duplicates", "-q"], expect=1)
    line = next(x for x in res.output.splitlines() if x.startswith("FAILED"))
    assert "gA/00000.tar" in line and f"{other}/00000.tar" in line and "not applied" in line, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shards_failed"] == [str(root / other / "00000.tar")] or \
        [s["status"] for s in summary["per_shard"]] == ["failed"]
    assert "GroupsOfAnotherInput" in summary["per_shard"][0]["error"]
    for folder in ("kept", "rejected", "scores", ".done"):  # nothing written half
        assert not list((out / folder).glob("*")) if (out / folder).exists() else True


def test_the_groups_apply_to_the_shard_they_were_made_from(two_datasets, tmp_path):
    root = two_datasets
    out = tmp_path / "f"
    run_cli(["filter", root / "gA" / "00000.tar", "--out", out, "--groups", root / "dd" / "groups.parquet",
             "--drop-duplicates", "-q"])
    s = pd.read_parquet(out / "scores" / "00000.parquet")
    assert sorted(s["reason"]) == ["duplicate", "duplicate", "kept"]


def test_a_shard_rewritten_since_dedup_is_said_to_have_changed(two_datasets, tmp_path):
    """The same file, rewritten after dedup read it: refused as changed (then and now), not as
    another file of the same name."""
    import shutil

    src = tmp_path / "gA"
    shutil.copytree(two_datasets / "gA", src)
    run_cli(["dedup", src, "--out", tmp_path / "dd", "-q"])
    data = bytearray((src / "00000.tar").read_bytes())
    data[-20000] ^= 0xFF
    (src / "00000.tar").write_bytes(bytes(data))
    res = run_cli(["filter", src / "00000.tar", "--out", tmp_path / "f", "--groups",
                   tmp_path / "dd" / "groups.parquet", "-q"], expect=1)
    assert "has changed since dedup made --groups" in res.output and "run dedup again" in res.output, res.output
