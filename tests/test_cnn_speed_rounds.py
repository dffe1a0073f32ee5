"""benchmarks/cnn_speed.py times detectors in alternating rounds and compares rates within a round."""

from __future__ import annotations

import numpy as np


def test_rounds_alternate_order_and_ratios_pair_within_a_round(benchmark_script):
    mod = benchmark_script("cnn_speed.py")
    calls: list[str] = []
    # a "machine" that stalls once, on the 4th timing (a burst of steal time): only that round's
    # ratio may move, and the median over the rounds must not
    def timer(name):
        def t():
            calls.append(name)
            return {"a": 100.0, "b": 10.0}[name] / (4.0 if len(calls) == 4 else 1.0)
        return t

    rates = mod.rounds({"a": timer("a"), "b": timer("b")}, 5)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert len(rates["a"]) == len(rates["b"]) == 5
    med, lo, hi = mod.ratio_summary(rates, "a", "b")
    assert med == 10.0 and hi == 10.0
    assert np.isclose(lo, (100.0 / 4) / 10.0)  # round 2 (b, then a stalled)


def test_the_script_reports_medians_on_real_detectors(benchmark_script, capsys, monkeypatch):
    import pytest

    pytest.importorskip("pyiqa")
    mod = benchmark_script("cnn_speed.py")
    monkeypatch.setattr(mod, "test_images",
                        lambda n: [np.random.default_rng(i).integers(0, 256, (96, 128, 3), dtype=np.uint8)
                                   for i in range(n)])
    monkeypatch.setattr("sys.argv", ["cnn_speed.py", "--n", "4", "--rounds", "2", "--threads", "1"])
    mod.main()
    out = capsys.readouterr().out
    assert "2 alternating rounds" in out and "median of 2 rounds" in out
    assert "pyiqa:piqe" in out and "speed ratio cnn (48 crops)/piqe" in out
