"""What `collapseguard calibrate` reads from `--clean` and what it says about it: folders it cannot
read whole, overlapping folders, unscored images, the scores table's text cells, `--batch-size`,
and `collapseguard calibrations` on a `--per-kind` file. Real images, the real `nss`
detector."""

import os

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from PIL import Image

from collapseguard.calibration.show import show
from collapseguard.calibration.thresholds import load_calibration
from collapseguard.cli import main

SIZE = 48
LOOSE = ["--detector", "nss", "--max-false-drop", "0.3", "--confidence", "0.6", "--holdout", "0",
         "--no-plot", "-q"]


def _picture(rng):
    y, x = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    img = np.stack([x * rng.uniform(60, 200), y * rng.uniform(60, 200), (x + y) * rng.uniform(30, 100)], -1)
    return np.clip(img + 20, 0, 255).astype(np.uint8)


def _folder(path, n, seed=0, suffix="png"):
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(_picture(rng)).save(path / f"p{i}.{suffix}")
    return path


def _calibrate(*args):
    return CliRunner().invoke(main, ["calibrate", *map(str, args)])


def test_a_clean_folder_holding_what_cannot_be_read_is_refused_before_scoring(tmp_path):
    """A broken link to a folder of clean pictures (moved away) or to an image, a FIFO named like
    an image and a ``.tar.xz`` are named and nothing is written; a link loop and a second link to a
    folder already read lose nothing and are no error."""
    clean = _folder(tmp_path / "clean", 12)
    (clean / "more").symlink_to(tmp_path / "moved_away", target_is_directory=True)
    (clean / "gone.png").symlink_to(tmp_path / "gone.png")
    os.mkfifo(clean / "pipe.png")
    (clean / "more.tar.xz").write_bytes(b"")
    out = tmp_path / "cal.json"
    res = _calibrate("--clean", clean, "--out", out, *LOOSE)
    assert res.exit_code != 0
    assert "more: a broken link" in res.output and "gone.png: a broken link" in res.output
    assert "pipe.png: not a regular file" in res.output
    assert "more.tar.xz: a tar compressed other than with gzip" in res.output
    assert not out.exists()
    for name in ("more", "gone.png", "pipe.png", "more.tar.xz"):
        (clean / name).unlink()
    (clean / "loop").symlink_to(clean)
    (clean / "again").symlink_to(_folder(tmp_path / "other", 3, seed=1))
    (clean / "again2").symlink_to(tmp_path / "other")
    res = _calibrate("--clean", clean, "--out", out, "--scores-out", tmp_path / "s.csv", *LOOSE)
    assert res.exit_code == 0, res.output
    assert len(pd.read_csv(tmp_path / "s.csv")) == 15


