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


def _top_octave_by_definition(img: np.ndarray, window: int) -> float:
    """``top_octave`` as its docstring defines it, written plainly (float64 box means)."""
    h, w = img.shape[:2]
    top, left = max(0, (h - window) // 2), max(0, (w - window) // 2)
    x = img[top: top + window, left: left + window].astype(np.float64)
    y = (x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114) / 255.0

    def energy(a):
        lap = a[1:-1, :-2] + a[1:-1, 2:] + a[:-2, 1:-1] + a[2:, 1:-1] - 4 * a[1:-1, 1:-1]
        return (lap * lap).mean()

    coarse = []
    for o in (0, 1):
        a = y[o:, o:]
        hh, ww = a.shape[0] // 2 * 2, a.shape[1] // 2 * 2
        coarse.append(energy(a[:hh, :ww].reshape(hh // 2, 2, ww // 2, 2).mean(axis=(1, 3))))
    return float(np.log(energy(y) + 1e-8) - np.log(np.mean(coarse) + 1e-8))


@pytest.mark.parametrize("shape", [(9, 9), (10, 17), (33, 64), (321, 320), (400, 515), (768, 1024)])
def test_top_octave_and_the_colour_cast_match_their_definitions(shape):
    """The fast reductions (strided 2x2 sums, per-channel means) give what the plain definitions
    give, on odd and even sizes, windows cut or not, both grid phases."""
    from collapseguard.detectors.pair_features import (
        FEATURES,
        OCTAVE_WINDOW,
        features_at,
        top_octave,
    )

    rng = np.random.default_rng(sum(shape))
    img = (rng.random((*shape, 3)) ** 2 * 255).astype(np.uint8)
    img[::3] //= 2  # some structure beside the noise
    assert top_octave(img) == pytest.approx(_top_octave_by_definition(img, OCTAVE_WINDOW), abs=1e-4)
    rgb = img.astype(np.float32) / 255.0
    mean_rgb = rgb.astype(np.float64).reshape(-1, 3).mean(axis=0)
    cast = float(np.sqrt(((mean_rgb - mean_rgb.mean()) ** 2).sum()))
    assert features_at(rgb)[FEATURES.index("cast")] == pytest.approx(cast, abs=1e-5)


def test_weights_naming_a_cnn_mix_read_the_sum_of_both_cnns_and_refuse_another_mix(tmp_path, photos):
    from safetensors.numpy import save_file

    from collapseguard.detectors.compare import Comparator, comparator_cnn
    from collapseguard.detectors.base import DetectorError

    t = load_weights()
    own, shipped = comparator_cnn(), create("cnn")
    mix = 0.7
    path = tmp_path / "mixed.safetensors"
    meta = {**t["meta"], "cnn_mix": repr(mix), "cnn": comparator_cnn(mix).version}
    save_file({"w": t["w"].astype(np.float32), "s": t["s"].astype(np.float32)}, str(path), metadata=meta)
    comp = Comparator(weights=str(path))
    imgs = [photos[0], degrade(photos[0], rounds=4, seed=5)]
    want = np.asarray(own.score(imgs)) + mix * np.asarray(shipped.score(imgs))
    got = [d["cnn"] for d in comp.describe(imgs)]
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert comp.version != create("compare").version
    # the weights were fitted on this mix: another one (or the plain cnn) is refused
    with pytest.raises(DetectorError, match="fitted on cnn"):
        Comparator(weights=str(path), cnn=own)
    with pytest.raises(DetectorError, match="fitted on cnn"):
        Comparator(weights=str(path), cnn=comparator_cnn(0.5))
    # dedup describes with the packaged comparator's cnn: such weights are refused there
    from PIL import Image

    from collapseguard.dedup.run import run_dedup

    (tmp_path / "in").mkdir()
    Image.fromarray(photos[0]).save(tmp_path / "in" / "a.png")
    with pytest.raises(DetectorError, match="fitted on cnn"):
        run_dedup([str(tmp_path / "in")], tmp_path / "out", weights=str(path), quiet=True)
    bad = tmp_path / "bad.safetensors"
    save_file({"w": t["w"].astype(np.float32), "s": t["s"].astype(np.float32)}, str(bad),
              metadata={**t["meta"], "cnn_mix": "half"})
    with pytest.raises(DetectorError, match="cnn_mix 'half'"):
        Comparator(weights=str(bad))
