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
