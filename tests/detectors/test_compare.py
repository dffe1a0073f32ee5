"""The pairwise comparator (``compare``): antisymmetric by construction, shipped weights with a
calibrated level, and on real photos it ranks a re-rendered copy below its original whatever
the storage and size of either copy."""

from __future__ import annotations

import numpy as np
import pytest
from cg_testutil import degrade

from collapseguard.dedup.copies import resized, stored
from collapseguard.detectors import create
from collapseguard.detectors.compare import load_weights


@pytest.fixture(scope="module")
def comp():
    return create("compare")


def test_swapping_the_pair_swaps_the_probability(comp, photos):
    a, b = photos[0], degrade(photos[0], seed=1)
    p, q = comp.compare(a, b), comp.compare(b, a)
    assert p + q == pytest.approx(1.0, abs=1e-9)
    assert comp.compare(a, a) == pytest.approx(0.5)


@pytest.mark.parametrize("storage", ["png", "jpeg:90:420", "jpeg:75:420", "webp:80"])
def test_a_re_rendered_copy_is_worse_whatever_its_storage_and_size(comp, photos, storage):
    for i, img in enumerate(photos[:3]):
        damaged = degrade(img, rounds=6, seed=i)
        _, copy = stored(resized(damaged, 0.8), storage)
        assert comp.compare(img, copy) > 0.5, (i, storage)


def test_shipped_weights_carry_the_calibrated_level_and_its_guarantee():
    t = load_weights()
    level = float(t["meta"]["level"])
    assert 0.5 < level < 1.0
    assert "clean-only groups" in t["meta"]["guarantee"]
    assert np.isfinite(t["w"]).all() and (t["s"] > 0).all()


def test_descriptions_from_a_scores_row_give_the_same_probability(comp, photos):
    from collapseguard.detectors.compare import description_from_row

    imgs = [photos[1], degrade(photos[1], seed=3)]
    detail = comp.score_detailed(imgs)
    rows = [{k: v[i] for k, v in detail.items()} for i in range(2)]
    a, b = (description_from_row(r) for r in rows)
    assert comp.prob(a, b) == pytest.approx(comp.compare(*imgs), abs=1e-9)


def test_only_the_features_the_weights_read_are_computed_and_the_probability_is_unchanged(comp, photos):
    from collapseguard.detectors.compare import FEATURES, pair_inputs
    from collapseguard.detectors.pair_features import ladder

    assert comp.features_used == {f for f, w in zip(FEATURES, comp.w) if w != 0}
    assert comp.features_used < set(FEATURES)  # the shipped weights ignore some features
    a, b = photos[0], degrade(photos[0], rounds=4, seed=3)
    da, db = comp.describe([a, b])
    # the filters (gradient, median, local variance) of unread features are never run
    skipped = [j for j, f in enumerate(FEATURES)
               if f in ("grad", "noise", "impulse", "texture") and f not in comp.features_used]
    assert skipped and np.isnan(da["ladder"][:, skipped]).all()
    full_a = {"cnn": da["cnn"], "ladder": ladder(a)}
    full_b = {"cnn": db["cnn"], "ladder": ladder(b)}
    assert not np.isnan(full_a["ladder"][-1]).any()
    x_full = np.dot(comp.w, pair_inputs(full_a, full_b) / comp.s)
    x_used = np.dot(comp.w, pair_inputs(da, db) / comp.s)
    assert x_used == pytest.approx(x_full, rel=1e-12, abs=1e-12)
    # the description's version names the features, so kept descriptions of another set are not reused
    untrained = create("compare").__class__(untrained=True, cnn=comp.cnn)
    assert untrained.features_used is None
    assert untrained.description_version != comp.description_version
