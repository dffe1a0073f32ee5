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
    ("p0000", ("", 0)), ("p_12", ("", 12)), ("pic_3", ("pic", 3)),
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


# --- layouts users have ------------------------------------------------------------------------

def test_relative_folder_with_duplicate_steps_lists_them(tmp_path, monkeypatch):
    # `chains ls chains/` (a relative path) with a doubled step used to crash in relative_to
    for s in (0, 1, 2):
        _img(tmp_path / "data" / "fam" / "c1" / f"step_{s}.png", s)
    _img(tmp_path / "data" / "fam" / "c1" / "step_002.jpg", 9)
    monkeypatch.chdir(tmp_path)
    d = discover_chains("data")
    assert sorted(d.manifest["step"]) == [0, 1]
    assert sorted(p for p, _ in d.unplaced) == ["fam/c1/step_002.jpg", "fam/c1/step_2.png"]


def test_non_utf8_file_name_is_reported_not_fatal(tmp_path):
    import os
    for s in (0, 1):
        _img(tmp_path / "fam" / "good" / f"{s}.png", s)
    bad = os.fsencode(tmp_path) + b"/fam/b\xffd"
    try:
        os.makedirs(bad)
    except OSError:
        pytest.skip("file system refuses non-UTF-8 names")
    for s in (0, 1):
        Image.fromarray(np.full((8, 10, 3), s, np.uint8)).save(os.fsdecode(bad + b"/%d.png" % s))
    d = discover_chains(tmp_path)
    assert list(d.manifest["chain_id"].unique()) == ["fam/good"]
    assert ("fam/b\\xffd/0.png", "the file name is not valid UTF-8") in d.unplaced
    d.summary().encode("utf-8")  # printable


def test_link_to_a_file_outside_the_folder_is_not_read(tmp_path):
    secret = tmp_path / "elsewhere" / "secret.png"
    _img(secret, 200)
    root = tmp_path / "chains"
    for s in (0, 1):
        _img(root / "fam" / "c" / f"step_{s}.png", s)
    (root / "fam" / "c" / "step_2.png").symlink_to(secret)
    (root / "fam" / "c" / "step_3.png").symlink_to(root / "fam" / "c" / "step_1.png")  # inside: fine
    d = discover_chains(root)
    assert sorted(d.manifest["step"]) == [0, 1, 3]
    assert str(secret.resolve()) not in set(d.manifest["path"])
    assert ("fam/c/step_2.png", "a link to a file outside the folder") in d.unplaced


def test_huge_step_number_is_reported_not_wrapped(tmp_path):
    for s in (0, 1):
        _img(tmp_path / "fam" / "c" / f"step_{s}.png", s)
    _img(tmp_path / "fam" / "c" / "step_99999999999999999999999.png", 5)
    d = discover_chains(tmp_path)
    assert sorted(d.manifest["step"]) == [0, 1]
    assert [p for p, _ in d.unplaced] == ["fam/c/step_99999999999999999999999.png"]
    write_manifest(d.manifest, tmp_path / "m.csv")  # was: a step of -2**63 that no tool accepts
    bad = d.manifest.astype({"step": object})
    bad.loc[1, "step"] = 10**23
    with pytest.raises(ManifestError, match="step must be"):
        write_manifest(bad, tmp_path / "m2.csv")


@pytest.mark.parametrize("stem,expected", [
    ("step_-1", ("", -1)), ("-3", ("", -3)), ("cat_-2", ("cat", -2)), ("cat-7", ("cat", 7)),
    ("step-4", ("", 4)),
])
def test_parse_step_minus_sign(stem, expected):
    assert parse_step(stem) == expected


def test_negative_step_file_is_not_read_as_step_one(tmp_path):
    for s in ("-1", "0", "2"):
        _img(tmp_path / "fam" / "c" / f"step_{s}.png", abs(int(s)) + 1)
    d = discover_chains(tmp_path)
    m = d.manifest.set_index("step")
    assert sorted(m.index) == [0, 2]  # step_-1 used to become step 1
    assert [p for p, _ in d.unplaced] == ["fam/c/step_-1.png"]


