"""`collapseguard calibrate` end to end on tiny generated chains, scored by the real `nss` detector."""

import json
import sys

import numpy as np
import pandas as pd
import pytest
from cg_testutil import run_with_stdout_closed_early
from click.testing import CliRunner
from PIL import Image

from collapseguard.calibration.thresholds import (
    DEFAULTS_DIR,
    CalibrationMismatch,
    load_calibration,
    resolve_threshold,
    save_calibration,
)
from collapseguard.cli import main
from collapseguard.detectors import create
from collapseguard.training_data_tools.manifest import write_manifest

SIZE = 48


def _clean_image(rng):
    """Smooth gradient plus a flat shape: a clean, noise-free picture."""
    y, x = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    img = np.stack([x * rng.uniform(60, 200), y * rng.uniform(60, 200), (x + y) * rng.uniform(30, 100)], -1)
    cy, cx, r = rng.integers(10, 38, 2).tolist() + [rng.integers(5, 12)]
    img[(np.mgrid[0:SIZE, 0:SIZE][0] - cy) ** 2 + (np.mgrid[0:SIZE, 0:SIZE][1] - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return np.clip(img + 20, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("calib")
    rng = np.random.default_rng(0)
    rows = []
    for s in range(6):
        orig = _clean_image(rng)
        for fam, sigma in (("noise", 12.0), ("grain", 20.0)):
            cid = f"{fam}-{s}"
            img = orig.astype(np.float64)
            for step in range(6):
                if step:
                    img = img + rng.normal(0, sigma, img.shape)  # accumulating noise
                if step not in (0, 1, 3, 5):
                    continue
                p = root / "chains" / cid / f"{step}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(p)
                rows.append({"chain_id": cid, "source_image": f"src{s}", "family": fam, "task": "t", "step": step, "path": str(p)})
    write_manifest(pd.DataFrame(rows), root / "chains" / "manifest.csv")
    clean = root / "clean"
    clean.mkdir()
    for i in range(40):
        Image.fromarray(_clean_image(rng)).save(clean / f"photo{i}.png")
    return root


def _run(args):
    res = CliRunner().invoke(main, ["calibrate", *args])
    return res


@pytest.fixture(scope="module")
def calibrated(data):
    """One real scoring run (chains + clean folder), kept for the tests below."""
    out, scores = data / "cal.json", data / "scores.csv"
    res = _run(["--chains", str(data / "chains"), "--detector", "nss", "--clean", str(data / "clean"),
                "--max-false-drop", "0.1", "--confidence", "0.9", "--out", str(out),
                "--scores-out", str(scores)])
    assert res.exit_code == 0, res.output
    return out, scores, res.output


def data_dir(out):
    return out.parent


def test_calibrate_end_to_end(calibrated, tmp_path):
    out, scores, output = calibrated
    cal = load_calibration(out)
    det = create("nss")
    assert cal.detector == "nss" and cal.detector_version == det.version
    assert cal.alpha == 0.1 and cal.confidence == 0.9 and cal.n_clean >= 22
    assert 0 < cal.guaranteed_false_drop <= 0.1
    assert "binomial order statistic" in cal.method
    assert out.with_suffix(".png").stat().st_size > 1000
    # the file records the command that made it, as it was given (not the test runner's argv)
    import shlex
    recorded = shlex.split(cal.command)
    assert recorded[:2] == ["collapseguard", "calibrate"], cal.command
    for opt, value in (("--chains", str(data_dir(out) / "chains")), ("--detector", "nss"),
                       ("--clean", str(data_dir(out) / "clean")), ("--out", str(out))):
        assert recorded[recorded.index(opt) + 1] == value, cal.command
    assert "first step with >=90% dropped" in output
    # accumulating noise is caught more as steps grow
    allc = {r["step"]: r["fraction"] for r in cal.drop_curve if r["family"] == "all"}
    assert allc[0] < allc[1] <= allc[3] <= allc[5] and allc[5] >= 0.9
    assert np.all(np.diff(cal.probability_map["y"]) >= 0)
    # the file is accepted for nss at its version, refused for another version / detector
    t, msg, _ = resolve_threshold(det, calibration=out)
    assert t == cal.threshold and "nss@" in msg
    det.version = "not-" + det.version
    with pytest.raises(CalibrationMismatch):
        resolve_threshold(det, calibration=out)
    # reusing the scores table gives the same calibration without scoring again
    out2 = tmp_path / "cal2.json"
    res = _run(["--from-scores", str(scores), "--max-false-drop", "0.1", "--confidence", "0.9",
                "--out", str(out2), "--no-plot"])
    assert res.exit_code == 0, res.output
    assert load_calibration(out2).threshold == cal.threshold
    # with every clean picture counted (--holdout 0) the threshold is the k-th largest of the
    # pictures' highest clean scores, k from the binomial bound: derived here from scores.csv
    from collapseguard.calibration.bounds import order_statistic_rank
    res = _run(["--from-scores", str(scores), "--max-false-drop", "0.1", "--confidence", "0.9",
                "--holdout", "0", "--out", str(out2), "--no-plot"])
    assert res.exit_code == 0, res.output
    t = pd.read_csv(scores)
    clean = t[(t["kind"] == "clean") | (t["step"] == 0)]
    highest = np.sort(clean.groupby("source_image")["score"].max().to_numpy())[::-1]
    k = order_statistic_rank(len(highest), 0.1, 0.9)
    assert 1 <= k < len(highest) and load_calibration(out2).threshold == highest[k - 1]
    # called from a Python program (another argv[0]), the file still records the command as typed
    args = ["--from-scores", str(scores), "--max-false-drop", "0.1", "--confidence", "0.9", "--holdout", "0",
            "--out", str(out2), "--no-plot"]
    main.main(["calibrate", *args], prog_name="some_script.py", standalone_mode=False)
    assert load_calibration(out2).command == "collapseguard calibrate " + " ".join(args)
    res = _run(["--from-scores", str(scores), "--detector", "cnn", "--out", str(out2)])
    assert res.exit_code != 0 and "nss" in res.output


def test_calibrate_refuses_too_few_clean(calibrated, tmp_path):
    res = _run(["--from-scores", str(calibrated[1]), "--out", str(tmp_path / "c.json")])
    assert res.exit_code != 0
    assert "at least 299 distinct clean pictures are needed" in res.output
    assert not (tmp_path / "c.json").exists()


def test_calibrate_fr_target(data, tmp_path):
    out = tmp_path / "fr.json"
    res = _run(["--chains", str(data / "chains"), "--detector", "nss",
                "--max-false-drop", "0.3", "--confidence", "0.7", "--target", "fr:psnr<20",
                "--out", str(out), "--no-plot"])
    assert res.exit_code == 0, res.output
    cal = json.loads(out.read_text())
    assert cal["target"] == "fr:psnr<20" and cal["clean_steps"] == []
    # with PSNR as the truth, some early-step images count as clean: more clean images than
    # originals, though the bound counts each original's picture once
    assert cal["split"]["n_clean_threshold_images"] + cal["split"]["n_clean_holdout"] > 6
    assert cal["n_clean"] == cal["split"]["threshold_sources"] <= 6


def test_calibrate_bad_options(data, tmp_path):
    assert _run(["--out", str(tmp_path / "x.json")]).exit_code != 0
    res = _run(["--chains", str(data / "chains"), "--target", "fr:lpips", "--out", str(tmp_path / "x.json")])
    assert res.exit_code != 0 and "target" in res.output
    res = _run(["--chains", str(data / "chains"), "--clean-steps", "a,b", "--out", str(tmp_path / "x.json")])
    assert res.exit_code != 0


def test_saved_calibration_round_trips_through_filter_resolution(tmp_path):
    det = create("nss")
    cal = load_calibration(save_calibration(
        __import__("collapseguard.calibration.thresholds", fromlist=["Calibration"]).Calibration(
            detector="nss", detector_version=det.version, threshold=1.5), tmp_path / "c.json"))
    assert resolve_threshold(det, calibration=tmp_path / "c.json")[0] == cal.threshold == 1.5


def test_full_reference_measures():
    from collapseguard.calibration.scoring import full_reference

    rng = np.random.default_rng(1)
    ref = _clean_image(rng)
    noisy = [np.clip(ref + rng.normal(0, s, ref.shape), 0, 255).astype(np.uint8) for s in (5, 20)]
    assert full_reference(ref, ref, "ssim") == pytest.approx(1.0)
    s1, s2 = (full_reference(ref, n, "ssim") for n in noisy)
    assert 1.0 > s1 > s2
    p1, p2 = (full_reference(ref, n, "psnr") for n in noisy)
    assert p1 > p2 > 10
    wider = np.asarray(Image.fromarray(ref).resize((SIZE + 8, SIZE)))  # aspect drift
    assert 0.5 < full_reference(ref, wider, "ssim") < 1.0


def test_clean_variants_grouped_by_source(tmp_path):
    """Crops/JPEGs of one photo are written as NAME__variant and read back as one source."""
    from collapseguard.calibration.clean_sets import largest_per_folder, write_variants
    from collapseguard.calibration.scoring import iter_clean_images

    rng = np.random.default_rng(2)
    big = rng.integers(0, 255, (200, 300, 3), dtype=np.uint8)
    small = rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)
    paths = write_variants([("pack/a b", big), ("small", small)], tmp_path / "clean", crops=3, crop_size=96)
    names = sorted(p.name for p in paths)
    assert names == ["pack_a_b__c0.png", "pack_a_b__c0_q85.jpg", "pack_a_b__c1.png", "pack_a_b__c2.png",
                     "small__c0.png", "small__c0_q85.jpg"]
    crop = np.asarray(Image.open(tmp_path / "clean" / "pack_a_b__c0.png"))
    assert crop.shape == (96, 96, 3)  # native-resolution crop, not a resize
    assert any((crop == big[y:y + 96, x:x + 96]).all() for y in range(105) for x in range(205))
    sources = {s for s, _, _ in iter_clean_images([tmp_path / "clean"])}
    assert sources == {"clean/pack_a_b", "clean/small"}
    with pytest.raises(ValueError, match="same file stem"):
        write_variants([("x/y", small), ("x_y", small)], tmp_path / "dup")
    # one picture per folder of a multi-resolution wallpaper pack
    for size in ((64, 48), (128, 96)):
        (tmp_path / "wp" / "Kite").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
            tmp_path / "wp" / "Kite" / f"{size[0]}x{size[1]}.png")
    assert [p.name for p in largest_per_folder(tmp_path / "wp")] == ["128x96.png"]


def test_clean_images_from_tar_shard(tmp_path):
    import io
    import tarfile

    from collapseguard.calibration.scoring import iter_clean_images

    shard = tmp_path / "shard-000.tar"
    with tarfile.open(shard, "w") as tf:
        for name, data in (("s1.png", _png_bytes()), ("s1.json", b"{}"), ("s2.jpg", _png_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    items = list(iter_clean_images([shard]))
    assert [s for s, _, _ in items] == ["shard-000.tar:s1", "shard-000.tar:s2"]
    assert items[0][2]() == _png_bytes()


def test_shards_of_one_name_in_two_folders_hold_different_pictures(tmp_path):
    """Shards named alike in two folders, with class folders inside: every member is its own
    picture (the bound counts pictures), named by folder, shard and member folder."""
    import io
    import tarfile

    from collapseguard.calibration.scoring import iter_clean_images

    for folder in ("x", "y"):
        (tmp_path / "clean" / folder).mkdir(parents=True)
        with tarfile.open(tmp_path / "clean" / folder / "part.tar", "w") as tf:
            for cls in ("cls0", "cls1"):
                data = _png_bytes()
                info = tarfile.TarInfo(f"{cls}/000.png")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    ids = [s for s, _, _ in iter_clean_images([tmp_path / "clean"])]
    assert ids == ["clean/x/part.tar:cls0/000", "clean/x/part.tar:cls1/000",
                   "clean/y/part.tar:cls0/000", "clean/y/part.tar:cls1/000"]


def _png_bytes():
    import io

    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 100, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_scores_table_from_two_detectors_refused(calibrated, tmp_path):
    from collapseguard.calibration.scoring import read_scores

    t = pd.read_csv(calibrated[1])
    t.loc[0, "detector_version"] = "other"
    t.to_csv(tmp_path / "mixed.csv", index=False)
    with pytest.raises(ValueError, match="exactly one detector/version"):
        read_scores(tmp_path / "mixed.csv")
    res = _run(["--from-scores", str(tmp_path / "mixed.csv"), "--out", str(tmp_path / "c.json")])
    assert res.exit_code != 0 and "exactly one detector" in res.output


def test_scores_table_round_trips_every_float_exactly(tmp_path):
    """A threshold recomputed --from-scores must be the same float (pandas 2's default parser
    missed by one ulp on a GPU machine's pandas)."""
    from collapseguard.calibration.scoring import read_scores, save_scores

    x = np.random.default_rng(0).normal(size=20000) * 3.0
    x[::997] = np.nan
    table = pd.DataFrame({"source_image": "s", "family": "f", "step": 0, "kind": "chain",
                          "path": [f"p{i}.png" for i in range(len(x))], "score": x})
    t, det, ver = read_scores(save_scores(table, tmp_path / "s.csv", "nss", "v1"))
    assert (det, ver) == ("nss", "v1")
    np.testing.assert_array_equal(t["score"].to_numpy(), x)  # NaN == NaN here, bit-exact otherwise


def test_calibrate_refuses_bad_outputs_and_inputs_before_scoring(calibrated, tmp_path):
    scores = str(calibrated[1])
    common = ["--from-scores", scores, "--max-false-drop", "0.1", "--confidence", "0.9"]
    (tmp_path / "adir").mkdir()
    res = _run([*common, "--out", str(tmp_path / "adir")])
    assert res.exit_code == 1 and "it is a folder" in res.output and "Traceback" not in res.output
    res = _run([*common, "--holdout", "1", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "--holdout" in res.output
    # a hand-edited table: a typo in kind, a fractional step
    t = pd.read_csv(scores)
    for col, val, msg in (("kind", "Chain", "kind must be"), ("step", 1.5, "step must be")):
        bad = t.copy()
        bad[col] = bad[col].astype(object)
        bad.loc[bad.index[1], col] = val
        bad.to_csv(tmp_path / "bad.csv", index=False)
        res = _run(["--from-scores", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "c.json")])
        assert res.exit_code == 1 and msg in res.output, res.output


def test_infinite_clean_scores_count_as_false_drops():
    from collapseguard.calibration.bounds import order_statistic_threshold
    from collapseguard.calibration.thresholds import CalibrationError
    s = np.r_[np.linspace(0, 1, 500), [np.nan] * 5]
    base = order_statistic_threshold(s, 0.01, 0.95)
    with_inf = order_statistic_threshold(np.r_[s, np.inf], 0.01, 0.95)
    assert base.n == 500 and with_inf.n == 501  # NaN left out, +inf counted
    assert with_inf.threshold > base.threshold  # one clean image above everything moves the bound
    with pytest.raises(CalibrationError, match="are \\+inf"):
        order_statistic_threshold(np.r_[np.linspace(0, 1, 490), [np.inf] * 10], 0.01, 0.95)


def test_calibrate_out_png_is_not_overwritten_by_the_plot(tmp_path):
    """`--out cal.png` used to write the calibration and then the plot over it (exit 0)."""
    from collapseguard.calibration.scoring import save_scores

    rng = np.random.default_rng(7)
    n = 400
    t = pd.DataFrame({"source_image": [f"c/{i}" for i in range(n)], "family": "clean-extra", "step": 0,
                      "kind": "clean", "path": [f"c/{i}.png" for i in range(n)],
                      "score": rng.normal(size=n), "chain_id": ""})
    save_scores(t, tmp_path / "s.csv", "synthetic", "v1")
    out = tmp_path / "cal.png"
    res = _run(["--from-scores", str(tmp_path / "s.csv"), "--holdout", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert load_calibration(out).n_clean == n  # still the calibration
    assert (tmp_path / "cal.png.plot.png").read_bytes()[:4] == b"\x89PNG"
    assert "in-sample (--holdout 0) false-drop" in res.output  # not called held-out
    res = _run(["--from-scores", str(tmp_path / "s.csv"), "--out", str(tmp_path / "x.json"),
                "--scores-out", str(tmp_path / "x.json")])
    assert res.exit_code != 0 and "different files" in res.output


def test_clean_folder_named_with_at_sign_is_split_by_image(tmp_path):
    """A folder such as ``me@host/`` must not make all its images one source (the split reads
    ``NAME@VIEW`` as views of one picture)."""
    from collapseguard.calibration.scoring import iter_clean_images
    from collapseguard.training_data_tools.manifest import source_group

    folder = tmp_path / "me@host"
    folder.mkdir()
    for i in range(4):
        (folder / f"p{i}.png").write_bytes(_png_bytes())
    groups = {source_group(s) for s, _, _ in iter_clean_images([folder])}
    assert len(groups) == 4


def test_from_scores_checks_the_detector_by_version_not_spelling(calibrated, tmp_path):
    from pathlib import Path

    import collapseguard
    weights = Path(collapseguard.__file__).parent / "weights" / "cnn.safetensors"
    cnn = create("cnn")
    table = pd.read_csv(calibrated[1], dtype=str, keep_default_na=False)
    table["detector"], table["detector_version"] = f"cnn:{weights}", cnn.version
    table.to_csv(tmp_path / "cnn_scores.csv", index=False)
    common = ["--from-scores", str(tmp_path / "cnn_scores.csv"), "--max-false-drop", "0.1",
              "--confidence", "0.9", "--no-plot"]
    # the packaged weights under their short name are the same detector as under their path
    res = _run([*common, "--detector", "cnn", "--out", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    res = _run([*common, "--detector", "nss", "--out", str(tmp_path / "b.json")])
    assert res.exit_code != 0 and "holds scores of cnn:" in res.output
    assert not (tmp_path / "b.json").exists()


def test_from_scores_refuses_scores_out_and_a_plot_path_that_is_a_folder(calibrated, tmp_path):
    common = ["--from-scores", str(calibrated[1]), "--max-false-drop", "0.1", "--confidence", "0.9"]
    res = _run([*common, "--scores-out", str(tmp_path / "s.csv"), "--out", str(tmp_path / "a.json")])
    assert res.exit_code != 0 and "computes none" in res.output
    (tmp_path / "c.png").mkdir()  # where the plot of c.json would go
    res = _run([*common, "--out", str(tmp_path / "c.json")])
    assert res.exit_code != 0 and "cannot write the plot" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "c.json").exists()  # refused before anything was written


def test_from_scores_of_a_file_that_is_no_csv_table_names_the_file(tmp_path):
    """An empty file, an image and ragged text given as --from-scores: one line naming the file,
    not pandas' message alone."""
    (tmp_path / "empty.csv").write_text("")
    Image.fromarray(_clean_image(np.random.default_rng(1))).save(tmp_path / "picture.csv", format="PNG")
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n1,2,3,4\n")
    for name in ("empty.csv", "picture.csv", "ragged.csv"):
        res = _run(["--from-scores", str(tmp_path / name), "--out", str(tmp_path / "c.json")])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and f"{tmp_path / name}: not a scores table" in lines[0], res.output
        assert "\\n" not in lines[0]


def test_printing_calibrations_into_a_pipe_closed_early_stops_quietly():
    """``collapseguard calibrations FILE | head -1`` stops as every ``collapseguard`` command does
    (click): nothing on stderr, exit status 1, no BrokenPipeError traceback. The file is given 200 times, so the output outgrows the pipe's buffer and the
    reader closes it while the command is still writing."""
    files = [str(DEFAULTS_DIR / "cnn.json")] * 200
    status, err = run_with_stdout_closed_early([sys.executable, "-c", "from collapseguard.cli import main; main()", "calibrations", *files])
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert (status, err) == (1, "")


def test_a_folder_of_unrelated_numbered_pictures_is_called_no_chain(data, tmp_path, photos):
    """Files numbered in one folder are one chain by the layout rule. Calibrating on a folder of
    photos ``p0000.png`` ... warns that it is no chain, on stderr and in the calibration file's
    notes; the same layout holding a real chain (one picture, noise growing) gets no warning."""
    from collapseguard.images import encode_png

    rng = np.random.default_rng(1)
    base = photos[0][:96, :96].astype(np.float64)
    for name in ("photos", "chain"):
        (tmp_path / name).mkdir()
    for i in range(8):
        pic = photos[i % len(photos)]
        crop = pic[:96, :96] if i % 2 == 0 else pic[-96:, -96:]
        (tmp_path / "photos" / f"p{i:04d}.png").write_bytes(encode_png(np.ascontiguousarray(crop)))
        noisy = np.clip(base + rng.normal(0, 3 * i, base.shape), 0, 255).astype(np.uint8)
        (tmp_path / "chain" / f"p{i:04d}.png").write_bytes(encode_png(noisy))
    (tmp_path / "up").mkdir()
    (tmp_path / "photos").rename(tmp_path / "up" / "photos")  # named through its parent too
    for name, warned in (("up/photos", True), ("up", True), ("chain", False)):
        out = tmp_path / f"{name.replace('/', '_')}.json"
        res = _run(["--chains", str(tmp_path / name), "--clean", str(data / "clean"), "--detector", "nss",
                    "--max-false-drop", "0.2", "--confidence", "0.8", "--holdout", "0", "--no-plot", "-q",
                    "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert ("look like two different pictures" in res.output) is warned, res.output
        notes = " ".join(load_calibration(out).notes)
        assert ("look like two different pictures" in notes) is warned, notes


def test_calibrate_and_calibrations_print_rates_as_percents_and_never_none(tmp_path):
    """The held-out false-drop rate as a percent of a count (not 0.2857142857142857), and a family
    that never reaches 90% or 99% dropped as "never (to step N)" (not None), in the run's output
    and in `collapseguard calibrations`. Gentle chains of the bundled photos, scored by nss."""
    import re

    from collapseguard.calibration.show import show

    res = CliRunner().invoke(main, ["chains", "make", "--sources", "bundled", "--max-sources", "8",
                                    "--families", "noise_tint", "--steps", "10", "--keep", "0,5,10",
                                    "--out", str(tmp_path / "chains"), "-w", "1", "-q"])
    assert res.exit_code == 0, res.output
    res = _run(["--chains", str(tmp_path / "chains"), "--detector", "nss", "--max-false-drop", "0.3",
                "--confidence", "0.6", "--out", str(tmp_path / "c.json"), "--no-plot", "-q"])
    assert res.exit_code == 0, res.output
    cal = load_calibration(tmp_path / "c.json")
    line = next(x for x in res.output.splitlines() if "false-drop" in x and "bound:" in x)
    assert re.search(r"false-drop (\d+\.\d\d% of \d+ clean images|n/a \(no clean image held out\))$", line), line
    assert not re.search(r"\d\.\d{8,}", res.output)
    assert any(None in lv.values() for lv in cal.first_step_dropped.values()), cal.first_step_dropped
    for text in (res.output, show(tmp_path / "c.json")):
        assert "None" not in text
        assert "never (to step 10)" in text


def test_clean_folder_files_of_no_image_type_are_named_before_scoring(tmp_path):
    rng = np.random.default_rng(5)
    folder = tmp_path / "clean"
    folder.mkdir()
    for i in range(4):
        Image.fromarray(_clean_image(rng)).save(folder / f"p{i}.png")
    (folder / "layers.psd").write_bytes(b"8BPS")
    (folder / "b.PSD").write_bytes(b"\x00")
    (folder / "table.parquet").write_bytes(b"PAR1")
    res = _run(["--clean", str(folder), "--detector", "nss", "--max-false-drop", "0.5", "--confidence",
                "0.5", "--holdout", "0", "--no-plot", "--out", str(tmp_path / "c.json")])
    text = " ".join(res.output.split())
    assert ("warning: 3 file(s) in the --clean folders were not read, not being an image type: "
            ".psd (2), .parquet (1)") in text
    assert "shards .tar, .tar.gz, .tgz)" in text  # a clean folder's Parquet files are not read
