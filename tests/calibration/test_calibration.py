"""Calibration: the finite-sample bound, isotonic maps, calibration files and threshold resolution.

Everything here runs on synthetic scores with numpy (no detector, no images).
"""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from collapseguard.calibration import bounds, thresholds
from collapseguard.calibration.bounds import (
    NotEnoughCleanSamples,
    min_clean_samples,
    order_statistic_threshold,
    thresholds_batch,
)
from collapseguard.calibration.build import (
    breakdown,
    build_calibration,
    drop_curve,
    first_steps,
    label_clean,
)
from collapseguard.calibration.scoring import CLEAN_FAMILY
from collapseguard.calibration.thresholds import (
    Calibration,
    CalibrationError,
    CalibrationMismatch,
    NoThresholdError,
    check_detector,
    default_calibration,
    load_calibration,
    resolve_threshold,
    save_calibration,
    threshold_for_drop_fraction,
)
from collapseguard.io import calibration_file
from collapseguard.training_data_tools.manifest import source_group, split_by_source

# ---------------------------------------------------------------------------------------------
# The bound
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dist,n,alpha,conf", [
    ("normal", 299, 0.01, 0.95),
    ("normal", 1000, 0.01, 0.95),
    ("exponential", 500, 0.05, 0.90),
    ("normal", 200, 0.05, 0.99),
])
def test_bound_holds_over_resamples(dist, n, alpha, conf):
    """Over many clean samples, the true false-drop rate of the threshold exceeds alpha in at most
    about delta of them, and matches the exact Binomial tail the bound is built on."""
    rng = np.random.default_rng(0)
    reps = 20000
    if dist == "normal":
        clean = rng.standard_normal((reps, n))
        sf = stats.norm.sf
    else:
        clean = rng.exponential(size=(reps, n))
        sf = stats.expon.sf
    t = thresholds_batch(clean, alpha, conf)
    true_rate = sf(t)  # P(clean score > t), exact for the known distribution
    exceed = float(np.mean(true_rate > alpha))
    delta = 1 - conf
    k = bounds.order_statistic_rank(n, alpha, conf)
    exact = stats.binom.cdf(k - 1, n, alpha)  # P(rate > alpha) for this k
    assert exact <= delta
    mc_err = 4 * np.sqrt(delta * (1 - delta) / reps)
    assert exceed <= delta + mc_err
    assert abs(exceed - exact) <= mc_err  # the bound is what it says, not vacuous
    # a fresh clean test set per resample: empirical false-drop rates behave accordingly
    fresh = (rng.standard_normal((2000, 400)) if dist == "normal" else rng.exponential(size=(2000, 400)))
    emp = np.mean(fresh > t[:2000, None], axis=1)
    assert np.mean(emp > alpha) < 0.5  # sanity: most resamples drop fewer than alpha of fresh clean


def show_main(argv: list[str]) -> int:
    """``collapseguard calibrations ARGV``: its output printed (for capsys), its exit status."""
    from click.testing import CliRunner

    from collapseguard.cli import main
    res = CliRunner().invoke(main, ["calibrations", *argv], catch_exceptions=False)  # a crash raises
    print(res.stdout, end="")
    return res.exit_code


def test_bound_with_ties_stays_conservative():
    rng = np.random.default_rng(1)
    reps, n, alpha, conf = 20000, 400, 0.02, 0.9
    clean = rng.integers(0, 30, size=(reps, n)).astype(float)  # heavy ties
    t = thresholds_batch(clean, alpha, conf)
    true_rate = np.array([np.mean(np.arange(30) > v) for v in range(30)])[t.astype(int)]
    assert np.mean(true_rate > alpha) <= (1 - conf) + 0.01


def test_single_threshold_matches_batch_and_reports_guarantee():
    rng = np.random.default_rng(2)
    s = rng.standard_normal(700)
    r = order_statistic_threshold(s, 0.01, 0.95)
    assert r.threshold == thresholds_batch(s[None], 0.01, 0.95)[0]
    assert r.k == bounds.order_statistic_rank(700, 0.01, 0.95) and r.k >= 1
    assert np.sum(s > r.threshold) == r.k - 1  # k-th largest, strict rule
    assert 0 < r.guaranteed_false_drop <= 0.01
    # Beta quantile and binomial tail agree: P(rate > guaranteed) == delta
    assert stats.binom.cdf(r.k - 1, 700, r.guaranteed_false_drop) == pytest.approx(0.05, abs=1e-6)
    assert "binomial order statistic" in r.method


def test_too_few_clean_samples_refused_with_number_needed():
    assert min_clean_samples(0.01, 0.95) == 299
    assert min_clean_samples(0.05, 0.95) == 59
    rng = np.random.default_rng(3)
    order_statistic_threshold(rng.standard_normal(299), 0.01, 0.95)  # just enough
    with pytest.raises(NotEnoughCleanSamples) as ei:
        order_statistic_threshold(rng.standard_normal(298), 0.01, 0.95)
    assert ei.value.needed == 299 and ei.value.n == 298
    assert "299" in str(ei.value) and "298" in str(ei.value)
    # NaN scores are not clean evidence
    s = np.concatenate([rng.standard_normal(250), np.full(60, np.nan)])
    with pytest.raises(NotEnoughCleanSamples, match="at least 299"):
        order_statistic_threshold(s, 0.01, 0.95)


def test_bad_rates_rejected():
    with pytest.raises(ValueError):
        order_statistic_threshold(np.zeros(1000), 0.0, 0.95)
    with pytest.raises(ValueError):
        order_statistic_threshold(np.zeros(1000), 0.01, 1.0)


