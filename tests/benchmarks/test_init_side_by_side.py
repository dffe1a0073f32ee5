"""benchmarks/init_side_by_side.py: the ensemble of weights files puts members on one scale."""

from __future__ import annotations

import numpy as np
import pandas as pd


def _member(rng, scale, shift, good_family):
    """Scores of one detector on 2 families x 60 chains x steps 0/5/10 (+ 20 clean files):
    it separates ``good_family``'s damage well and not the other's."""
    rows, sc = [], []
    for fam in ("a", "b"):
        for c in range(60):
            for step in (0, 5, 10):
                rows.append({"family": fam, "chain_id": f"{fam}{c}", "step": step})
                gain = 2.0 if fam == good_family else 0.0
                sc.append(rng.normal() + gain * (step > 0))
    chain = scale * np.array(sc) + shift
    clean = scale * rng.normal(size=20) + shift
    return pd.DataFrame(rows), {"png": (chain, clean)}


def test_the_ensemble_does_not_depend_on_a_members_scale_and_helps_where_they_differ(benchmark_script):
    mod = benchmark_script("init_side_by_side.py")
    test_df, a = _member(np.random.default_rng(0), 1.0, 0.0, "a")
    _, b = _member(np.random.default_rng(1), 1.0, 0.0, "b")
    _, b_big = _member(np.random.default_rng(1), 1000.0, 50.0, "b")  # same ranking, other scale
    ens, _ = mod.ensemble_scores([(a, None), (b, None)], test_df)
    ens_big, _ = mod.ensemble_scores([(a, None), (b_big, None)], test_df)
    np.testing.assert_allclose(ens["png"][0], ens_big["png"][0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ens["png"][1], ens_big["png"][1], rtol=1e-9, atol=1e-9)
    # a plain sum would let the large-scale member decide alone; the standardised mean does not
    fam = mod.family_aurocs(test_df.assign(score=ens_big["png"][0]))
    naive = mod.family_aurocs(test_df.assign(score=a["png"][0] + b_big["png"][0]))
    assert fam["a"][0] > naive["a"][0] + 0.1
    worst = {name: min(mod.family_aurocs(test_df.assign(score=m["png"][0]))[f][0] for f in "ab")
             for name, m in (("a", a), ("b", b))}
    assert min(fam["a"][0], fam["b"][0]) > max(worst.values()) + 0.15


def test_the_eval_report_gives_each_clean_kind_its_share_above_the_threshold(benchmark_script, capsys):
    mod = benchmark_script("init_side_by_side.py")
    test_df, a = _member(np.random.default_rng(0), 1.0, 0.0, "a")
    thr = float(np.quantile(mod.clean_png_scores(a, test_df), 0.99))
    # evaluation chains of two kinds: every "leafy" step 0 scores above the threshold, no "flat" one
    rows, ev_scores = [], []
    for kind, step0 in (("leafy", thr + 1.0), ("flat", thr - 5.0)):
        for c in range(4):
            for step in (0, 5, 10):
                rows.append({"family": "a", "chain_id": f"{kind}{c}", "step": step, "kind": kind,
                             "storage": "png"})
                ev_scores.append(step0 if step == 0 else thr + step)
    res = mod.report({}, a, np.array(ev_scores), test_df, pd.DataFrame(rows))
    assert res["eval"]["png"]["step0_above_by_kind"] == {"flat": 0.0, "leafy": 1.0}
    assert res["eval"]["png"]["step0_above"] == 0.5
    assert "largest 1.000" in capsys.readouterr().out


def test_gap_poolings_and_damage_size(benchmark_script, tmp_path):
    mod = benchmark_script("init_side_by_side.py")
    from PIL import Image

    # constant crop logits: every pooling is that constant; a soft max/min lean to the extremes
    flat = mod.pool_features(np.full((1, 24), 1.5), np.zeros(1))[0]
    np.testing.assert_allclose(flat[:4], 1.5, atol=1e-9)
    spread = mod.pool_features(np.array([[0.0, 10.0]]), np.array([0.25]))[0]
    assert spread[1] > 9.0 and spread[2] < 1.0 and spread[0] == 5.0 and spread[4] == 0.25
    # damage size: noise of sigma 8 on a flat picture is ~30 dB; a chain whose size changes is left out
    rng = np.random.default_rng(0)
    base = np.full((64, 64, 3), 128, np.uint8)
    rows = []
    for fam, later in (("noisy", lambda: np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)),
                       ("cropped", lambda: base[:48])):
        for step in (0, 5, 10):
            path = tmp_path / f"{fam}_{step}.png"
            Image.fromarray(base if step == 0 else later()).save(path)
            rows.append({"family": fam, "chain_id": fam, "step": step, "path": str(path), "storage": "png"})
    dmg = mod.damage_size(pd.DataFrame(rows)).set_index("family")
    assert abs(dmg.loc["noisy", "PSNR step 5 (dB)"] - 20 * np.log10(255 / 8)) < 0.5
    assert dmg.loc["cropped", "chains same size"] == 0 and np.isnan(dmg.loc["cropped", "PSNR step 5 (dB)"])
