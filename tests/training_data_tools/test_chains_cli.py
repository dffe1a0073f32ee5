"""`collapseguard chains` make / ls / export / sheet, end to end on tiny data."""

import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from collapseguard.cli import main
from collapseguard.images import decode_image, load_image
from collapseguard.training_data_tools.export import export_shards, sample_key
from collapseguard.training_data_tools.loaders import load_chains
from collapseguard.training_data_tools.sheet import contact_sheet, pick_chains


@pytest.fixture(scope="module")
def chains_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("chains")
    res = CliRunner().invoke(main, ["chains", "make", "--sources", "art:2:64-80", "--families",
                                    "codec,noise_tint", "--steps", "3", "--keep", "0,1,3",
                                    "--out", str(out), "--workers", "1", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "4 chains, 12 images" in res.output
    return out


def test_ls_prints_summary(chains_dir):
    res = CliRunner().invoke(main, ["chains", "ls", str(chains_dir)])
    assert res.exit_code == 0, res.output
    assert "chains: 4  images: 12" in res.output and "codec: 2" in res.output
    assert "steps: 0,1,3" in res.output


def test_ls_folder_layout_reports_unplaced(tmp_path):
    for s in range(2):
        Image.new("RGB", (8, 8)).save(tmp_path / f"fam{s}.png")
        (tmp_path / "famA" / "c1").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "famA" / "c1" / f"step_{s}.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "famA" / "c1" / "cover.png")
    out = tmp_path / "m.csv"
    res = CliRunner().invoke(main, ["chains", "ls", str(tmp_path), "--manifest-out", str(out)])
    assert res.exit_code == 0, res.output
    assert "famA" in res.output and "cover.png: no step number" in res.output
    df = load_chains(out)  # fam0.png + fam1.png at the top are a flat chain "fam"
    assert sorted(df["chain_id"].unique()) == ["fam", "famA/c1"] and len(df) == 4


def test_ls_refuses_a_manifest_out_its_readers_would_refuse(chains_dir, tmp_path):
    """A manifest may only name files under its own folder: written elsewhere, it could not be
    read back, so ``--manifest-out`` outside the chains folder is refused before anything is written."""
    import shutil

    chains_dir = Path(shutil.copytree(chains_dir, tmp_path / "chains"))  # the fixture is shared
    out = tmp_path / "elsewhere" / "m.csv"
    res = CliRunner().invoke(main, ["chains", "ls", str(chains_dir), "--manifest-out", str(out)])
    assert res.exit_code != 0 and "lie outside its folder" in res.output and not out.exists()
    inside = chains_dir / "found.csv"
    res = CliRunner().invoke(main, ["chains", "ls", str(chains_dir), "--manifest-out", str(inside)])
    assert res.exit_code == 0, res.output
    assert len(load_chains(inside)) == 12
    # the library's writer refuses it too: it wrote what its reader then refused
    from collapseguard.training_data_tools.manifest import ManifestError, read_manifest, write_manifest
    with pytest.raises(ManifestError, match="lie outside its folder"):
        write_manifest(read_manifest(inside), out)
    assert not out.exists()


def test_ls_fails_clearly(tmp_path):
    (tmp_path / "x.txt").write_text("no images")
    res = CliRunner().invoke(main, ["chains", "ls", str(tmp_path)])
    assert res.exit_code != 0 and "seen: 1 file(s)" in res.output


def test_make_rejects_unknown_family(tmp_path):
    res = CliRunner().invoke(main, ["chains", "make", "--sources", "art:1:64-64", "--families", "zzz",
                                    "--steps", "1", "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code != 0 and "unknown family" in res.output


def test_export_writes_shards_with_metadata(chains_dir, tmp_path):
    res = CliRunner().invoke(main, ["chains", "export", str(chains_dir), "--out", str(tmp_path),
                                    "--maxcount", "5"])
    assert res.exit_code == 0, res.output
    shards = sorted(tmp_path.glob("chains-*.tar"))
    assert len(shards) == 3 and not list(tmp_path.glob("*.tmp"))
    df = load_chains(chains_dir)
    want = {sample_key(c, s): p for c, s, p in zip(df["chain_id"], df["step"], df["path"])}
    seen = {}
    for sh in shards:
        with tarfile.open(sh) as tar:
            for m in tar:
                key, ext = m.name.split(".", 1)
                data = tar.extractfile(m).read()
                seen.setdefault(key, {})[ext] = data
    assert set(seen) == set(want)
    for key, parts in seen.items():
        meta = json.loads(parts["json"])
        assert {"chain_id", "family", "task", "step", "source_image"} <= set(meta)
        assert isinstance(meta["params"], dict)
        assert parts["png"] == Path(want[key]).read_bytes()  # bytes copied, not re-encoded
    with pytest.raises(ValueError, match="prefix"):
        export_shards(df, tmp_path, prefix="../x")
    for bad in (["--maxcount", "0"], ["--prefix", "../x"]):  # refused before --out is made
        res = CliRunner().invoke(main, ["chains", "export", str(chains_dir), "--out", str(tmp_path / "refused"), *bad])
        assert res.exit_code == 2 and not (tmp_path / "refused").exists(), res.output


def test_export_says_which_files_are_in_no_chain(tmp_path):
    from collapseguard.images import encode_png

    for i in range(3):
        (tmp_path / "in" / "a").mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / "b").mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / "a" / f"{i}.png").write_bytes(encode_png(np.full((8, 8, 3), i, np.uint8)))
        (tmp_path / "in" / "b" / f"IMG_{i + 1:04d}.png").write_bytes(encode_png(np.full((8, 8, 3), 9 + i, np.uint8)))
    res = CliRunner().invoke(main, ["chains", "export", str(tmp_path / "in"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "3 image file(s)" in res.output and "in no chain" in res.output and "chains ls" in res.output
    with tarfile.open(next((tmp_path / "o").glob("*.tar"))) as tf:
        assert len([m for m in tf.getmembers() if m.name.endswith(".png")]) == 3


def test_sheet_has_native_crops(chains_dir, tmp_path):
    out = tmp_path / "sheet.png"
    res = CliRunner().invoke(main, ["chains", "sheet", str(chains_dir), "--out", str(out), "--crop", "32",
                                    "--where", "centre"])
    assert res.exit_code == 0, res.output
    sheet = np.asarray(Image.open(out).convert("RGB"))
    df = load_chains(chains_dir)
    ids = pick_chains(df, 16)
    assert len(ids) == 4 and {df[df.chain_id == i].family.iloc[0] for i in ids[:2]} == {"codec", "noise_tint"}
    # the first tile of row 0 equals the centre crop of that chain's step 0, pixel for pixel
    row = df[(df.chain_id == ids[0]) & (df.step == 0)]
    img = load_image(row.path.iloc[0])
    h, w = img.shape[:2]
    y, x = (h - 32) // 2, (w - 32) // 2
    from collapseguard.training_data_tools import sheet as sheet_mod
    tile = sheet[sheet_mod._HEAD_H:sheet_mod._HEAD_H + 32, sheet_mod._LABEL_W:sheet_mod._LABEL_W + 32]
    np.testing.assert_array_equal(tile, img[y:y + 32, x:x + 32])
    assert sheet.shape[0] == sheet_mod._HEAD_H + 4 * 36 and sheet.shape[1] == sheet_mod._LABEL_W + 3 * 36
    # an --out that is a link to another file replaces the link, never writes through it
    victim = tmp_path / "precious.txt"
    victim.write_text("kept as it is")
    linked = tmp_path / "linked.png"
    linked.symlink_to(victim)
    res = CliRunner().invoke(main, ["chains", "sheet", str(chains_dir), "--out", str(linked), "--crop", "32"])
    assert res.exit_code == 0, res.output
    assert victim.read_text() == "kept as it is" and not linked.is_symlink()
    assert np.asarray(Image.open(linked)).shape == np.asarray(Image.open(out)).shape
    with pytest.raises(ValueError, match="no chains of"):
        contact_sheet(df, tmp_path / "x.png", families=["nope"])
    assert decode_image(out.read_bytes()).shape == sheet.shape
    # a --crop beyond every image: tiles as large as the images, not 4096 px of white each
    big = contact_sheet(df, tmp_path / "big.png", crop=4096, where="centre")
    sides = [load_image(p).shape[:2] for p in df[df.step == 0].path]
    with Image.open(big) as im:
        assert im.size == (sheet_mod._LABEL_W + 3 * (max(w for _, w in sides) + sheet_mod._GAP),
                           sheet_mod._HEAD_H + 4 * (max(h for h, _ in sides) + sheet_mod._GAP))
    kept = sorted(int(k) for k in df.step.unique())
    res = CliRunner().invoke(main, ["chains", "sheet", str(chains_dir), "--out", str(tmp_path / "y.png"),
                                    "--steps", f"{kept[0]},{max(kept) + 30}"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert f"no chain has step(s) [{max(kept) + 30}]; the steps kept are {kept}" in res.output
    assert not (tmp_path / "y.png").exists()


def test_manifest_paths_outside_the_folder_are_refused(chains_dir, tmp_path):
    import shutil

    import pandas as pd
    bad = tmp_path / "bad"
    shutil.copytree(chains_dir, bad)
    m = pd.read_csv(bad / "manifest.csv", dtype=str)
    secret = tmp_path / "secret.png"
    secret.write_bytes((bad / m.loc[0, "path"]).read_bytes())
    for p in ("../secret.png", str(secret)):
        m.loc[0, "path"] = p
        m.to_csv(bad / "manifest.csv", index=False)
        res = CliRunner().invoke(main, ["chains", "export", str(bad), "--out", str(tmp_path / "s")])
        assert res.exit_code == 1 and "outside the manifest's folder" in res.output
        assert not list((tmp_path / "s").glob("*.tar"))
    # a link inside the folder to a file outside it: named as a link, with where it points
    (bad / "inside.png").symlink_to(secret)
    m.loc[0, "path"] = "inside.png"
    m.to_csv(bad / "manifest.csv", index=False)
    res = CliRunner().invoke(main, ["chains", "export", str(bad), "--out", str(tmp_path / "s")])
    assert res.exit_code == 1 and "link to files outside it" in res.output
    assert f"(a link to {secret.resolve()})" in " ".join(res.output.split())


def test_export_refuses_to_mix_with_an_earlier_export(chains_dir, tmp_path):
    out = tmp_path / "shards"
    assert CliRunner().invoke(main, ["chains", "export", str(chains_dir), "--out", str(out),
                                     "--maxcount", "5"]).exit_code == 0
    n = len(list(out.glob("*.tar")))
    res = CliRunner().invoke(main, ["chains", "export", str(chains_dir), "--out", str(out)])
    assert res.exit_code == 1 and "already holds" in res.output and len(list(out.glob("*.tar"))) == n
    (tmp_path / "afile").write_text("x")
    res = CliRunner().invoke(main, ["chains", "make", "--sources", "art:1:64-64", "--steps", "1",
                                    "--out", str(tmp_path / "afile"), "--workers", "1"])
    assert res.exit_code == 1 and "a file of that name exists" in res.output


def test_make_with_an_empty_keep_says_no_step_would_be_kept(tmp_path):
    res = CliRunner().invoke(main, ["chains", "make", "--sources", "art:1:64-64", "--families", "codec",
                                    "--steps", "2", "--keep", "", "--out", str(tmp_path),
                                    "--no-progress"])
    assert res.exit_code == 1 and "no kept step between 1 and --steps 2" in res.output  # no TypeError


def test_export_keeps_chains_with_non_ascii_names_apart(tmp_path):
    for v, name in ((10, "猫"), (90, "犬")):
        for s in range(2):
            d = tmp_path / "in" / "flux2" / name
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8, 3), v + s, np.uint8)).save(d / f"step_{s}.png")
    paths = export_shards(tmp_path / "in", tmp_path / "out")  # was: "two chains map to the same key"
    with tarfile.open(paths[0]) as tar:
        names = tar.getnames()
        metas = [json.loads(tar.extractfile(n).read()) for n in names if n.endswith(".json")]
    keys = {n.rsplit(".", 1)[0] for n in names}
    assert len(keys) == 4 and all(k.isascii() and "." not in k and "/" not in k for k in keys)
    assert sorted(m["chain_id"] for m in metas) == ["flux2/犬", "flux2/犬", "flux2/猫", "flux2/猫"]
    assert sample_key("cat/flux2", 3) == "cat_flux2__s0003"  # plain ids keep their keys


def test_make_and_store_refuse_an_out_that_already_holds_a_manifest(tmp_path):
    out = tmp_path / "chains"
    args = ["chains", "make", "--sources", "art:1:64-64", "--steps", "1", "--keep", "0,1", "--out",
            str(out), "--workers", "1", "--no-progress"]
    assert CliRunner().invoke(main, [*args, "--families", "codec"]).exit_code == 0
    before = (out / "manifest.csv").read_bytes()
    # a second run wrote its own manifest over the first: the codec chains dropped out of every
    # command that reads the folder, their images left behind, without a word
    res = CliRunner().invoke(main, [*args, "--families", "noise_tint"])
    assert res.exit_code == 1 and "already holds" in res.output, res.output
    assert (out / "manifest.csv").read_bytes() == before and not (out / "noise_tint").exists()
    res = CliRunner().invoke(main, ["chains", "store", str(out), "--out", str(out), "--workers", "1"])
    assert res.exit_code == 1 and "already holds" in res.output, res.output
    assert (out / "manifest.csv").read_bytes() == before and not (out / "png").exists()
    assert load_chains(out)["family"].unique().tolist() == ["codec"]


def test_make_refuses_a_negative_keep_step_and_zero_steps_and_sheet_a_crop_it_cannot_draw(tmp_path):
    """``--keep -1,2`` used to drop -1 without a word, ``--steps 0`` wrote one-image "chains", and
    ``chains sheet --crop 8`` passed the option's range and then failed inside."""
    base = ["chains", "make", "--sources", "art:1:64-64", "--families", "codec", "-o", str(tmp_path / "c")]
    res = CliRunner().invoke(main, [*base, "--keep", "-1,2", "--steps", "3"])
    assert res.exit_code == 2 and "--keep" in res.output and "-1" in res.output
    res = CliRunner().invoke(main, [*base, "--steps", "0"])
    assert res.exit_code == 2 and "--steps" in res.output
    assert not (tmp_path / "c" / "manifest.csv").exists()
    res = CliRunner().invoke(main, ["chains", "sheet", str(tmp_path), "--crop", "8", "-o", str(tmp_path / "s.png")])
    assert res.exit_code == 2 and "--crop" in res.output and "16<=x<=4096" in res.output


def test_ls_prints_names_from_the_data_with_control_characters_escaped(tmp_path):
    """A family folder named with a terminal escape (one that sets the window title) is shown
    escaped, as every other command shows names from the data."""
    fam = tmp_path / "grain\x1b]0;owned\x07"
    (fam / "c1").mkdir(parents=True)
    for s in range(2):
        Image.new("RGB", (8, 8)).save(fam / "c1" / f"step_{s}.png")
    res = CliRunner().invoke(main, ["chains", "ls", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert "grain\\x1b]0;owned\\x07" in res.output


def test_make_from_a_shard_whose_key_repeats_uses_each_sample(tmp_path):
    """A shard holding key ``k`` twice (``k, j, k``, as io.tar reads it: two samples): both
    pictures become chains, under distinct source names, and none is dropped."""
    from cg_testutil import add_member

    from collapseguard.images import encode_png

    colours = {"k": (200, 30, 30), "j": (30, 200, 30), "k2": (30, 30, 200)}
    pics = {n: np.tile(np.array(c, np.uint8), (24, 32, 1)) for n, c in colours.items()}
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for name, data in [("k.png", encode_png(pics["k"])), ("k.json", b"{}"),
                           ("j.png", encode_png(pics["j"])), ("k.png", encode_png(pics["k2"]))]:
            add_member(tar, name, data)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"shards:{tmp_path}/s*.tar",
                                    "--families", "codec", "--steps", "1", "--keep", "0,1",
                                    "--out", str(out), "--workers", "1", "-q"])
    assert res.exit_code == 0, res.output
    df = load_chains(out)
    step0 = df[df["step"] == 0]
    assert sorted(step0["source_image"]) == ["s/j", "s/k", "s/k@repeat1"]
    got = sorted(tuple(load_image(p)[0, 0]) for p in step0["path"])
    assert got == sorted(colours.values())


def test_make_refuses_zero_repeats_naming_the_option_and_help_shows_its_range(tmp_path):
    """``--repeats 0`` was refused after parsing with one message about steps and repeats both,
    and ``--help`` showed no range for it; it is refused as ``--steps 0`` is, naming the option."""
    from collapseguard.training_data_tools.chains import make_chains

    base = ["chains", "make", "--sources", "art:1:64-64", "--families", "codec", "-o", str(tmp_path / "c")]
    res = CliRunner().invoke(main, [*base, "--repeats", "0"])
    assert res.exit_code == 2 and "--repeats" in res.output and "x>=1" in res.output, res.output
    assert "steps" not in res.output
    assert not (tmp_path / "c").exists()
    res = CliRunner().invoke(main, ["chains", "make", "--help"], terminal_width=200)
    line = next(ln for ln in res.output.splitlines() if "--repeats" in ln)
    assert "INTEGER RANGE" in line and "[default: 1; x>=1]" in line, line
    # the library names the one setting that is wrong
    for kwargs, named, other in (({"repeats": 0}, "repeats", "steps"), ({"steps": -1}, "steps", "repeats")):
        with pytest.raises(ValueError, match=named) as err:
            make_chains([], ["codec"], out_dir=tmp_path / "lib", **kwargs)
        assert other not in str(err.value)


def test_every_source_the_refusal_names_is_in_the_help_and_the_reference():
    """The ``unknown source`` refusal lists ``pixel:N`` and ``screen:N``; ``chains make --help``
    and docs/REFERENCE.md's list of sources did not. Every spec it names is in both."""
    from collapseguard.training_data_tools.sources import SourceError, resolve_sources

    with pytest.raises(SourceError) as err:
        list(resolve_sources("no-such-source"))
    listed = re.split(r", | or ", str(err.value).partition(": use ")[2])
    specs = [s for s in listed if re.fullmatch(r"bundled|[a-z]+:[A-Z]+", s)]
    assert {"bundled", "art:N", "pixel:N", "screen:N", "folder:PATH"} <= set(specs), specs
    res = CliRunner().invoke(main, ["chains", "make", "--help"], terminal_width=200)
    help_text = " ".join(res.output.split())
    reference = (Path(__file__).resolve().parents[2] / "docs" / "REFERENCE.md").read_text(encoding="utf-8")
    assert [s for s in specs if s not in help_text] == [], help_text
    assert [s for s in specs if f"`{s}`" not in reference] == []


def test_make_names_each_source_image_it_cannot_decode(tmp_path):
    """A garbage or truncated image among the sources was left out without a word (the run
    printed only its counts); each is now named, with its reason, and the rest are made."""
    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg, encode_png

    pic = np.tile(np.array((120, 60, 30), np.uint8), (40, 48, 1))
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "good.png").write_bytes(encode_png(pic))
    (folder / "junk.jpg").write_bytes(b"not an image at all")
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        add_member(tar, "a.png", encode_png(pic))
        add_member(tar, "b.jpg", encode_jpeg(pic, 90)[:40])  # cut short
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"folder:{folder},shards:{tmp_path}/s.tar",
                                    "--families", "codec", "--steps", "1", "--keep", "0,1",
                                    "--out", str(out), "--workers", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert "skipped 2 source image(s) that could not be decoded or are too small" in res.output
    assert "junk.jpg: " in res.output and "s.tar:b.jpg: " in res.output
    assert sorted(load_chains(out).query("step == 0")["source_image"]) == ["good", "s/a"]


def test_a_refused_make_or_store_leaves_no_out_folder(tmp_path):
    """``--keep -1`` and a bad ``--storages`` are refused as usage errors; the ``--out`` folder
    was made before they were checked and stayed behind, empty."""
    res = CliRunner().invoke(main, ["chains", "make", "--sources", "art:1:64-64", "--keep", "0,-1",
                                    "-o", str(tmp_path / "m")])
    assert res.exit_code == 2 and "counted from 0" in res.output, res.output
    res = CliRunner().invoke(main, ["chains", "store", str(tmp_path), "--storages", "gif:3",
                                    "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--storages" in res.output, res.output
    res = CliRunner().invoke(main, ["chains", "make", "--sources", "art:1:64-64", "--families", "nosuch",
                                    "-o", str(tmp_path / "f")])
    assert res.exit_code == 1 and "unknown family ['nosuch']" in res.output, res.output
    assert not any((tmp_path / d).exists() for d in ("m", "s", "f"))


def test_make_from_specs_whose_names_meet_makes_every_picture_and_names_what_it_skips(tmp_path):
    """Names are distinct across the specs of one ``--sources`` (a folder ``s`` holding ``k.png``
    and a shard ``s.tar`` with key ``k`` both give ``s/k``; two such shards in other folders as
    well): the run was refused as "duplicate source name". And when every source image is
    undecodable, the refusal ("no sources") comes with the note naming them."""
    from cg_testutil import add_member

    from collapseguard.images import encode_png

    pic = np.tile(np.array((90, 140, 30), np.uint8), (40, 48, 1))
    (tmp_path / "f" / "s").mkdir(parents=True)
    (tmp_path / "f" / "s" / "k.png").write_bytes(encode_png(pic))
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        with tarfile.open(tmp_path / d / "s.tar", "w") as tar:
            add_member(tar, "k.png", encode_png(pic))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["chains", "make", "--sources",
                                    f"folder:{tmp_path}/f,shards:{tmp_path}/a/s.tar,shards:{tmp_path}/b/s.tar",
                                    "--families", "codec", "--steps", "1", "--keep", "0,1",
                                    "--out", str(out), "--workers", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert sorted(load_chains(out).query("step == 0")["source_image"]) == [
        "s/k", "s/k@repeat1", "s/k@repeat2"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"folder:{tmp_path}/bad",
                                    "--out", str(tmp_path / "out2"), "-q"])
    assert res.exit_code == 1
    assert "skipped 1 source image(s) that could not be decoded or are too small" in res.output and "x.png" in res.output


@pytest.mark.parametrize("args, said", [
    (["--families", "codec,codec"], "named more than once"),
    (["--families", "codec", "--keep", "7"], "no kept step between 1 and --steps 2"),
    (["--families", "codec", "--keep", "0"], "no kept step between 1 and --steps 2"),
])
def test_make_refuses_what_would_write_duplicate_or_one_image_chains(tmp_path, args, said):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["chains", "make", "--sources", "art:1:64-64", "--steps", "2", *args,
                                    "--out", str(out), "--no-progress", "-w", "1"])
    assert res.exit_code != 0 and said in res.output, res.output
    assert not (out / "manifest.csv").exists() and not list(out.rglob("*.png"))


def test_make_names_a_damaged_shard_and_refuses_a_glob_of_images(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar archive" * 40)
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"shards:{bad}", "--families", "codec",
                                    "--steps", "1", "--out", str(tmp_path / "o1"), "--no-progress", "-w", "1"])
    assert res.exit_code == 1 and "cannot read shard" in res.output and "Traceback" not in res.output
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(tmp_path / "a.png")
    res = CliRunner().invoke(main, ["chains", "make", "--sources", str(tmp_path / "*.png"), "--families", "codec",
                                    "--steps", "1", "--out", str(tmp_path / "o2"), "--no-progress", "-w", "1"])
    assert res.exit_code == 1 and "not tar shards" in res.output


def test_ls_writes_a_tsv_manifest_its_readers_read_and_refuses_other_suffixes(chains_dir, tmp_path):
    from collapseguard.training_data_tools.manifest import read_manifest

    out = Path(chains_dir) / "again.tsv"
    try:
        res = CliRunner().invoke(main, ["chains", "ls", str(chains_dir), "--manifest-out", str(out)])
        assert res.exit_code == 0, res.output
        assert "\t" in out.read_text().splitlines()[0]
        assert len(read_manifest(out)) == len(read_manifest(chains_dir))
    finally:
        out.unlink(missing_ok=True)
    res = CliRunner().invoke(main, ["chains", "ls", str(chains_dir), "--manifest-out", str(tmp_path / "m.txt")])
    assert res.exit_code != 0 and ".csv, .tsv or .parquet" in res.output


def test_a_source_named_like_a_missing_value_makes_a_readable_manifest(tmp_path):
    from collapseguard.training_data_tools.manifest import read_manifest

    src = tmp_path / "src"
    src.mkdir()
    for name in ("NA", "null", "None"):
        Image.fromarray(np.random.default_rng(len(name)).integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(
            src / f"{name}.png")
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"folder:{src}", "--families", "codec",
                                    "--steps", "1", "--out", str(tmp_path / "out"), "--no-progress", "-w", "1"])
    assert res.exit_code == 0, res.output
    assert set(read_manifest(tmp_path / "out")["source_image"]) == {"NA", "null", "None"}


def test_make_leaves_out_a_source_too_small_for_a_replicator_and_names_it(tmp_path):
    """A folder of pictures holding an icon: the icon is named and left out, as an undecodable
    image is, and the other pictures' chains are made."""
    from collapseguard.images import encode_png

    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "good.png").write_bytes(encode_png(np.tile(np.array((120, 60, 30), np.uint8), (40, 48, 1))))
    (folder / "icon.png").write_bytes(encode_png(np.zeros((1, 1, 3), np.uint8)))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"folder:{folder}", "--families", "codec",
                                    "--steps", "1", "--keep", "0,1", "--out", str(out), "--workers", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert "skipped 1 source image(s)" in res.output and "icon: 1x1 is too small for a replicator" in res.output
    assert sorted(load_chains(out).query("step == 0")["source_image"]) == ["good"]


def test_max_sources_says_when_it_leaves_sources_out(tmp_path):
    """--max-sources takes the first N sources in --sources order, so a spec listed later can give
    none: that is said, and not when every source was used."""
    args = ["chains", "make", "--families", "noise_tint", "--steps", "1", "--keep", "0,1", "-w", "1", "-q"]
    res = CliRunner().invoke(main, [*args, "--sources", "art:2,pixel:1", "--max-sources", "2",
                                    "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "note: --max-sources 2 used the first 2 sources of --sources art:2,pixel:1 in order" in res.output
    res = CliRunner().invoke(main, [*args, "--sources", "art:2", "--max-sources", "2", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0 and "--max-sources" not in res.output, res.output


def test_a_skipped_source_names_its_file_once(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(np.full((96, 96, 3), 120, np.uint8)).save(src / "good.png")
    (src / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"folder:{src}", "--families", "noise_tint",
                                    "--steps", "1", "--keep", "0,1", "-w", "1", "-q", "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "skipped 1 source image" in ln)
    assert line.count("bad.png") == 1, line


def test_sheet_shows_an_unreadable_image_as_a_tile_and_draws_the_rest(chains_dir, tmp_path):
    """One truncated step image (a copy of the chains folder) is a tile that says so and a note
    naming it; the other tiles are drawn as from the intact folder."""
    import shutil
    broken = tmp_path / "chains"
    shutil.copytree(chains_dir, broken)
    df = load_chains(broken)
    ids = pick_chains(df, 16)
    victim = Path(df[(df.chain_id == ids[0]) & (df.step == 3)].path.iloc[0])
    victim.write_bytes(victim.read_bytes()[:100])
    out, whole = tmp_path / "s.png", tmp_path / "whole.png"
    args = ["--crop", "32", "--where", "centre"]
    res = CliRunner().invoke(main, ["chains", "sheet", str(broken), "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    assert "note: 1 image(s) could not be read" in res.output and victim.name in res.output
    assert CliRunner().invoke(main, ["chains", "sheet", str(chains_dir), "--out", str(whole), *args]).exit_code == 0
    a, b = np.asarray(Image.open(out).convert("RGB")), np.asarray(Image.open(whole).convert("RGB"))
    from collapseguard.training_data_tools import sheet as sheet_mod
    x0 = sheet_mod._LABEL_W + 2 * 36  # row 0, column of step 3: differs; the rest is the same
    mask = np.ones(a.shape[:2], bool)
    mask[sheet_mod._HEAD_H:sheet_mod._HEAD_H + 36, x0:x0 + 36] = False
    mask[:, :sheet_mod._LABEL_W] = False  # chain names are the folder's own
    assert a.shape == b.shape and (a[mask] == b[mask]).all()
    assert not (a[sheet_mod._HEAD_H:sheet_mod._HEAD_H + 32, x0:x0 + 32] == b[sheet_mod._HEAD_H:sheet_mod._HEAD_H + 32, x0:x0 + 32]).all()


def test_evaluate_and_calibrate_say_chains_numbered_from_1_were_renumbered(tmp_path):
    """Files step_001..step_003 with no original: read as steps 0-2 (the first taken as the
    original), and every reader says so: a step of the figures is one less than its file's."""
    from PIL import Image
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64] / 64.0
    for c in range(4):
        base = np.stack([x * 200, y * 180, (x + y) * 60 + 20 * c], -1)
        for i in (1, 2, 3):
            (tmp_path / "ren" / f"c{c}").mkdir(parents=True, exist_ok=True)
            img = np.clip(base + rng.normal(0, 6 * i, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(tmp_path / "ren" / f"c{c}" / f"step_{i:03d}.png")
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(tmp_path / "ren"), "-d", "nss",
                                    "-o", str(tmp_path / "ev"), "--steps", "2", "-q"])
    assert res.exit_code == 0, res.output
    assert "renumbered from 0" in (tmp_path / "ev" / "results.md").read_text()
    res = CliRunner().invoke(main, ["calibrate", "--chains", str(tmp_path / "ren"), "-d", "nss",
                                    "--max-false-drop", "0.5", "--confidence", "0.5", "--holdout", "0",
                                    "--no-plot", "-q", "-o", str(tmp_path / "cal.json")])
    assert "renumbered from 0" in res.output, res.output
    assert "scoring" not in res.output  # -q: warnings only, no progress line


def test_an_interrupted_chains_make_says_the_same_command_resumes(tmp_path, monkeypatch):
    from collapseguard.training_data_tools import chains as chains_mod

    real, calls = chains_mod.run_chain, []

    def stops_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(chains_mod, "run_chain", stops_at_the_second)
    args = ["chains", "make", "--sources", "art:2:64-96", "--families", "codec", "--steps", "2",
            "--keep", "0,2", "--out", str(tmp_path / "c"), "-w", "1", "-q"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0 and "the same command makes the rest" in res.output, res.output
    monkeypatch.setattr(chains_mod, "run_chain", real)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert len(load_chains(tmp_path / "c")) == 4
