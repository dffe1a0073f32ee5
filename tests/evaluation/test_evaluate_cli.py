"""End to end: `collapseguard evaluate` on tiny chains made here, with detectors registered here."""

import json
import re

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from collapseguard.cli import main
from collapseguard.detectors import Detector, register
from collapseguard.evaluation.scoring import score_manifest, time_detectors
from collapseguard.images import encode_png
from collapseguard.training_data_tools.manifest import read_manifest, write_manifest

STEPS = (0, 1, 2, 3, 5, 10, 20)


def _residual_energy(img: np.ndarray) -> float:
    """Mean absolute difference between horizontally adjacent pixels: grows with added noise."""
    x = img.astype(np.float64)
    return float(np.abs(np.diff(x, axis=1)).mean())


class Tracking(Detector):
    """Sees the degradation: high-frequency energy goes up with every noise step."""

    name = "evaltest-track"
    version = "t1"

    def score(self, images):
        return np.array([_residual_energy(im) for im in images], dtype=np.float32)


class Anti(Tracking):
    """Anti-correlated with the degradation."""

    name = "evaltest-anti"

    def score(self, images):
        return -super().score(images)


class Flaky(Tracking):
    """NaN for 36-wide images; refuses batches holding a 40-wide image, and some such images."""

    name = "evaltest-flaky"

    def score(self, images):
        if any(im.shape[1] == 40 for im in images):
            if len(images) > 1:
                raise RuntimeError("batch refused")
            if images[0][0, 0, 0] % 2:  # some single images still fail
                raise RuntimeError("odd pixel")
        out = super().score(images)
        out[[im.shape[1] == 36 for im in images]] = np.nan
        return out


class Chatty(Tracking):
    """NaN for every odd-brightness image, each with a reason of its own (a judge quoting an
    answer), with Markdown and HTML in it."""

    name = "evaltest-chatty"

    def score(self, images):
        out = super().score(images)
        self.last_nan_reasons = [""] * len(images)
        for i, im in enumerate(images):
            if int(im.mean() * 1000) % 2:
                out[i] = np.nan
                self.last_nan_reasons[i] = f"no rating in '<b>`{im.mean():.6f}`</b>'"
        return out


register("evaltest-track", Tracking)
register("evaltest-chatty", Chatty)
register("evaltest-anti", Anti)
register("evaltest-flaky", Flaky)


def _make_chains(root, n_sources=3, families=("grain", "speckle"), drop=None, width=32):
    """Smooth sources; each step adds a little seeded noise (grain: gaussian, speckle: sparse)."""
    rows = []
    for s in range(n_sources):
        yy, xx = np.mgrid[0:24, 0:width]
        src = np.stack([(xx * 3 + s * 20) % 200, (yy * 4 + 30) % 200, np.full_like(xx, 90 + s)], -1)
        for fam in families:
            rng = np.random.default_rng(s * 7 + len(fam))
            cur = src.astype(np.float64)
            for step in range(max(STEPS) + 1):
                if step:
                    if fam == "grain":
                        cur = cur + rng.normal(0, 3.0, cur.shape)
                    else:
                        cur = cur + (rng.random(cur.shape) < 0.03) * rng.normal(0, 40.0, cur.shape)
                if step in STEPS and (drop is None or (f"{fam}-{s}", step) != drop):
                    path = root / f"{fam}-{s}" / f"{step:02d}.png"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(encode_png(np.clip(cur, 0, 255).round().astype(np.uint8)))
                    rows.append({"chain_id": f"{fam}-{s}", "source_image": f"src{s}", "family": fam,
                                 "task": "edit", "step": step, "path": str(path)})
    write_manifest(pd.DataFrame(rows), root / "manifest.csv")
    return root


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    return _make_chains(tmp_path_factory.mktemp("chains"), drop=("grain-2", 10))


