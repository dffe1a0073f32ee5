"""`collapseguard evaluate` per storage and per clean kind, on real chains of real photos stored
two ways, scored by the shipped cnn with its shipped calibration."""

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from collapseguard.cli import main
from collapseguard.detectors import create
from collapseguard.evaluation.breakdown import clean_drop_rates, drop_rates
from collapseguard.evaluation.metrics import auroc
from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.manifest import read_manifest, write_manifest
from collapseguard.training_data_tools.storage import store_chains


@pytest.fixture(scope="module")
def stored(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("breakdown")
    srcs = [("astronaut", photos[0][:96, :96]), ("coffee", photos[1][:96, :96]),
            ("chelsea", photos[2][:96, :96]), ("rocket", photos[3][:96, :96])]
    m = make_chains(srcs, ["noise_tint", "scattered_dots"], steps=20, keep=(0, 1, 5, 10, 20),
                    out_dir=root / "chains", workers=1, progress=False)
    kinds = {"astronaut": "portrait", "coffee": "photo", "chelsea": "photo", "rocket": "photo"}
    m = read_manifest(root / "chains").assign(kind=lambda d: d["source_image"].map(kinds))
    write_manifest(m, root / "chains" / "manifest.csv")
    store_chains(read_manifest(root / "chains"), ["png", "jpeg:90:420"], root / "stored")
    return root


@pytest.fixture(scope="module")
def evaluated(stored):
    out = stored / "eval"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(stored / "stored"), "--detectors", "cnn",
                                    "--out", str(out), "--no-plot", "-q", "--threads", "1"])
    assert res.exit_code == 0, res.output
    return out


def test_scores_carry_storage_and_kind(evaluated):
    s = pd.read_csv(evaluated / "scores.csv")
    assert set(s["storage"]) == {"png", "jpeg q90 4:2:0"}
    assert set(s["source_kind"]) == {"portrait", "photo"}


def test_auroc_by_storage_matches_the_scores(evaluated):
    s = pd.read_csv(evaluated / "scores.csv")
    t = pd.read_csv(evaluated / "auroc_by_storage.csv")
    for storage in ("png", "jpeg q90 4:2:0"):
        for fam in ("noise_tint", "scattered_dots"):
            g = s[(s["storage"] == storage) & (s["family"] == fam)]
            want = auroc(g.loc[g["step"].isin([0, 1]), "score"], g.loc[g["step"] == 10, "score"])
            row = t[(t["storage"] == storage) & (t["family"] == fam)]
            assert len(row) == 1 and row["k10"].iloc[0] == pytest.approx(want)
    f = pd.read_csv(evaluated / "failures_by_storage.csv")
    assert set(f["storage"]) == {"png", "jpeg q90 4:2:0"}
    assert f[f["family"] == "all"].groupby("storage")["evaluated"].sum().eq(8).all()  # 8 chains each


def test_kind_tables_and_drops_at_the_shipped_threshold(evaluated):
    from collapseguard.calibration.thresholds import default_calibration
    from collapseguard.detectors import create

    det = create("cnn")
    thr = default_calibration(det.name, str(det.version)).threshold
    s = pd.read_csv(evaluated / "scores.csv")
    k = pd.read_csv(evaluated / "auroc_by_kind.csv")
    assert set(k["source_kind"]) == {"portrait", "photo"}
    cd = pd.read_csv(evaluated / "clean_drops.csv")
    assert (cd["threshold"] == thr).all()
    row = cd[(cd["source_kind"] == "photo") & (cd["storage"] == "png")].iloc[0]
    clean = s[(s["step"] == 0) & (s["source_kind"] == "photo") & (s["storage"] == "png")]
    clean = clean.drop_duplicates("source_image")  # two chains of a source share its original
    assert row["n"] == 3 and row["dropped"] == int((clean["score"] > thr).sum())
    d = pd.read_csv(evaluated / "drops.csv")
    r = d[(d["storage"] == "jpeg q90 4:2:0") & (d["family"] == "noise_tint") & (d["step"] == 10)].iloc[0]
    g = s[(s["storage"] == "jpeg q90 4:2:0") & (s["family"] == "noise_tint") & (s["step"] == 10)]
    assert r["n"] == 4 and r["fraction"] == pytest.approx((g["score"] > thr).mean())
    md = (evaluated / "results.md").read_text()
    assert "## By storage" in md and "## By clean kind" in md and "Clean images dropped" in md
    summary = json.loads((evaluated / "summary.json").read_text())
    assert summary["thresholds"]["cnn"]["threshold"] == thr