def test_overlapping_clean_folders_use_each_image_once_under_its_first_name(tmp_path):
    """``--clean DIR --clean DIR/sub --clean DIR``: each file is scored once, with the source id of
    the first location that names it, so it cannot sit on both sides of the split."""
    clean = _folder(tmp_path / "clean", 10)
    _folder(clean / "sub", 5, seed=1, suffix="jpg")
    scores = tmp_path / "s.csv"
    res = _calibrate("--clean", clean, "--clean", clean / "sub", "--clean", clean,
                     "--out", tmp_path / "cal.json", "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    t = pd.read_csv(scores, keep_default_na=False)
    assert len(t) == 15 and t["path"].is_unique
    assert set(t.loc[t["path"].str.endswith(".jpg"), "source_image"]) == {f"clean/sub/p{i}" for i in range(5)}
    assert load_calibration(tmp_path / "cal.json").n_clean == 15


def test_scores_table_cells_that_start_like_formulas_are_inert_and_read_back_exactly(tmp_path, monkeypatch):
    """A clean folder named ``=HYPERLINK(...)`` gives source ids and paths that a spreadsheet
    would run; they get a leading ``'`` in --scores-out, and --from-scores reads the values back
    as they were (same threshold, same split)."""
    monkeypatch.chdir(tmp_path)
    _folder(tmp_path / "=HYPERLINK(1)", 12)
    _folder(tmp_path / "'quoted", 4, seed=2)
    res = _calibrate("--clean", "./=HYPERLINK(1)", "--clean", "./'quoted", "--out", "a.json",
                     "--scores-out", "s.csv", *LOOSE)
    assert res.exit_code == 0, res.output
    t = pd.read_csv("s.csv", dtype=str, keep_default_na=False)
    for col in t.columns:
        assert not t[col].str.startswith(("=", "+", "-", "@", "\t", "\r")).any(), col
    assert t["source_image"].str.startswith("'=HYPERLINK(1)/").sum() == 12
    assert t["source_image"].str.startswith("''quoted/").sum() == 4
    res = _calibrate("--from-scores", "s.csv", "--out", "b.json", *LOOSE)
    assert res.exit_code == 0, res.output
    a, b = load_calibration("a.json"), load_calibration("b.json")
    assert (a.threshold, a.k, a.n_clean) == (b.threshold, b.k, b.n_clean)
    assert [r["source_image"] for r in a.top_clean] == [r["source_image"] for r in b.top_clean]
    assert a.top_clean[0]["path"].startswith(("=HYPERLINK(1)/", "'quoted/"))


@pytest.mark.parametrize("size", ["0", "-3"])
def test_batch_size_must_be_positive(tmp_path, size):
    clean = _folder(tmp_path / "clean", 3)
    res = _calibrate("--clean", clean, "--batch-size", size, "--out", tmp_path / "cal.json", *LOOSE)
    assert res.exit_code == 2 and "--batch-size" in res.output
    assert not (tmp_path / "cal.json").exists()


def test_the_unscored_images_are_named_with_their_errors(tmp_path):
    """Images that cannot be decoded are left out and named (escaped), with why, not only counted."""
    clean = _folder(tmp_path / "clean", 12)
    (clean / "broken\x1b[31m.png").write_bytes(b"not an image")
    (clean / "empty.jpg").write_bytes(b"")
    res = _calibrate("--clean", clean, "--out", tmp_path / "cal.json", *LOOSE)
    assert res.exit_code == 0, res.output
    line = next(s for s in res.output.splitlines() if "could not be scored" in s)
    assert line.startswith("note: 2 image(s) could not be scored and were left out")
    said = res.output[res.output.index(line):]
    assert "broken\\x1b[31m.png" in said and "\x1b" not in said
    assert "empty.jpg" in said


def test_python_m_calibration_prints_the_per_kind_rows(tmp_path):
    a = _folder(tmp_path / "a", 12)
    b = _folder(tmp_path / "b", 12, seed=3, suffix="jpg")
    out = tmp_path / "cal.json"
    res = _calibrate("--clean", f"photos={a}", "--clean", f"shots={b}", "--per-kind", "--out", out, *LOOSE)
    assert res.exit_code == 0, res.output
    text = show(out)
    for r in load_calibration(out).per_kind:
        assert f"kind {r['kind']}: threshold {r['threshold']:.6g} (k={r['k']} of n={r['n']})" in text


def test_a_sub_folder_named_as_a_kind_takes_that_kind_and_one_image_cannot_be_two_kinds(tmp_path):
    """``--clean DIR --clean shots=DIR/sub``: DIR/sub's images are ``shots`` (each still scored
    once), so the kind is covered by ``--per-kind``; one folder under two kinds is refused."""
    clean = _folder(tmp_path / "clean", 10)
    _folder(clean / "sub", 5, seed=1, suffix="jpg")
    scores = tmp_path / "s.csv"
    res = _calibrate("--clean", clean, "--clean", f"shots={clean / 'sub'}",
                     "--out", tmp_path / "cal.json", "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    t = pd.read_csv(scores, keep_default_na=False)
    assert len(t) == 15 and t["path"].is_unique
    assert (t["source_kind"] == "shots").sum() == 5
    assert set(t.loc[t["source_kind"] == "shots", "path"].str[-4:]) == {".jpg"}
    res = _calibrate("--clean", f"a={clean}", "--clean", f"b={clean}", "--out", tmp_path / "c2.json", *LOOSE)
    assert res.exit_code != 0 and "named as two kinds, a and b" in res.output
    assert not (tmp_path / "c2.json").exists()


def test_chain_originals_also_named_as_clean_are_scored_once_as_chain_images(tmp_path):
    """A manifest whose step-0 rows are the originals' own files, with the originals' folder also
    passed as ``--clean``: each file is one row (the chain's), so it cannot count twice or sit on
    both sides of the split, and the run says so."""
    originals = _folder(tmp_path / "originals", 8)
    later = _folder(tmp_path / "later", 8, seed=2)
    rows = []
    for i in range(8):
        rows.append({"chain_id": f"c{i}", "source_image": f"p{i}", "family": "f", "task": "replicate",
                     "step": 0, "path": str(originals / f"p{i}.png")})
        rows.append({"chain_id": f"c{i}", "source_image": f"p{i}", "family": "f", "task": "replicate",
                     "step": 5, "path": str(later / f"p{i}.png")})
    pd.DataFrame(rows).to_csv(tmp_path / "manifest.csv", index=False)
    _folder(tmp_path / "originals" / "more", 4, seed=5)  # clean images no chain holds: kept
    scores = tmp_path / "s.csv"
    res = _calibrate("--chains", tmp_path / "manifest.csv", "--clean", originals, "--out", tmp_path / "cal.json",
                     "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    assert "8 --clean image(s) are also chain images" in res.output
    t = pd.read_csv(scores, keep_default_na=False)
    assert len(t) == 20 and t["path"].map(os.path.realpath).is_unique
    assert (t["kind"] == "clean").sum() == 4
    assert load_calibration(tmp_path / "cal.json").n_clean == 12


def test_byte_identical_clean_files_count_as_one_picture_whatever_their_names(tmp_path):
    """A scraped clean set holds exact copies under unrelated names: they are one picture for the
    bound (and one side of the split), so 12 copies of one file beside 3 other pictures are 4
    pictures, never 15 independent ones."""
    import shutil

    clean = _folder(tmp_path / "clean", 4)
    for i in range(12):
        shutil.copy(clean / "p0.png", clean / f"copy_{i:02d}.png")
    scores = tmp_path / "s.csv"
    res = _calibrate("--clean", clean, "--out", tmp_path / "cal.json", "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    assert load_calibration(tmp_path / "cal.json").n_clean == 4
    assert "12 --clean image(s) are copies of other --clean images" in res.output
    t = pd.read_csv(scores, keep_default_na=False)
    assert len(t) == 16 and t["source_image"].nunique() == 4


def test_clean_files_of_identical_pixels_count_as_one_picture(tmp_path):
    """One picture saved again with another PNG text chunk, or as lossless WebP, has other bytes
    and the same pixels: it is one picture for the bound, as a byte-identical copy is, so that a
    folder of re-saved copies cannot pass for many independent clean pictures."""
    from PIL import PngImagePlugin

    clean = _folder(tmp_path / "clean", 4)
    img = Image.open(clean / "p0.png")
    for i in range(10):
        meta = PngImagePlugin.PngInfo()
        meta.add_text("Comment", f"copy {i}")
        img.save(clean / f"copy_{i:02d}.png", pnginfo=meta)
    img.save(clean / "copy.webp", lossless=True)
    assert len({(clean / f"copy_{i:02d}.png").read_bytes() for i in range(10)}) == 10
    scores = tmp_path / "s.csv"
    res = _calibrate("--clean", clean, "--out", tmp_path / "cal.json", "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    assert "11 --clean image(s) are copies of other --clean images" in res.output
    assert load_calibration(tmp_path / "cal.json").n_clean == 4
    t = pd.read_csv(scores, keep_default_na=False)
    assert len(t) == 15 and t["source_image"].nunique() == 4


def test_identical_pixels_are_one_picture_across_a_shard_and_folders(tmp_path):
    """Copies of one picture spread over a shard and two folders, with an undecodable member and
    a caption between them and batches of 2 (results of several images come in together): each
    image's digest is its own, so each copy takes the source of the first image of its pixels and
    every other picture keeps its own."""
    import io
    import tarfile

    from cg_testutil import add_member
    from PIL import PngImagePlugin

    a = _folder(tmp_path / "a", 4)
    b = tmp_path / "b"
    b.mkdir()
    meta = PngImagePlugin.PngInfo()
    meta.add_text("Comment", "re-saved")
    Image.open(a / "p2.png").save(b / "again.png", pnginfo=meta)  # p2's pixels, other bytes

    def encoded(img, **kw):
        buf = io.BytesIO()
        img.save(buf, **kw)
        return buf.getvalue()

    shard = tmp_path / "s" / "x-000.tar"
    shard.parent.mkdir()
    new = Image.fromarray(_picture(np.random.default_rng(9)))
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "k0.png", encoded(Image.open(a / "p0.png"), format="PNG", pnginfo=meta))
        add_member(tf, "k1.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # undecodable
        add_member(tf, "k1.txt", b"a caption")
        add_member(tf, "k2.png", encoded(new, format="PNG"))
        add_member(tf, "k3.webp", encoded(Image.open(a / "p1.png"), format="WEBP", lossless=True))
    scores = tmp_path / "s.csv"
    res = _calibrate("--clean", shard, "--clean", a, "--clean", b, "--batch-size", "2",
                     "--out", tmp_path / "cal.json", "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    assert "3 --clean image(s) are copies of other --clean images" in res.output
    t = pd.read_csv(scores, keep_default_na=False)
    src = dict(zip(t["path"].map(lambda p: p.replace(str(tmp_path), "")), t["source_image"]))
    assert src == {"/s/x-000.tar:k0.png": "x-000.tar:k0", "/s/x-000.tar:k1.png": "x-000.tar:k1",
                   "/s/x-000.tar:k2.png": "x-000.tar:k2", "/s/x-000.tar:k3.webp": "x-000.tar:k3",
                   "/a/p0.png": "x-000.tar:k0", "/a/p1.png": "x-000.tar:k3", "/a/p2.png": "a/p2",
                   "/a/p3.png": "a/p3", "/b/again.png": "a/p2"}
    assert load_calibration(tmp_path / "cal.json").n_clean == 5  # p0, p1, p2, p3 and the new one


def test_a_folder_of_one_picture_under_many_names_is_refused_as_one_picture(tmp_path):
    """40 copies of one photo differing only in a PNG comment are one picture: too few for any
    bound, never a "calibrated" file resting on one image."""
    import skimage.data as sd
    from PIL import PngImagePlugin

    clean = tmp_path / "clean"
    clean.mkdir()
    img = Image.fromarray(sd.astronaut()[::8, ::8])
    for i in range(40):
        meta = PngImagePlugin.PngInfo()
        meta.add_text("Comment", f"copy {i}")
        img.save(clean / f"copy{i:03d}.png", pnginfo=meta)
    res = _calibrate("--clean", clean, "--out", tmp_path / "cal.json", *LOOSE)
    assert res.exit_code != 0
    assert "39 --clean image(s) are copies of other --clean images" in res.output
    assert " 1 distinct clean picture, which cannot support" in res.output
    assert not (tmp_path / "cal.json").exists()


def test_the_plot_of_equal_scores_draws_without_warnings(tmp_path):
    """Every score the same (a scores table of tied images): the histogram gets bins of a width,
    with no divide-by-zero RuntimeWarning and no empty panel."""
    import warnings

    pytest.importorskip("matplotlib")
    clean = _folder(tmp_path / "clean", 12)
    scores = tmp_path / "s.csv"
    res = _calibrate("--clean", clean, "--out", tmp_path / "a.json", "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    t = pd.read_csv(scores, keep_default_na=False)
    t["score"] = -0.0957737
    t.to_csv(scores, index=False)
    loose = [a for a in LOOSE if a not in ("--no-plot", "--detector", "nss")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = _calibrate("--from-scores", scores, "--out", tmp_path / "b.json", *loose)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "b.png").stat().st_size > 0


def test_the_too_few_refusal_points_to_scores_out_and_from_scores(tmp_path):
    """Scoring can take long, and the refusal comes after it: it says how to keep the scores
    (--scores-out) and reuse them (--from-scores), or where they already are."""
    clean = _folder(tmp_path / "clean", 5)
    strict = ["--max-false-drop", "0.01", "--confidence", "0.95"]
    res = _calibrate("--clean", clean, "--out", tmp_path / "a.json", *LOOSE, *strict)
    assert res.exit_code != 0 and "rerun with --scores-out FILE, then with --from-scores FILE in place of --chains" in res.output
    scores = tmp_path / "s.csv"
    res = _calibrate("--clean", clean, "--out", tmp_path / "a.json", "--scores-out", scores, *LOOSE, *strict)
    assert res.exit_code != 0 and f"--from-scores {scores} in place of --chains and --clean, without scoring again" in res.output
    res = _calibrate("--from-scores", scores, "--out", tmp_path / "a.json", "--no-plot", *strict)
    assert res.exit_code != 0 and "without scoring again" not in res.output


def test_a_clean_file_of_a_chain_step_0s_pixels_is_that_chains_picture(tmp_path):
    """Chains made from the clean folder and calibrated with it (the natural workflow): each clean
    file has the pixels of a chain's step 0, so it is that chain's picture, counted once and kept
    on one side of the split; and a clean file with a later step's pixels (a degraded copy under
    another name) is refused."""
    clean = _folder(tmp_path / "clean", 6)
    chains = tmp_path / "chains"
    res = CliRunner().invoke(main, ["chains", "make", "--sources", f"folder:{clean}", "--families", "codec",
                                    "--steps", "2", "--keep", "0,2", "-o", str(chains), "-q", "-w", "1"])
    assert res.exit_code == 0, res.output
    scores = tmp_path / "s.csv"
    res = _calibrate("--chains", chains, "--clean", clean, "--out", tmp_path / "cal.json",
                     "--scores-out", scores, *LOOSE)
    assert res.exit_code == 0, res.output
    assert "6 --clean image(s) have the pixels of a chain's step-0 image" in res.output
    t = pd.read_csv(scores, keep_default_na=False)
    assert t["source_image"].nunique() == 6
    assert load_calibration(tmp_path / "cal.json").n_clean == 6
    step2 = sorted(chains.rglob("step_002.png"))[0]
    Image.open(step2).save(clean / "renamed.png")
    res = _calibrate("--chains", chains, "--clean", clean, "--out", tmp_path / "cal2.json", *LOOSE)
    assert res.exit_code == 1 and "renamed.png" in res.output and "step 2" in res.output, res.output


def test_a_key_a_clean_shard_repeats_enters_the_bound_by_its_highest_score(tmp_path):
    """Two members of one key in a --clean shard (or two chains of one source from different
    originals) are one picture: the bound takes its highest score, as if only that image were
    there, not the first one read."""
    import io
    import tarfile
    rng = np.random.default_rng(3)
    pictures = [_picture(rng) for _ in range(10)]
    noisy = np.clip(pictures[0].astype(float) + rng.normal(0, 40, pictures[0].shape), 0, 255)

    def shard(path, members):
        with tarfile.open(path, "w") as tf:
            for name, img in members:
                buf = io.BytesIO()
                Image.fromarray(np.asarray(img, np.uint8)).save(buf, "PNG")
                info = tarfile.TarInfo(name)
                info.size = buf.tell()
                tf.addfile(info, io.BytesIO(buf.getvalue()))
        return path

    rest = [(f"c{i}.png", p) for i, p in enumerate(pictures[1:])]
    twice = shard(tmp_path / "twice.tar", [("k.png", pictures[0]), *rest, ("k.png", noisy)])
    once = shard(tmp_path / "once.tar", [*rest, ("k.png", noisy)])
    thresholds = []
    for src in (twice, once):
        out = tmp_path / f"{src.stem}.json"
        res = _calibrate("--clean", src, "--out", out, "--max-false-drop", "0.2", "--confidence", "0.7",
                         *[a for a in LOOSE if a not in ("0.3", "0.6", "--max-false-drop", "--confidence")])
        assert res.exit_code == 0, res.output
        cal = load_calibration(out)
        assert cal.n_clean == 10
        thresholds.append(cal.threshold)
    assert thresholds[0] == thresholds[1]
