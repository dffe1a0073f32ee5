"""A false-drop guarantee per clean kind (`calibrate --per-kind`, `bounds.per_kind_threshold`)."""

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from PIL import Image
from scipy import stats

from collapseguard.calibration.bounds import (
    NotEnoughCleanSamples,
    order_statistic_threshold,
    per_kind_threshold,
)
from collapseguard.calibration.thresholds import (
    Calibration,
    CalibrationError,
    load_calibration,
)
from collapseguard.cli import main


def test_each_kind_keeps_its_rate_where_a_pooled_threshold_does_not():
    """Two kinds of clean scores, the minority one shifted up (as grainy photos are for a noise
    detector). Over many draws the pooled threshold lets the minority kind's true false-drop rate
    pass alpha most of the time; the per-kind threshold keeps every kind's rate under alpha in at
    least ``confidence`` of the draws."""
    rng = np.random.default_rng(0)
    alpha, conf = 0.05, 0.9
    n_major, n_minor, shift = 400, 100, 1.5
    pooled_bad = per_kind_bad = 0
    draws = 300
    for _ in range(draws):
        major, minor = rng.normal(0, 1, n_major), rng.normal(shift, 1, n_minor)
        scores = np.concatenate([major, minor])
        kinds = ["photo"] * n_major + ["grainy"] * n_minor
        pooled = order_statistic_threshold(scores, alpha, conf).threshold
        joint, parts = per_kind_threshold(scores, kinds, alpha, conf)
        assert joint.threshold == max(p.bound.threshold for p in parts)
        assert {p.kind for p in parts} == {"photo", "grainy"}
        pooled_bad += stats.norm.sf(pooled, loc=shift) > alpha
        rates = (stats.norm.sf(joint.threshold), stats.norm.sf(joint.threshold, loc=shift))
        per_kind_bad += max(rates) > alpha
    assert pooled_bad / draws > 0.5
    assert per_kind_bad / draws <= 1 - conf


def test_each_kind_gets_the_bonferroni_confidence():
    rng = np.random.default_rng(1)
    scores = rng.normal(0, 1, 900)
    kinds = np.repeat(["a", "b", "c"], 300)
    joint, parts = per_kind_threshold(scores, kinds, 0.02, 0.9)
    for p in parts:
        own = order_statistic_threshold(scores[kinds == p.kind], 0.02, 1 - 0.1 / 3)
        assert p.bound.threshold == own.threshold and p.bound.k == own.k
    assert joint.confidence == 0.9 and joint.empirical_false_drop == np.mean(scores > joint.threshold)
    # the stated rate holds for every kind: the largest of the kinds' own bounds
    assert joint.guaranteed_false_drop == max(p.bound.guaranteed_false_drop for p in parts) <= 0.02


def test_a_kind_with_too_few_clean_scores_is_named():
    scores = np.r_[np.zeros(400), np.ones(30)]
    with pytest.raises(NotEnoughCleanSamples, match=r"'screens' has 30") as err:
        per_kind_threshold(scores, ["photo"] * 400 + ["screens"] * 30, 0.01, 0.95)
    assert err.value.needed == 368  # 1% at 95% for each of two kinds


@pytest.fixture(scope="module")
def two_kinds(tmp_path_factory, photos):
    """Real photo windows, and the same kind of windows with sensor-like grain (a clean kind a
    noise detector scores high)."""
    root = tmp_path_factory.mktemp("perkind")
    rng = np.random.default_rng(3)
    for kind, n, sigma in (("photos", 24, 0.0), ("grainy", 12, 14.0)):
        (root / kind).mkdir()
        for i in range(n):
            img = photos[i % 4]
            y, x = rng.integers(0, img.shape[0] - 64), rng.integers(0, img.shape[1] - 64)
            win = img[y:y + 64, x:x + 64].astype(np.float64) + rng.normal(0, sigma, (64, 64, 3))
            Image.fromarray(np.clip(win, 0, 255).astype(np.uint8)).save(root / kind / f"{kind}{i}.png")
    return root


def _calibrate(root, out, *extra):
    res = CliRunner().invoke(main, ["calibrate", "--detector", "nss", "--clean", f"photos={root / 'photos'}",
                                    "--clean", f"grainy={root / 'grainy'}", "--max-false-drop", "0.2",
                                    "--confidence", "0.8", "--holdout", "0", "--no-plot", "--out", str(out),
                                    "--scores-out", str(out.with_suffix(".csv")), *extra])
    assert res.exit_code == 0, res.output
    return load_calibration(out), pd.read_csv(out.with_suffix(".csv")), res.output