def test_clopper_pearson_covers():
    lo, hi = bounds.clopper_pearson(0, 50)
    assert lo == 0 and 0 < hi < 0.1
    lo, hi = bounds.clopper_pearson(50, 50)
    assert hi == 1 and 0.9 < lo < 1
    lo, hi = bounds.clopper_pearson(30, 100)
    assert lo < 0.3 < hi


# ---------------------------------------------------------------------------------------------
# Isotonic maps
# ---------------------------------------------------------------------------------------------

def _synthetic_table(n_sources=300, families=("noise", "dots"), steps=(0, 1, 2, 3, 5, 10, 20), seed=0,
                     n_extra=0):
    rng = np.random.default_rng(seed)
    rows = []
    bases = rng.normal(size=n_sources)  # the step-0 score of a source is shared by its chains
    for fi, fam in enumerate(families):
        for s in range(n_sources):
            base = bases[s]
            for st in steps:
                score = base if st == 0 else base + (1.0 + 0.5 * fi) * np.sqrt(st) + 0.3 * rng.normal()
                path = f"src{s}/0.png" if st == 0 else f"{fam}/src{s}/{st}.png"
                rows.append({"source_image": f"src{s}", "family": fam, "step": st, "kind": "chain",
                                 "path": path, "score": score, "chain_id": f"{fam}-{s}"})
    for i in range(n_extra):
        rows.append({"source_image": f"extra{i}", "family": "clean-extra", "step": 0, "kind": "clean",
                         "path": f"extra/{i}.png", "score": rng.normal(), "chain_id": ""})
    return pd.DataFrame(rows)


def test_isotonic_maps_are_monotone():
    rng = np.random.default_rng(4)
    x = rng.normal(size=2000)
    y = (rng.random(2000) < 1 / (1 + np.exp(-3 * x))).astype(float)
    knots = bounds.isotonic_knots(x, y, y_min=0, y_max=1, max_knots=50)
    assert len(knots["x"]) <= 50
    assert np.all(np.diff(knots["x"]) >= 0) and np.all(np.diff(knots["y"]) >= 0)
    cal = Calibration("d", "v", 0.0, probability_map=knots,
                      step_map=bounds.isotonic_knots(x, np.round(5 * (x - x.min())) + rng.normal(size=2000)))
    grid = np.linspace(-6, 6, 2001)
    p = cal.probability(grid)
    assert np.all(np.diff(p) >= 0) and p.min() >= 0 and p.max() <= 1
    assert p[-1] > 0.9 and p[0] < 0.1
    assert np.all(np.diff(cal.equivalent_step(grid)) >= 0)
    assert np.isnan(cal.probability([np.nan])[0])
    assert np.all(np.isnan(Calibration("d", "v", 0.0).probability([0.0, 1.0])))


def test_build_calibration_maps_curve_and_split():
    table = _synthetic_table(n_extra=200)
    cal = build_calibration(table, "synthetic", "v1", alpha=0.01, confidence=0.95, holdout=0.3)
    # threshold from the threshold part's clean images; split disjoint by source
    parts = split_by_source(table[np.isfinite(table["score"])], {"threshold": 0.7, "holdout": 0.3},
                            salt="calibration")
    thr_src, hold_src = set(parts["threshold"]["source_image"]), set(parts["holdout"]["source_image"])
    assert thr_src.isdisjoint(hold_src)
    clean_thr = parts["threshold"]
    clean_thr = clean_thr[(clean_thr["step"] == 0)].drop_duplicates("source_image")
    assert cal.n_clean == len(clean_thr)
    assert cal.threshold == order_statistic_threshold(clean_thr["score"], 0.01, 0.95).threshold
    assert cal.split["threshold_sources"] + cal.split["holdout_sources"] == table["source_image"].nunique()
    # drop curve on holdout sources only, rising with step
    all_rows = sorted((r for r in cal.drop_curve if r["family"] == "all"), key=lambda r: r["step"])
    assert sum(r["n"] for r in all_rows if r["step"] == 0) == len(
        parts["holdout"][(parts["holdout"]["kind"] == "chain") & (parts["holdout"]["step"] == 0)]
        .drop_duplicates("source_image"))
    fr = [r["fraction"] for r in all_rows]
    assert fr[-1] > 0.9 > fr[0] and fr[0] < 0.05
    for r in cal.drop_curve:
        assert r["ci_low"] <= r["fraction"] <= r["ci_high"]
    # the harder-to-catch family needs at least as many steps
    fs = cal.first_step_dropped
    assert fs["dots"]["0.9"] is not None and fs["noise"]["0.9"] is not None
    assert fs["dots"]["0.9"] <= fs["noise"]["0.9"]
    # maps monotone
    assert np.all(np.diff(cal.probability_map["y"]) >= 0)
    assert np.all(np.diff(cal.step_map["y"]) >= 0)
    # equivalent step: a score typical of step k (its median over the chains) maps to k, so a
    # typical original reads as step 0 rather than as the average step of images that overlap it
    chain_rows = table[(table["kind"] == "chain") & np.isfinite(table["score"])]
    chain_rows = chain_rows.drop_duplicates("path")  # an original shared by several chains counts once
    med = chain_rows.groupby("step")["score"].median()
    np.testing.assert_allclose(cal.equivalent_step(med.to_numpy()), med.index.to_numpy(), atol=1e-9)
    assert cal.equivalent_step([med.iloc[0] - 100.0])[0] == 0.0
    # the clean images the threshold rests on: the highest clean scores of the threshold part
    top = clean_thr.sort_values("score", ascending=False)
    assert [r["score"] for r in cal.top_clean] == pytest.approx(top["score"].head(len(cal.top_clean)).tolist())
    assert len(cal.top_clean) >= max(5, cal.k + 3)
    assert cal.top_clean[0]["path"] == top["path"].iloc[0]
    # the threshold is the k-th highest clean score: k - 1 clean images lie above it
    assert cal.top_clean[cal.k - 1]["score"] == cal.threshold
    assert all(r["score"] > cal.threshold for r in cal.top_clean[:cal.k - 1])
    # round trip through JSON keeps everything
    again = Calibration.from_json(cal.to_json())
    assert again.threshold == cal.threshold and again.drop_curve == cal.drop_curve
    assert again.top_clean == cal.top_clean
    assert "binomial order statistic" in again.method and again.scope