def test_doubled_original_does_not_renumber_the_chain(tmp_path):
    # step 0 twice (a PNG and a JPEG copy): the chain used to be renumbered so step 1 became the
    # original and every label was one off
    c = tmp_path / "fam" / "c"
    _img(c / "step_0.png", 0)
    _img(c / "step_000.jpg", 0)
    for s in (1, 2, 3):
        _img(c / f"step_{s}.png", s * 10)
    with pytest.raises(ChainLayoutError):
        discover_chains(tmp_path)
    _img(tmp_path / "fam" / "ok" / "0.png", 1)
    _img(tmp_path / "fam" / "ok" / "1.png", 2)
    d = discover_chains(tmp_path)
    assert list(d.manifest["chain_id"].unique()) == ["fam/ok"]
    assert not any("renumbered" in n for n in d.notes)
    assert ("fam/c/step_1.png", "chain fam/c has an ambiguous step 0 (original)") in d.unplaced


def test_a_chain_that_lost_its_original_in_a_set_numbered_from_0_is_left_out(tmp_path):
    """Three chains step_000..003, one of which lost step_000: numbered from 1 is decided for the
    set, so that chain is left out with its reason instead of its step 1 becoming the original;
    a set where every chain starts at 1 is still renumbered."""
    for c in "ABC":
        for s in range(4):
            _img(tmp_path / "set" / f"chain{c}" / f"step_{s:03d}.png", s * 10 + ord(c))
    (tmp_path / "set" / "chainC" / "step_000.png").unlink()
    d = discover_chains(tmp_path / "set")
    assert sorted(d.manifest["chain_id"].unique()) == ["chainA", "chainB"]
    assert ("chainC/step_001.png", "chain chainC has no step 0 (original)") in d.unplaced
    assert not any("renumbered" in n for n in d.notes)
    for c in "AB":
        (tmp_path / "set" / f"chain{c}" / "step_000.png").unlink()
    d = discover_chains(tmp_path / "set")
    assert sorted(d.manifest["chain_id"].unique()) == ["chainA", "chainB", "chainC"]
    assert any("renumbered" in n for n in d.notes)


def test_image_model_layout_is_read_the_right_way_round(tmp_path):
    # Banana100-like: IMAGE/MODEL/step_XXX.png; every model's chain of an image starts from it
    images, models = ["cat", "dog", "tree"], ["flux2", "nano_banana_pro", "qwen"]
    for i, im in enumerate(images):
        for j, m in enumerate(models):
            _img(tmp_path / im / m / "step_000.png", 100 + i)
            for s in (1, 2):
                _img(tmp_path / im / m / f"step_{s:03d}.png", 10 * i + 3 * j + s)
    d = discover_chains(tmp_path)
    df = d.manifest
    assert sorted(df["family"].unique()) == models
    assert sorted(df["source_image"].unique()) == images
    one = df[df["chain_id"] == "dog/qwen"]
    assert set(one["family"]) == {"qwen"} and set(one["source_image"]) == {"dog"}
    assert any("IMAGE/MODEL" in n for n in d.notes)


def test_family_chain_layout_with_shared_names_is_not_swapped(tmp_path):
    # MODEL/IMAGE/...: the chains under one model start from different pictures
    for j, m in enumerate(["flux2", "qwen", "seedream", "gpt"]):
        for i, im in enumerate(["cat", "dog"]):
            _img(tmp_path / m / im / "0.png", 100 + i)
            _img(tmp_path / m / im / "1.png", 10 * j + i)
    df = discover_chains(tmp_path).manifest
    assert sorted(df["family"].unique()) == ["flux2", "gpt", "qwen", "seedream"]
    assert sorted(df["source_image"].unique()) == ["cat", "dog"]


