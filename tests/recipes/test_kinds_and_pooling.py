"""recipes/kind_thresholds.py and recipes/crop_pooling.py: the parts their tables rest on."""

import numpy as np
import pandas as pd
import pytest
from skimage import data

from collapseguard.calibration.bounds import order_statistic_threshold


def test_threshold_is_the_bound_where_it_exists_and_the_largest_score_below(recipe_script):
    rec = recipe_script("kind_thresholds.py")
    rng = np.random.default_rng(0)
    many = rng.normal(size=1000)
    t, n, k, rate = rec.threshold(many, 0.95)
    ref = order_statistic_threshold(many, 0.01, 0.95)
    assert (t, n, k) == (ref.threshold, ref.n, ref.k) and rate == pytest.approx(ref.guaranteed_false_drop)
    few = rng.normal(size=40)  # the bound needs 299: the largest score, and the weaker rate it guarantees
    t, n, k, rate = rec.threshold(few, 0.95)
    assert (t, n, k) == (few.max(), 40, 1) and 0.05 < rate < 0.1
    t, _, k, _ = rec.threshold(many, 0.95, rule="quantile")  # k = ceil(alpha n)
    assert k == 10 and t == np.sort(many)[::-1][9]


def test_folds_keep_a_package_together_and_spread_pictures(recipe_script):
    rec = recipe_script("kind_thresholds.py")
    rows = pd.DataFrame({"package": ["a"] * 6 + ["b"] * 4 + ["c"] * 3 + ["d"] * 2,
                         "picture": [f"p{i}" for i in range(15)]})
    by_pkg = rec.folds(rows, 3)
    assert all(len(set(by_pkg[rows["package"] == p])) == 1 for p in "abcd")
    assert sorted(np.bincount(by_pkg).tolist()) == [4, 5, 6]  # a(6) | b(4) | c(3)+d(2)
    by_pic = rec.folds(rows, 3, "picture")
    assert np.bincount(by_pic).tolist() == [5, 5, 5]


def test_web_scores_read_a_score_cache_or_a_table_and_refuse_gaps(recipe_script):
    rec = recipe_script("kind_thresholds.py")
    manifest = pd.DataFrame({"name": ["b", "a"], "png": ["/w/png/b.png", "/w/png/a.png"],
                             "jpeg90": ["/w/jpeg90/b.jpg", "/w/jpeg90/a.jpg"]})
    cache = pd.DataFrame({"path": ["/w/png/a.png", "/e/x.png", "/w/jpeg90/a.jpg", "/w/png/b.png",
                                   "/w/jpeg90/b.jpg"], "score": [1.0, 9.0, 2.0, 3.0, 4.0]})
    got = rec.web_scores(manifest, cache)
    assert got["png"].tolist() == [3.0, 1.0] and got["jpeg90"].tolist() == [4.0, 2.0]
    table = pd.DataFrame({"name": ["a", "b"], "png": [1.0, 3.0], "jpeg90": [2.0, 4.0]})
    assert rec.web_scores(manifest, table).equals(got)
    with pytest.raises(SystemExit, match="1 of 2 pictures"):
        rec.web_scores(manifest, cache[cache["path"] != "/w/jpeg90/b.jpg"])


def test_kind_features_tell_a_flat_drawing_from_a_photo(recipe_script, photos):
    rec = recipe_script("kind_thresholds.py")
    drawing = np.full((256, 256, 3), 255, np.uint8)
    drawing[40:200, 60:70] = (0, 0, 0)
    drawing[100:110, 20:240] = (200, 30, 30)
    f_draw = dict(zip(rec.FEATURES, rec.kind_features(drawing)))
    for photo in photos:
        f_photo = dict(zip(rec.FEATURES, rec.kind_features(photo)))
        assert f_draw["log_colours"] < 1 and f_photo["log_colours"] > 3.5  # < 10 colours, > 3,000
        assert f_draw["flat0"] > 0.9 and f_photo["flat0"] < 0.5
        assert f_draw["axis_edges"] > f_photo["axis_edges"]
    assert len(rec.kind_features(drawing)) == len(rec.FEATURES)


def test_crop_pooling_reads_the_shipped_score_and_its_parts(recipe_script):
    torch = pytest.importorskip("torch")
    rec = recipe_script("crop_pooling.py")
    from collapseguard.detectors import create

    det = create("cnn")
    img = data.astronaut()[:300, :400]
    out = rec.read(det.net.eval(), img, max_tiles=96)
    assert out["grid24"] == pytest.approx(float(det.score([img])[0]), abs=1e-4)
    assert out["grid24"] == pytest.approx(out["grid24.crops"] + out["grid24.context"], abs=1e-4)
    assert out["tiles"] == 7 * 9  # ceil(300/48) x ceil(400/48) tiles of 48 px
    assert out["dense.max"] >= out["dense.q90"] >= out["dense.q75"]
    assert out["grid24-whole"] == pytest.approx(out["grid24"] - out["whole"])
    with torch.inference_mode():
        small = rec.read(det.net.eval(), img[:60, :60], max_tiles=96)
    assert small["tiles"] == 4 and np.isfinite(list(small.values())).all()
