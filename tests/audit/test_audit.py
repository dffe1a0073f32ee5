"""``collapseguard audit`` on real tiny shards: outputs agree with independent scoring, sampling
decodes only the sample, detector comparison, native crops, and the report in a real headless
browser (no console errors, images decode, a hostile key stays text)."""

from __future__ import annotations

import json
import math
import tarfile
from html import escape as html_escape
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cg_browser import find_chromium, inspect_report
from cg_testutil import add_member, degrade
from click.testing import CliRunner
from scipy import ndimage
from scipy import stats as sps

from collapseguard.audit import stats
from collapseguard.audit.run import AuditError, AuditOptions, align_scores, run_audit
from collapseguard.audit.sampling import choose_sample, list_samples
from collapseguard.calibration.thresholds import Calibration, save_calibration
from collapseguard.cli import main
from collapseguard.detectors import create
from collapseguard.detectors.base import Detector, register
from collapseguard.detectors.nss import NSSDetector
from collapseguard.images import decode_image, encode_jpeg, encode_png
from collapseguard.scoring import readback

HOSTILE_KEY = ('<img src=x onerror="document.body.dataset.pwned=1">'
               '<script>document.title="PWNED";document.body.dataset.ran=1</script>')
FORMULA_KEY = '=1+cmd|" /C calc"!A0'
HOSTILE_CAPTION = '<script>document.title="CAPTION RAN"</script>&amp; <b>bold?</b>'


class LaplaceEnergy(Detector):
    """Mean absolute Laplacian of luminance: a crude sharpness/noise metric (higher = rougher)."""

    name = "test-laplace"
    version = "1"

    def score(self, images):
        return np.array([np.abs(ndimage.laplace(im.astype(np.float32).mean(2))).mean()
                         for im in images], dtype=np.float32)


class CountingDetector(Detector):
    """Mean brightness, counting every image it is given (to see what was decoded)."""

    name = "test-count"
    version = "1"
    seen = 0

    def score(self, images):
        CountingDetector.seen += len(images)
        return np.array([im.mean() for im in images], dtype=np.float32)


register("test-laplace", LaplaceEnergy)
register("test-count", CountingDetector)


def small(photos):
    return [p[:144, :176] for p in photos]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, photos):
    """clean shard, degraded shard (+ hostile key/caption, broken image, sample without image),
    and a folder of loose images. Returns paths and the images by (shard, key)."""
    root = tmp_path_factory.mktemp("audit")
    imgs = small(photos)
    truth = {}
    with tarfile.open(root / "clean-000.tar", "w") as tf:
        for i, im in enumerate(imgs):
            add_member(tf, f"c{i}.png", encode_png(im))
            add_member(tf, f"c{i}.txt", f"clean photo {i}".encode())
            truth[("clean-000.tar", f"c{i}")] = ("clean", im)
    with tarfile.open(root / "degraded-000.tar", "w") as tf:
        for i, im in enumerate(imgs):
            d = degrade(im, seed=i)
            add_member(tf, f"d{i}.png", encode_png(d))
            truth[("degraded-000.tar", f"d{i}")] = ("degraded", d)
        d = degrade(imgs[3], seed=11)  # a key a spreadsheet would run as a formula
        add_member(tf, FORMULA_KEY + ".png", encode_png(d))
        truth[("degraded-000.tar", FORMULA_KEY)] = ("degraded", d)
        add_member(tf, HOSTILE_KEY + ".png", encode_png(imgs[0]))
        add_member(tf, HOSTILE_KEY + ".txt", HOSTILE_CAPTION.encode())
        truth[("degraded-000.tar", HOSTILE_KEY)] = ("clean", imgs[0])
        add_member(tf, "broken.png", b"this is not a png <script>x</script>")
        add_member(tf, "meta-only.json", b"{}")
    loose = root / "loose"
    (loose / "sub").mkdir(parents=True)
    (loose / "sub" / "a.jpg").write_bytes(encode_jpeg(imgs[1], 97))
    (loose / "b.png").write_bytes(encode_png(degrade(imgs[2], seed=9)))
    truth[("loose", "sub/a.jpg")] = ("clean", decode_image((loose / "sub" / "a.jpg").read_bytes()))
    truth[("loose", "b.png")] = ("degraded", decode_image((loose / "b.png").read_bytes()))
    inputs = [str(root / "clean-000.tar"), str(root / "degraded-000.tar"), str(loose)]
    return root, inputs, truth


def nss_threshold(truth):
    det = create("nss")
    clean = det.score([im for t, im in truth.values() if t == "clean"])
    bad = det.score([im for t, im in truth.values() if t == "degraded"])
    assert bad.min() > clean.max(), "fixture degradation must be visible to nss"
    return float((bad.min() + clean.max()) / 2)


def step_calibration(threshold: float) -> Calibration:
    det = create("nss")
    return Calibration(detector="nss", detector_version=det.version, threshold=threshold,
                       step_map={"x": [0.0, threshold, 3 * threshold], "y": [0.0, 4.0, 20.0]},
                       probability_map={"x": [0.0, threshold, 2 * threshold], "y": [0.0, 0.5, 1.0]})


