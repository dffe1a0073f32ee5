"""`collapseguard calibrate` per storage and per clean kind, on real chains stored two ways."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from collapseguard.calibration.thresholds import Calibration, load_calibration
from collapseguard.cli import main
from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.manifest import read_manifest, write_manifest
from collapseguard.training_data_tools.storage import store_chains


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("calbreak")
    srcs = [(f"{n}-{i}", p[y:y + 64, x:x + 64]) for n, p in zip(("astro", "coffee", "cat", "rocket"), photos)
            for i, (y, x) in enumerate(((0, 0), (96, 96), (160, 0)))]
    make_chains(srcs, ["scattered_dots"], steps=3, keep=(0, 1, 3), out_dir=root / "chains", workers=1,
                progress=False)
    m = read_manifest(root / "chains")
    m["kind"] = ["portrait" if s.startswith("astro") else "photo" for s in m["source_image"]]
    write_manifest(m, root / "chains" / "manifest.csv")
    store_chains(read_manifest(root / "chains"), ["png", "jpeg:75:420"], root / "stored")
    res = CliRunner().invoke(main, ["calibrate", "--chains", str(root / "stored"), "--detector", "nss",
                                    "--max-false-drop", "0.2", "--confidence", "0.8", "--holdout", "0",
                                    "--out", str(root / "cal.json"), "--scores-out", str(root / "scores.csv"),
                                    "--no-plot"])
    assert res.exit_code == 0, res.output
    return root, res.output


def test_scores_table_has_storage_and_kind(calibrated):
    root, _ = calibrated
    t = pd.read_csv(root / "scores.csv")
    assert set(t["storage"]) == {"png", "jpeg q75 4:2:0"}
    assert set(t["source_kind"]) == {"portrait", "photo"}


def test_breakdown_matches_the_scores(calibrated):
    root, out = calibrated
    cal = load_calibration(root / "cal.json")
    t = pd.read_csv(root / "scores.csv")
    bd = cal.breakdown
    assert bd["measured_on"].startswith("every source")
    for storage in ("png", "jpeg q75 4:2:0"):
        g = t[(t["storage"] == storage) & (t["step"] == 0)]
        row = next(r for r in bd["storage"]["clean"] if r["storage"] == storage)
        assert row["n"] == 12  # one original per source in each storage
        assert row["dropped"] == int((g["score"] > cal.threshold).sum())
        s3 = t[(t["storage"] == storage) & (t["step"] == 3)]
        row = next(r for r in bd["storage"]["steps"] if r["storage"] == storage and r["step"] == 3)
        assert row["fraction"] == pytest.approx((s3["score"] > cal.threshold).mean())
    kinds = {r["source_kind"]: r for r in bd["source_kind"]["clean"]}
    assert set(kinds) == {"portrait", "photo"} and kinds["portrait"]["n"] == 6 and kinds["photo"]["n"] == 18
    assert "by storage" in out and "by clean kind" in out and "jpeg q75 4:2:0" in out
    again = Calibration.from_json(json.dumps(json.loads((root / "cal.json").read_text())))
    assert again.breakdown == cal.breakdown


def test_from_scores_gives_the_same_breakdown(calibrated, tmp_path):
    root, _ = calibrated
    res = CliRunner().invoke(main, ["calibrate", "--from-scores", str(root / "scores.csv"), "--max-false-drop",
                                    "0.2", "--confidence", "0.8", "--holdout", "0", "--out",
                                    str(tmp_path / "c.json"), "--no-plot"])
    assert res.exit_code == 0, res.output
    assert load_calibration(tmp_path / "c.json").breakdown == load_calibration(root / "cal.json").breakdown


def test_a_breakdown_that_is_not_an_object_is_refused(calibrated):
    from collapseguard.calibration.thresholds import CalibrationError

    root, _ = calibrated
    d = json.loads((root / "cal.json").read_text())
    d["breakdown"] = [1, 2]
    with pytest.raises(CalibrationError, match="breakdown"):
        Calibration.from_dict(d)


def test_the_storage_table_bands_jpeg_qualities(tmp_path):
    """Clean JPEGs saved at 25 qualities (as web JPEGs arrive) give a few quality bands in the
    per-storage table, not a row per quality."""
    import skimage.data as sd
    from click.testing import CliRunner
    from PIL import Image

    from collapseguard.calibration.thresholds import load_calibration
    from collapseguard.cli import main

    clean = tmp_path / "clean"
    clean.mkdir()
    pics = [sd.astronaut(), sd.chelsea(), sd.coffee(), sd.rocket()]
    for i, q in enumerate(range(70, 95)):
        s = pics[i % 4]
        Image.fromarray(s[24 * (i // 4):24 * (i // 4) + 64, 24 * (i // 4):24 * (i // 4) + 64]).save(
            clean / f"p{i}.jpg", quality=q)
    res = CliRunner().invoke(main, ["calibrate", "--clean", str(clean), "--detector", "nss", "--max-false-drop",
                                    "0.3", "--confidence", "0.6", "--holdout", "0", "--no-plot", "--out",
                                    str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    rows = [r["storage"] for r in load_calibration(tmp_path / "c.json").breakdown["storage"]["clean"]]
    assert 2 <= len(rows) <= 4 and all(r.startswith(("jpeg q70-79", "jpeg q80-89", "jpeg q90-94")) for r in rows), rows
    assert "jpeg q80-89 4:2:0" in res.output
