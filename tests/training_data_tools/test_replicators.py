"""Replicator families: determinism, shape, growing damage, parameter variety, bad input."""

import numpy as np
import pytest

from collapseguard.training_data_tools.replicators import (
    ReplicatorError,
    create_replicator,
    list_families,
)
from collapseguard.training_data_tools.sources import procedural_art

FAMILIES = list_families()


@pytest.fixture(scope="module")
def images():
    """Two small clean images: procedural art and a textured photo-like pattern."""
    art = procedural_art(1, seed=3, min_side=96, max_side=128)[0][1]
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:80, 0:112]
    tex = 128 + 50 * np.sin(xx / 3.0)[..., None] * np.cos(yy / 5.0)[..., None] + rng.normal(0, 6, (80, 112, 3))
    tex[20:60, 30:80] = [200, 60, 40]
    return [art, np.clip(tex, 0, 255).astype(np.uint8)]


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255.0 ** 2 / max(mse, 1e-10))


def run(family, image, seed, n):
    rng = np.random.default_rng(seed)
    rep = create_replicator(family, rng)
    out = [image]
    for _ in range(n):
        out.append(rep.step(out[-1], rng))
    return rep, out


def test_core_families_registered():
    for fam in ["noise_tint", "contour_wrinkles", "scattered_dots", "texture_simplify",
                "aspect_drift", "codec", "mixed"]:
        assert fam in FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_deterministic_and_keeps_shape(family, images):
    img = images[0]
    rep_a, a = run(family, img, 7, 3)
    rep_b, b = run(family, img, 7, 3)
    assert rep_a.params == rep_b.params
    for x, y in zip(a, b):
        assert x.shape == img.shape and x.dtype == np.uint8
        np.testing.assert_array_equal(x, y)
    _, c = run(family, img, 8, 3)
    assert not np.array_equal(a[-1], c[-1]), "a different seed should give a different chain"


@pytest.mark.parametrize("family", FAMILIES)
def test_damage_grows_with_step(family, images):
    """Mean PSNR to step 0 over a few chains falls from step 1 to 5 to 20."""
    curves = []
    for seed in range(3):
        for img in images:
            _, xs = run(family, img, seed, 20)
            curves.append([psnr(img, xs[k]) for k in (1, 5, 20)])
    m = np.mean(curves, axis=0)
    assert m[0] > m[1] > m[2], m
    assert m[0] > 30, f"step 1 should be subtle, mean PSNR {m[0]:.1f}"


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "mixed"])
def test_parameters_are_drawn_per_chain(family):
    p = [create_replicator(family, np.random.default_rng(s)).params for s in range(6)]
    assert "strength" in p[0]
    assert len({round(x["strength"], 6) for x in p}) == 6


def test_aspect_drift_records_its_change(images):
    rep, xs = run("aspect_drift", images[0], 1, 10)
    st = rep.state
    assert st["content_scale_x"] >= 1 and st["content_scale_y"] >= 1
    assert st["content_scale_x"] * st["content_scale_y"] > 1.005
    assert st["content_aspect_drift"] == pytest.approx(st["content_scale_x"] / st["content_scale_y"])
    assert xs[-1].shape == images[0].shape


def test_mixed_uses_two_components():
    rep = create_replicator("mixed", np.random.default_rng(0))
    comps = rep.params["components"]
    assert len(comps) == 2 and comps[0] != comps[1] and "mixed" not in comps
    pinned = create_replicator("mixed", np.random.default_rng(0), components=["codec", "noise_tint"])
    assert pinned.params["components"] == ["codec", "noise_tint"]


def test_bad_inputs_rejected():
    with pytest.raises(ReplicatorError, match="unknown replicator family"):
        create_replicator("nope", np.random.default_rng(0))
    with pytest.raises(ReplicatorError, match="unknown parameter"):
        create_replicator("codec", np.random.default_rng(0), bogus=1)
    rep = create_replicator("codec", np.random.default_rng(0))
    with pytest.raises(ReplicatorError, match="uint8"):
        rep.step(np.zeros((32, 32), np.uint8), np.random.default_rng(0))
    with pytest.raises(ReplicatorError, match="uint8"):
        rep.step(np.zeros((32, 32, 3), np.float32), np.random.default_rng(0))
    with pytest.raises(ReplicatorError, match="too small"):
        rep.step(np.zeros((4, 4, 3), np.uint8), np.random.default_rng(0))
