"""recipes/compare_weights.py (worker processes, cross-validated input sets) and
recipes/compare_eval.py's rank figures, on tiny real chains (noise that grows with the step) and
the packaged comparator."""

import json

import numpy as np
import pytest
from cg_chains import make_tiny_chains, smooth_art
from safetensors.numpy import load_file

from collapseguard.dedup.fit import describe_all, describer_pool, untrained_comparator
from collapseguard.detectors.compare import INPUTS, load_weights


def _fit(rec, manifest, work, out, workers, *more):
    return rec.main([str(manifest), "--work", str(work), "--out", str(out), "--clean", "art:4:64-96",
                     "--clean-copies", "1", "--alpha", "0.5", "--confidence", "0.5",
                     "--workers", str(workers), *more])


def test_describe_all_in_worker_processes_gives_each_images_own_description():
    rng = np.random.default_rng(3)
    images = [smooth_art(rng, 72 + 8 * i, 88) for i in range(5)]
    images[2] = np.clip(images[2] + rng.normal(0, 12, images[2].shape), 0, 255).astype(np.uint8)
    comp = untrained_comparator()
    here = describe_all(comp, images, batch=2)
    with describer_pool(2) as pool:
        there = describe_all(comp, images, batch=2, pool=pool)
    assert len(there) == len(images)
    for a, b in zip(here, there):  # in order, and the same up to the cnn's thread rounding
        np.testing.assert_array_equal(a["ladder"], b["ladder"])
        assert abs(a["cnn"] - b["cnn"]) < 1e-3
    assert len({round(d["cnn"], 3) for d in there}) == len(images)  # not one image's repeated


def test_compare_weights_fits_alike_with_worker_processes(tmp_path, recipe_script):
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
    assert w1["w"][INPUTS.index("cnn")] != 0  # fitted (the untrained weights are all 0)
    assert w1["w"][INPUTS.index("grad")] == 0  # not among the default inputs


