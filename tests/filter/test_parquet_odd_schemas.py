"""Parquet files whose schema is legal but unusual: view types, an image column pandas wrote as
all-null, an image name on a column of text, two columns of one name, categorical keys. Each is
filtered with every row conserved or fails by name; none is passed over without a word."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cg_testutil import degrade, run_cli

from collapseguard.images import encode_png


def _threshold(photos) -> float:
    from collapseguard.detectors import create
    det = create("nss")
    clean, bad = det.score(photos), det.score([degrade(p, seed=i) for i, p in enumerate(photos)])
    assert bad.min() > clean.max()
    return float((bad.min() + clean.max()) / 2)


def _images(photos) -> list[bytes]:
    """Clean and degraded PNGs in turn: decisions alternate, so kept and rejected both hold rows."""
    return [b for i, p in enumerate(photos) for b in (encode_png(p), encode_png(degrade(p, seed=i)))]


@pytest.mark.parametrize("image_type", [pa.binary(), pa.binary_view()])
def test_view_typed_columns_are_filtered_with_every_row_conserved(tmp_path, photos, image_type):
    images = _images(photos)
    src = tmp_path / "view.parquet"
    pq.write_table(pa.table({"image": pa.array(images, image_type),
                             "caption": pa.array([f"c{i}" for i in range(len(images))],
                                                 pa.string_view())}), src)
    out = tmp_path / "out"
    run_cli(["filter", src, "-o", out, "-d", "nss", "--threshold", _threshold(photos), "-q"])
    scores = pd.read_parquet(out / "scores" / "view.parquet")
    assert scores["reason"].tolist() == ["kept", "degraded"] * len(photos)
    rows = pq.read_table(src).to_pylist()
    for sub, want in (("kept", "kept"), ("rejected", "degraded")):
        assert pq.read_table(out / sub / src.name).to_pylist() == \
            [r for r, why in zip(rows, scores["reason"]) if why == want]


def test_an_all_null_image_column_in_a_folder_is_rows_without_images(tmp_path, photos):
    """pandas writes an image column of None cells as Arrow's null type: the file is read from a
    folder (not passed over as a table without images), each row ``no_image`` and kept."""
    d = tmp_path / "ds"
    d.mkdir()
    pq.write_table(pa.table({"key": ["a", "b"], "image": [encode_png(p) for p in photos[:2]]}),
                   d / "part-0.parquet")
    pd.DataFrame({"key": ["c", "d"], "image": [None, None]}).to_parquet(d / "part-1.parquet")
    assert pa.types.is_null(pq.read_schema(d / "part-1.parquet").field("image").type)
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", "1e9", "-q"])
    scores = pd.read_parquet(out / "scores" / "part-1.parquet")
    assert scores["key"].tolist() == ["c", "d"] and set(scores["reason"]) == {"no_image"}
    assert pq.read_table(out / "kept" / "part-1.parquet").to_pylist() == \
        pq.read_table(d / "part-1.parquet").to_pylist()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 4 and summary["shards_failed"] == []


def test_an_image_column_of_text_fails_by_name_not_skipped(tmp_path, photos):
    """A folder file whose image column holds text (base64, say), or whose only image-like column
    is the one --image-column names: the file fails, named, and the run exits 1."""
    import base64
    d = tmp_path / "ds"
    d.mkdir()
    pq.write_table(pa.table({"key": ["a"], "image": [encode_png(photos[0])]}), d / "good.parquet")
    text = base64.b64encode(encode_png(photos[1])).decode()
    pq.write_table(pa.table({"key": ["b"], "pixels": [text]}), d / "b64.parquet")
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", "1e9", "-q"])  # a metadata table
    assert not (out / "kept" / "b64.parquet").exists()
    res = run_cli(["filter", d, "-o", tmp_path / "out2", "-d", "nss", "--threshold", "1e9",
                   "--image-column", "pixels"], expect=1)
    assert "b64.parquet" in res.output and "holds string, not image bytes" in res.output
    pq.write_table(pa.table({"key": ["b"], "image": [text]}), d / "b64.parquet")
    res = run_cli(["filter", d, "-o", tmp_path / "out3", "-d", "nss", "--threshold", "1e9"],
                  expect=1)
    assert "column 'image' holds string, not image bytes" in res.output


def test_two_columns_of_one_name_are_refused_by_name(tmp_path, photos):
    png = encode_png(photos[0])
    schema = pa.schema([("image", pa.binary()), ("image", pa.binary())])
    src = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([png]), pa.array([png])], schema=schema), src)
    res = run_cli(["filter", src, "-o", tmp_path / "out", "-d", "nss", "--threshold", "1e9"],
                  expect=1)
    assert "two columns named 'image'" in res.output and "Traceback" not in res.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "KeyError" not in json.dumps(summary)


@pytest.mark.parametrize("keys", [pd.Categorical(["cat_a", "cat_b"]), ["x", "y"]])
def test_keys_are_read_from_text_categories_and_views(tmp_path, photos, keys):
    src = tmp_path / "k.parquet"
    images = [encode_png(p) for p in photos[:2]]
    if isinstance(keys, list):  # a string_view key column
        pq.write_table(pa.table({"key": pa.array(keys, pa.string_view()), "image": images}), src)
    else:
        pd.DataFrame({"key": keys, "image": images}).to_parquet(src)
        assert pa.types.is_dictionary(pq.read_schema(src).field("key").type)
    run_cli(["score", src, "-d", "nss", "-o", tmp_path / "s.csv", "-q"])
    assert pd.read_csv(tmp_path / "s.csv")["key"].tolist() == list(keys)


def test_naming_the_column_found_resumes_the_completed_file(tmp_path, photos):
    """A first run finds 'jpg' and warns that 'png' was not judged, naming --image-column; rerun
    with --image-column jpg, the completed file is reused, not refused for other settings."""
    images = [encode_png(p) for p in photos[:2]]
    src = tmp_path / "two.parquet"
    pq.write_table(pa.table({"jpg": images, "png": images}), src)
    out = tmp_path / "out"
    res = run_cli(["filter", src, "-o", out, "-d", "nss", "--threshold", "1e9"])
    assert "--image-column" in res.output
    before = (out / "kept" / "two.parquet").read_bytes()
    res = run_cli(["filter", src, "-o", out, "-d", "nss", "--threshold", "1e9",
                   "--image-column", "jpg"])
    assert "other settings" not in res.output and "--image-column" not in res.output
    shard = json.loads((out / "summary.json").read_text())["per_shard"][0]
    assert shard["status"] == "resumed" and "unjudged_image_columns" not in shard
    assert (out / "kept" / "two.parquet").read_bytes() == before
    res = run_cli(["filter", src, "-o", out, "-d", "nss", "--threshold", "1e9",
                   "--image-column", "png"], expect=1)  # another column: other outputs
    assert "other settings" in res.output


def test_max_shard_bytes_counts_a_local_parquet_file_s_size(tmp_path, photos):
    src = tmp_path / "big.parquet"
    pq.write_table(pa.table({"image": [encode_png(p) for p in photos[:2]]}), src)
    size = src.stat().st_size
    res = run_cli(["filter", src, "-o", tmp_path / "a", "-d", "nss", "--threshold", "1e9",
                   "--max-shard-bytes", size - 1], expect=1)
    assert f"more than {size - 1} bytes in the file" in res.output
    run_cli(["filter", src, "-o", tmp_path / "b", "-d", "nss", "--threshold", "1e9", "-q",
             "--max-shard-bytes", size])


def test_score_tables_of_parquet_inputs_have_a_row_column_even_when_empty(tmp_path, photos):
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"image": pa.array([], pa.binary())}), empty)
    run_cli(["score", empty, "-d", "nss", "-o", tmp_path / "e.csv", "-q"])
    full = tmp_path / "full.parquet"
    pq.write_table(pa.table({"image": [encode_png(photos[0])]}), full)
    run_cli(["score", full, "-d", "nss", "-o", tmp_path / "f.csv", "-q"])
    assert list(pd.read_csv(tmp_path / "e.csv").columns) == list(pd.read_csv(tmp_path / "f.csv").columns)
    assert "row" in pd.read_csv(tmp_path / "e.csv").columns


def test_audit_flagged_rows_of_a_repeated_key_are_told_apart(tmp_path, photos):
    src = tmp_path / "repeat.parquet"
    pq.write_table(pa.table({"key": ["dup", "dup"], "image": [encode_png(p) for p in photos[:2]]}), src)
    run_cli(["audit", src, "-o", tmp_path / "a", "-d", "nss", "--threshold", "-1e9", "-q"])
    flagged = pd.read_csv(tmp_path / "a" / "flagged.csv")
    assert flagged["key"].tolist() == ["dup", "dup"] and sorted(flagged["row"]) == [0, 1]
    assert np.isfinite(flagged["score"]).all()


def test_collapseguard_s_own_tables_in_a_folder_stay_out_and_a_real_column_wins(tmp_path, photos):
    """A scores table (text ``image`` column of member names, or a zero-row one whose ``image``
    pandas typed null) is no input, even with ``--image-column image``; a file with an all-null
    ``image`` beside a binary column of another name is not read as rows without images: the
    reader says to name the column."""
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.table({"key": ["a"], "image": [encode_png(photos[0])]}), d / "imgs.parquet")
    run_cli(["score", d, "-d", "nss", "-o", d / "scores.parquet", "-q"])
    pd.DataFrame({"key": pd.Series([], dtype=object), "image": pd.Series([], dtype=object)}).to_parquet(
        d / "empty_scores.parquet")
    assert pa.types.is_null(pq.read_schema(d / "empty_scores.parquet").field("image").type)
    for extra in ([], ["--image-column", "image"]):
        out = tmp_path / f"out{len(extra)}"
        run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", "1e9", "-q", *extra])
        assert sorted(p.name for p in (out / "kept").iterdir()) == ["imgs.parquet"]
    run_cli(["score", d, "-d", "nss", "-o", d / "scores.parquet", "-q"])  # its own table: written over
    both = tmp_path / "both.parquet"
    pq.write_table(pa.table({"image": pa.nulls(2), "content": [encode_png(p) for p in photos[:2]]}), both)
    res = run_cli(["filter", both, "-o", tmp_path / "b", "-d", "nss", "--threshold", "1e9"], expect=1)
    assert "column 'image' holds null" in res.output and "--image-column" in res.output
    run_cli(["filter", both, "-o", tmp_path / "b2", "-d", "nss", "--threshold", "1e9", "-q",
             "--image-column", "content"])
