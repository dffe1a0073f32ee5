"""benchmarks/manifest_damage.py: PSNR per chain from real chains, and AUROC within damage bands
(the split that tells a detector missing visible damage from chains with next to none)."""

import numpy as np
import pandas as pd

from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.sources import procedural_art


def test_chain_psnr_on_real_chains(tmp_path, benchmark_script):
    mod = benchmark_script("manifest_damage.py")
    art = procedural_art(1, seed=3, min_side=64, max_side=64)
    flat = [("flat-grey", np.full((64, 64, 3), 128, np.uint8))]  # a copy of flat grey stays flat
    make_chains(art + flat, ["noise_tint", "contour_wrinkles"], steps=3, keep=(0, 3), out_dir=tmp_path,
                seed=0, workers=1, progress=False)
    t = mod.chain_psnr(str(tmp_path), 3).set_index("chain_id")
    assert len(t) == 4
    noisy = t[(t["family"] == "noise_tint") & (t["kind"] != "flat")]
    assert np.isfinite(noisy["psnr"]).all() and (noisy["psnr"] < 60).all()  # noise was added
    wr = t[(t["family"] == "contour_wrinkles") & (t["kind"] == "flat")]
    assert np.isinf(wr["psnr"]).all()  # no contour to wrinkle: pixel-identical, "no damage"
    assert mod.damage_band(float(wr["psnr"].iloc[0])) == "identical"


def test_auroc_by_damage_bands(benchmark_script):
    mod = benchmark_script("manifest_damage.py")
    per_chain = pd.DataFrame({"chain_id": ["a", "b", "c", "d"], "kind": ["wp", "wp", "art", "art"],
                              "psnr": [25.0, 45.0, 28.0, np.inf]})
    # a and c: the damaged step scores higher; b: lower (missed); d: identical images, equal scores
    scores = pd.DataFrame({"chain_id": list("aabbccdd"), "step": [0, 5] * 4,
                           "score": [0.0, 2.0, 1.0, 0.5, 0.2, 3.0, 1.5, 1.5]})
    t = mod.auroc_by_damage(per_chain, scores, 5).set_index(["kind", "band"])
    assert t.loc[("all", "< 30 dB"), "chains"] == 2
    assert t.loc[("all", "< 30 dB"), "auroc"] == 1.0  # {0.0, 0.2} vs {2.0, 3.0}
    assert t.loc[("wp", ">= 40 dB"), "auroc"] == 0.0
    assert t.loc[("art", "identical"), "auroc"] == 0.5  # a tie counts one half
    assert np.isnan(t.loc[("wp", "30-35 dB"), "auroc"]) and t.loc[("wp", "30-35 dB"), "chains"] == 0
    # over every chain: negatives {0, 1, 0.2, 1.5}, positives {2, 0.5, 3, 1.5}: 4 + 2 + 4 + 3.5 wins
    assert abs(t.loc[("all", "all"), "auroc"] - 13.5 / 16) < 1e-12
    assert mod.damage_band(float("nan")) == "resized" and mod.damage_band(35.0) == "35-40 dB"


def test_visible_criteria_counts_only_chains_damaged_past_each_cut(tmp_path, benchmark_script):
    mod = benchmark_script("manifest_damage.py")
    art = procedural_art(2, seed=4, min_side=64, max_side=64)
    flat = [("flat-grey", np.full((64, 64, 3), 128, np.uint8))]
    make_chains(art + flat, ["noise_tint", "contour_wrinkles"], steps=10, keep=(0, 5, 10), out_dir=tmp_path,
                seed=0, workers=1, progress=False)
    from collapseguard.training_data_tools.manifest import read_manifest

    m = read_manifest(tmp_path)
    p10 = mod.chain_psnr(str(tmp_path), 10).set_index("chain_id")["psnr"]
    # a stand-in detector that sees damage perfectly: score = how far the step is below 60 dB PSNR
    psnr_of = {k: mod.chain_psnr(str(tmp_path), k).set_index("chain_id")["psnr"] for k in (5, 10)}
    score = [0.0 if r.step == 0 else max(0.0, 60.0 - min(60.0, psnr_of[r.step][r.chain_id]))
             for r in m.itertuples()]
    scores = m.assign(score=score)[["chain_id", "step", "score"]]
    t = mod.visible_criteria(str(tmp_path), scores, np.array([0.0, 0.0, 0.0])).set_index("chains")
    assert t.loc["all chains", "n_clean"] == 6 + 3  # six chains' step 0 + three extra clean scores
    assert t.loc["all chains", "n_step10"] == 6
    assert t.loc["< 30 dB", "n_step10"] == int((p10 < 30).sum())
    assert np.isinf(p10).sum() == 1  # the flat grey's wrinkle chain: pixel-identical, in "all" only
    # identical chain: its step 10 scores 0 like every clean image; the others rank perfectly
    n = t.loc["all chains", "n_step10"]
    assert abs(t.loc["all chains", "auroc_0v10"] - ((n - 1) + 0.5) / n) < 1e-12
    assert t.loc["< 40 dB", "auroc_0v10"] == 1.0 and t.loc["< 40 dB", "clean_above_thr95_10"] == 0.0