@pytest.fixture(scope="module")
def audited(dataset):
    """One CLI audit with nss, an explicit threshold, a calibration with a step map, a compare."""
    root, inputs, truth = dataset
    t = nss_threshold(truth)
    cal = save_calibration(step_calibration(t * 1.01), root / "cal.json")
    out = root / "out"
    res = CliRunner().invoke(main, ["audit", *inputs, "--out", str(out), "-d", "nss", "--threshold",
                                    repr(t), "--calibration", str(cal), "--compare",
                                    "test-laplace,nss", "--gallery-size", "4", "--quiet"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out, t, truth, cal


def test_outputs_agree_with_independent_scores(audited):
    out, t, truth, cal_path = audited
    df = pd.read_parquet(out / "scores.parquet")
    det = create("nss")
    # every scored row equals nss on the image itself, read independently of the audit
    got = {(Path(s).name, k): v for s, k, v in zip(df["source"], df["key"], df["score"])}
    for (src, key), (_, im) in truth.items():
        assert got[(src, key)] == pytest.approx(float(det.score([im])[0]), rel=1e-5)
    # clean never flagged, degraded always flagged
    for (src, key), (label, _) in truth.items():
        row = df[(df["source"].map(lambda s: Path(s).name) == src) & (df["key"] == key)].iloc[0]
        assert bool(row["flagged"]) == (label == "degraded"), (src, key)
    errors = df[df["error"].fillna("") != ""]
    assert set(errors["key"]) == {"broken", "meta-only"}
    assert errors["score"].isna().all() and not errors["flagged"].any()

    flagged = pd.read_csv(out / "flagged.csv", keep_default_na=False, na_values=[""])
    assert list(flagged.columns) == ["source", "key", "score", "equivalent_step"]
    expect = df[df["score"] > t].sort_values("score", ascending=False)
    # formula-like keys are written inert (leading '), everything else exactly
    assert list(flagged["key"]) == [("'" + k if k.startswith("=") else k) for k in expect["key"]]
    assert "'" + FORMULA_KEY in set(flagged["key"]) and FORMULA_KEY in set(df["key"])
    np.testing.assert_allclose(flagged["score"], expect["score"], rtol=1e-12)
    cal = Calibration.from_json(Path(cal_path).read_text())
    np.testing.assert_allclose(flagged["equivalent_step"], cal.equivalent_step(flagged["score"]))
    # the calibration's P(degraded), named for what it is relative to (not a bare "probability")
    assert "probability" not in df.columns
    np.testing.assert_allclose(df["p_degraded_chain_mix"], cal.probability(df["score"]), equal_nan=True)

    summary = json.loads((out / "summary.json").read_text())
    scored = df["score"].notna()
    assert summary["samples"] == len(df) == len(truth) + 2
    assert summary["scored"] == int(scored.sum())
    assert summary["flagged"] == len(flagged)
    assert summary["flagged_fraction"] == pytest.approx(len(flagged) / scored.sum())
    lo, hi = stats.binomial_interval(len(flagged), int(scored.sum()))
    assert (summary["ci_low"], summary["ci_high"]) == pytest.approx((lo, hi))
    assert lo < summary["flagged_fraction"] < hi
    assert summary["threshold"] == t and not summary["sample"]["sampled"]
    per = {Path(r["source"]).name: r for r in summary["per_source"]}
    assert per["clean-000.tar"]["flagged"] == 0 and per["degraded-000.tar"]["flagged"] == sum(
        1 for (src, _), (label, _) in truth.items() if src == "degraded-000.tar" and label == "degraded")
    assert sum(r["samples"] for r in summary["per_source"]) == len(df)
    st = summary["equivalent_step"]
    assert st["available"] and st["flagged"]["p50"] == pytest.approx(
        float(np.median(cal.equivalent_step(flagged["score"]))))
    assert st["max_step"] == 20.0  # the map's clamp: a value there reads "at least step 20"
    # storage: every shard member is a PNG, the loose a.jpg a 4:2:0 JPEG; unreadable rows "unknown"
    by_kind = {r["storage"]: r for r in summary["storage"]}
    assert by_kind["jpeg 4:2:0"]["samples"] == 1 and by_kind["unknown"]["samples"] == 2
    assert by_kind["unknown"]["scored"] == 0
    assert by_kind["png"]["samples"] == len(df) - 3
    assert sum(r["flagged"] for r in summary["storage"]) == summary["flagged"]
    assert summary["storage_note"] is None  # nss, not a chroma-sensitive detector


def test_storage_note_only_for_chroma_sensitive_detectors_and_subsampled_jpegs():
    df = pd.DataFrame({"storage": ["png", "jpeg 4:2:0", "jpeg 4:2:0", "jpeg 4:4:4", ""],
                       "score": [1.0, 5.0, 0.5, 2.0, np.nan],
                       "flagged": [False, True, False, False, False]})
    table = stats.storage_table(df)
    assert [r["storage"] for r in table] == ["jpeg 4:2:0", "png", "jpeg 4:4:4", "unknown"]
    assert table[0] == {"storage": "jpeg 4:2:0", "samples": 2, "scored": 2, "flagged": 1, "fraction": 0.5}
    assert math.isnan(table[3]["fraction"])
    note = stats.storage_note(table, "cnn")
    assert note.startswith("2 of 4 scored images are JPEGs with subsampled chroma")
    assert stats.storage_note(table, "nss") is None
    assert stats.storage_note(table, "ens:nss+cnn") == note.replace("cnn misses", "ens:nss+cnn misses")
    assert stats.storage_note(table, "ens:nss+pyiqa:piqe") is None
    assert stats.storage_note(stats.storage_table(df[df.storage != "jpeg 4:2:0"]), "cnn") is None
    assert stats.storage_table(df.drop(columns="storage")) == []


def test_format_step_marks_the_clamp():
    from collapseguard.audit.stats import format_step

    assert format_step(20.0, 20.0) == ">= 20" and format_step(19.96, 20.0) == "20.0"
    assert format_step(7.25, 20.0) == "7.2" and format_step(3.0, None) == "3.0"


def test_compare_is_percentile_matched(audited):
    out, t, _, _ = audited
    df = pd.read_parquet(out / "scores.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert [c["detector"] for c in summary["compare"]] == ["test-laplace"]  # nss is the main one
    c = summary["compare"][0]
    other = df["score:test-laplace"].to_numpy()
    main_scores = df["score"].to_numpy()
    both = np.isfinite(other) & np.isfinite(main_scores)
    fo = df["flagged:test-laplace"].to_numpy(bool)
    assert not fo[~both].any()
    assert fo.sum() == c["other_flagged"] <= c["main_flagged"] == int((main_scores[both] > t).sum())
    assert (other[fo].min() if fo.any() else np.inf) > c["matched_threshold"] >= other[both & ~fo].max()
    assert c["main_flags_other_calls_fine"] == int((df["flagged"] & ~df["flagged:test-laplace"]).sum())
    assert c["other_flags_main_calls_fine"] == int((~df["flagged"] & df["flagged:test-laplace"]).sum())
    rho = sps.spearmanr(main_scores[both], other[both]).statistic
    assert c["spearman"] == pytest.approx(rho)
    html = (out / "report.html").read_text()
    assert "Where other metrics disagree" in html and "nss vs test-laplace" in html


def test_report_is_self_contained_and_escaped(audited):
    out = audited[0]
    html = (out / "report.html").read_text()
    assert "<script" not in html.lower()  # no script at all; the hostile ones are escaped
    assert html.count("&lt;script&gt;") >= 2

    class Tags(HTMLParser):
        tags, links, handlers, csp = [], [], [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "meta" and ("http-equiv", "Content-Security-Policy") in attrs:
                self.csp.append(dict(attrs)["content"])
            self.links += [v for k, v in attrs if k in ("src", "href", "action", "srcset")]
            self.handlers += [k for k, v in attrs if k.startswith("on")]

    parsed = Tags()
    parsed.feed(html)
    assert "script" not in parsed.tags and "iframe" not in parsed.tags and not parsed.handlers
    assert parsed.links and all(v.startswith(("data:image/", "#")) for v in parsed.links)
    assert parsed.tags.count("img") > 10 and "meta" in parsed.tags
    assert len(parsed.csp) == 1 and "default-src 'none'" in parsed.csp[0]


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (CI installs "
                    "Debian's chromium: apt-get install chromium)")
def test_report_in_headless_chromium(audited, tmp_path):
    out = audited[0]
    shot = tmp_path / "report.png"
    info = inspect_report(out / "report.html", screenshot=shot)
    assert info["problems"] == []  # no console errors, exceptions or CSP violations
    assert info["images"] > 10 and info["broken"] == []  # every embedded image decoded
    assert info["scripts"] == 0 and info["handlers"] == 0
    assert info["bodyData"] == {} and info["title"].startswith("collapseguard audit")
    assert HOSTILE_KEY in info["text"]  # shown as text, not markup
    assert '<script>document.title="CAPTION RAN"</script>&amp;' in info["text"]
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sample_scores_only_the_sample(dataset, tmp_path):
    _, inputs, truth = dataset
    all_keys = list(list_samples(inputs))
    assert len(all_keys) == len(truth) + 2
    sel, total = choose_sample(inputs, 5, seed=3)
    assert total == len(all_keys) and sum(sel(*sample) for sample in all_keys) == 5
    assert choose_sample(inputs, total, seed=3) == (None, total)

    CountingDetector.seen = 0
    opts = AuditOptions(detector="test-count", threshold=100.0, sample=5, seed=3, gallery_size=2)
    summary = run_audit(inputs, tmp_path / "a", opts, quiet=True)
    df = pd.read_parquet(tmp_path / "a" / "scores.parquet")
    assert len(df) == 5 and summary["sample"] == {
        "sampled": True, "audited": 5, "population": total, "seed": 3,
        "note": f"figures are estimates from a seeded random sample of 5 of {total} samples"}
    # only the sampled images were decoded and scored (the gallery reads them back later)
    assert CountingDetector.seen == int(df["score"].notna().sum())
    assert {(s, k) for s, k in zip(df["source"], df["key"])} == {
        (s, k) for s, k, nth in all_keys if sel(s, k, nth)}
    html = (tmp_path / "a" / "report.html").read_text()
    assert "Estimates." in html and f"5 of {total} samples" in html
    again = run_audit(inputs, tmp_path / "b", opts, quiet=True)
    other = run_audit(inputs, tmp_path / "c", AuditOptions(
        detector="test-count", threshold=100.0, sample=5, seed=4, gallery_size=2), quiet=True)
    keys = lambda d: set(pd.read_parquet(Path(d) / "scores.parquet")["key"])
    assert again["samples"] == 5 and keys(tmp_path / "b") == keys(tmp_path / "a")
    assert other["samples"] == 5 and keys(tmp_path / "c") != keys(tmp_path / "a")


class _Renamed(NSSDetector):
    """nss under another name: a detector that has no packaged calibration."""

    def __init__(self, name):
        super().__init__()
        self.name = name


def test_cli_summary_table_and_errors(dataset, tmp_path):
    _, inputs, truth = dataset
    t = nss_threshold(truth)
    res = CliRunner().invoke(main, ["audit", inputs[0], inputs[2], "--out", str(tmp_path / "o"),
                                    "-d", "nss", "--threshold", repr(t)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert f"flagged    {summary['flagged']} = " in res.stdout
    assert "clean-000.tar" in res.stdout and str(tmp_path / "o" / "report.html") in res.stdout
    assert summary["flagged"] == 1  # only loose/b.png is degraded
    # without a threshold the packaged default calibration is used, and the report says so
    res = CliRunner().invoke(main, ["audit", inputs[0], "--out", str(tmp_path / "d"), "-d", "nss", "-q"])
    assert res.exit_code == 0, res.output
    assert "default calibration for nss" in json.loads((tmp_path / "d/summary.json").read_text())["threshold_source"]
    # a detector with no threshold and no calibration: a clear error, nothing written
    register("uncalibrated-nss", lambda: _Renamed("uncalibrated-nss"))
    res = CliRunner().invoke(main, ["audit", inputs[0], "--out", str(tmp_path / "x"), "-d", "uncalibrated-nss"])
    assert res.exit_code != 0 and "--threshold" in res.output and not (tmp_path / "x").exists()
    with pytest.raises(AuditError):
        run_audit(inputs[:1], tmp_path / "y", AuditOptions(detector="uncalibrated-nss"), quiet=True)
    # a compared detector that does not exist fails before anything is scored or written
    res = CliRunner().invoke(main, ["audit", inputs[0], "--out", str(tmp_path / "w"), "-d", "nss",
                                    "--threshold", "1", "--compare", "no-such-metric", "-w", "2"])
    assert res.exit_code != 0 and "no-such-metric" in res.output and not (tmp_path / "w").exists()
    res = CliRunner().invoke(main, ["audit", str(tmp_path / "missing.tar"), "--out",
                                    str(tmp_path / "z"), "-d", "nss", "--threshold", "1"])
    assert res.exit_code != 0 and "missing.tar" in res.output


def test_binomial_interval_matches_scipy():
    for k, n in [(0, 10), (3, 10), (10, 10), (17, 400)]:
        r = sps.binomtest(k, n)
        for method in ("clopper-pearson", "wilson"):
            ci = r.proportion_ci(0.95, method="exact" if method == "clopper-pearson" else "wilson")
            assert stats.binomial_interval(k, n, 0.95, method) == pytest.approx((ci.low, ci.high))
    assert all(math.isnan(v) for v in stats.binomial_interval(0, 0))
    with pytest.raises(ValueError):
        stats.binomial_interval(5, 3)


def test_detail_crop_is_native_and_finds_texture():
    rng = np.random.default_rng(0)
    img = np.full((400, 600, 3), 128, np.uint8)
    img[:, 400:] = rng.integers(0, 256, (400, 200, 3), dtype=np.uint8)  # texture on the right
    crop, (y, x) = readback.detail_crop(img, 128)
    assert crop.shape == (128, 128, 3) and x >= 400 - 16
    np.testing.assert_array_equal(crop, img[y: y + 128, x: x + 128])
    small_img = img[:50, :70]
    crop, (y, x) = readback.detail_crop(small_img, 128)
    np.testing.assert_array_equal(crop, small_img)  # smaller than the crop: shown whole, not padded
    assert max(readback.thumbnail(img, 100).shape[:2]) == 100


def test_select_travels_to_workers_and_skips_before_decoding(dataset):
    """The sampling predicate is picklable (worker processes get it with each shard task), and a
    shard task that carries it yields rows only for the samples it accepts."""
    import pickle

    from collapseguard.scoring.run import plan_score_tasks, score_task
    _, inputs, _ = dataset
    sel, _ = choose_sample(inputs, 4, seed=1)
    tasks = pickle.loads(pickle.dumps(plan_score_tasks(inputs, sel)))
    CountingDetector.seen = 0
    rows = [r for t in tasks for r in score_task(t, CountingDetector())]
    chosen = {(s, k) for s, k, nth in list_samples(inputs) if sel(s, k, nth)}
    assert {(r["source"], r["key"]) for r in rows} == chosen and len(rows) == 4
    assert CountingDetector.seen == sum(1 for r in rows if not r["error"])
    # without a predicate the tasks are the filter's plain ones
    assert all(len(t) == 2 for t in plan_score_tasks(inputs))


class Broken(Detector):
    """A compared detector that always fails (to see the main scores survive it)."""

    name = "test-broken"
    version = "1"

    def score(self, images):
        raise RuntimeError("no scores today")


register("test-broken", Broken)


def test_compare_in_one_pass_matches_separate_passes(dataset, tmp_path):
    """workers=1 scores the compared detector on the same decoded images (ComparePanel);
    workers=2 gives it its own read-and-decode pass in worker processes. Same numbers."""
    _, inputs, truth = dataset
    t = nss_threshold(truth)
    runs = {}
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        summary = run_audit(inputs, out, AuditOptions(detector="nss", threshold=t, compare=("cnn",),
                                                      workers=w, gallery_size=2), quiet=True)
        runs[w] = (summary, pd.read_parquet(out / "scores.parquet"))
    (s1, d1), (s2, d2) = runs[1], runs[2]
    assert list(zip(d1["source"], d1["key"])) == list(zip(d2["source"], d2["key"]))
    np.testing.assert_allclose(d1["score:cnn"], d2["score:cnn"], rtol=1e-5, equal_nan=True)
    assert np.isfinite(d1["score:cnn"]).sum() == len(truth)
    for k in ("matched_threshold", "images_compared", "main_flagged", "other_flagged", "both_flagged"):
        assert s1["compare"][0][k] == pytest.approx(s2["compare"][0][k], rel=1e-5)


def test_failing_compared_detector_keeps_main_scores(dataset, tmp_path):
    _, inputs, truth = dataset
    t = nss_threshold(truth)
    summary = run_audit(inputs, tmp_path / "out", AuditOptions(
        detector="nss", threshold=t, compare=("test-broken",), workers=1, gallery_size=2), quiet=True)
    df = pd.read_parquet(tmp_path / "out" / "scores.parquet")
    assert np.isfinite(df["score"]).sum() == len(truth)  # the main detector scored everything
    assert df["score:test-broken"].isna().all()
    assert any("test-broken" in f and "no scores today" in f for f in summary["failures"])


def test_compare_scatter_without_common_scores_says_so_and_does_not_warn():
    import warnings

    from collapseguard.audit.plots import compare_scatter

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty legend used to warn here
        png = compare_scatter([1.0, 2.0], [float("nan"), float("nan")], 1.5, 0.0, "cnn", "nss")
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        drawn = compare_scatter([1.0, 2.0], [0.5, -0.5], 1.5, 0.0, "cnn", "nss")
    assert drawn != png


def test_a_key_repeated_in_a_shard_is_two_samples_in_galleries_and_comparisons(tmp_path, photos):
    from collapseguard.images import encode_png
    shard = tmp_path / "dup.tar"
    with tarfile.open(shard, "w") as tf:
        for name, img in (("d1.png", photos[0]), ("d2.png", photos[1]), ("d1.png", photos[2])):
            add_member(tf, name, encode_png(img[:64, :64]))
    got = readback.fetch_samples([(str(shard), "d1", "d1.png", 0), (str(shard), "d1", "d1.png", 1)])
    first, second = got[(str(shard), "d1", 0)].image, got[(str(shard), "d1", 1)].image
    assert np.array_equal(first, photos[0][:64, :64]) and np.array_equal(second, photos[2][:64, :64])
    base = pd.DataFrame({"source": ["s"] * 3, "key": ["d1", "d2", "d1"], "score": [1.0, 2.0, 3.0]})
    # another detector's rows for the same samples, in another order: matched by occurrence
    other = pd.DataFrame({"source": ["s"] * 3, "key": ["d2", "d1", "d1"], "score": [20.0, 11.0, 33.0]})
    assert align_scores(base, other).tolist() == [11.0, 20.0, 33.0]


class Saturated(Detector):
    """A metric that saturates: the same score for every image (ties everywhere)."""

    name = "test-saturated"
    version = "1"

    def score(self, images):
        return np.full(len(images), 7.0, dtype=np.float32)


class InfOnBright(Detector):
    """Mean brightness, but +inf (a numerical blow-up) on bright images."""

    name = "test-inf"
    version = "1"

    def score(self, images):
        m = np.array([im.mean() for im in images], dtype=np.float64)
        return np.where(m > 100, np.inf, m)


register("test-saturated", Saturated)
register("test-inf", InfOnBright)


def test_compare_when_every_image_is_flagged(dataset, tmp_path):
    """The main detector flags every scored image: the compared one must flag them all too (this
    used to stop the audit with "drop fraction must be in [0, 1), got 1.0")."""
    _, inputs, truth = dataset
    summary = run_audit(inputs, tmp_path / "out", AuditOptions(
        detector="nss", threshold=-1e9, compare=("test-laplace",), gallery_size=2), quiet=True)
    c = summary["compare"][0]
    assert summary["flagged"] == summary["scored"] == c["images_compared"] == len(truth)
    assert c["main_flagged"] == c["other_flagged"] == c["both_flagged"] == len(truth)
    assert c["agreement"] == 1.0 and c["main_flags_other_calls_fine"] == 0
    df = pd.read_parquet(tmp_path / "out" / "scores.parquet")
    assert c["matched_threshold"] < df["score:test-laplace"].min()
    assert df.loc[df["score"].notna(), "flagged:test-laplace"].all()
    # the summary line names the threshold the comparison used (not the metric's own)
    from collapseguard.audit.run import format_summary
    line = next(x for x in format_summary(summary).splitlines() if x.startswith("compare"))
    assert line.startswith(f"compare    test-laplace at {c['matched_threshold']:.4g} (flags the share nss flags)")


def test_compare_report_says_when_ties_keep_the_other_from_flagging_as_many(dataset, tmp_path):
    """A compared metric whose scores tie at the matched threshold flags fewer images (tied scores
    are kept); the report must not claim that it flags the same fraction without the numbers."""
    _, inputs, truth = dataset
    import warnings

    t = nss_threshold(truth)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no rank correlation of a constant (scipy used to warn)
        summary = run_audit(inputs, tmp_path / "out", AuditOptions(
            detector="nss", threshold=t, compare=("test-saturated",), gallery_size=2), quiet=True)
    c = summary["compare"][0]
    assert c["main_flagged"] > 0 and c["other_flagged"] == 0  # every score ties
    assert c["spearman"] is None
    assert "tie" in c["threshold_rule"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert (f"nss flags {c['main_flagged']}, test-saturated flags 0 (not {c['main_flagged']}: its "
            "scores tie at the threshold") in html
    from collapseguard.audit.run import format_summary  # the terminal line says it too
    line = next(x for x in format_summary(summary).splitlines() if x.startswith("compare"))
    assert f"(flags 0 where nss flags {c['main_flagged']}: its scores tie at the threshold)" in line, line


def test_not_scored_table_lists_only_samples_that_were_not_scored(tmp_path, photos):
    """A sample scored with a note (an unsafe member name, renamed) is not "could not be scored"."""
    shard = tmp_path / "notes.tar"
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "ok.png", encode_png(photos[0][:64, :64]))
        add_member(tf, "../../escaped.png", encode_png(photos[1][:64, :64]))
        add_member(tf, "broken.png", b"not a png")
    summary = run_audit([str(shard)], tmp_path / "out", AuditOptions(
        detector="nss", threshold=1e9, gallery_size=2), quiet=True)
    df = pd.read_parquet(tmp_path / "out" / "scores.parquet")
    noted = df[df["key"] == "escaped"].iloc[0]
    assert np.isfinite(noted["score"]) and "unsafe member name" in noted["error"]  # scored, with a note
    assert summary["errors"] == 1
    assert [x["key"] for x in summary["error_examples"]] == ["broken"]
    html = (tmp_path / "out" / "report.html").read_text()
    errors = html[html.index('<section id="errors">'):]
    assert "broken" in errors and "escaped" not in errors


def test_infinite_compared_scores_are_not_scored_in_one_pass(dataset, tmp_path):
    """With one process the compared scores come from the panel, not through score_records: an
    infinite one must still read as "could not score" (NaN, never flagged), as in its own pass."""
    _, inputs, truth = dataset
    t = nss_threshold(truth)
    run_audit(inputs, tmp_path / "out", AuditOptions(
        detector="nss", threshold=t, compare=("test-inf",), workers=1, gallery_size=2), quiet=True)
    df = pd.read_parquet(tmp_path / "out" / "scores.parquet")
    bright = np.array([im.mean() > 100 for _, im in truth.values()])
    assert bright.any() and (~bright).any()
    other = df["score:test-inf"].to_numpy(np.float64)
    assert not np.isinf(other).any()
    assert np.isnan(other).sum() == int(bright.sum()) + int(df["score"].isna().sum())
    assert not df.loc[np.isnan(other), "flagged:test-inf"].any()


def test_gallery_does_not_hold_every_full_image_at_once(tmp_path, photos):
    """Gallery thumbnails and crops are made as each image is read back, so building the cards
    holds about one full-resolution image, not the whole gallery (up to 3 x 100 + comparisons)."""
    import tracemalloc

    from collapseguard.audit.run import _items

    big = np.tile(photos[0], (4, 4, 1))[:960, :1280]  # 1280x960: 3.7 MB decoded
    shard = tmp_path / "big.tar"
    n = 40
    with tarfile.open(shard, "w") as tf:
        for i in range(n):
            add_member(tf, f"b{i:02d}.jpg", encode_jpeg(np.roll(big, 7 * i, axis=1), 90))
    df = pd.DataFrame({"source": [str(shard)] * n, "key": [f"b{i:02d}" for i in range(n)],
                       "image": [f"b{i:02d}.jpg" for i in range(n)], "score": np.arange(n, dtype=float),
                       "flagged": [True] * n, "equivalent_step": [np.nan] * n,
                       "width": [1280] * n, "height": [960] * n})
    tracemalloc.start()
    try:
        cards = _items(df, {"degraded": list(range(n))}, AuditOptions(detector="nss"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(cards["degraded"]) == n and all("crop" in c for c in cards["degraded"])
    assert peak < 0.5 * n * big.nbytes, peak / 1e6  # 40 images would be 147 MB


def test_explicit_threshold_does_not_claim_the_calibrations_guarantee(dataset, tmp_path):
    """--threshold with --calibration uses only the calibration's score maps: the report must not
    present the calibration's false-drop guarantee as if it held at the threshold in use."""
    _, inputs, truth = dataset
    t = nss_threshold(truth)
    cal = step_calibration(t * 1.5)
    cal.alpha, cal.confidence, cal.n_clean = 0.01, 0.95, 600
    guarantee = html_escape(cal.guarantee_text())
    assert guarantee.startswith("at most 1")
    path = save_calibration(cal, tmp_path / "cal.json")
    summary = run_audit(inputs, tmp_path / "out", AuditOptions(
        detector="nss", threshold=t, calibration=str(path), gallery_size=2), quiet=True)
    assert summary["calibration"]["guarantee_applies"] is False
    html = (tmp_path / "out" / "report.html").read_text()
    assert f"Calibration: {guarantee}" not in html
    assert "holds at its own threshold" in html
    # with the calibration's own threshold, the guarantee is the one in use
    run_audit(inputs, tmp_path / "own", AuditOptions(detector="nss", calibration=str(path),
                                                     gallery_size=2), quiet=True)
    assert f"Calibration: {guarantee}" in (tmp_path / "own" / "report.html").read_text()


def test_a_file_name_that_is_not_utf8_is_scored_audited_and_shown(tmp_path, photos):
    import os
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "plain.png").write_bytes(encode_png(photos[0]))
    raw = os.path.join(os.fsencode(loose), b"\xff<b>.png")  # not UTF-8, and HTML-ish
    with open(raw, "wb") as fh:
        fh.write(encode_png(photos[1]))
    res = CliRunner().invoke(main, ["score", str(loose), "--out", str(tmp_path / "s.csv"), "-d", "nss", "-q"])
    assert res.exit_code == 0, res.output
    assert sorted(pd.read_csv(tmp_path / "s.csv")["key"]) == ["\\xff<b>.png", "plain.png"]
    out = tmp_path / "audit"
    res = CliRunner().invoke(main, ["audit", str(loose), "--out", str(out), "-d", "nss", "--threshold", "-100", "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["error_examples"] == []
    html = (out / "report.html").read_text()
    assert "\\xff&lt;b&gt;.png" in html and "<b>.png" not in html
    # both flagged images are read back for the gallery: no card says it could not find its file
    assert "No such file" not in html and html.count("data:image/png") >= 2


def test_sample_counts_a_repeated_key_and_a_shard_named_twice_once_each(tmp_path, photos):
    shard = tmp_path / "rep.tar"
    with tarfile.open(shard, "w") as tf:  # keys a, b, a, c: the second "a" is a sample of its own
        for i, key in enumerate(["a", "b", "a", "c"]):
            add_member(tf, f"{key}.png", encode_png(photos[i]))
    inputs = [str(shard), str(shard)]  # and the shard given twice
    assert [(k, n) for _, k, n in list_samples(inputs)] == [("a", 0), ("b", 0), ("a", 1), ("c", 0)]
    for seed in range(12):  # under the old rank both "a" were chosen together for some seeds
        summary = run_audit(inputs, tmp_path / f"o{seed}", AuditOptions(
            detector="nss", threshold=100.0, sample=1, seed=seed, gallery_size=1), quiet=True)
        assert summary["sample"]["audited"] == 1 and summary["sample"]["population"] == 4


def test_a_sampled_estimate_never_contradicts_the_sample():
    """1 of 20 sampled images flagged in a dataset of 42: at least that one is in the dataset, and
    the 19 seen unflagged cap the upper end."""
    c = stats.flag_counts(np.r_[np.zeros(19), 10.0], threshold=1.0)
    est = stats.dataset_estimate(c, 42)
    assert c.ci_low * 42 < 1 and est["low"] == 1  # the scaled interval alone would say 0
    assert est["low"] <= est["count"] <= est["high"] <= 42 - 19
    none = stats.dataset_estimate(stats.flag_counts(np.zeros(20), threshold=1.0), 42)
    assert none["low"] == none["count"] == 0 and 0 < none["high"] <= 22
    every = stats.dataset_estimate(stats.flag_counts(np.full(20, 5.0), threshold=1.0), 42)
    assert every["high"] == 42 and every["low"] >= 20



def test_sources_of_one_basename_get_distinct_escaped_labels_in_the_terminal_table(tmp_path, photos):
    """Two folders both named ``shards`` and two shards both named ``000.tar``: each row of the
    terminal table is labelled by the shortest path suffix that tells it apart, escaped."""
    imgs = small(photos)
    hostile = "b\x1b]0;PWNED\x07"  # would set the terminal's title if printed raw
    for parent, im in (("a", imgs[0]), (hostile, imgs[1])):
        (tmp_path / parent / "shards").mkdir(parents=True)
        (tmp_path / parent / "shards" / "x.png").write_bytes(encode_png(im))
    for parent, im in (("c", imgs[2]), ("d", imgs[3])):
        (tmp_path / parent).mkdir()
        with tarfile.open(tmp_path / parent / "000.tar", "w") as tf:
            add_member(tf, "k.png", encode_png(im))
    inputs = [tmp_path / "a" / "shards", tmp_path / hostile / "shards", tmp_path / "c" / "000.tar",
              tmp_path / "d" / "000.tar"]
    res = CliRunner().invoke(main, ["audit", *map(str, inputs), "--out", str(tmp_path / "o"),
                                    "-d", "nss", "--threshold", "-100"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    lines = res.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("source "))
    labels = [x.rsplit(None, 3)[0].strip() for x in lines[head + 1: head + 5]]
    assert sorted(labels) == sorted(["a/shards", "b\\x1b]0;PWNED\\x07/shards", "c/000.tar", "d/000.tar"])


def test_the_compare_panel_passes_on_the_main_detectors_nan_reasons(photos):
    """``audit --compare`` in one worker scores through ComparePanel, which hid the main
    detector's reason for a NaN ("could not score the image" instead of the judge's words)."""
    from collapseguard.audit.panel import ComparePanel
    from collapseguard.detectors import Detector, create
    from collapseguard.images import encode_png
    from collapseguard.scoring.records import score_records

    class Picky(Detector):
        name, version = "picky", "1"

        def score(self, images):
            self.last_nan_reasons = ["too dark to judge" if a.mean() < 100 else "" for a in images]
            return np.array([np.nan if r else 1.0 for r in self.last_nan_reasons], np.float32)

    dark = (photos[0][:64, :64] // 4).astype(np.uint8)
    panel = ComparePanel(Picky(), {"nss": create("nss")})
    [(_, res)] = list(score_records([[("d.png", encode_png(dark))]], panel))
    assert np.isnan(res.score) and res.error == "too dark to judge"


def test_a_sampled_second_copy_of_a_repeated_key_shows_its_own_picture(tmp_path):
    """``--sample`` that takes only the second of two samples keyed ``dup``: its card must show
    that (blue) picture, the one it scored, not the first (red) copy the sample skipped."""
    shard = tmp_path / "s.tar"
    red, blue = np.zeros((48, 48, 3), np.uint8), np.zeros((48, 48, 3), np.uint8)
    red[..., 0], blue[..., 2] = 230, 230
    grey = np.full((48, 48, 3), 120, np.uint8)
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "dup.png", encode_png(red))
        for i in range(6):
            add_member(tf, f"k{i}.png", encode_png(grey))
        add_member(tf, "dup.png", encode_png(blue))
    seed = next(s for s in range(1000) if (lambda sel: sel(str(shard), "dup", 1) and not sel(str(shard), "dup", 0))(
        choose_sample([str(shard)], 4, s)[0]))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["audit", str(shard), "--out", str(out), "-d", "nss", "--threshold", "-1e9",
                                    "--sample", "4", "--seed", str(seed), "-q"])
    assert res.exit_code == 0, res.output
    html = (out / "report.html").read_text()
    import base64
    import io
    import re

    from PIL import Image

    thumbs = re.findall(r'src="data:image/jpeg;base64,([^"]+)" alt="thumbnail of dup"', html)
    assert thumbs
    for t in thumbs:
        mean = np.asarray(Image.open(io.BytesIO(base64.b64decode(t))).convert("RGB"), float).reshape(-1, 3).mean(0)
        assert mean[2] > 150 and mean[0] < 80, mean  # blue, the copy that was scored


def test_audit_of_a_pipe_source_not_ending_in_tar_shows_its_pictures(tmp_path, dataset):
    """A ``pipe:`` command is a shard whatever it ends in, for the gallery as for scoring."""
    src = dataset[0] / "clean-000.tar"
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["audit", f"pipe:cat {src} | cat -", "--out", str(out), "-d", "nss",
                                    "--threshold", "0", "-q"])
    assert res.exit_code == 0, res.output
    html = (out / "report.html").read_text()
    assert 'alt="thumbnail of' in html and "accepted on the command line only" not in html


def test_a_file_that_states_no_bound_is_no_calibration_to_claim_a_guarantee_from(dataset, tmp_path):
    """An earlier audit's summary.json holds detector, version and threshold, so it can be given
    as --calibration; it states no false-drop bound, so neither the report nor the summary may
    claim the guarantee a calibration gives, and `calibrations` says the same."""
    root, inputs, truth = dataset
    first = tmp_path / "a"
    run = CliRunner().invoke(main, ["audit", inputs[0], "--out", str(first), "-d", "nss",
                                    "--threshold", "0", "-q"], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    out = tmp_path / "b"
    run = CliRunner().invoke(main, ["audit", inputs[0], "--out", str(out), "-d", "nss",
                                    "--calibration", str(first / "summary.json"), "-q"],
                             catch_exceptions=False)
    assert run.exit_code == 0, run.output
    cal = json.loads((out / "summary.json").read_text())["calibration"]
    assert cal["guarantee_applies"] is False and cal["calibrated"] is False
    assert cal["label"] == "uncalibrated: the file states no false-drop bound"
    html = (out / "report.html").read_text()
    assert "no false-drop guarantee is claimed" in html and "The false-drop guarantee holds" not in html
    shown = CliRunner().invoke(main, ["calibrations", str(first / "summary.json")])
    assert "uncalibrated: the file states no false-drop bound" in shown.output


def test_galleries_of_a_small_dataset_say_what_they_leave_out(dataset, tmp_path):
    """Nothing flagged and a gallery larger than the data: every kept image is already in the
    galleries above, and the kept gallery says so instead of "no kept images"."""
    root, inputs, truth = dataset
    out = tmp_path / "a"
    run = CliRunner().invoke(main, ["audit", inputs[0], "--out", str(out), "-d", "nss",
                                    "--threshold", "1e9", "--gallery-size", "12", "-q"], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    html = (out / "report.html").read_text()
    assert json.loads((out / "summary.json").read_text())["flagged"] == 0
    assert "No kept image beyond those shown above." in html and "No kept images." not in html


def test_the_report_names_sources_of_one_basename_as_the_terminal_does(tmp_path, photos):
    """Two ``00000.tar`` of different datasets and two folders named ``photos``: report.html's
    per-source rows and gallery captions name each by the terminal's shortest unique suffix
    (HTML-escaped), not by the same file name twice."""
    imgs = small(photos)
    hostile = "<b>coyo"
    for parent, im in (("laion", imgs[0]), (hostile, imgs[1])):
        (tmp_path / parent).mkdir()
        with tarfile.open(tmp_path / parent / "00000.tar", "w") as tf:
            add_member(tf, "k.png", encode_png(im))
    for parent, im in (("x", imgs[2]), ("y", imgs[3])):
        (tmp_path / parent / "photos").mkdir(parents=True)
        (tmp_path / parent / "photos" / "p.png").write_bytes(encode_png(im))
    inputs = [tmp_path / "laion" / "00000.tar", tmp_path / hostile / "00000.tar",
              tmp_path / "x" / "photos", tmp_path / "y" / "photos"]
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["audit", *map(str, inputs), "--out", str(out), "-d", "nss",
                                    "--threshold", "-100", "--gallery-size", "4"])
    assert res.exit_code == 0, res.output
    import re
    html = (out / "report.html").read_text()
    want = ["laion/00000.tar", html_escape(hostile) + "/00000.tar", "x/photos", "y/photos"]
    rows = re.findall(r'<td class=l title="[^"]*">([^<]*)</td><td>\d+', html)
    assert sorted(rows) == sorted(want)
    captions = set(re.findall(r'class="sub" title="[^"]*">in ([^<]*)</div>', html))
    assert captions == set(want)  # every image is flagged: each source has a card
    assert "<b>coyo" not in html
    lines = res.stdout.splitlines()  # the terminal names them the same way
    head = next(i for i, x in enumerate(lines) if x.startswith("source "))
    assert sorted(x.rsplit(None, 3)[0].strip() for x in lines[head + 1: head + 5]) == sorted(
        [hostile + "/00000.tar", "laion/00000.tar", "x/photos", "y/photos"])


def test_threshold_alone_keeps_the_packaged_calibrations_step_map(dataset, tmp_path):
    """The step map belongs to the detector's score scale, not to a threshold: `--threshold` without
    `--calibration` still shows the replication step from the packaged calibration of this exact
    detector version, and says its guarantee is not the one in use. A detector with no packaged
    calibration says why there is no step and what to pass."""
    from collapseguard.io.calibration_file import default_calibration
    _, inputs, truth = dataset
    t = nss_threshold(truth)
    shipped = default_calibration("nss", create("nss").version)
    assert shipped is not None and shipped.step_map is not None
    summary = run_audit(inputs[:2], tmp_path / "a", AuditOptions(detector="nss", threshold=t, gallery_size=2),
                        quiet=True)
    assert summary["threshold"] == t and summary["equivalent_step"]["available"]
    assert "packaged default calibration for nss" in summary["threshold_source"]
    assert summary["calibration"]["guarantee_applies"] is False
    df = pd.read_parquet(tmp_path / "a" / "scores.parquet")
    np.testing.assert_allclose(df["equivalent_step"], shipped.equivalent_step(df["score"]), equal_nan=True)
    html = (tmp_path / "a" / "report.html").read_text()
    assert "holds at its own threshold" in html and "Unavailable" not in html

    register("unshipped-nss", lambda: _Renamed("unshipped-nss"))
    summary = run_audit(inputs[:1], tmp_path / "b", AuditOptions(detector="unshipped-nss", threshold=t,
                                                                 gallery_size=2), quiet=True)
    reason = summary["equivalent_step"]["reason"]
    assert not summary["equivalent_step"]["available"] and summary["calibration"] is None
    assert "no packaged calibration" in reason and "add --calibration FILE" in reason
    assert html_escape(reason) in (tmp_path / "b" / "report.html").read_text()


def test_samples_filter_sets_aside_whatever_their_score_are_never_tagged_kept(tmp_path, photos):
    """Unsafe member names, a refused member (a link) and a repeated key: `filter` rejects these
    samples whatever their score. The audit must say so (scores.parquet's set_aside, the summary,
    the terminal, a report section and the cards' tags) instead of tagging them "kept", and agree
    with what `filter` itself decides on the same shard."""
    imgs = small(photos)
    shard = tmp_path / "shards" / "x-000.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w") as tf:
        for name, im in (("../escape.png", imgs[0]), ("/abs/path.png", imgs[1]), ("fine.png", imgs[2]),
                         ("other.png", imgs[3]), ("fine.png", imgs[0])):
            add_member(tf, name, encode_png(im))
        link = tarfile.TarInfo("linked.png")
        link.type, link.linkname = tarfile.SYMTYPE, "fine.png"
        tf.addfile(link)
        add_member(tf, "linked.txt", b"a caption")
    out = tmp_path / "audit"
    res = CliRunner().invoke(main, ["audit", str(shard.parent), "--out", str(out), "-d", "nss",
                                    "--threshold", "1e9", "--gallery-size", "12"])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(out / "scores.parquet")
    got = list(zip(df["key"], df["set_aside"]))
    assert got == [("escape", "unsafe_name"), ("abs/path", "unsafe_name"), ("fine", ""), ("other", ""),
                   ("fine", "repeated_key"), ("linked", "refused_member")]
    # the same reasons as filter's own decisions on this shard
    run = CliRunner().invoke(main, ["filter", str(shard.parent), "--out", str(tmp_path / "f"), "-d", "nss",
                                    "--threshold", "1e9", "-w", "1", "-q"])
    assert run.exit_code == 0, run.output
    fdf = pd.read_parquet(tmp_path / "f" / "scores" / "x-000.parquet")
    assert [r if r in ("unsafe_name", "refused_member", "repeated_key") else "" for r in fdf["reason"]] == \
        list(df["set_aside"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["set_aside"]["count"] == 4 and summary["set_aside"]["by_reason"] == {
        "unsafe_name": 2, "refused_member": 1, "repeated_key": 1}
    assert "set aside  4 sample(s)" in res.stdout and "2 unsafe name" in res.stdout
    import re
    html = (out / "report.html").read_text()
    tags = re.findall(r'<span class="tag [a-z]"[^>]*>([^<]*)</span> <span class="key">([^<]*)', html)
    by_key = {}
    for t, k in tags:
        by_key.setdefault(k, set()).add(t)
    assert by_key["escape"] == {"set aside: unsafe name"} and by_key["abs/path"] == {"set aside: unsafe name"}
    assert by_key["other"] == {"kept"}
    assert "set aside: repeated key" in by_key["fine"] and "kept" in by_key["fine"]
    assert 'id="setaside"' in html and html.count("<td class=l>unsafe name</td>") == 2
    assert "<td class=l>refused member</td>" in html and "<td class=l>repeated key</td>" in html
    kept = html[html.index('id="kept"'):html.index("</section>", html.index('id="kept"'))]
    assert "set aside" not in kept  # the random sample of kept images holds none of them


def test_folder_files_of_no_image_type_are_counted_and_named(tmp_path, photos):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i, img in enumerate(photos[:2]):
        (folder / f"p{i}.png").write_bytes(encode_png(img))
    (folder / "layers.psd").write_bytes(b"8BPS")
    (folder / "notes.txt").write_text("not an image")
    (folder / "b.psd").write_bytes(b"\x00")
    res = CliRunner().invoke(main, ["audit", str(folder), "--out", str(tmp_path / "o"), "-d", "nss",
                                    "--threshold", "3.0", "-w", "1"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["other_files"] == {".psd": 2, ".txt": 1}
    assert summary["scored"] == 2
    assert "3 file(s) in the folders given were not read, not being an image type: .psd (2), .txt (1)" in res.output