def test_calibrate_per_kind_on_real_images(two_kinds, tmp_path):
    pooled, scores, pooled_out = _calibrate(two_kinds, tmp_path / "pooled.json")
    cal, again, out = _calibrate(two_kinds, tmp_path / "kinds.json", "--per-kind")
    # the pooled run says which kind its guarantee does not cover, and what to do
    assert "note: clean kind grainy loses" in pooled_out and "--per-kind gives each kind its own" in pooled_out
    assert "note: clean kind photos" not in pooled_out and "note: clean kind" not in out
    assert set(scores["source_kind"]) == {"photos", "grainy"}
    assert again["score"].tolist() == scores["score"].tolist()
    grainy = scores.loc[scores["source_kind"] == "grainy", "score"].to_numpy()
    assert np.mean(grainy > pooled.threshold) > 0.2  # the pooled 20% is broken on the minority kind
    rows = {r["kind"]: r for r in cal.per_kind}
    assert set(rows) == {"photos", "grainy"}
    for kind, r in rows.items():  # each kind's threshold, recomputed from the scores table
        own = order_statistic_threshold(scores.loc[scores["source_kind"] == kind, "score"], 0.2, 0.9)
        assert r["threshold"] == pytest.approx(own.threshold, rel=0, abs=1e-12) and r["k"] == own.k
        assert r["dropped_at_threshold"] <= own.k - 1
    assert cal.threshold == max(r["threshold"] for r in rows.values()) >= pooled.threshold
    assert np.mean(grainy > cal.threshold) <= 0.2
    assert "each of 2 clean kinds" in cal.guarantee_text() and "kind grainy: threshold" in out
    kinds = {r["source_kind"]: r for r in cal.breakdown["source_kind"]["clean"]}
    assert kinds["grainy"]["n"] == 12 and kinds["photos"]["n"] == 24
    assert Calibration.from_json(cal.to_json()).per_kind == cal.per_kind


def test_per_kind_from_scores_needs_no_rescoring(two_kinds, tmp_path):
    cal, _, _ = _calibrate(two_kinds, tmp_path / "k.json", "--per-kind")
    res = CliRunner().invoke(main, ["calibrate", "--from-scores", str(tmp_path / "k.csv"), "--per-kind",
                                    "--max-false-drop", "0.2", "--confidence", "0.8", "--holdout", "0",
                                    "--no-plot", "--out", str(tmp_path / "again.json")])
    assert res.exit_code == 0, res.output
    again = load_calibration(tmp_path / "again.json")
    assert again.threshold == cal.threshold
    # the clean folders the table's images came from, not only the table's own name
    assert [s for s in again.clean_sources if s.startswith("clean images")] == [
        f"clean images {two_kinds / 'grainy'}, {two_kinds / 'photos'} (from the scores table)"]


def test_per_kind_refuses_a_kind_too_small_for_the_guarantee(two_kinds, tmp_path):
    res = CliRunner().invoke(main, ["calibrate", "--detector", "nss", "--clean", f"photos={two_kinds / 'photos'}",
                                    "--clean", f"grainy={two_kinds / 'grainy'}", "--per-kind", "--max-false-drop",
                                    "0.05", "--confidence", "0.8", "--holdout", "0", "--no-plot", "--out",
                                    str(tmp_path / "c.json")])
    assert res.exit_code != 0 and "'grainy' has 12" in res.output and "'photos' has 24" in res.output
    # it leads with the kind that falls short, not with a bare count the whole set seems to have
    assert "error: the clean kind 'grainy' has only 12 distinct clean pictures" in res.output
    assert not (tmp_path / "c.json").exists()


def test_clean_kind_syntax_and_paths_with_an_equals_sign(two_kinds, tmp_path):
    odd = tmp_path / "a=b"
    odd.mkdir()
    for p in sorted((two_kinds / "photos").iterdir())[:12]:
        (odd / p.name).write_bytes(p.read_bytes())
    res = CliRunner().invoke(main, ["calibrate", "--detector", "nss", "--clean", str(odd), "--clean",
                                    f"grainy={two_kinds / 'grainy'}", "--max-false-drop", "0.2", "--confidence",
                                    "0.8", "--holdout", "0", "--no-plot", "--out", str(tmp_path / "c.json"),
                                    "--scores-out", str(tmp_path / "c.csv")])
    assert res.exit_code == 0, res.output
    t = pd.read_csv(tmp_path / "c.csv", keep_default_na=False)
    assert sorted(set(t["source_kind"])) == ["", "grainy"]  # the existing folder "a=b" is a path
    res = CliRunner().invoke(main, ["calibrate", "--clean", f"screens={tmp_path / 'missing'}", "--out",
                                    str(tmp_path / "d.json")])
    assert res.exit_code != 0 and "missing: no such file or folder" in res.output