def test_evaluate_tracking_passes_anti_fails(chains, tmp_path):
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors",
                                    "evaltest-track,evaltest-anti", "--out", str(out),
                                    "--batch-size", "5", "-q"])
    assert res.exit_code == 0, res.output
    for name in ("results.md", "chains.csv", "scores.csv", "auroc.csv", "summary.json",
                 "mean_score_vs_step.png"):
        assert (out / name).is_file(), name
    assert (out / "mean_score_vs_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    summary = json.loads((out / "summary.json").read_text())
    fails = {r["detector"]: r for r in summary["failures"]}
    # 6 chains, grain-2 lacks step 10 -> skipped; 5 evaluated
    assert fails["evaltest-track"]["evaluated"] == 5 and fails["evaltest-track"]["failed"] == 0
    assert fails["evaltest-anti"]["failed"] == 5 and fails["evaltest-anti"]["passed"] == 0
    assert fails["evaltest-track"]["skipped"] == 1
    speed = {d["detector"]: d for d in summary["speed"]["detectors"]}
    assert speed["evaltest-track"]["images"] == 41 and speed["evaltest-track"]["images_per_s"] > 0

    au = pd.read_csv(out / "auroc.csv").set_index(["detector", "family"])
    assert au.loc[("evaltest-track", "all"), "k20"] == 1.0
    assert au.loc[("evaltest-anti", "all"), "k20"] == 0.0
    assert set(au.index.get_level_values("family")) == {"all", "grain", "speckle"}

    per_chain = pd.read_csv(out / "chains.csv")
    assert {"chain_id", "family", "detector", "delta_5", "delta_10", "delta_20", "pass",
            "spearman"} <= set(per_chain.columns)
    assert len(per_chain) == 12
    tr = per_chain[per_chain.detector == "evaltest-track"].set_index("chain_id")
    assert (tr.drop("grain-2")["delta_20"] > tr.drop("grain-2")["delta_5"]).all()
    assert tr.loc["grain-2", "status"] == "skipped" and "10" in tr.loc["grain-2", "reason"]
    assert tr["spearman"].min() > 0.9

    scores = pd.read_csv(out / "scores.csv")
    assert len(scores) == 2 * 41 and scores["score"].notna().all()
    md = (out / "results.md").read_text()
    assert "| evaltest-anti | 5 | 5 | 0 | 1 |" in md
    assert "grain-2" in md and "population std" in md and "decode excluded" in md
    assert "evaltest-anti: failed 5 of 5 chains" in res.output


def test_nan_and_errors_count_as_failures(tmp_path):
    chains = _make_chains(tmp_path / "c36", n_sources=2, families=("grain",), width=36)
    other = _make_chains(tmp_path / "c32", n_sources=1, families=("speckle",))
    df = pd.concat([read_manifest(chains), read_manifest(other)])
    df.to_csv(tmp_path / "all.csv", index=False)
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(tmp_path / "all.csv"), "--detectors",
                                    "evaltest-flaky", "--out", str(out), "--no-plot", "-q",
                                    "--scale", "iqr"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    f = s["failures"][0]
    assert (f["evaluated"], f["failed"], f["fail_nan"], f["passed"]) == (3, 2, 2, 1)
    assert s["scale"]["evaltest-flaky"]["method"] == "iqr"
    assert not (out / "mean_score_vs_step.png").exists()
    assert "NaN score at step(s)" in (out / "results.md").read_text()


def test_results_md_lists_a_few_scoring_errors_per_detector_as_code(tmp_path):
    """A detector that says why each NaN is one gives each image its own error text: results.md
    listed every one (one line per image) as plain Markdown; it lists the most frequent few as
    inline code and counts the rest, which scores.csv holds image by image."""
    chains = _make_chains(tmp_path / "c", n_sources=6)
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors",
                                    "evaltest-chatty", "--out", str(out), "--no-plot", "-q"])
    assert res.exit_code == 0, res.output
    errors = pd.read_csv(out / "scores.csv", keep_default_na=False)["error"]
    distinct = errors[errors != ""].nunique()
    assert distinct > 12, distinct
    md = (out / "results.md").read_text()
    section = md.split("## Scoring errors")[1].split("\n## ")[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("- ")]
    assert len(lines) == 11, section  # ten texts and one line for the rest
    assert f"{distinct - 10} other error text(s)" in lines[-1]
    assert all("``no rating in '<b>`" in ln for ln in lines[:-1]), lines[:2]