def test_parquet_files_of_one_name_in_two_folders_keep_their_images(tmp_path):
    # HF configs: flux2/train-00000.parquet and qwen/train-00000.parquet used to extract into one
    # folder, so the first file's chains pointed at the second file's images
    for m, base in (("flux2", 10), ("qwen", 200)):
        rows = {"image": [{"bytes": _png_bytes(base + i), "path": None} for i in range(4)],
                "chain_id": ["a", "a", "b", "b"], "step": [0, 1, 0, 1], "model": [m] * 4}
        (tmp_path / m).mkdir()
        pq.write_table(pa.table(rows), tmp_path / m / "train-00000-of-00001.parquet")
    df = load_chains(tmp_path)
    assert len(df) == 8 and set(df["family"]) == {"flux2", "qwen"}  # every row of both files
    for _, r in df.iterrows():
        with Image.open(r["path"]) as im:
            value = int(np.asarray(im)[0, 0, 0])
        base = 10 if r["family"] == "flux2" else 200
        assert value == base + {("a", 0): 0, ("a", 1): 1, ("b", 0): 2, ("b", 1): 3}[
            (r["source_image"], r["step"])], r.to_dict()


def test_manifest_with_an_empty_path_cell_is_a_manifest_error(tmp_path):
    _img(tmp_path / "a.png")
    (tmp_path / "manifest.csv").write_text(
        "chain_id,source_image,family,task,step,path\nc,s,f,t,0,a.png\nc,s,f,t,1,\n")
    with pytest.raises(ManifestError, match="empty path"):
        load_chains(tmp_path)


@pytest.mark.parametrize("column", ["family", "task"])
def test_manifest_with_an_empty_family_or_task_cell_is_a_manifest_error(tmp_path, column):
    from click.testing import CliRunner

    from collapseguard.cli import main

    for c, v in (("a", 10), ("b", 200)):
        for s in range(2):
            _img(tmp_path / c / f"{s}.png", v + s)
    cells = {"family": "f", "task": "t"}
    lines = ["chain_id,source_image,family,task,step,path"]
    for c in ("a", "b"):
        row = dict(cells, **({column: ""} if c == "b" else {}))
        lines += [f"{c},{c},{row['family']},{row['task']},{s},{c}/{s}.png" for s in range(2)]
    (tmp_path / "manifest.csv").write_text("\n".join(lines) + "\n")
    # chain b was left out of `chains ls`'s family or task counts (and, without a family, out of
    # `chains sheet`; `evaluate` ended in a TypeError traceback sorting a NaN among family names)
    with pytest.raises(ManifestError, match=f"empty {column}"):
        load_chains(tmp_path)
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(tmp_path), "--detectors", "nss",
                                    "--out", str(tmp_path / "eval"), "-q"])
    assert res.exit_code == 1 and f"empty {column}" in res.output, res.output


def test_a_parquet_manifest_with_an_empty_string_family_is_an_empty_family(tmp_path):
    """A Parquet cell holds "" where a CSV cell reads as missing: one row of a chain with family ""
    was reported as "more than one family", and a chain all "" went through with no family."""
    import pandas as pd

    for s in range(2):
        _img(tmp_path / f"{s}.png", 10 + s)
    rows = [{"chain_id": "c", "source_image": "s", "family": fam, "task": "t", "step": s,
             "path": f"{s}.png"} for s, fam in ((0, "f"), (1, ""))]
    pd.DataFrame(rows).to_parquet(tmp_path / "manifest.parquet")
    with pytest.raises(ManifestError, match="empty family in row"):
        load_chains(tmp_path)
    pd.DataFrame([dict(r, family=" ") for r in rows]).to_parquet(tmp_path / "manifest.parquet")
    with pytest.raises(ManifestError, match="empty family in row"):
        load_chains(tmp_path)