def test_from_scores_gives_the_same_tables(evaluated, tmp_path):
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(evaluated / "scores.csv"),
                                    "--out", str(tmp_path), "--no-plot"])
    assert res.exit_code == 0, res.output
    assert "not used with --from-scores" not in res.output
    res_d = CliRunner().invoke(main, ["evaluate", "--from-scores", str(evaluated / "scores.csv"), "-d", "nss",
                                      "--out", str(tmp_path / "d"), "--no-plot"])
    assert res_d.exit_code == 0 and "note: --detector not used with --from-scores" in res_d.output, res_d.output
    for name in ("auroc_by_storage", "auroc_by_kind", "clean_drops", "drops", "failures_by_kind"):
        a, b = pd.read_csv(evaluated / f"{name}.csv"), pd.read_csv(tmp_path / f"{name}.csv")
        pd.testing.assert_frame_equal(a, b)


def test_storage_from_the_header_without_a_storage_column(stored, tmp_path):
    """A user's own chains (no storage column, no kind): storage is read from each file."""
    from PIL import Image

    m = read_manifest(stored / "chains").drop(columns=["kind"])
    rows = []
    for _, r in m[m["family"] == "noise_tint"].iterrows():
        p = tmp_path / "jpg" / f"{r['chain_id']}_{r['step']}.jpg"
        p.parent.mkdir(exist_ok=True)
        Image.open(r["path"]).save(p, quality=75, subsampling=0)
        rows.append({**r, "path": str(p)})
    write_manifest(pd.DataFrame(rows), tmp_path / "jpg" / "manifest.csv")
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(tmp_path / "jpg"), "--detectors", "nss",
                                    "--out", str(tmp_path / "ev"), "--no-plot", "-q", "--calibration", "none"])
    assert res.exit_code == 0, res.output
    s = pd.read_csv(tmp_path / "ev" / "scores.csv", keep_default_na=False)
    assert set(s["storage"]) == {"jpeg q75 4:4:4"} and set(s["source_kind"]) == {""}
    assert not (tmp_path / "ev" / "auroc_by_kind.csv").exists()  # no kinds: no kind tables
    assert not (tmp_path / "ev" / "drops.csv").exists()
    assert "## By clean kind" not in (tmp_path / "ev" / "results.md").read_text()


def test_drop_tables_count_each_original_once():
    s = pd.DataFrame({
        "detector": "d", "chain_id": ["a", "a", "b", "b"], "source_image": ["x", "x", "x", "x"],
        "family": ["f", "f", "g", "g"], "step": [0, 10, 0, 10], "score": [1.0, 5.0, 1.0, 0.5],
        "storage": "png", "source_kind": "photo"})
    cd = clean_drop_rates(s, {"d": 0.9})
    assert cd[(cd["source_kind"] == "photo") & (cd["storage"] == "png")]["n"].iloc[0] == 1
    d = drop_rates(s, {"d": 0.9})
    allrow = d[(d["family"] == "all") & (d["step"] == 0)].iloc[0]
    assert allrow["n"] == 1 and allrow["dropped"] == 1
    assert d[(d["family"] == "g") & (d["step"] == 10)]["fraction"].iloc[0] == 0.0
    assert np.isnan(drop_rates(s.assign(score=np.nan), {"d": 0.9})["fraction"]).all()
    assert drop_rates(s, {}).empty


def test_clean_steps_zero_compares_originals_only(evaluated, tmp_path):
    res = CliRunner().invoke(main, ["evaluate", "--from-scores", str(evaluated / "scores.csv"), "--out",
                                    str(tmp_path), "--no-plot", "--clean-steps", "0", "--calibration", "none"])
    assert res.exit_code == 0, res.output
    s = pd.read_csv(evaluated / "scores.csv")
    t = pd.read_csv(tmp_path / "auroc_by_storage.csv")
    g = s[(s["storage"] == "png") & (s["family"] == "noise_tint")]
    row = t[(t["storage"] == "png") & (t["family"] == "noise_tint")].iloc[0]
    assert row["n_clean"] == 4
    assert row["k5"] == pytest.approx(auroc(g.loc[g["step"] == 0, "score"], g.loc[g["step"] == 5, "score"]))
    assert "clean (steps 0) vs step k" in (tmp_path / "results.md").read_text()


def test_eval_set_figures_prints_the_family_mean_of_the_run(evaluated, benchmark_script, capsys):
    mod = benchmark_script("eval_set_figures.py")
    mod.main([str(evaluated)])  # one detector scored: no --detector needed
    out = capsys.readouterr().out
    t = pd.read_csv(evaluated / "auroc_by_storage.csv")
    fams = t[t["family"] != "all"]
    want = fams.groupby("storage")["k5"].mean()
    k5_table = out.split("AUROC clean vs step 5")[1].split("AUROC clean vs step 10")[0]
    row = next(line for line in k5_table.splitlines() if line.startswith("family mean")).split()[2:]
    assert [float(v) for v in row] == pytest.approx([want["png"], want["jpeg q90 4:2:0"]], abs=5e-4)
    assert "share of clean images (step 0) dropped" in out
    with pytest.raises(SystemExit, match="it scored \\['cnn'\\]"):
        mod.main([str(evaluated), "--detector", "nss"])