def test_build_refuses_too_few_clean_with_number():
    table = _synthetic_table(n_sources=100)
    with pytest.raises(NotEnoughCleanSamples) as ei:
        build_calibration(table, "synthetic", "v1", alpha=0.01, confidence=0.95)
    assert ei.value.needed == 299
    # the message says the count is after the holdout, and how many to bring in all
    n_all = int(table[table["step"] == 0]["source_image"].nunique())
    assert f"of the {n_all} scored clean pictures" in str(ei.value) and "about 428 clean pictures" in str(ei.value)


def test_clean_steps_and_fr_target_labels():
    t = pd.DataFrame({"source_image": ["a"] * 4 + ["x"], "family": ["f"] * 4 + ["clean-extra"],
                          "step": [0, 1, 2, 5, 0], "kind": ["chain"] * 4 + ["clean"],
                          "path": list("abcde"), "score": [0.0] * 5,
                          "fr": [1.0, 0.95, 0.85, 0.5, np.nan]})
    assert label_clean(t, "step", [0]).tolist() == [True, False, False, False, True]
    assert label_clean(t, "step", [0, 1]).tolist() == [True, True, False, False, True]
    assert label_clean(t, "fr:ssim", [0]).tolist() == [True, True, False, False, True]
    assert label_clean(t, "fr:ssim<0.8", [0]).tolist() == [True, True, True, False, True]
    assert label_clean(t, "fr:ssim:0.8", [0]).tolist() == [True, True, True, False, True]
    with pytest.raises(ValueError):
        label_clean(t, "fr:lpips", [0])


def test_first_steps_none_when_never_reached():
    curve = [{"family": "f", "step": s, "n": 10, "dropped": d, "fraction": d / 10, "ci_low": 0, "ci_high": 1}
             for s, d in [(0, 0), (1, 5), (3, 9), (5, 9)]]
    assert first_steps(curve) == {"f": {"0.9": 3, "0.99": None}}
    rows = drop_curve(_synthetic_table(n_sources=20), threshold=1e9)
    assert all(r["dropped"] == 0 for r in rows)


# ---------------------------------------------------------------------------------------------
# Files, detector checks, resolution
# ---------------------------------------------------------------------------------------------

class _Det:
    def __init__(self, name, version):
        self.name, self.version = name, version


def _cal(**kw):
    base = {"detector": "cnn", "detector_version": "abc123", "threshold": 0.42, "alpha": 0.01, "confidence": 0.95,
                "n_clean": 400, "guaranteed_false_drop": 0.0098, "method": bounds.BOUND_NAME}
    base.update(kw)
    return Calibration(**base)


def test_save_load_round_trip(tmp_path):
    cal = _cal(probability_map={"x": [0, 1], "y": [0.1, 0.9]}, notes=["n"])
    p = save_calibration(cal, tmp_path / "c.json")
    assert load_calibration(p) == cal
    d = json.loads(p.read_text())
    d["future_field"] = {"a": 1}
    p.write_text(json.dumps(d))
    again = load_calibration(p)
    assert again.extra == {"future_field": {"a": 1}}
    assert json.loads(again.to_json())["future_field"] == {"a": 1}


@pytest.mark.parametrize("text,match", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"detector": "cnn", "threshold": 1}', "missing"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": "high"}', "threshold"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": NaN}', "finite"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "alpha": 3}', "alpha"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "probability_map": {"x": [0, 1], "y": [1, 0]}}',
     "monotone"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "format_version": 99}', "newer"),
])
def test_malformed_files_rejected(tmp_path, text, match):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(CalibrationError, match=match):
        load_calibration(p)


def test_missing_file_clear_error(tmp_path):
    with pytest.raises(CalibrationError, match="cannot read"):
        load_calibration(tmp_path / "nope.json")


def test_mismatched_detector_or_version_refused(tmp_path):
    cal = _cal()
    check_detector(cal, _Det("cnn", "abc123"))
    for det in (_Det("nss", "abc123"), _Det("cnn", "other")):
        with pytest.raises(CalibrationMismatch) as ei:
            check_detector(cal, det)
        assert "cnn@abc123" in str(ei.value) and f"{det.name}@{det.version}" in str(ei.value)
    p = save_calibration(cal, tmp_path / "c.json")
    with pytest.raises(CalibrationMismatch):
        resolve_threshold(_Det("cnn", "other"), calibration=p)
    with pytest.raises(CalibrationMismatch):  # even beside an explicit threshold
        resolve_threshold(_Det("cnn", "other"), threshold=0.3, calibration=p)