def test_score_manifest_records_decode_and_detector_errors(tmp_path):
    root = _make_chains(tmp_path / "c", n_sources=1, families=("grain",), width=40)
    df = read_manifest(root)
    df.loc[df.step == 3, "path"] = str(tmp_path / "missing.png")
    (tmp_path / "junk.png").write_bytes(b"not an image")
    df.loc[df.step == 5, "path"] = str(tmp_path / "junk.png")
    scores, timings, _ = score_manifest(df, [Flaky(), Tracking()], batch_size=4)
    flaky = scores[scores.detector == "evaltest-flaky"].reset_index(drop=True)
    assert flaky.loc[flaky.step == 5, "error"].iloc[0].startswith("decode_error")
    assert flaky.loc[flaky.step == 3, "error"].iloc[0].startswith("decode_error")
    odd = flaky["error"].str.contains("odd pixel")
    assert flaky.loc[odd, "score"].isna().all()
    ok = flaky["error"] == ""
    assert odd.sum() >= 1 and ok.sum() >= 1  # both paths of the per-image retry are exercised
    assert ok.sum() + odd.sum() == len(df) - 2 and flaky.loc[ok, "score"].notna().all()
    track = scores[scores.detector == "evaltest-track"]
    assert (track["error"] == "").sum() == len(df) - 2
    assert timings[1].images == len(df) - 2


def test_time_detectors_counts_images_and_bad_input():
    imgs = [np.zeros((8, 8, 3), np.uint8)] * 5
    t = time_detectors([Tracking()], imgs, batch_size=2)[0]
    assert t.images == 5 and t.seconds > 0 and t.images_per_s > 0
    with pytest.raises(ValueError):
        time_detectors([Tracking()], imgs, batch_size=0)


def test_time_detectors_take_turns_batch_by_batch():
    """A shared machine's load comes in bursts: timing one detector after the other put a whole
    burst on one of them. They take turns per batch, in alternating order."""
    calls = []

    class Logged(Tracking):
        def __init__(self, tag):
            super().__init__()
            self.name, self.tag = f"evaltest-{tag}", tag

        def score(self, images):
            calls.append((self.tag, len(images)))
            return super().score(images)

    imgs = [np.zeros((8, 8, 3), np.uint8)] * 5
    a, b = time_detectors([Logged("a"), Logged("b")], imgs, batch_size=2)
    assert calls == [("a", 1), ("b", 1),  # warm-ups
                     ("a", 2), ("b", 2), ("b", 2), ("a", 2), ("a", 1), ("b", 1)]
    assert a.images == b.images == 5
    with pytest.raises(ValueError):
        score_manifest(pd.DataFrame({"path": []}), [Tracking()])


def test_unknown_detector_is_a_clean_error(chains, tmp_path):
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors", "nope-xyz",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "unknown detector" in res.output


