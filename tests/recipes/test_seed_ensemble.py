"""recipes/seed_ensemble.py: the mean of several weights' cached scores, ranked per family."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def _auroc(neg, pos) -> float:
    return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


def test_the_mean_of_two_weights_is_ranked_beside_each(tmp_path, recipe_script, capsys):
    rec = recipe_script("seed_ensemble.py")
    rng = np.random.default_rng(0)
    rows = [{"chain_id": f"{fam}{c}", "family": fam, "step": step, "storage": "png",
             "path": f"{fam}/{c}/step_{step:03d}.png"}
            for fam in ("noise_tint", "realesrgan") for c in range(6) for step in (0, 5, 10)]
    ev = pd.DataFrame(rows)
    ev.to_csv(tmp_path / "manifest.csv", index=False)
    files = [str(tmp_path / p) for p in ev["path"]]
    # two "seeds" that err on different images: each alone ranks worse than their mean
    truth = ev["step"].to_numpy() / 5.0
    a, b = truth + rng.normal(0, 1.5, len(ev)), truth + rng.normal(0, 1.5, len(ev))
    cache = tmp_path / "cache"
    cache.mkdir()
    pd.DataFrame({"path": files, "score": a}).to_csv(cache / "cnn-aaaaaaaaaaaa.csv", index=False)
    pd.DataFrame({"path": files, "score": b}).to_csv(cache / "cnn-bbbbbbbbbbbb.csv", index=False)
    assert rec.main(["--eval", str(tmp_path / "manifest.csv"), "--cache", str(cache),
                     "aaaaaaaaaaaa", "bbbbbbbbbbbb"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.split()}
    mean = (a + b) / 2
    held = ev["family"] == "realesrgan"  # a held-out network family; noise_tint the default one
    for name, s in (("aaaaaaaaaaaa", a), ("bbbbbbbbbbbb", b), ("mean", mean)):
        worst_held = _auroc(s[held & (ev["step"] == 0)], s[held & (ev["step"] == 10)])
        default = _auroc(s[~held & (ev["step"] == 0)], s[~held & (ev["step"] == 5)])
        assert [float(x) for x in lines[name]][:2] == pytest.approx([worst_held, default], abs=5e-4)
    # a version whose scores were never cached is named, not read as missing values
    with pytest.raises(SystemExit):
        rec.main(["--eval", str(tmp_path / "manifest.csv"), "--cache", str(cache), "cccccccccccc"])
    assert "cnn-cccccccccccc.csv is missing" in capsys.readouterr().err