def test_cnn_weights_path_spelling_does_not_matter_but_the_weights_do(tmp_path, monkeypatch):
    """cnn's version hashes its weights, so cnn, cnn:w.safetensors and cnn:../w.safetensors with
    one version are one detector; other families still match by their full name."""
    cal = _cal()  # made for cnn@abc123
    for name in ("cnn:w.safetensors", "cnn:../x/w.safetensors"):
        check_detector(cal, _Det(name, "abc123"))
    with pytest.raises(CalibrationMismatch):
        check_detector(cal, _Det("cnn:w.safetensors", "other"))
    pyiqa = _cal(detector="pyiqa:piqe")
    with pytest.raises(CalibrationMismatch):
        check_detector(pyiqa, _Det("pyiqa:niqe", "abc123"))
    monkeypatch.setattr(calibration_file, "DEFAULTS_DIR", tmp_path / "defaults")
    save_calibration(_cal(threshold=0.5), tmp_path / "defaults" / "cnn.json")
    assert resolve_threshold(_Det("cnn:/weights/cnn.safetensors", "abc123"))[0] == 0.5
    with pytest.raises(NoThresholdError, match="packaged default calibration is for cnn@abc123"):
        resolve_threshold(_Det("cnn:/weights/other.safetensors", "newer"))


def test_resolve_threshold_order(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration_file, "DEFAULTS_DIR", tmp_path / "defaults")
    det = _Det("cnn", "abc123")
    with pytest.raises(NoThresholdError, match="--threshold.*--calibration.*--drop-fraction"):
        resolve_threshold(det)
    save_calibration(_cal(threshold=0.5), tmp_path / "defaults" / "cnn.json")
    t, msg, cal = resolve_threshold(det)
    assert t == 0.5 and cal is not None
    assert msg.startswith("default calibration for cnn@abc123") and "1% false drops with 95% confidence" in msg
    assert default_calibration("cnn", "abc123").threshold == 0.5
    assert default_calibration("cnn", "newer") is None
    with pytest.raises(NoThresholdError, match="packaged default calibration is for cnn@abc123"):
        resolve_threshold(_Det("cnn", "newer"))
    p = save_calibration(_cal(threshold=0.7), tmp_path / "mine.json")
    t, msg, cal = resolve_threshold(det, calibration=p)
    assert t == 0.7 and str(p) in msg
    t, msg, cal = resolve_threshold(det, threshold=0.1, calibration=None)
    assert t == 0.1 and cal is None and "explicit" in msg and "not used" not in msg
    t, msg, cal = resolve_threshold(det, threshold=0.1, calibration=p)  # both: the user is told
    assert t == 0.1 and cal.threshold == 0.7 and "threshold 0.7 is not used" in msg
    with pytest.raises(ValueError):
        resolve_threshold(det, threshold=float("nan"))


def test_drop_fraction_threshold():
    rng = np.random.default_rng(5)
    s = rng.normal(size=1000)
    t = threshold_for_drop_fraction(s, 0.05)
    assert np.sum(s > t) == 50
    assert np.sum(np.concatenate([s, [np.nan] * 10]) > threshold_for_drop_fraction(
        np.concatenate([s, [np.nan] * 10]), 0.05)) == 50
    assert np.sum(s > threshold_for_drop_fraction(s, 0.0)) == 0
    with pytest.raises(ValueError):
        threshold_for_drop_fraction(s, 1.0)
    with pytest.raises(ValueError):
        threshold_for_drop_fraction([np.nan], 0.1)
    cal = thresholds.drop_fraction_calibration(_Det("nss", "v"), s, 0.05)
    assert cal.label.startswith("uncalibrated: drop-fraction") and not cal.is_calibrated
    assert "uncalibrated" in cal.guarantee_text()


# ---------------------------------------------------------------------------------------------
# The calibrations shipped in the package
# ---------------------------------------------------------------------------------------------