def test_tables_recomputed_from_scores_file(chains, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    args = ["evaluate", "--chains", str(chains), "--detectors", "evaltest-track,evaltest-anti",
            "--no-plot", "-q"]
    assert CliRunner().invoke(main, [*args, "--out", str(first)]).exit_code == 0
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"),
                                    "--out", str(second), "--no-plot", "--steps", "20"])
    assert res.exit_code == 0, res.output
    a = pd.read_csv(first / "chains.csv")
    b = pd.read_csv(second / "chains.csv")
    same = a["status"] != "skipped"
    assert same.sum() == 10 and np.allclose(a.loc[same, "delta_20"], b.loc[same, "delta_20"])
    assert "delta_5" not in b.columns
    # with only Δ20 required, the chain that lacks step 10 is evaluated instead of skipped
    assert (b["status"] == "skipped").sum() == 0 and (a["status"] == "skipped").sum() == 2
    assert "not measured" in (second / "results.md").read_text()
    # steps no chain has: nothing is evaluated, and the run says so instead of passing
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"),
                                    "--out", str(tmp_path / "none"), "--no-plot", "--steps", "7,50"])
    assert res.exit_code == 1 and "no chain could be evaluated" in res.output
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(bad), "--out", str(tmp_path / "c")])
    assert res.exit_code != 0 and "not a scores.csv" in res.output
    # every row one chain's step 0 (as in a calibration's scores): named in one short line, not
    # with the list of every step
    flat = pd.read_csv(first / "scores.csv")
    flat = pd.concat([flat] * 20, ignore_index=True)
    flat["chain_id"], flat["step"] = flat["chain_id"].iloc[0], 0
    flat.to_csv(tmp_path / "flat.csv", index=False)
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(tmp_path / "flat.csv"), "--out",
                                    str(tmp_path / "d")])
    assert res.exit_code != 0 and "step(s) 0 appear more than once" in res.output, res.output
    assert len(res.output) < 400, res.output


def test_a_calibration_file_applies_to_its_own_detector_of_a_two_detector_scores_file(chains, tmp_path):
    """``--from-scores`` of a two-detector run with ``--calibration FILE`` (made for one of them)
    gives that detector its threshold and the other none, instead of failing on the other one."""
    from collapseguard.calibration.thresholds import Calibration, save_calibration

    first = tmp_path / "a"
    assert CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors",
                                     "evaltest-track,evaltest-anti", "--no-plot", "-q",
                                     "--out", str(first)]).exit_code == 0
    cal = save_calibration(Calibration(detector="evaltest-anti", detector_version="t1", threshold=-1.0),
                           tmp_path / "anti.json")
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"), "--no-plot",
                                    "--calibration", str(cal), "--out", str(tmp_path / "b")])
    assert res.exit_code in (0, 1) and "Traceback" not in res.output, res.output
    thresholds = json.loads((tmp_path / "b" / "summary.json").read_text())["thresholds"]
    assert list(thresholds) == ["evaltest-anti"] and thresholds["evaltest-anti"]["threshold"] == -1.0
    other = save_calibration(Calibration(detector="nss", detector_version="x", threshold=1.0),
                             tmp_path / "nss.json")
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"), "--no-plot",
                                    "--calibration", str(other), "--out", str(tmp_path / "c")])
    assert res.exit_code == 1 and "--calibration" in res.output  # matching neither: refused, named


def test_a_numeric_looking_detector_version_is_read_back_as_written(chains, tmp_path):
    """A version such as ``0123`` or ``1e5`` is text: read back from scores.csv it must not become
    the number 123 or 100000.0 (the calibration lookup goes by the version's exact text)."""
    first, second = tmp_path / "a", tmp_path / "b"
    assert CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors", "evaltest-track",
                                     "--no-plot", "-q", "--out", str(first)]).exit_code == 0
    scores = pd.read_csv(first / "scores.csv", dtype=str)
    scores["version"] = "0123"
    scores.to_csv(first / "scores.csv", index=False)
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"),
                                    "--out", str(second), "--no-plot"])
    assert res.exit_code in (0, 1), res.output
    assert set(pd.read_csv(second / "scores.csv", dtype=str)["version"]) == {"0123"}


