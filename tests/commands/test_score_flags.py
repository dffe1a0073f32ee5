"""`score` flags every row as `filter` would decide it: `flagged` (score > threshold, empty where
the score is) and `threshold` columns, from --threshold, --calibration or the detector's shipped
calibration."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
from cg_testutil import make_shard
from click.testing import CliRunner

from collapseguard.cli import main
from collapseguard.detectors import Detector, base, create
from collapseguard.io.calibration_file import (
    default_calibration,
    default_calibration_path,
)


def _shard(tmp_path, photos):
    shard = tmp_path / "in" / "s-000.tar"
    shard.parent.mkdir()
    make_shard(shard, photos[:3], extra=[("broken.jpg", b"\xff\xd8 not a jpeg")])
    return shard


def _score(args, expect=0):
    res = CliRunner().invoke(main, ["score", *args, "--quiet"], catch_exceptions=False)
    assert res.exit_code == expect, res.output
    return res


def test_score_flags_rows_at_the_shipped_threshold_as_filter_decides(tmp_path, photos):
    shard = _shard(tmp_path, photos)
    _score([str(shard), "--out", str(tmp_path / "s.parquet")])
    df = pd.read_parquet(tmp_path / "s.parquet")
    det = create("cnn")
    t = default_calibration(det.name, det.version).threshold
    assert list(df.columns[:5]) == ["source", "key", "score", "flagged", "threshold"]
    assert (df["threshold"] == t).all()
    scored = df["score"].notna()
    assert not scored.all() and df.loc[~scored, "flagged"].isna().all()  # the broken sample
    assert (df.loc[scored, "flagged"] == (df.loc[scored, "score"] > t)).all()
    assert df["flagged"].fillna(False).any() and not df["flagged"].fillna(True).all()
    # filter, with the same shipped calibration, rejects exactly the flagged samples as degraded
    res = CliRunner().invoke(main, ["filter", str(shard), "--out", str(tmp_path / "f"), "--quiet",
                                    "--workers", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    f = pd.read_parquet(tmp_path / "f" / "scores" / "s-000.parquet")
    degraded = set(f.loc[f["reason"] == "degraded", "key"])
    assert degraded == set(df.loc[df["flagged"].fillna(False).astype(bool), "key"])


def test_score_threshold_and_calibration_options(tmp_path, photos):
    shard = _shard(tmp_path, photos)
    _score([str(shard), "--out", str(tmp_path / "a.parquet")])
    s = pd.read_parquet(tmp_path / "a.parquet")["score"].dropna()
    t = float(np.median(s)) + 1e-3  # half the rows either side
    _score([str(shard), "--out", str(tmp_path / "t.csv"), "--threshold", str(t)])
    df = pd.read_csv(tmp_path / "t.csv", keep_default_na=False)
    assert (df["threshold"].astype(float) == t).all()
    scored = df["score"] != ""
    assert set(df.loc[~scored, "flagged"]) == {""}  # empty in CSV where the score is
    want = df.loc[scored, "score"].astype(float) > t
    assert (df.loc[scored, "flagged"].map({"True": True, "False": False}) == want).all()
    assert 0 < want.sum() < len(want)
    # a calibration file: its threshold; one made for another detector is refused before scoring
    cal = tmp_path / "cnn.json"
    shutil.copy(default_calibration_path("cnn"), cal)
    _score([str(shard), "--out", str(tmp_path / "c.parquet"), "--calibration", str(cal)])
    assert (pd.read_parquet(tmp_path / "c.parquet")["threshold"] ==
            default_calibration(create("cnn").name, create("cnn").version).threshold).all()
    res = _score([str(shard), "--out", str(tmp_path / "x.parquet"), "--calibration",
                  str(default_calibration_path("nss"))], expect=1)
    assert "calibration was made for detector nss" in res.output
    assert not (tmp_path / "x.parquet").exists()


class Brightness(Detector):
    """A real, if naive, detector with no calibration anywhere: mean brightness."""

    name, version = "test-brightness", "1"

    def score(self, images):
        return np.array([float(np.mean(im)) for im in images], np.float32)


def test_a_detector_without_a_calibration_scores_with_empty_flags(tmp_path, photos, monkeypatch):
    shard = _shard(tmp_path, photos)
    monkeypatch.setitem(base._REGISTRY, "test-brightness", Brightness)  # registered for this test
    res = _score([str(shard), "--out", str(tmp_path / "s.parquet"), "-d", "test-brightness"])
    df = pd.read_parquet(tmp_path / "s.parquet")
    assert df["score"].notna().sum() == 6
    assert df["flagged"].isna().all() and df["threshold"].isna().all()
    assert "no threshold for test-brightness" in res.output
    # with --threshold it flags
    _score([str(shard), "--out", str(tmp_path / "t.parquet"), "-d", "test-brightness",
            "--threshold", "100"])
    df = pd.read_parquet(tmp_path / "t.parquet")
    ok = df["score"].notna()
    assert (df.loc[ok, "flagged"] == (df.loc[ok, "score"] > 100)).all()


def test_a_calibration_for_another_detector_beside_a_threshold_says_to_drop_it(tmp_path, photos):
    """With --threshold given, the calibration would give only its score maps: the advice is to
    drop --calibration, not to pass the --threshold that is already there."""
    shard = tmp_path / "s.tar"
    make_shard(shard, photos[:1])
    args = ["score", str(shard), "-d", "nss", "-o", str(tmp_path / "s.csv"), "-q",
            "--calibration", str(default_calibration_path("cnn"))]
    res = CliRunner().invoke(main, [*args, "--threshold", "5"])
    assert res.exit_code == 1 and "drop --calibration" in res.output, res.output
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "or pass --threshold" in res.output, res.output