SHIPPED = sorted(thresholds.DEFAULTS_DIR.glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_default_is_valid_and_current(path):
    """A shipped default loads, states its guarantee, and matches the detector as it is now
    (otherwise `filter` without --threshold would silently have no default):
    rerun recipes/make_default_calibration.sh after changing a detector."""
    from collapseguard.detectors import create

    cal = load_calibration(path)
    assert thresholds.default_calibration_path(cal.detector) == path
    assert cal.is_calibrated  # (the file format checks the guarantee of calibrated files only)
    assert cal.scope and cal.clean_sources and "binomial order statistic" in cal.method
    assert np.all(np.diff(cal.probability_map["y"]) >= 0) and np.all(np.diff(cal.step_map["y"]) >= 0)
    det = create(cal.detector)  # every shipped default's detector ships with the package
    assert det.version == cal.detector_version, (
        f"{path.name} was made for {cal.detector}@{cal.detector_version} but the detector is now "
        f"@{det.version}: rerun recipes/make_default_calibration.sh {cal.detector}")
    t, msg, _ = resolve_threshold(det)
    assert t == cal.threshold and msg.startswith(f"default calibration for {cal.detector}@")


def test_show_prints_guarantee_and_curve(tmp_path, capsys):

    cal = build_calibration(_synthetic_table(n_extra=200), "synthetic", "v1")
    p = save_calibration(cal, tmp_path / "c.json")
    assert show_main([str(p)]) == 0
    out = capsys.readouterr().out
    assert "synthetic@v1" in out and f"k={cal.k} of n={cal.n_clean}" in out
    assert "step 20" in out and "dots: first step >=90% dropped:" in out
    assert "highest clean scores" in out and cal.top_clean[0]["path"] in out
    # a file name with a terminal control sequence is printed escaped, never raw
    table = _synthetic_table(n_extra=200)
    table.loc[table["kind"] == "clean", "source_image"] = "extra-x"  # keep it on one side of the split
    evil = table.index[table["kind"] == "clean"][0]
    table.loc[evil, ["path", "score"]] = ["evil\x1b[2J.png", 99.0]
    cal = build_calibration(table, "synthetic", "v1", holdout=0.0)
    assert cal.top_clean[0]["path"] == "evil\x1b[2J.png"
    assert show_main([str(save_calibration(cal, tmp_path / "e.json"))]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "'evil\\x1b[2J.png'" in out
    (tmp_path / "bad.json").write_text("{}")
    assert show_main([str(tmp_path / "bad.json")]) == 1


def test_family_and_detector_names_are_printed_escaped(tmp_path, capsys):
    """A chains manifest and a calibration file are data from elsewhere: a family or detector name
    holding terminal control codes (set the window title, clear the screen) is printed escaped by
    `calibrate` and by `collapseguard calibrations`, never raw."""
    from click.testing import CliRunner

    from collapseguard.calibration.scoring import save_scores
    from collapseguard.cli import main

    evil = "dots\x1b]0;owned\x07\x1b[2J"
    save_scores(_synthetic_table(n_sources=60, families=("noise", evil)), tmp_path / "s.csv",
                "synthetic", "v1")
    res = CliRunner().invoke(main, ["calibrate", "--from-scores", str(tmp_path / "s.csv"), "--no-plot",
                                    "--max-false-drop", "0.2", "--confidence", "0.8",
                                    "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert "dots\\x1b]0;owned\\x07\\x1b[2J: first step" in res.output
    cal = load_calibration(tmp_path / "c.json")
    cal.detector = "synthetic\x1b[2J"
    assert show_main([str(save_calibration(cal, tmp_path / "e.json"))]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "synthetic\\x1b[2J@v1" in out and "dots\\x1b]0;owned" in out


@pytest.mark.parametrize("text,match", [
    ("[" * 100000 + "]" * 100000, "not valid JSON"),  # nesting too deep for the parser
    ('{"detector": "cnn", "detector_version": "v", "threshold": ' + "9" * 5000 + "}", "not valid JSON"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": ' + "9" * 400 + "}", "finite"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": "4.2"}', "threshold must be a number"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "format_version": true}', "format_version"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "k": "two"}', "k must be"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "top_clean": [1]}', "top_clean"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "top_clean": [{"path": "x"}]}', "top_clean"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "drop_curve": [{"family": "a"}]}', "drop_curve"),
    ('{"detector": "cnn", "detector_version": "v", "threshold": 1, "first_step_dropped": {"a": 3}}',
     "first_step_dropped"),
])
def test_hostile_calibration_files_are_calibration_errors(tmp_path, text, match):
    """Whatever a file holds, loading it fails with CalibrationError (one line in filter/audit), not
    a RecursionError traceback, and `collapseguard calibrations` says error, not crash."""

    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(CalibrationError, match=match):
        load_calibration(p)
    assert show_main([str(p)]) == 1


def test_file_stating_a_guarantee_the_bound_cannot_give_is_refused(tmp_path):
    """A calibrated file must not make filter/audit print "at most 1% false drops with 95%
    confidence" from 10 clean scores, or from a k the order-statistic bound does not allow."""
    base = {"detector": "cnn", "detector_version": "v", "threshold": 1.0, "alpha": 0.01, "confidence": 0.95}
    p = tmp_path / "c.json"
    for bad, match in (({"n_clean": 10}, "at least 299"),
                       ({"n_clean": 501, "k": 5}, "k=5"),
                       ({"n_clean": 501, "k": 0}, "k=0"),
                       ({"alpha": 0.0, "confidence": 1.0, "n_clean": 501}, r"in \(0, 1\)"),
                       ({"n_clean": 501, "k": 2, "guaranteed_false_drop": 0.05}, "above alpha")):
        p.write_text(json.dumps({**base, **bad}))
        with pytest.raises(CalibrationError, match=match):
            load_calibration(p)
    p.write_text(json.dumps({**base, "n_clean": 501, "k": 2, "guaranteed_false_drop": 0.0094}))
    assert "at most 1% false drops" in load_calibration(p).guarantee_text()
    # an uncalibrated record states no guarantee and is not held to one
    p.write_text(json.dumps({**base, "n_clean": 0, "label": "uncalibrated: drop-fraction 0.05"}))
    assert load_calibration(p).guarantee_text().startswith("uncalibrated")
    # every calibration build_calibration writes passes the check
    cal = build_calibration(_synthetic_table(n_extra=200), "synthetic", "v1")
    assert Calibration.from_json(cal.to_json()).k == cal.k


@pytest.mark.parametrize("n", [299, 501, 1339, 20_000, 250_000])
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_the_guarantee_check_allows_exactly_the_ks_the_bound_allows(tmp_path, n, alpha):
    """Loading a file checks its k with a binomial CDF of its own (no scipy.stats import at every
    filter start): the largest k scipy's CDF allows loads, the next is refused, and the CDF
    matches scipy's."""
    from collapseguard.io.calibration_file import binomial_cdf

    j = int(stats.binom.ppf(0.05, n, alpha))  # the smallest j with cdf(j) >= 0.05
    best = j + 1 - int(stats.binom.cdf(j, n, alpha) > 0.05)  # the largest k with cdf(k - 1) <= 0.05
    ks = np.arange(max(1, best - 30), best + 30)
    ours = np.array([binomial_cdf(int(k) - 1, n, alpha) for k in ks])
    np.testing.assert_allclose(ours, stats.binom.cdf(ks - 1, n, alpha), rtol=1e-7, atol=1e-300)
    assert stats.binom.cdf(best - 1, n, alpha) <= 0.05 < stats.binom.cdf(best, n, alpha)
    base = {"detector": "cnn", "detector_version": "v", "threshold": 1.0, "alpha": alpha,
            "confidence": 0.95, "n_clean": n}
    p = tmp_path / "c.json"
    p.write_text(json.dumps({**base, "k": best}))
    assert load_calibration(p).k == best
    p.write_text(json.dumps({**base, "k": best + 1}))
    with pytest.raises(CalibrationError, match=f"k={best + 1}"):
        load_calibration(p)


def test_a_file_claiming_a_huge_clean_set_is_checked_quickly_and_exactly(tmp_path):
    """A hostile file cannot stall loading: a k of billions is checked in one call of the
    incomplete beta function (at the bound: the largest k scipy allows loads, the next is
    refused), and an alpha so small that no count of clean samples can support it is refused."""
    import time

    from collapseguard.io.calibration_file import SUMMED_TERMS, binomial_cdf

    n = 10**12
    j = int(stats.binom.ppf(0.05, n, 0.01))
    best = j + 1 - int(stats.binom.cdf(j, n, 0.01) > 0.05)  # the largest k with cdf(k - 1) <= 0.05
    assert best > SUMMED_TERMS
    for k in (best - 1000, best, best + 1):
        assert binomial_cdf(k - 1, n, 0.01) == pytest.approx(stats.binom.cdf(k - 1, n, 0.01), rel=1e-7)
    base = {"detector": "cnn", "detector_version": "v", "threshold": 1.0, "alpha": 0.01,
            "confidence": 0.95, "n_clean": n}
    p = tmp_path / "c.json"
    t = time.perf_counter()
    p.write_text(json.dumps({**base, "k": best}))
    assert load_calibration(p).k == best
    p.write_text(json.dumps({**base, "k": best + 1}))
    with pytest.raises(CalibrationError, match="does not support"):
        load_calibration(p)
    for alpha in (1e-17, 1e-300):
        p.write_text(json.dumps({**base, "alpha": alpha, "k": 1}))
        with pytest.raises(CalibrationError, match="needs more than"):
            load_calibration(p)
    assert time.perf_counter() - t < 5


def test_views_of_one_picture_count_as_one_source():
    """Two views ``p@a``/``p@b`` of one photo stay on one side of the split (source_group) and are
    one clean picture for the bound: n_clean counts pictures, the images are counted beside it."""
    table = _synthetic_table(n_sources=500, families=("noise",))
    views = table.copy()
    views["source_image"] = views["source_image"] + "@b"
    views["path"] = "b/" + views["path"]
    views["chain_id"] = views["chain_id"] + "b"
    table["source_image"] = table["source_image"] + "@a"
    cal = build_calibration(pd.concat([table, views], ignore_index=True), "synthetic", "v1")
    assert cal.n_clean == cal.split["n_clean_threshold_sources"] == cal.split["threshold_sources"] // 2
    assert cal.split["n_clean_threshold_images"] == 2 * cal.n_clean
    assert cal.split["n_clean_holdout"] == 2 * cal.split["n_clean_holdout_pictures"] > 0
    assert cal.split["bound_unit"] == "pictures" and "pictures" in cal.guarantee_text()
    assert cal.threshold == max(r["score"] for r in cal.top_clean[cal.k - 1:cal.k])
    assert len({source_group(r["source_image"]) for r in cal.top_clean}) == len(cal.top_clean)


def test_the_guarantee_holds_for_pictures_with_several_images():
    """Three stored copies of each of 400 pictures score almost alike. Counted as 1,200 independent
    scores, the bound's threshold would break its 1% / 95% promise in about one draw in six; counted
    as 400 pictures, it keeps it. The true false-drop rate of a N(0, 1) clean score is known."""
    rng = np.random.default_rng(0)
    broken = 0
    draws = 60
    for _ in range(draws):
        shared = rng.normal(size=400)
        score = 0.995 * np.repeat(shared, 3) + np.sqrt(1 - 0.995 ** 2) * rng.normal(size=1200)
        table = pd.DataFrame({"source_image": np.repeat([f"pic{i}" for i in range(400)], 3),
                              "family": "clean-extra", "step": 0, "kind": "clean",
                              "path": [f"clean/pic{i // 3}__{i % 3}.png" for i in range(1200)],
                              "score": score, "chain_id": ""})
        cal = build_calibration(table, "synthetic", "v1", alpha=0.01, confidence=0.95, holdout=0)
        assert cal.n_clean == 400 and cal.split["n_clean_threshold_images"] == 1200
        broken += stats.norm.sf(cal.threshold) > 0.01
    assert broken <= 0.05 * draws, broken


def test_the_drop_curve_title_says_in_sample_when_nothing_was_held_out():
    from collapseguard.calibration.plot import curve_title

    table = _synthetic_table(n_extra=200)
    assert curve_title(build_calibration(table, "synthetic", "v1", holdout=0.3)).endswith("(holdout sources)")
    assert curve_title(build_calibration(table, "synthetic", "v1", holdout=0.0)).endswith(
        "(in-sample: --holdout 0)")


def test_show_says_in_sample_when_nothing_was_held_out(tmp_path, capsys):

    table = _synthetic_table(n_extra=200)
    for holdout, said, unsaid in ((0.3, "held-out clean false drops", "in-sample"),
                                  (0.0, "in-sample (--holdout 0) clean false drops", "held-out")):
        p = save_calibration(build_calibration(table, "synthetic", "v1", holdout=holdout),
                             tmp_path / f"h{holdout}.json")
        assert show_main([str(p)]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("k="))
        assert said in line and unsaid not in line, line


def test_show_prints_rates_as_percentages_and_a_bare_threshold_as_uncalibrated(tmp_path, capsys):
    """Intervals read as percentages with a decimal (one drop in 1,120 was shown "0.1% [0%,0%]",
    an interval below its own estimate; held-out CIs were raw floats), and a file that states no
    bound (a run's summary.json) says so instead of printing None fields and an empty table."""
    from collapseguard.calibration.build import breakdown_text, curve_table
    from collapseguard.io.calibration_file import NO_BOUND_LABEL

    table = _synthetic_table(n_extra=200)
    p = save_calibration(build_calibration(table, "synthetic", "v1", holdout=0.3), tmp_path / "c.json")
    assert show_main([str(p)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("k="))
    assert "e-0" not in line and "CI [" in line and "%, " in line, line
    cal = Calibration(detector="d", detector_version="v", threshold=1.0,
                      drop_curve=[{"family": "f", "step": 5, "fraction": 1 / 1120, "ci_low": 2.3e-5,
                                   "ci_high": 0.00496, "n": 1120}])
    assert "0.1% [0.0%,0.5%]" in curve_table(cal, steps=(5,))
    cal.breakdown = {"measured_on": "held-out", "source_kind": {
        "clean": [{"source_kind": "photo", "fraction": 1 / 1120, "ci_low": 2.3e-5, "ci_high": 0.00496, "n": 1120}],
        "steps": []}}
    assert "0.1% of 1120 [0.0%,0.5%]" in breakdown_text(cal, steps=(5,))  # calibrate's per-kind table
    bare = save_calibration(Calibration(detector="d", detector_version="v", threshold=1.0), tmp_path / "b.json")
    assert show_main([str(bare)]) == 0
    out = capsys.readouterr().out
    assert NO_BOUND_LABEL in out and "None" not in out and "family" not in out, out


def test_per_kind_counts_the_sources_of_the_kind_that_sets_the_threshold():
    """With ``per_kind``, n_clean is the binding kind's, counted in pictures: a kind made of four
    crops per picture has a quarter as many clean scores as images."""
    rng = np.random.default_rng(2)
    rows = [{"source_image": f"crop{i // 4}", "family": "clean-extra", "step": 0, "kind": "clean",
             "path": f"crops/{i}.png", "score": rng.normal(2.0), "chain_id": "", "source_kind": "crops"}
            for i in range(480)]  # 4 crops per picture, scoring higher: it sets the threshold
    rows += [{"source_image": f"photo{i}", "family": "clean-extra", "step": 0, "kind": "clean",
              "path": f"photos/{i}.png", "score": rng.normal(), "chain_id": "", "source_kind": "photos"}
             for i in range(480)]
    cal = build_calibration(pd.DataFrame(rows), "synthetic", "v1", alpha=0.05, confidence=0.9, holdout=0,
                            per_kind=True)
    binding = max(cal.per_kind, key=lambda r: r["threshold"])
    assert binding["kind"] == "crops" and cal.n_clean == binding["n"] == 120  # the crops' pictures
    assert cal.split["n_clean_threshold_images"] == 480  # the crops' images, not both kinds' 960
    assert {r["kind"]: r["n"] for r in cal.per_kind} == {"crops": 120, "photos": 480}


def test_drop_curve_counts_a_shared_original_once_per_family_and_infinite_scores_as_drops():
    """Three chains of one family from each original: the family's step-0 row counts each original
    once, as the "all" row does; a +inf clean score is a drop in the curve and the breakdown, as in
    the held-out rate (only NaN means not scored)."""
    rows = []
    for s in range(10):
        for c in range(3):
            rows.append({"source_image": f"src{s}", "family": "f", "step": 0, "kind": "chain",
                         "path": f"src{s}.png", "score": float(s), "chain_id": f"c{s}-{c}", "storage": "png"})
            rows.append({"source_image": f"src{s}", "family": "f", "step": 5, "kind": "chain",
                         "path": f"c{s}-{c}/5.png", "score": 20.0 + s, "chain_id": f"c{s}-{c}", "storage": "png"})
    rows += [{"source_image": f"x{i}", "family": CLEAN_FAMILY, "step": 0, "kind": "clean", "path": f"x{i}.png",
              "score": np.inf if i < 2 else -1.0, "chain_id": "", "storage": "png"} for i in range(10)]
    table = pd.DataFrame(rows)
    curve = drop_curve(table, threshold=7.5)
    f0 = next(r for r in curve if r["family"] == "f" and r["step"] == 0)
    assert (f0["n"], f0["dropped"]) == (10, 2)
    extra = next(r for r in curve if r["family"] == CLEAN_FAMILY)
    assert (extra["n"], extra["dropped"]) == (10, 2)
    table["clean"] = table["step"] == 0
    clean_row = breakdown(table, threshold=7.5)["storage"]["clean"][0]
    assert (clean_row["n"], clean_row["dropped"]) == (20, 4)


def test_drop_fraction_counts_infinite_scores():
    """``score > threshold`` drops at most round(fraction * n) scores, +-inf counted and ranked."""
    s = np.concatenate([np.arange(90.0), [np.inf] * 10])
    t = threshold_for_drop_fraction(s, 0.05)
    assert np.sum(s > t) <= 5
    s = np.concatenate([np.arange(50.0), [-np.inf] * 50])
    t = threshold_for_drop_fraction(s, 0.1)
    assert np.sum(s > t) == 10


def test_ssim_target_of_an_image_too_small_for_a_window_is_nan_not_a_crash():
    from collapseguard.calibration.scoring import full_reference

    tiny = np.full((2, 2, 3), 128, np.uint8)
    assert np.isnan(full_reference(tiny, tiny, "ssim"))
    assert full_reference(np.full((3, 3, 3), 9, np.uint8), np.full((3, 3, 3), 9, np.uint8), "ssim") == 1.0


def test_show_prints_the_notes_and_where_curve_intervals_pool_pictures(tmp_path):
    """Every family's chains come from the same sources, so the "all" row's images are several
    per picture: its row records the pictures, and the printed table says the interval is
    narrower than the evidence. The file's notes (the picture count among them) are printed."""
    from collapseguard.calibration.show import show

    cal = build_calibration(_synthetic_table(n_extra=200), "synthetic", "v1", holdout=0.3)
    rows = {(r["family"], r["step"]): r for r in cal.drop_curve}
    assert rows[("all", 5)]["n"] == 2 * rows[("all", 5)]["pictures"]  # two families per source
    assert rows[("noise", 5)]["n"] == rows[("noise", 5)]["pictures"]
    text = show(save_calibration(cal, tmp_path / "c.json"))
    assert "intervals treat images as independent" in text and "(e.g. all step 1: 174 images of 87 pictures)" in text
    assert "note: n_clean counts distinct clean pictures" in text and "; by picture 0 of " in text


def test_a_picture_under_two_kinds_counts_once_in_a_pooled_bound():
    """The same 400 pictures named as two kinds (``--clean photos=a --clean jpegs=b``): the pooled
    bound counts 400 pictures, the per-kind one each kind's 400."""
    rng = np.random.default_rng(5)
    score = rng.normal(size=400)
    rows = [{"source_image": f"imgs/p{i}", "family": "clean-extra", "step": 0, "kind": "clean",
             "path": f"{kind}/p{i}.png", "score": score[i] + 0.01 * j, "chain_id": "", "source_kind": kind}
            for j, kind in enumerate(("photos", "jpegs")) for i in range(400)]
    pooled = build_calibration(pd.DataFrame(rows), "synthetic", "v1", holdout=0)
    assert pooled.n_clean == 400 and len({r["source_image"] for r in pooled.top_clean}) == len(pooled.top_clean)
    per_kind = build_calibration(pd.DataFrame(rows), "synthetic", "v1", holdout=0, alpha=0.05, confidence=0.9,
                                 per_kind=True)
    assert {r["kind"]: r["n"] for r in per_kind.per_kind} == {"photos": 400, "jpegs": 400}


def test_a_threshold_beside_a_calibration_without_score_maps_says_it_adds_nothing():
    """--threshold beside a calibration made without chains (no step or probability map): the
    threshold source and the audit report say the file adds nothing, not that its maps are used."""
    from collapseguard.audit.report_html import _headline
    from collapseguard.io.calibration_file import Calibration

    det = _Det("cnn", "v1")
    bare = Calibration("cnn", "v1", 2.0, label="calibrated")
    _, source, _ = resolve_threshold(det, threshold=0.5, calibration=bare)
    assert "holds no score maps: it adds nothing here" in source and "only its score maps" not in source
    mapped = Calibration("cnn", "v1", 2.0, label="calibrated", step_map={"x": [0.0, 1.0], "y": [0.0, 5.0]})
    assert "only its score maps" in resolve_threshold(det, threshold=0.5, calibration=mapped)[1]
    cal = {"guarantee": "at most 1%", "threshold": 2.0, "calibrated": True, "guarantee_applies": False,
           "has_step_map": False, "has_probability_map": False}
    summary = {"flagged_fraction": 0.1, "flagged": 1, "scored": 10, "confidence": 0.95, "ci_low": 0.0,
               "ci_high": 0.4, "detector": "cnn", "detector_version": "v1", "threshold_source": source,
               "decision_rule": "score > threshold", "errors": 0, "sample": {"sampled": False},
               "failures": [], "calibration": cal}
    assert "adds nothing at the threshold used here" in _headline(summary)
    cal["has_step_map"] = True
    assert "Calibration used for its score maps only" in _headline(summary)


def test_the_drop_curve_table_shows_the_steps_the_chains_hold():
    """Chains kept at steps 0, 2 and 30 show those columns, not fixed steps of dashes beside a
    summary line naming steps 2 and 30; many steps show the usual ones first, seven columns at
    most."""
    from collapseguard.calibration.build import curve_table, table_steps

    cal = Calibration(detector="d", detector_version="v", threshold=1.0, drop_curve=[
        {"family": "codec", "step": s, "fraction": f, "ci_low": 0.0, "ci_high": 1.0, "n": 8}
        for s, f in ((0, 0.0), (2, 0.5), (30, 1.0))])
    head, row = curve_table(cal).splitlines()[:2]
    assert head.split()[1:] == ["step", "0", "step", "2", "step", "30"]
    assert "50.0%" in row and "100.0%" in row and " - " not in row + " "
    assert table_steps([0, 1, 2, 3, 5, 10, 20, 30, 50, 100]) == (0, 1, 2, 3, 5, 10, 20)
    assert table_steps([0, 2, 4, 6, 8, 12, 14, 16]) == (0, 2, 4, 6, 8, 12, 14)
    # the per-storage and per-kind tables too: the steps after 0 they hold, none without chains
    from collapseguard.calibration.build import breakdown_text
    cal.breakdown = {"measured_on": "held-out", "storage": {
        "clean": [{"storage": "png", "fraction": 0.0, "ci_low": 0.0, "ci_high": 0.1, "n": 30}],
        "steps": [{"storage": "png", "step": s, "fraction": f, "n": 30} for s, f in ((2, 0.5), (10, 0.9))]}}
    head = breakdown_text(cal).splitlines()[1]
    assert head.split()[-4:] == ["step", "2", "step", "10"] and "20" not in head
    cal.breakdown["storage"]["steps"] = []
    assert "step" not in breakdown_text(cal).splitlines()[1]