@pytest.fixture(scope="module")
def odd_chains(tmp_path_factory):
    """The tiny chains under family and chain names a folder can have: a formula, a pipe, a line
    break, backticks, and matplotlib's $...$."""
    root = _make_chains(tmp_path_factory.mktemp("odd"), n_sources=2)
    df = read_manifest(root)
    fams = {"grain": '=HYPERLINK("http://x","y")', "speckle": "$\\bad{x$ a|b\nc"}
    df["family"] = df["family"].map(fams)
    df["chain_id"] = df["chain_id"].map(lambda c: ("@" if c.endswith("0") else "`x`\n| y |") + c)
    df.to_csv(root / "odd.csv", index=False)
    return root / "odd.csv", sorted(fams.values())


def test_names_that_look_like_formulas_are_inert_in_csv_and_read_back_as_they_were(odd_chains, tmp_path):
    import csv

    manifest, families = odd_chains
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(manifest), "--detectors", "evaltest-track",
                                    "--out", str(out), "--no-plot", "-q"])
    assert res.exit_code == 0, res.output
    for name in ("scores.csv", "chains.csv", "auroc.csv"):
        with open(out / name, newline="", encoding="utf-8") as fh:
            cells = [c for row in csv.reader(fh) for c in row]
        assert not [c for c in cells if c[:1] in ("=", "+", "@", "\t", "\r")], name
        assert any(c.startswith("'=HYPERLINK") for c in cells), name
    again = tmp_path / "again"
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(out / "scores.csv"), "--out", str(again),
                                    "--no-plot"])
    assert res.exit_code == 0, res.output
    first, second = (json.loads((d / "summary.json").read_text()) for d in (out, again))
    assert first["families"] == second["families"] == families
    assert first["auroc"]["table"] == second["auroc"]["table"]
    assert first["failures_by_family"] == second["failures_by_family"]


def test_names_with_pipes_and_line_breaks_keep_results_md_tables_whole(odd_chains, tmp_path):
    manifest, _ = odd_chains
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(manifest), "--detectors", "evaltest-track",
                                    "--out", str(out), "--no-plot", "-q", "--steps", "5,30"])
    assert res.exit_code == 1  # step 30 is in no chain: all skipped, listed by chain name
    md = (out / "results.md").read_text()
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|"):  # every row of a table is one line, with the header's cell count
            header = next(h for h in reversed(lines[: i + 1]) if h.startswith("|") and
                          not lines[lines.index(h) - 1].startswith("|"))
            assert line.endswith("|") and len(re.split(r"(?<!\\)\|", line)) == len(header.split("|")), line
    assert "| evaltest-track | $\\bad{x$ a\\|b↵c |" in md
    # skipped chains are listed as one-line code spans (a backtick in the name does not end them)
    assert "- `` `x`↵| y |speckle-1 ``: missing step(s) [30]" in md
    assert not [ln for ln in lines if ln.startswith("c") or ln.startswith("| y |")]


def test_a_family_name_with_dollar_signs_is_plotted_as_written(odd_chains, tmp_path):
    # matplotlib would parse "$\bad{x$" as mathtext and raise on saving, before results.md is written
    manifest, _ = odd_chains
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(manifest), "--detectors",
                                    "evaltest-track,evaltest-anti", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert (out / "mean_score_vs_step.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "results.md").is_file() and (out / "summary.json").is_file()


def test_a_rerun_without_plot_removes_the_earlier_runs_plot(chains, tmp_path):
    out = tmp_path / "eval"
    args = ["evaluate", "--chains", str(chains), "--detectors", "evaltest-track", "--out", str(out), "-q"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert (out / "mean_score_vs_step.png").is_file()
    res = CliRunner().invoke(main, [*args, "--no-plot", "--family", "grain"])
    assert res.exit_code == 0, res.output
    assert not (out / "mean_score_vs_step.png").exists()  # it showed both families, the tables one
    assert "plot" not in json.loads((out / "summary.json").read_text())["files"]


def test_steps_given_twice_or_including_the_base_step_are_refused(chains, tmp_path):
    first = tmp_path / "a"
    assert CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors", "evaltest-track",
                                     "--out", str(first), "--no-plot", "-q"]).exit_code == 0
    for steps, base, why in (("5,5", "1", "twice"), ("1,5", "1", "base step"), ("5,10", "5", "base step"), ("5", "10", "lie before the base step 10")):
        res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"), "--out",
                                        str(tmp_path / "b"), "--steps", steps, "--base-step", base])
        assert res.exit_code == 2 and why in res.output, (steps, res.output)
        assert "Traceback" not in res.output and not (tmp_path / "b").exists()