def test_eval_set_figures_kind_oracle_keeps_every_kind_under_the_target(evaluated, benchmark_script, capsys):
    mod = benchmark_script("eval_set_figures.py")
    s = pd.read_csv(evaluated / "scores.csv")
    for alpha in (0.0, 0.5):
        lines = mod.kind_oracle(s, "cnn", alpha)
        assert [ln.split(" | ")[0] for ln in lines] == ["png", "jpeg q90 4:2:0"]
        for line in lines:
            storage, t = line.split(" | ")[0], float(line.split("threshold ")[1].split()[0])
            clean = s[(s["storage"] == storage) & (s["step"] == 0)].drop_duplicates(["source_image", "storage"])
            t_exact = clean["score"][np.isclose(clean["score"], t, rtol=1e-5)].max()  # t is printed to 6 digits
            worst = clean.groupby("source_kind")["score"].apply(lambda v, t_exact=t_exact: (v > t_exact).mean()).max()
            assert worst <= alpha
            if alpha == 0.0:  # the lowest such threshold: the highest clean score
                assert t == pytest.approx(clean["score"].max(), rel=1e-5)
            ten = s[(s["storage"] == storage) & (s["step"] == 10)]
            assert float(line.split("step 10 dropped ")[1].split(":")[0]) == pytest.approx((ten["score"] > t).mean(),
                                                                                        abs=5e-4)
    mod.main([str(evaluated), "--kind-max-drop", "0.01"])
    assert "the lowest threshold dropping at most 0.01 of every clean kind" in capsys.readouterr().out



def test_eval_set_figures_top_clean_lists_each_kinds_highest_pictures(evaluated, benchmark_script, capsys):
    mod = benchmark_script("eval_set_figures.py")
    s = pd.read_csv(evaluated / "scores.csv")
    lines = mod.top_clean(s, "cnn", 2)
    clean = s[(s["step"] == 0) & (s["storage"] == "png")].drop_duplicates(["source_image", "storage"])
    kinds = {line.split(":")[0].strip(): line for line in lines[1:lines.index("jpeg q90 4:2:0:")]}
    assert lines[0] == "png:" and set(kinds) == set(clean["source_kind"])
    for kind, g in clean.groupby("source_kind"):
        want = g.sort_values("score", ascending=False).head(2)
        listed = kinds[kind].split(": ", 1)[1].split(", ")
        assert [x.rsplit(" ", 1)[0] for x in listed] == list(want["source_image"])
        assert [float(x.rsplit(" ", 1)[1]) for x in listed] == pytest.approx(list(want["score"]), abs=5e-3)
    mod.main([str(evaluated), "--top-clean", "1"])
    assert "the 1 highest-scoring clean pictures (step 0) of each kind" in capsys.readouterr().out


def test_eval_set_figures_kind_oracle_allows_exactly_alpha_of_a_kind(benchmark_script):
    """100 clean scores 0..99 and A = 0.29: 29 may be dropped (0.29 * 100 is 28.999... in floating
    point), so the lowest threshold is 70, not 71."""
    mod = benchmark_script("eval_set_figures.py")
    rows = [{"chain_id": f"c{i}", "source_image": f"s{i}", "family": "noise_tint", "step": 0, "storage": "png",
             "source_kind": "photo", "detector": "cnn", "score": float(i)} for i in range(100)]
    rows += [{"chain_id": f"c{i}", "source_image": f"s{i}", "family": "noise_tint", "step": 10, "storage": "png",
              "source_kind": "photo", "detector": "cnn", "score": float(i) + 0.5} for i in range(100)]
    line = mod.kind_oracle(pd.DataFrame(rows), "cnn", 0.29)[0]
    assert float(line.split("threshold ")[1].split()[0]) == 70.0


def test_the_runtime_is_chosen_and_named_and_scores_agree(stored, evaluated):
    """By default the cnn runs as filter runs it (onnxruntime on a CPU); --runtime torch runs the
    network as trained. Each report names what ran it beside its speed, and the scores agree."""
    out = stored / "eval_torch"
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(stored / "stored"), "--detectors", "cnn",
                                    "--out", str(out), "--no-plot", "-q", "--threads", "1",
                                    "--runtime", "torch"])
    assert res.exit_code == 0, res.output
    from collapseguard.detectors.cnn_family import set_default_runtime
    from collapseguard.evaluation.run import runtime_of
    restore = set_default_runtime("auto")  # what the default run picked on this machine
    try:
        auto = runtime_of(create("cnn"))
    finally:
        restore()
    assert f"`cnn` on {auto}" in (evaluated / "results.md").read_text()
    assert "`cnn` on torch" in (out / "results.md").read_text()
    a = pd.read_csv(evaluated / "scores.csv").sort_values("path")["score"].to_numpy()
    b = pd.read_csv(out / "scores.csv").sort_values("path")["score"].to_numpy()
    assert len(a) == len(b) > 0 and abs(a - b).max() < 1e-3
