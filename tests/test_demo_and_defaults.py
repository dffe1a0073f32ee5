"""The shipped pieces fit together: default calibrations match the shipped detectors, and the
demo runs end to end offline with the default detector."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from collapseguard.calibration.thresholds import (
    default_calibration,
    default_calibration_path,
    load_calibration,
)
from collapseguard.cli import main
from collapseguard.detectors import DEFAULT_DETECTOR, create


@pytest.mark.parametrize("name", [DEFAULT_DETECTOR, "nss"])
def test_shipped_calibration_matches_shipped_detector(name):
    det = create(name)
    cal = default_calibration(name, det.version)
    shipped = load_calibration(default_calibration_path(name))
    assert cal is not None, (f"calibration/defaults/{name}.json was made for "
                             f"{shipped.detector}@{shipped.detector_version}, but the shipped "
                             f"{name} is version {det.version}: rerun recipes/make_default_calibration.sh")
    assert np.isfinite(cal.threshold)


def test_demo_runs_offline_with_the_default_detector(tmp_path):
    res = CliRunner().invoke(main, ["demo", str(tmp_path), "--workers", "1", "--steps", "12"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"default calibration for {DEFAULT_DETECTOR}" in res.output
    summary = json.loads((tmp_path / "filtered/summary.json").read_text())
    shards = sorted(p.name for p in (tmp_path / "shards").glob("*.tar"))
    assert len(shards) == 3 and summary["shards"] == 3 and summary["shards_failed"] == []
    scores = pd.concat([pd.read_parquet(p) for p in (tmp_path / "filtered/scores").glob("*.parquet")])
    assert len(scores) == summary["samples"] == summary["kept"] + summary["rejected"]
    degraded = scores.key.str.endswith("_degraded")
    assert degraded.sum() == (~degraded).sum() > 0
    # the degraded copies score higher than the clean photos they came from, as a group
    assert scores[degraded].score.median() > scores[~degraded].score.median()
    assert "truth vs decision" in res.output


def test_demo_without_a_threshold_for_its_detector_fails_before_building(tmp_path):
    pytest.importorskip("pyiqa")
    res = CliRunner().invoke(main, ["demo", str(tmp_path / "d"), "-d", "pyiqa:entropy", "-w", "1"])
    assert res.exit_code == 1 and "pass --threshold T" in res.output and "--drop-fraction" not in res.output
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("args, code, says", [
    (["--threshold", "nan"], 2, "nan is not a finite number"),
    (["--threshold", "inf"], 2, "inf is not a finite number"),
    (["--steps", "0"], 2, "0 is not in the range x>=1"),
    (["--steps", "-1"], 2, "-1 is not in the range x>=1"),
])
def test_demo_refuses_what_it_cannot_honour_in_one_line_before_building(tmp_path, args, code, says):
    """A non-finite threshold was a traceback; zero or negative steps made 'degraded' copies that
    were never re-rendered, and the truth table called them degraded."""
    res = CliRunner().invoke(main, ["demo", str(tmp_path / "d"), *args, "-q"])
    assert res.exit_code == code and says in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "d").exists()