def test_chains_whose_images_all_fail_to_decode_are_reported_not_a_traceback(tmp_path):
    chains = _make_chains(tmp_path / "c", n_sources=2, families=("grain",))
    for p in chains.rglob("*.png"):  # as a clone without git-lfs leaves them: pointer text files
        p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1234\n")
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors",
                                    "evaltest-track", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output  # was a ValueError from the plot, then from summary.json
    assert "failed 2 of 2 chains" in res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["failures"][0]["fail_nan"] == 2
    assert s["speed"]["detectors"][0]["images"] == 0
    assert s["speed"]["detectors"][0]["images_per_s"] is None
    assert (out / "mean_score_vs_step.png").read_bytes()[:4] == b"\x89PNG"


def test_auroc_steps_that_are_also_clean_steps_are_refused(chains, tmp_path):
    first = tmp_path / "a"
    assert CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors", "evaltest-track",
                                     "--out", str(first), "--no-plot", "-q"]).exit_code == 0
    for clean, auroc in (("0,1,2", "2,3,5,10,20"), ("0,1", "1,5")):
        res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"), "--out",
                                        str(tmp_path / "b"), "--clean-steps", clean, "--auroc-steps", auroc])
        # an image on both sides of the AUROC: step 2 against 0,1,2 read as 0.5-ish, not refused
        assert res.exit_code == 2 and "--clean-steps" in res.output, (clean, res.output)
        assert "Traceback" not in res.output and not (tmp_path / "b").exists()
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(first / "scores.csv"), "--out",
                                    str(tmp_path / "c"), "--clean-steps", "0,1,2", "--auroc-steps", "3,5"])
    assert res.exit_code == 0, res.output


def test_a_calibration_made_for_another_detector_is_refused_with_what_evaluate_takes(chains, tmp_path):
    """evaluate has no --threshold: refusing a calibration made for another detector, it points to
    the options it has."""
    from collapseguard.calibration.thresholds import Calibration, save_calibration

    other = save_calibration(Calibration(detector="nss", detector_version="x", threshold=1.0),
                             tmp_path / "nss.json")
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "--detectors", "evaltest-track",
                                    "--calibration", str(other), "--no-plot", "-q",
                                    "--out", str(tmp_path / "e")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "was made for detector nss@x, not evaltest-track@t1" in res.output
    assert "--calibration default or none" in res.output and "--threshold" not in res.output


def test_a_step_none_of_whose_images_could_be_scored_keeps_its_column(tmp_path):
    """Every step-20 file truncated: the drop table keeps its step-20 column (empty), every family
    keeps its row, and results.md and summary.json are written."""
    root = _make_chains(tmp_path / "chains")
    for p in root.rglob("20.png"):
        p.write_bytes(p.read_bytes()[:60])
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(root), "-d", "nss", "--out", str(out),
                                    "--no-plot", "-q"])
    assert res.exit_code == 0, res.output
    md = (out / "results.md").read_text()
    table = md.split("### Share of step-k images dropped, per storage and family")[1]
    assert "step 20" in table.splitlines()[2]
    assert all(f"| {fam} |" in table for fam in ("grain", "speckle"))
    assert (out / "summary.json").is_file()