def test_a_changed_manifest_is_described_again(tmp_path, recipe_script, capsys):
    chains = make_tiny_chains(tmp_path / "ch", n_sources=8, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_weights.py")
    assert _fit(rec, chains / "manifest.csv", tmp_path / "w", tmp_path / "c.st", 1) == 0
    assert "described" in capsys.readouterr().err
    assert _fit(rec, chains / "manifest.csv", tmp_path / "w", tmp_path / "c.st", 1) == 0
    assert "chain images" not in capsys.readouterr().err  # cached
    text = (chains / "manifest.csv").read_text().splitlines()
    (chains / "manifest.csv").write_text("\n".join(text[:-4]) + "\n")  # one chain fewer
    assert _fit(rec, chains / "manifest.csv", tmp_path / "w", tmp_path / "c.st", 1) == 0
    assert "described 56 chain images" in capsys.readouterr().err


def test_cross_validation_never_fits_on_the_fold_it_ranks(recipe_script, monkeypatch):
    rec = recipe_script("compare_weights.py")
    rng = np.random.default_rng(0)
    n = 300
    bucket = rng.uniform(0, 1, n)  # pairs' source pictures; >= 0.6 held out
    info = [(b >= 0.6, "noise", 0, 3, 0, b) for b in bucket]
    x = rng.normal(0, 1, (n, len(INPUTS)))
    x[:, INPUTS.index("cnn")] += 1.0  # the later step scores higher
    x[:, 0] = np.arange(n)  # each pair's row number, to trace it
    xi = rng.normal(0, 0.1, (40, len(INPUTS)))
    xi[:, 0] = -1
    xi_bucket = rng.uniform(0, 0.6, 40)
    seen = []
    real = rec.fit_pairs

    def spy(xs, xis, used, weight):
        seen.append(set(xs[:, 0].astype(int)))
        return real(xs, xis, used, weight)

    monkeypatch.setattr(rec, "fit_pairs", spy)
    out = rec.cross_validate([["cnn"]], x, info, xi, xi_bucket, 1.0)
    fold = np.minimum((bucket / rec.FIT_SHARE * 3).astype(int), 2)
    assert len(seen) == 3
    for k, rows in enumerate(seen):
        ranked = set(np.flatnonzero((bucket < 0.6) & (fold == k)))
        assert rows and not rows & ranked  # never the fold it ranks
        assert not rows & set(np.flatnonzero(bucket >= 0.6))  # never the held-out pictures
    share, pairs = out["cnn"]["by_family_step0_vs_ge3"]["noise"]
    assert pairs == int((bucket < 0.6).sum()) and share > 0.7  # cnn + 1 standard deviation
    empty = [(b >= 0.6, "noise", 0, 3, 0, min(b, 0.1)) for b in bucket]  # every fit pair in fold 0
    with pytest.raises(ValueError, match="fold"):
        rec.cross_validate([["cnn"]], x, empty, xi, xi_bucket, 1.0)


def test_compare_weights_cross_validates_input_sets(tmp_path, recipe_script):
    chains = make_tiny_chains(tmp_path / "ch", n_sources=12, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_weights.py")
    assert _fit(rec, chains / "manifest.csv", tmp_path / "w", tmp_path / "c.st", 1,
                "--choose-inputs", "cnn;all") == 0
    cv = json.loads((tmp_path / "w" / "figures.json").read_text())["cross_validated_inputs"]
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
    no15 = rec.rank_figures(rows[rows["step"] != 5], cnn, lad, t["w"], t["s"])  # no step 5
    assert no15["step1_vs_5"] == {} and no15["step1_vs_5_worst"] is None
    assert no15["step0_vs_ge3"]["noise"][1] == 4
    capsys.readouterr()
    assert rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work")]) == 0
    out, err = capsys.readouterr()
    assert "described" not in err  # cached
    printed = json.loads(out.strip().splitlines()[-1])
    assert printed["weights"] == "packaged" and printed["step0_vs_ge3_worst"] == good["step0_vs_ge3_worst"]
    with pytest.raises(SystemExit):
        rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work"), "--max-step", "3"])


def test_compare_pairnet_learns_the_labelled_direction_is_antisymmetric_and_reloads(tmp_path, recipe_script, capsys):
    import pandas as pd
    import torch

    chains = make_tiny_chains(tmp_path / "ch", n_sources=10, steps=(0, 1, 4, 5), families=("noise",))
    m = pd.read_csv(chains / "manifest.csv")
    m.assign(step=5 - m["step"]).to_csv(chains / "reversed.csv", index=False)  # later = less noise
    rec = recipe_script("compare_pairnet.py")
    opts = ["--steps", "300", "--batch", "16", "--crop", "32", "--crops", "2", "--width", "16", "--side", "64"]
    first = {}
    for name in ("manifest", "reversed"):
        args = [str(chains / f"{name}.csv"), "--work", str(tmp_path / name), *opts]
        assert rec.main(args) == 0
        out, err = capsys.readouterr()
        assert "trained in" in err
        first[name] = json.loads(out.strip().splitlines()[-1])
        ho = first[name]["held_out"]
        assert ho["step0_vs_ge3"]["by_family"]["noise"][1] > 0  # some pictures are held out
        # either direction is learnt; a net that did not learn orders both alike (its sign is fixed)
        assert ho["step0_vs_ge3"]["worst"] >= 0.75 and ho["step1_vs_5"]["worst"] >= 0.7
    assert rec.main(args) == 0  # the same arguments load the weights written
    out, err = capsys.readouterr()
    assert "trained in" not in err and json.loads(out.strip().splitlines()[-1]) == first["reversed"]

    net = rec.PairNet(16)
    net.load_state_dict(torch.load(first["manifest"]["weights"], weights_only=True))
    rng = np.random.default_rng(1)
    a = smooth_art(rng, 70, 90)
    b = np.clip(a + rng.normal(0, 12, a.shape), 0, 255).astype(np.uint8)
    ab, ba = rec.pair_logits(net.eval(), [(a, b), (b, a)], 32, 2)
    assert ab > 0 and abs(ab + ba) < 1e-5  # swapping the pair negates the logit
    small = rec.reduced(b, 40)  # a reduced copy is aligned to the other's size
    assert max(small.shape[:2]) == 40 and rec.aligned(a, small).shape == a.shape


def test_compare_eval_bands_pairs_by_how_much_the_damage_changed_the_picture(tmp_path, recipe_script, capsys):
    from PIL import Image

    chains = make_tiny_chains(tmp_path / "ch", n_sources=4, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_eval.py")
    rows, cnn, lad = rec.describe_manifest(str(chains / "manifest.csv"), tmp_path / "work", 10, 1)
    psnr = rec.content_psnr(rows, tmp_path / "work")
    a, b = (np.asarray(Image.open(chains / "noise" / f"noise-0_{k}.png"), np.float64) for k in (0, 5))
    want = 10 * np.log10(255.0 ** 2 / np.mean((a - b) ** 2))
    assert psnr[("noise-0", 0, 5)] == psnr[("noise-0", 5, 0)] == pytest.approx(want)
    assert psnr[("noise-0", 0, 3)] > psnr[("noise-0", 0, 5)]  # more noise, further from step 0
    t = load_weights()
    u = rec.utilities(rows, cnn, lad, t["w"], t["s"])
    cut = float(np.median([psnr[(f"noise-{i}", 0, k)] for i in range(4) for k in (3, 5)]))
    figures = rec.psnr_band_figures(rows, u, psnr, [cut])
    bands = figures["noise"]
    assert sum(n for _, n in bands.values()) == 4 * 2 and figures["pairs_without_psnr"] == 0
    below = sum(psnr[(f"noise-{i}", 0, k)] < cut for i in range(4) for k in (3, 5))
    assert bands[f"<{cut:g}"][1] == below and bands[f">={cut:g}"][1] == 8 - below  # each in its band
    assert rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work"), "--psnr-bands", "30,40"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sum(n for _, n in printed["step0_vs_ge3_by_psnr"]["noise"].values()) == 8
    with pytest.raises(SystemExit):
        rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work"), "--psnr-bands", "3O"])


def test_compare_pairnet_families_read_what_a_filtered_manifest_reads(tmp_path, recipe_script):
    import pandas as pd

    chains = make_tiny_chains(tmp_path / "ch", n_sources=3, steps=(0, 1, 3), families=("noise", "grain2"))
    m = pd.read_csv(chains / "manifest.csv")
    m[m["family"] == "grain2"].to_csv(chains / "grain2.csv", index=False)
    rec = recipe_script("compare_pairnet.py")
    rows_f, made_f, copy_f = rec.load_chains([str(chains / "grain2.csv")], 64, 0)
    rows, made, copy = rec.load_chains([str(chains / "manifest.csv")], 64, 0, ["grain2"])
    assert list(rows["path"]) == list(rows_f["path"]) and len(rows) == 9
    assert all(np.array_equal(a, b) for a, b in zip(made + copy, made_f + copy_f))  # the same copies too
    with pytest.raises(SystemExit, match="no chains of nope"):
        rec.load_chains([str(chains / "manifest.csv")], 64, 0, ["grain2", "nope"])


def test_compare_eval_describes_with_another_cnn_and_skips_weights_fitted_on_its_own(
        tmp_path, recipe_script, capsys):
    from importlib import resources

    chains = make_tiny_chains(tmp_path / "ch", n_sources=3, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_eval.py")
    other = str(resources.files("collapseguard") / "weights" / "cnn.safetensors")
    _, own_cnn, own_lad = rec.describe_manifest(str(chains / "manifest.csv"), tmp_path / "w", 10, 1)
    _, cnn, lad = rec.describe_manifest(str(chains / "manifest.csv"), tmp_path / "w", 10, 1, other)
    np.testing.assert_array_equal(lad, own_lad)  # the features do not depend on the cnn
    assert not np.allclose(cnn, own_cnn, atol=1e-3)  # its own cache entry, another cnn's scores
    capsys.readouterr()
    assert rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "w"), "--cnn", other]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "" and "fitted on cnn" in err and "skipped" in err  # packaged: the own cnn's


def test_compare_mlp_fits_both_models_on_the_same_descriptions(tmp_path, recipe_script, capsys):
    chains = make_tiny_chains(tmp_path / "ch", n_sources=10, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_mlp.py")
    common = [str(chains / "manifest.csv"), "--work", str(tmp_path / "w"), "--eval",
              str(chains / "manifest.csv"), "--eval-work", str(tmp_path / "ew"), "--steps", "150"]
    got = {}
    for hidden in ("0", "8"):
        assert rec.main([*common, "--hidden", hidden]) == 0
        got[hidden] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(tmp_path.joinpath("w").glob("descriptions-*.npz"))  # compare_weights.py's cache
    for out in got.values():
        for ranking in ("eval_borda", "eval_group_ctx"):
            fam = out[ranking]["step0_vs_ge3"]["by_family"]
            assert list(fam) == ["noise"] and out[ranking]["step0_vs_ge3"]["worst"] == fam["noise"]
    lin = got["0"]["eval_group_ctx"]["step0_vs_ge3"]["worst"]
    assert lin >= 0.75  # growing noise: the linear model orders it
    assert got["0"]["eval_borda"]["step0_vs_ge3"]["worst"] == lin  # linear: both rankings agree


def test_a_cnn_mix_fit_names_its_mix_and_is_ranked_only_with_it(tmp_path, recipe_script, capsys):
    from collapseguard.detectors.compare import Comparator, comparator_cnn

    chains = make_tiny_chains(tmp_path / "ch", n_sources=8, steps=(0, 1, 3, 5), families=("noise",))
    fit = recipe_script("compare_weights.py")
    assert _fit(fit, chains / "manifest.csv", tmp_path / "w", tmp_path / "m.st", 1, "--cnn-mix", "0.5") == 0
    t = load_weights(tmp_path / "m.st")
    assert t["meta"]["cnn_mix"] == "0.5" and t["meta"]["cnn"] == comparator_cnn(0.5).version
    assert sorted((tmp_path / "w").glob("other-cnn-chains-*.npz"))  # the shipped cnn's scores, cached
    assert Comparator(weights=str(tmp_path / "m.st")).cnn.mix == 0.5
    # the same chains without the mix fit other weights (the mix reaches the fit's cnn input)
    assert _fit(fit, chains / "manifest.csv", tmp_path / "w", tmp_path / "p.st", 1) == 0
    assert not np.allclose(load_weights(tmp_path / "p.st")["w"], t["w"], atol=1e-4)
    ev = recipe_script("compare_eval.py")
    capsys.readouterr()
    args = [str(chains / "manifest.csv"), "--work", str(tmp_path / "e"), "--weights", str(tmp_path / "m.st")]
    assert ev.main(args) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "" and "skipped" in err  # described with the plain cnn: not its input
    assert ev.main([*args, "--cnn-mix", "0.5"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["inputs"] == "cnn,sat,hf,flat,cast" and figures["step0_vs_ge3_worst"] is not None


def test_pair_residual_tells_noise_spread_everywhere_from_smoothing_along_edges(tmp_path, recipe_script, photos, capsys):
    import pandas as pd
    from PIL import Image
    from scipy import ndimage

    rec = recipe_script("compare_pair_residual.py")
    root = tmp_path / "chains"
    rng = np.random.default_rng(0)
    for fam in ("noise", "blur"):
        rows = []
        for i, img in enumerate(photos[:3]):
            for step in (0, 1, 5, 10):
                if fam == "noise":
                    out = img + rng.normal(0, 2.0 * step, img.shape)
                else:
                    out = ndimage.gaussian_filter(img.astype(float), (0.25 * step, 0.25 * step, 0))
                path = f"{fam}/{i}_{step}.png"
                (root / fam).mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.clip(out, 0, 255).astype(np.uint8)).save(root / path)
                rows.append({"chain_id": f"{fam}{i}", "family": fam, "step": step, "path": path})
        pd.DataFrame(rows).to_csv(root / f"manifest_{fam}.csv", index=False)
    assert rec.main([str(root), "--work", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    pairs = pd.concat([pd.read_csv(f) for f in sorted((tmp_path / "w").glob("pairs-*.csv"))])
    assert len(pairs) == 2 * 3 * 3  # two families, three chains, three pairs each
    by = pairs[pairs["sa"] == 0].groupby("family")
    assert (by.get_group("noise")["dh"] > 0).all() and (by.get_group("blur")["dh"] < 0).all()
    # the noise's difference is spread over flat areas as over edges, the blur's follows edges
    assert by.get_group("noise")["r"].max() < by.get_group("blur")["r"].min()
    assert (by.get_group("blur")["comp"] > 0).all()  # the packaged comparator orders blur right
    assert "0v5+ worst:" in out and "comp+pair" in out


def test_drift_scores_rank_along_the_path_and_take_the_direction_from_the_utilities(recipe_script):
    rec = recipe_script("compare_drift.py")
    rng = np.random.default_rng(5)
    origin, way = rng.normal(128, 30, 48), rng.normal(0, 1, 48)
    step = np.array([3, 0, 5, 1, 2, 4])  # copies given out of order
    thumbs = origin + 6.0 * step[:, None] * way
    # utilities that trend with the step but misorder neighbours (1 and 2, 3 and 4)
    u = np.array([0.45, 0.0, 0.6, 0.25, 0.2, 0.4])
    assert list(step[np.argsort(rec.drift_scores(u, thumbs))]) == [0, 1, 2, 3, 4, 5]  # the geometry's order
    assert list(step[np.argsort(u)]) != [0, 1, 2, 3, 4, 5]
    assert list(step[np.argsort(rec.drift_scores(-u, thumbs))]) == [5, 4, 3, 2, 1, 0]  # direction: u's
    two = np.array([0.7, 0.1])
    np.testing.assert_array_equal(rec.drift_scores(two, thumbs[:2]), two)  # no geometry in a pair
    # a copy whose thumbnail is the root's own (a lossless copy) ranks after the root, not before
    same = np.vstack([thumbs[1], thumbs])  # the step-0 thumbnail again, first in the group
    order = np.argsort(rec.drift_scores(np.concatenate([[0.1], u]), same), kind="stable")
    assert order[0] == 2 and order[1] == 0
    # min-root keeps the comparator's least degraded copy first and orders the rest by the geometry
    assert list(step[np.argsort(rec.ranked("min-root", -u, thumbs))]) == [5, 4, 3, 2, 1, 0]
    assert list(step[np.argsort(rec.ranked("min-root", u, thumbs))]) == [0, 1, 2, 3, 4, 5]


def test_compare_drift_prints_both_rankings_for_every_setting(tmp_path, recipe_script, capsys):
    chains = make_tiny_chains(tmp_path / "ch", n_sources=4, steps=(0, 1, 3, 5), families=("noise",))
    rec = recipe_script("compare_drift.py")
    assert rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work"), "--draws", "1",
                     "--clean-level", str(tmp_path / "fit"), "--clean", "art:3:64-96",
                     "--alpha", "0.5", "--confidence", "0.5"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    level = lines.pop()["clean_level"]
    means = lines.pop()["mean_over_draws"]
    assert means["full"]["drift"]["step0_vs_ge3"]["worst"] == lines[1]["step0_vs_ge3"]["worst"]  # one draw
    assert level["clean_groups"] == 3
    for rule in ("utility", "drift"):  # three groups: the level is the highest of their maxima
        assert 0.5 <= level[rule]["level"] < 1 and level[rule]["k"] >= 1
    # a picture and two harmless copies: the slope's root is the comparator's kept copy in every
    # group (a root chosen by the wrong end of the slope moves it), so both rules set one level
    assert level["kept_copy_moved"] == 0 and level["drift"] == level["utility"]
    assert list((tmp_path / "fit").glob("clean-*.npz"))
    assert [(r["setting"], r["ranking"]) for r in lines] == [
        (s, k) for s in ("full", "one_storage", "chain3", "chain6") for k in ("utility", "drift")]
    full = lines[0]
    assert full["images"] == 16 and full["step0_vs_ge3"]["worst"] >= 0.875  # as compare_eval ranks them
    assert 0.75 <= full["kept_step0"] <= 1  # 4 pictures: step 0 first in at least 3 (noise grows with the step)
    drift = lines[1]  # along a noise chain the geometry agrees with the comparator
    assert drift["images"] == 16 and drift["step0_vs_ge3"]["worst"] >= 0.875 and drift["kept_step0"] >= 0.75
    assert list((tmp_path / "work").glob("eval-thumbs-*.npz"))
    for variant in ("corr", "root-only", "cov", "cos", "min-root"):  # the other rankings, full groups only
        assert rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work"),
                         "--settings", "full", "--variant", variant]) == 0
        out = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
        assert [(r["setting"], r["ranking"]) for r in out[:-1]] == [("full", "utility"), ("full", "drift")]
        assert out[0]["step0_vs_ge3"] == full["step0_vs_ge3"]  # the comparator's figures do not move
    with pytest.raises(SystemExit):
        rec.main([str(chains / "manifest.csv"), "--work", str(tmp_path / "work"), "--settings", "chain9"])
