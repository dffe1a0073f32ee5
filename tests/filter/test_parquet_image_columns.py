"""Parquet image columns beyond a plain binary column or an ``Image`` struct: a dictionary-encoded
binary column is found, filtered and written back as it is; a column holding a list of images per
row cannot be judged one image per row, so a file whose images are only there fails by name (never
skipped as if it were a scores table)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cg_testutil import add_member, degrade, run_cli

from collapseguard.images import encode_jpeg, encode_png

LIST_REASON = "holds a list of images per row"


def _threshold(photos) -> float:
    from collapseguard.detectors import create
    det = create("nss")
    clean = det.score(photos)
    bad = det.score([degrade(p, seed=i) for i, p in enumerate(photos)])
    assert bad.min() > clean.max()
    return float((bad.min() + clean.max()) / 2)


def _dictionary_parquet(path: Path, photos, column: str) -> list:
    """Clean and degraded JPEGs, each picture twice (the dictionary holds it once), a null image,
    in row groups of 3 (each with its own dictionary), with metadata of its own."""
    clean = [encode_jpeg(p, 92) for p in photos]
    bad = [encode_jpeg(degrade(p, seed=i), 92) for i, p in enumerate(photos)]
    values = [b for pair in zip(clean, bad) for b in pair] * 2 + [None]
    t = pa.table({"key": [f"r{i}" for i in range(len(values))],
                  column: pa.array(values, pa.binary()).dictionary_encode(),
                  "caption": [f"caption {i}" for i in range(len(values))]})
    pq.write_table(t.replace_schema_metadata({b"origin": b"a test table"}), path, row_group_size=3)
    return values


@pytest.mark.parametrize("column", ["image", "pic"])
def test_a_dictionary_encoded_image_column_is_filtered_and_written_back_as_it_is(tmp_path, photos,
                                                                                 column):
    """Found in a folder by its name, or named with --image-column: every row in exactly one of
    kept/ and rejected/, in order, values identical, under the input's schema (the dictionary
    type and the metadata); each output's dictionaries hold only that output's images."""
    d = tmp_path / "data"
    d.mkdir()
    src = d / "dict.parquet"
    values = _dictionary_parquet(src, photos, column)
    assert pa.types.is_dictionary(pq.read_schema(src).field(column).type)
    out = tmp_path / "out"
    how = [d] if column == "image" else [src, "--image-column", column]
    run_cli(["filter", *how, "-o", out, "-d", "nss", "--threshold", _threshold(photos), "-w", "1",
             "-q"])
    scores = pd.read_parquet(out / "scores" / "dict.parquet")
    n = len(photos)
    assert scores["reason"].tolist() == ["kept", "degraded"] * (2 * n) + ["no_image"]
    rows = pq.read_table(src).to_pylist()
    is_kept = (scores["decision"] == "kept").tolist()
    for sub, want in (("kept", True), ("rejected", False)):
        written = pq.read_table(out / sub / src.name)
        assert written.to_pylist() == [r for r, k in zip(rows, is_kept) if k == want]
        assert pq.read_schema(out / sub / src.name).equals(pq.read_schema(src), check_metadata=True)
        mine = {v for v, k in zip(values, is_kept) if k == want and v is not None}
        for chunk in written.column(column).chunks:
            assert set(chunk.dictionary.to_pylist()) <= mine
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == len(values) and summary["shards_failed"] == []


def _list_files(d: Path, photos) -> list[Path]:
    """A Hugging Face dataset of several images per row (``datasets``' own writer) and a pyarrow
    table with a ``list<binary>`` column."""
    import datasets
    jpgs = [encode_jpeg(p, 90) for p in photos[:2]]
    feats = datasets.Features({"images": datasets.Sequence(datasets.Image()),
                               "text": datasets.Value("string")})
    ds = datasets.Dataset.from_dict({"images": [[{"bytes": b, "path": None} for b in jpgs]] * 2,
                                     "text": ["a", "b"]}, features=feats)
    hf = d / "train-00000-of-00001.parquet"
    ds.to_parquet(str(hf))
    frames = d / "frames.parquet"
    pq.write_table(pa.table({"frames": pa.array([jpgs, jpgs[:1]], pa.list_(pa.binary())),
                             "id": [1, 2]}), frames)
    return [hf, frames]


def test_a_file_of_image_lists_in_a_folder_fails_by_name_as_an_unreadable_one_does(tmp_path, photos):
    d = tmp_path / "data"
    d.mkdir()
    lists = _list_files(d, photos)
    (d / "broken.parquet").write_bytes(b"PAR1 not really")
    pq.write_table(pa.table({"key": ["a"], "score": [1.0]}), d / "scores.parquet")  # no bytes
    with tarfile.open(d / "shard.tar", "w") as tf:
        add_member(tf, "a.jpg", encode_jpeg(photos[0], 90))
    out = tmp_path / "out"
    res = run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"],
                  expect=1)
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["shards_failed"]) == sorted(str(p) for p in [*lists, d / "broken.parquet"])
    errors = {Path(r["shard"]).name: r.get("error") or "" for r in summary["per_shard"]}
    assert "scores.parquet" not in errors and errors["shard.tar"] == ""
    assert "'images' holds a list of images per row" in errors[lists[0].name]
    assert "'frames' holds a list of images per row" in errors[lists[1].name]
    for p in lists:
        assert f"FAILED {p}" in res.stderr and LIST_REASON in res.stderr
        assert "\n" not in errors[p.name]
    assert sorted(p.name for p in (out / "kept").iterdir()) == ["shard.tar"]
    # score, audit and dedup name it too, and exit 1
    res = run_cli(["score", d, "-d", "nss", "-o", tmp_path / "s.csv", "-q"], expect=1)
    assert f"{lists[0]}: column 'images' {LIST_REASON}" in res.output
    run_cli(["audit", d, "-o", tmp_path / "a", "-d", "nss", "-q"], expect=1)
    failures = json.loads((tmp_path / "a/summary.json").read_text())["failures"]
    assert sum(LIST_REASON in json.dumps(f) for f in failures) == 2
    res = run_cli(["dedup", d, "-o", tmp_path / "dd", "-q"], expect=1)
    assert res.output.count(LIST_REASON) == 2


def test_a_file_of_image_lists_named_directly_says_why(tmp_path, photos):
    hf, _ = _list_files(tmp_path, photos)
    for extra in ([], ["--image-column", "images"]):
        res = run_cli(["filter", hf, "-o", tmp_path / "o", "-d", "nss", "--threshold", "1e9", "-w",
                       "1", "-q", *extra], expect=1)
        assert f"column 'images' {LIST_REASON}" in res.output and "one image per row" in res.output


def test_which_columns_hold_images(tmp_path):
    """Types and Hugging Face declarations: a column of one image per row is read, a list of
    them is named, a table with neither is no image table."""
    from collapseguard.io.parquet import (
        ParquetInputError,
        find_image_column,
        may_hold_images,
    )
    png = encode_png(np.zeros((8, 8, 3), np.uint8))
    large = pa.schema([("jpg", pa.dictionary(pa.int32(), pa.large_binary()))])
    assert find_image_column(large) == "jpg" and find_image_column(large, "jpg") == "jpg"
    # one image per row wins over a list of them beside it
    both = pa.schema([("frames", pa.large_list(pa.binary())), ("image", pa.binary())])
    assert find_image_column(both) == "image"
    with pytest.raises(ParquetInputError, match="'frames' holds a list of images per row"):
        find_image_column(both, "frames")
    # declared List(Image) in the metadata, whatever the storage
    hf = {"info": {"features": {"imgs": {"feature": {"_type": "Image"}, "_type": "List"}}}}
    declared = pa.schema([("imgs", pa.list_(pa.string()))],
                         metadata={b"huggingface": json.dumps(hf).encode()})
    with pytest.raises(ParquetInputError, match="'imgs' holds a list of images per row"):
        find_image_column(declared)
    pq.write_table(pa.table({"imgs": [["a.jpg"]]}, schema=declared), tmp_path / "declared.parquet")
    pq.write_table(pa.table({"image": pa.array([png]).dictionary_encode()}), tmp_path / "d.parquet")
    pq.write_table(pa.table({"key": ["a"], "score": [1.0]}), tmp_path / "scores.parquet")
    assert may_hold_images(str(tmp_path / "declared.parquet"))
    assert may_hold_images(str(tmp_path / "d.parquet"))
    assert not may_hold_images(str(tmp_path / "scores.parquet"))