def test_a_file_whose_kind_threshold_is_above_its_threshold_is_refused(two_kinds, tmp_path):
    _calibrate(two_kinds, tmp_path / "k.json", "--per-kind")
    d = json.loads((tmp_path / "k.json").read_text())
    d["threshold"] = min(r["threshold"] for r in d["per_kind"]) - 1.0
    with pytest.raises(CalibrationError, match="guarantee would not hold"):
        Calibration.from_dict(d)
    ok = {"kind": "photos", "n": 24, "threshold": d["threshold"] + 1.0}
    d["threshold"] += 2.0
    for bad in ({"kind": 3}, {**ok, "n": 1e999}, {**ok, "n": float("nan")}, {**ok, "n": 2.5},
                {**ok, "threshold": 10 ** 400}, {**ok, "threshold": float("inf")}):
        d["per_kind"] = [bad]
        with pytest.raises(CalibrationError, match="per_kind"):
            Calibration.from_json(json.dumps(d).replace("Infinity", "1e999").replace("NaN", "1e999"))
    d["per_kind"] = [ok]
    assert Calibration.from_dict(d).per_kind == [ok]


def test_a_kind_whose_sources_all_went_to_the_holdout_is_not_left_uncovered():
    """With --holdout, a small kind can land wholly in the held-out part: the per-kind guarantee
    must then refuse, naming it, not silently cover the other kinds only."""
    from collapseguard.calibration.build import build_calibration
    from collapseguard.training_data_tools.manifest import split_by_source

    rng = np.random.default_rng(0)
    names = pd.DataFrame({"source_image": [f"s{i}" for i in range(200)]})
    held = split_by_source(names, {"threshold": 0.7, "holdout": 0.3}, salt="calibration")["holdout"]
    shots = held["source_image"].tolist()[:4]  # four screenshots whose sources are all held out
    rows = [{"source_image": name, "family": "clean-extra", "step": 0, "kind": "clean", "path": name,
             "score": rng.normal(), "chain_id": "", "storage": "png", "source_kind": k}
            for k, srcs in (("photos", [f"p{i}" for i in range(30)]), ("shots", shots)) for name in srcs]
    with pytest.raises(NotEnoughCleanSamples, match=r"'shots' has 0.*clean pictures of each kind named"):
        build_calibration(pd.DataFrame(rows), "nss", "v", alpha=0.3, confidence=0.7, per_kind=True)
    cal = build_calibration(pd.DataFrame(rows), "nss", "v", alpha=0.3, confidence=0.7, holdout=0.0)
    assert cal.per_kind == []  # pooled: no kinds required