def test_parquet_extraction_never_writes_through_a_link_the_dataset_ships(tmp_path):
    """A downloaded dataset can hold links where its images are extracted: the bytes of its rows
    never land outside, and no extracted path leads outside."""
    import os
    from pathlib import Path
    ds = tmp_path / "ds"
    (ds / "data").mkdir(parents=True)
    recs = [{"image": {"bytes": _png_bytes(10 * s), "path": None}, "model": "pro", "chain": "7",
             "round": s} for s in range(3)]
    pq.write_table(pa.Table.from_pylist(recs), ds / "data" / "train-00000.parquet")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    same_size = tmp_path / "outside.png"
    same_size.write_bytes(_png_bytes(0))  # what row 0 extracts to, byte for byte
    out = ds / ".collapseguard_extracted" / "data" / "train-00000"
    out.mkdir(parents=True)
    for name in ("0000000.png.tmp", "0000000.tmp", "0000001.tmp"):
        os.symlink(victim, out / name)
    os.symlink(same_size, out / "0000000.png")
    df = discover_chains(ds).manifest
    assert victim.read_bytes() == b"mine"
    assert all(Path(p).resolve().is_relative_to(out.resolve()) for p in df["path"]), list(df["path"])
    assert not (out / "0000000.png").is_symlink()

    # a linked extraction folder is refused before anything is written through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ds2 = tmp_path / "ds2"
    (ds2 / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(recs), ds2 / "data" / "train-00000.parquet")
    (ds2 / ".collapseguard_extracted").mkdir()
    os.symlink(elsewhere, ds2 / ".collapseguard_extracted" / "data")
    with pytest.raises(ChainLayoutError, match="is a link"):
        discover_chains(ds2)
    assert list(elsewhere.iterdir()) == []
    os.symlink(elsewhere, tmp_path / "ds3")  # ds3 is the dataset itself, reached by a link: fine
    (ds2 / ".collapseguard_extracted" / "data").unlink()
    assert len(discover_chains(ds2, extract_dir=tmp_path / "ds3").manifest) == 3


def test_folders_of_p_numbered_files_are_one_chain_each_named_after_the_folder(tmp_path):
    """``pic0/p0000.png`` ... (README's own example of files numbered in one folder): each folder
    is a chain and its own picture, whether the folder or its parent is named, not one source
    ``p`` under six families."""
    for j in range(6):
        for i in range(4):
            _img(tmp_path / "set" / f"pic{j}" / f"p{i:04d}.png", 10 * j + i)
    df = load_chains(tmp_path / "set")
    assert sorted(df["chain_id"].unique()) == [f"pic{j}" for j in range(6)]
    assert sorted(df["source_image"].unique()) == [f"pic{j}" for j in range(6)]
    assert set(df["family"]) == {"unknown"} and len(df) == 24
    one = load_chains(tmp_path / "set" / "pic2")
    assert set(one["chain_id"]) == {"pic2"} and sorted(one["step"]) == [0, 1, 2, 3]


def test_files_in_no_chain_are_a_note_for_readers_that_go_on_without_them(tmp_path):
    """A chain numbered from 1 beside chains numbered from 0 has lost its original and is left
    out: load_chains says so in one line (calibrate, evaluate and export print it)."""
    for i in range(3):
        _img(tmp_path / "a" / f"{i}.png", i)
        _img(tmp_path / "b" / f"IMG_{i + 1:04d}.jpg", 50 + i)
    notes = []
    df = load_chains(tmp_path, notes=notes)
    assert set(df["chain_id"]) == {"a"}
    assert len(notes) == 1 and "3 image file(s)" in notes[0] and "no step 0" in notes[0], notes
    notes.clear()
    load_chains(tmp_path / "a", notes=notes)
    assert notes == []


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_manifest_writes_names_that_start_like_formulas_inert_and_reads_them_back(tmp_path, suffix):
    """Chain and family names come from folder names: ``=HYPERLINK(...)`` or ``+SUM(1)`` is
    written with a leading ``'`` (as every CSV output does), and read back as the name it is."""
    for name in ("=HYPERLINK(1)", "+SUM(1)", "'quoted"):
        for i in range(2):
            _img(tmp_path / "c" / name / f"{i}.png", i)
    found = discover_chains(tmp_path / "c").manifest
    out = tmp_path / "c" / f"manifest{suffix}"
    write_manifest(found, out)
    text = out.read_text()
    assert "'=HYPERLINK(1)" in text and "'+SUM(1)" in text and "''quoted" in text
    assert not any(cell.startswith(("=", "+")) for line in text.splitlines()
                   for cell in line.split("\t" if suffix == ".tsv" else ","))
    back = load_chains(out)
    assert sorted(back["chain_id"].unique()) == sorted(found["chain_id"].unique())
    assert set(back["source_image"]) == {"=HYPERLINK(1)", "+SUM(1)", "'quoted"}
