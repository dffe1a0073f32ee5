"""recipes/compare_weights.py with worker processes, and recipes/compare_eval.py's rank figures,
on tiny real chains (noise that grows with the step) and the packaged comparator."""

import json

import numpy as np
import pandas as pd
import pytest
from cg_chains import make_tiny_chains
from safetensors.numpy import load_file

from collapseguard.detectors.compare import INPUTS, load_weights


def _fit(rec, manifest, work, out, workers, *more):
    return rec.main([str(manifest), "--work", str(work), "--out", str(out), "--clean", "art:4:64-96",
                     "--clean-copies", "1", "--alpha", "0.5", "--confidence", "0.5",
                     "--workers", str(workers), *more])


def test_compare_weights_describes_alike_in_worker_processes(tmp_path, recipe_script):
    chains = make_tiny_chains(tmp_path / "ch", n_sources=8, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_weights.py")
    for workers in (1, 2):
        assert _fit(rec, chains / "manifest.csv", tmp_path / f"w{workers}", tmp_path / f"c{workers}.st",
                    workers) == 0
    one, two = ([np.load(p) for p in sorted((tmp_path / f"w{k}").glob("descriptions-*.npz"))]
                for k in (1, 2))
    assert len(one) == len(two) == 1
    assert np.array_equal(one[0]["chain_rows"], two[0]["chain_rows"])
    np.testing.assert_array_equal(one[0]["chain_lad"], two[0]["chain_lad"])  # numpy: exact
    np.testing.assert_allclose(one[0]["chain_cnn"], two[0]["chain_cnn"], atol=1e-3)  # thread counts
    w1, w2 = load_file(tmp_path / "c1.st"), load_file(tmp_path / "c2.st")
    np.testing.assert_allclose(w1["w"], w2["w"], atol=1e-3)
    assert w1["w"][0] != 0  # the fit used the cnn input (not the all-zero untrained weights)


def test_compare_weights_cross_validates_input_sets(tmp_path, recipe_script):
    chains = make_tiny_chains(tmp_path / "ch", n_sources=12, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_weights.py")
    assert _fit(rec, chains / "manifest.csv", tmp_path / "w", tmp_path / "c.st", 1,
                "--choose-inputs", "cnn;all") == 0
    figures = json.loads((tmp_path / "w" / "figures.json").read_text())
    cv = figures["cross_validated_inputs"]
    assert sorted(cv) == sorted(["cnn", ",".join(INPUTS)])
    for got in cv.values():
        share, pairs = got["by_family_step0_vs_ge3"]["noise"]
        assert pairs > 0 and share == got["worst_step0_vs_ge3"]
        assert got["worst_step0_vs_ge3"] >= 0.75  # growing noise: every input set sees it
    with pytest.raises(SystemExit):
        _fit(rec, chains / "manifest.csv", tmp_path / "w", tmp_path / "c.st", 1, "--choose-inputs", "cnn;nope")


def test_compare_eval_ranks_growing_noise_and_flips_with_the_weights(tmp_path, recipe_script, capsys):
    chains = make_tiny_chains(tmp_path / "ch", n_sources=4, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_eval.py")
    rows, cnn, lad = rec.describe_manifest(str(chains / "manifest.csv"), tmp_path / "work", 10, 1)
    assert len(rows) == len(cnn) == len(lad) == 16
    t = load_weights()
    good = rec.rank_figures(rows, cnn, lad, t["w"], t["s"])
    assert good["step0_vs_ge3"]["noise"][1] == 4 * 2  # per picture: step 0 against steps 3 and 5
    assert good["step1_vs_5"]["noise"][1] == 4
    assert good["step0_vs_ge3_worst"] >= 0.875  # noise of 9-15 grey levels on a smooth picture
    bad = rec.rank_figures(rows, cnn, lad, -t["w"], t["s"])  # the same utilities, negated
    assert bad["step0_vs_ge3_worst"] == 1 - good["step0_vs_ge3_worst"]
    # cached: a second run describes nothing and prints the same figures as JSON
    assert list((tmp_path / "work").glob("eval-descriptions-*.npz"))
    assert rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work")]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["weights"] == "packaged" and printed["step0_vs_ge3_worst"] == good["step0_vs_ge3_worst"]
    assert pd.read_csv(chains / "manifest.csv")["step"].max() == 5