def test_a_named_kind_without_a_scored_image_is_refused_not_left_out(two_kinds, tmp_path):
    """--per-kind promises a guarantee for each kind named: a kind whose images could not be
    scored, or a --clean location holding no image at all (a wrong folder, photos in a format not
    read), must be refused by name rather than dropped from the guarantee without a word."""
    (tmp_path / "screens").mkdir()
    (tmp_path / "screens/a.png").write_bytes(b"not a png")
    (tmp_path / "screens/b.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "psd").mkdir()
    (tmp_path / "psd/layers.PSD").write_bytes(b"8BPS")
    base = ["calibrate", "--detector", "nss", "--clean", f"photos={two_kinds / 'photos'}", "--per-kind",
            "--max-false-drop", "0.2", "--confidence", "0.8", "--holdout", "0", "--no-plot"]
    res = CliRunner().invoke(main, [*base, "--clean", f"screens={tmp_path / 'screens'}",
                                    "--out", str(tmp_path / "s.json")])
    assert res.exit_code == 1 and "'screens' has 0" in res.output, res.output
    assert not (tmp_path / "s.json").exists()
    for extra in ([f"layers={tmp_path / 'psd'}", "--per-kind"], [str(tmp_path / "psd")]):
        args = [a for a in base if a != "--per-kind"] + ["--clean", extra[0], *extra[1:]]
        res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "h.json")])
        assert res.exit_code == 1 and "holds no image file" in res.output and "psd" in res.output, res.output
        assert "Traceback" not in res.output and not (tmp_path / "h.json").exists()
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"key": ["a"], "jpg": [(two_kinds / "photos").glob("*").__next__().read_bytes()]}),
                   tmp_path / "clean.parquet")  # rows with images: said to be a Parquet file, not "no image"
    res = CliRunner().invoke(main, [*[a for a in base if a != "--per-kind"], "--clean", str(tmp_path / "clean.parquet"),
                                    "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 1 and "clean.parquet is a Parquet file" in res.output, res.output


def _chains_without_kinds(root, photos, n=6):
    """A chains manifest with no `kind` column: its step-0 originals are clean images of no kind."""
    from cg_testutil import degrade

    from collapseguard.training_data_tools.manifest import write_manifest

    rows = []
    for i in range(n):
        img = np.ascontiguousarray(photos[i % 4][64 * (i // 4):64 * (i // 4) + 64, :64])
        for step, pic in ((0, img), (5, degrade(img, rounds=5, seed=i))):
            p = root / "chains" / f"c{i}" / f"{step}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pic).save(p)
            rows.append({"chain_id": f"c{i}", "source_image": f"s{i}", "family": "noise", "task": "t",
                         "step": step, "path": str(p)})
    write_manifest(pd.DataFrame(rows), root / "chains" / "manifest.csv")
    return root / "chains"


def test_the_kind_none_in_a_per_kind_refusal_is_explained(two_kinds, photos, tmp_path):
    """Chains whose manifest names no kind beside --clean photos=...: the kind '(none)' that falls
    short is the chains' originals, and the refusal says so and how to fix it."""
    chains = _chains_without_kinds(tmp_path, photos)
    res = CliRunner().invoke(main, ["calibrate", "--detector", "nss", "--chains", str(chains), "--clean",
                                    f"photos={two_kinds / 'photos'}", "--per-kind", "--max-false-drop", "0.2",
                                    "--confidence", "0.8", "--holdout", "0", "--no-plot", "--out",
                                    str(tmp_path / "c.json")])
    assert res.exit_code == 1, res.output
    assert "the clean kind '(none)' has only 6" in res.output
    assert "kind '(none)' is the clean images without a kind: the clean steps of 6 chain source(s)" in res.output
    assert "add a `kind` column to the chains manifest, or leave --chains out" in res.output
    res = CliRunner().invoke(main, ["calibrate", "--detector", "nss", "--clean", f"photos={two_kinds / 'photos'}",
                                    "--clean", str(two_kinds / "grainy"), "--per-kind", "--max-false-drop",
                                    "0.15", "--confidence", "0.8", "--holdout", "0", "--no-plot", "--out",
                                    str(tmp_path / "d.json")])
    assert res.exit_code == 1, res.output
    assert "12 --clean image(s) given without KIND=" in res.output
    assert "name their kind with --clean KIND=LOCATION" in res.output


@pytest.mark.parametrize("clean, said", [("photos", "no clean kind is named"),
                                         ("photos=photos", "every clean image is of one kind (photos)")])
def test_per_kind_with_one_kind_says_the_guarantee_is_the_pooled_one(two_kinds, tmp_path, clean, said):
    """--per-kind and every clean image of one kind (none named, or one): the file is the pooled
    one, and the run says so rather than claiming "each of 1 clean kinds"."""
    loc = clean.replace("photos", str(two_kinds / "photos"), 1) if "=" not in clean else \
        f"photos={two_kinds / 'photos'}"
    args = ["--detector", "nss", "--max-false-drop", "0.2", "--confidence", "0.8", "--holdout", "0",
            "--no-plot"]
    res = CliRunner().invoke(main, ["calibrate", "--clean", loc, "--per-kind", *args, "--out",
                                    str(tmp_path / "k.json")])
    assert res.exit_code == 0, res.output
    assert f"note: --per-kind: {said}" in res.output and "the guarantee is the pooled one" in res.output
    assert "each of 1 clean kinds" not in res.output
    cal = load_calibration(tmp_path / "k.json")
    pooled = CliRunner().invoke(main, ["calibrate", "--clean", loc, *args, "--out", str(tmp_path / "p.json")])
    assert pooled.exit_code == 0 and "--per-kind:" not in pooled.output
    assert cal.per_kind == [] and cal.threshold == load_calibration(tmp_path / "p.json").threshold


def test_calibrations_does_not_put_one_kinds_count_beside_another_kinds_rate(two_kinds, tmp_path):
    """A --per-kind file's summary line: k and n are the kind that sets the threshold, the rate is
    the largest of the kinds' own bounds, possibly another kind's; each is named as such."""
    from collapseguard.calibration.show import show

    cal, _, out = _calibrate(two_kinds, tmp_path / "k.json", "--per-kind")
    binding = max(cal.per_kind, key=lambda r: r["threshold"])
    worst = max(cal.per_kind, key=lambda r: r["guaranteed_false_drop"])
    assert binding["n"] == cal.n_clean and binding["k"] == cal.k
    text = show(tmp_path / "k.json")
    line = next(x for x in text.splitlines() if x.startswith(f"k={cal.k} of n={cal.n_clean}"))
    assert f"of kind {binding['kind']}, which sets the threshold" in line
    assert (f"the largest of the kinds' own bounds: kind {worst['kind']}'s, k={worst['k']} of n={worst['n']}"
            in line)
    assert f"of kind {binding['kind']}, which sets the threshold" in out  # calibrate's bound line too
