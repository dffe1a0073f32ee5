"""benchmarks/detector_speed.py times detectors in rounds and compares rates within a round."""

from __future__ import annotations

import numpy as np
import pytest


def _images(n):
    return [np.random.default_rng(i).integers(0, 256, (96, 128, 3), dtype=np.uint8) for i in range(n)]


def test_a_stall_in_one_round_moves_only_that_rounds_ratio(benchmark_script):
    mod = benchmark_script("detector_speed.py")
    # rates of two detectors over 5 rounds; "a" stalled in round 2 (a burst of steal time)
    rates = {"a": [100.0, 100.0, 25.0, 100.0, 100.0], "b": [10.0] * 5}
    med, lo, hi = mod.ratio_summary(rates, "a", "b")
    assert med == 10.0 and hi == 10.0
    assert np.isclose(lo, 2.5)


def test_round_rates_on_real_detectors(benchmark_script):
    import torch

    from collapseguard.detectors import create

    torch.set_num_threads(1)
    mod = benchmark_script("detector_speed.py")
    dets = [create("cnn", device="cpu"), create("nss")]
    rates = mod.round_rates(dets, ["cnn", "nss"], _images(4), batch_size=2, n_rounds=3)
    assert set(rates) == {"cnn", "nss"}
    assert all(len(v) == 3 and all(r > 0 and np.isfinite(r) for r in v) for v in rates.values())


def test_the_script_reports_medians_and_crop_counts(benchmark_script, capsys, monkeypatch):
    pytest.importorskip("pyiqa")
    mod = benchmark_script("detector_speed.py")
    imgs, what = mod.test_images(2)  # the script's own 1024x768 pictures, from the bundled photos
    assert what == "bundled photos + procedural art" and [i.shape for i in imgs] == [(768, 1024, 3)] * 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # main() sets it for onnxruntime; restored after
    monkeypatch.setattr("sys.argv", ["detector_speed.py", "--n", "2", "--rounds", "2", "--threads", "1",
                                     "--detectors", "cnn,pyiqa:piqe", "--n-crops", "24", "48"])
    mod.main()
    out = capsys.readouterr().out
    assert "2 rounds" in out and "median of 2 rounds" in out
    assert "cnn (24 crops)" in out and "cnn (48 crops)" in out
    assert "speed ratio cnn (24 crops)/cnn (48 crops)" in out
    assert "speed ratio cnn (24 crops)/pyiqa:piqe" in out