def test_names_that_spell_missing_values_stay_names_through_from_scores(tmp_path):
    """A chain called "null", a family "NA" and a source "None" are names: the CSV manifest, the
    first run and --from-scores on its scores.csv all keep every chain."""
    root = _make_chains(tmp_path / "chains")
    m = read_manifest(root / "manifest.csv")
    m["family"] = m["family"].replace({"speckle": "NA"})
    m["chain_id"] = m["chain_id"].replace({"grain-0": "null"})
    m["source_image"] = m["source_image"].replace({"src1": "None"})
    write_manifest(m, root / "manifest.csv")
    assert read_manifest(root / "manifest.csv")["family"].eq("NA").any()
    out1, out2 = tmp_path / "e1", tmp_path / "e2"
    for args, out in ((["--chains", str(root), "-d", "nss"], out1), (["--from-scores", str(out1 / "scores.csv")], out2)):
        res = CliRunner().invoke(main, ["evaluate", *args, "--out", str(out), "--no-plot", "-q", "--calibration", "none"])
        assert res.exit_code == 0, res.output
    a = pd.read_csv(out1 / "chains.csv", keep_default_na=False)
    b = pd.read_csv(out2 / "chains.csv", keep_default_na=False)
    assert len(a) == len(b) == 6 and "null" in set(b["chain_id"]) and "NA" in set(b["family"])


def test_an_image_that_cannot_be_decoded_keeps_its_chain_in_its_storage_row(tmp_path):
    root = _make_chains(tmp_path / "chains")
    bad = next(root.rglob("grain-0/10.png"))
    bad.write_bytes(bad.read_bytes()[:40])
    out = tmp_path / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(root), "-d", "nss", "--out", str(out),
                                    "--no-plot", "-q", "--calibration", "none"])
    assert res.exit_code == 0, res.output
    f = pd.read_csv(out / "failures_by_storage.csv", keep_default_na=False)
    assert set(f["storage"]) == {"png"}
    row = f[(f["family"] == "all")].iloc[0]
    assert row["evaluated"] == 6 and row["failed"] >= 1


def test_results_md_cells_show_html_in_a_name_as_text():
    """A family or chain name comes from a folder name: in results.md's tables it is shown, not
    run, by a Markdown viewer that renders HTML."""
    from collapseguard.evaluation.report import _fmt

    assert _fmt("<img src=x onerror=alert(1)>a|b&c") == "&lt;img src=x onerror=alert(1)&gt;a\\|b&amp;c"


def test_a_folder_of_unrelated_numbered_pictures_is_called_no_chain(tmp_path, photos):
    """Files numbered in one folder are one chain by the layout rule; when its first two steps are
    two different pictures (a folder of photos ``p0000.png`` ...), evaluate says the verdict means
    nothing, on stderr and in results.md. A real chain in the same layout gets no such warning."""
    rng = np.random.default_rng(0)
    unrelated, chain = tmp_path / "photos", tmp_path / "chain"
    unrelated.mkdir()
    chain.mkdir()
    base = photos[0][:160, :160].astype(np.float64)
    for i in range(12):
        crop = photos[i % len(photos)][:160, :160] if i % 2 == 0 else photos[i % len(photos)][-160:, -160:]
        (unrelated / f"p{i:04d}.png").write_bytes(encode_png(np.ascontiguousarray(crop)))
        noisy = np.clip(base + rng.normal(0, 3 * i, base.shape), 0, 255).astype(np.uint8)
        (chain / f"p{i:04d}.png").write_bytes(encode_png(noisy))
    for folder, warned in ((unrelated, True), (chain, False)):
        res = CliRunner().invoke(main, ["evaluate", "--chains", str(folder), "-d", "nss", "--no-plot",
                                        "-q", "--steps", "5,10", "--out", str(tmp_path / folder.name)])
        assert res.exit_code == 0, res.output
        assert ("look like two different pictures" in res.output) is warned, res.output
        assert ("look like two different pictures" in (tmp_path / folder.name / "results.md").read_text()) is warned
