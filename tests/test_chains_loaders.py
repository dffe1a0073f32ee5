"""Chain loaders: every folder layout, manifests, imagefolder metadata, parquet, bad inputs."""

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from collapseguard.training_data_tools.loaders import (
    ChainLayoutError,
    discover_chains,
    load_chains,
    parse_step,
)
from collapseguard.training_data_tools.manifest import ManifestError, write_manifest


def _img(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.full((8, 10, 3), value, np.uint8)
    Image.fromarray(arr).save(path)


def _png_bytes(value):
    buf = io.BytesIO()
    Image.fromarray(np.full((6, 6, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("stem,expected", [
    ("0", ("", 0)), ("012", ("", 12)), ("step_012", ("", 12)), ("iter12", ("", 12)),
    ("image_0012", ("", 12)), ("Iteration-3", ("", 3)), ("original", ("", 0)),
    ("cat_007", ("cat", 7)), ("cat_iter_7", ("cat", 7)), ("readme", None), ("thumb", None),
])
def test_parse_step(stem, expected):
    assert parse_step(stem) == expected


@pytest.mark.parametrize("names", [
    ["0.png", "1.png", "2.png"], ["step_000.png", "step_001.png", "step_012.png"],
    ["iter0.jpg", "iter1.jpg", "iter12.jpg"], ["000.webp", "001.webp", "012.webp"],
    ["image_0000.png", "image_0001.png", "image_0012.png"],
])
def test_one_folder_per_chain(tmp_path, names):
    for chain in ("a", "b"):
        for i, n in enumerate(names):
            _img(tmp_path / chain / n, i)
    d = discover_chains(tmp_path)
    df = d.manifest
    assert sorted(df["chain_id"].unique()) == ["a", "b"]
    assert sorted(df["step"].unique()) == sorted({int(parse_step(n.rsplit('.', 1)[0])[1]) for n in names})
    assert set(df["family"]) == {"unknown"} and not d.unplaced


def test_family_and_task_folders(tmp_path):
    for fam in ("nano_banana_pro", "flux2"):
        for task in ("replicate", "restyle"):
            for chain in ("img01", "img02"):
                for s in (0, 1, 5):
                    _img(tmp_path / fam / task / chain / f"{s:03d}.png", s)
    _img(tmp_path / "flux2" / "shallow" / "0.png")
    _img(tmp_path / "flux2" / "shallow" / "1.png")
    (tmp_path / "README.txt").write_text("hi")
    _img(tmp_path / "flux2" / "replicate" / "img01" / "thumbnail.png")
    d = discover_chains(tmp_path)
    df = d.manifest
    deep = df[df["task"] != "unknown"]
    assert deep["chain_id"].nunique() == 8
    assert set(deep["family"]) == {"nano_banana_pro", "flux2"}
    assert set(deep["task"]) == {"replicate", "restyle"}
    # the same chain name under different families is the same start image (split by source)
    assert deep["source_image"].nunique() == 2
    shallow = df[df["chain_id"] == "flux2/shallow"]
    assert list(shallow["step"]) == [0, 1] and shallow["family"].iloc[0] == "flux2"
    assert [p for p, _ in d.unplaced] == ["flux2/replicate/img01/thumbnail.png"]
    assert "could not place 1 file" in d.summary()


def test_flat_prefix_layout_and_one_based(tmp_path):
    for chain in ("cat", "dog"):
        for s in (1, 2, 3):
            _img(tmp_path / "modelx" / f"{chain}_iter_{s}.png", s)
    d = discover_chains(tmp_path)
    df = d.manifest
    assert sorted(df["chain_id"].unique()) == ["modelx/cat", "modelx/dog"]
    assert sorted(df["step"].unique()) == [0, 1, 2]
    assert any("renumbered" in n for n in d.notes)
    with pytest.raises(ChainLayoutError, match="no step 0"):
        discover_chains(tmp_path, one_based=False)


def test_manifest_file_and_folder(tmp_path):
    rows = []
    for s in (0, 1):
        _img(tmp_path / f"c{s}.png", s)
        rows.append({"chain_id": "c", "source_image": "x", "family": "f", "task": "t", "step": s,
                     "path": str(tmp_path / f"c{s}.png")})
    write_manifest(pd.DataFrame(rows), tmp_path / "manifest.csv")
    write_manifest(pd.DataFrame(rows), tmp_path / "m.parquet")
    assert len(load_chains(tmp_path)) == 2
    assert len(load_chains(tmp_path / "m.parquet")) == 2
    bad = pd.DataFrame(rows + [rows[0]])
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ManifestError, match="duplicate"):
        load_chains(tmp_path / "bad.csv")


def test_imagefolder_metadata(tmp_path):
    lines = ["file_name,image_id,iteration,model"]
    for s in range(3):
        _img(tmp_path / "train" / f"x{s}.png", s)
        lines.append(f"x{s}.png,42,{s},banana")
    (tmp_path / "train" / "metadata.csv").write_text("\n".join(lines))
    df = load_chains(tmp_path)
    assert list(df["step"]) == [0, 1, 2] and set(df["family"]) == {"banana"}
    (tmp_path / "train" / "metadata.csv").write_text("file_name,image_id,iteration\n../../etc/passwd,1,0\n")
    with pytest.raises(ChainLayoutError, match="outside"):
        load_chains(tmp_path)


def test_parquet_dataset_is_extracted(tmp_path):
    data = tmp_path / "ds" / "data"
    data.mkdir(parents=True)
    recs = [{"image": {"bytes": _png_bytes(10 * s), "path": None}, "model": m, "chain": "7", "round": s}
            for m in ("pro", "two") for s in range(3)]
    pq.write_table(pa.Table.from_pylist(recs), data / "train-00000.parquet")
    d = discover_chains(tmp_path / "ds", extract_dir=tmp_path / "x")
    df = d.manifest
    assert df["chain_id"].nunique() == 2 and set(df["family"]) == {"pro", "two"}
    assert df["source_image"].nunique() == 1
    first = df[(df["family"] == "two") & (df["step"] == 2)]["path"].iloc[0]
    assert np.asarray(Image.open(first))[0, 0, 0] == 20
    pq.write_table(pa.Table.from_pylist([{"image": {"bytes": _png_bytes(1), "path": None},
                                          "caption": "a"}]), data / "train-00000.parquet")
    with pytest.raises(ChainLayoutError, match="columns seen"):
        discover_chains(tmp_path / "ds", extract_dir=tmp_path / "y")


def test_unreadable_layout_lists_what_was_seen(tmp_path):
    _img(tmp_path / "photos" / "sunset.png")
    _img(tmp_path / "photos" / "beach.jpg")
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ChainLayoutError) as e:
        discover_chains(tmp_path)
    msg = str(e.value)
    assert "seen: 3 file(s)" in msg and "photos/sunset.png" in msg and "no step number" in msg
    with pytest.raises(ChainLayoutError, match="does not exist"):
        discover_chains(tmp_path / "missing")
    with pytest.raises(ChainLayoutError, match="no image"):
        discover_chains(_empty(tmp_path))


def _empty(tmp_path):
    p = tmp_path / "empty"
    p.mkdir()
    (p / "a.txt").write_text("x")
    return p


def test_duplicate_steps_are_reported(tmp_path):
    for n in ("0.png", "1.png", "2.png", "2.jpg"):
        _img(tmp_path / "c" / n)
    d = discover_chains(tmp_path)
    assert list(d.manifest["step"]) == [0, 1]
    assert sorted(p for p, _ in d.unplaced) == ["c/2.jpg", "c/2.png"]


def test_parquet_without_step_columns_uses_stored_file_names(tmp_path):
    root = tmp_path / "ds"
    (root / "data").mkdir(parents=True)
    recs = [{"image": {"bytes": _png_bytes(s), "path": f"pro/edit/chain{c}/iter_{s:03d}.png"}, "caption": "x"}
            for c in (1, 2) for s in range(3)]
    recs.append({"image": {"bytes": _png_bytes(9), "path": "../../evil/readme.png"}, "caption": "y"})
    pq.write_table(pa.Table.from_pylist(recs), root / "data" / "train-00000.parquet")
    d = discover_chains(root, extract_dir=tmp_path / "x")
    df = d.manifest
    assert sorted(df["chain_id"].unique()) == ["pro/edit/chain1", "pro/edit/chain2"]
    assert set(df["family"]) == {"pro"} and set(df["task"]) == {"edit"}
    assert [p for p, _ in d.unplaced] == ["evil/readme.png"]
    assert all(str(tmp_path / "x") in p for p in df["path"])
    assert any("stored image file names" in n for n in d.notes)
