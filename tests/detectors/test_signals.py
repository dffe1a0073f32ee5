"""The training-free signals ``npr`` and ``fixedpoint`` on real photographs and on chains that the
package's own replicators make from them: which way each moves along a chain, and what each
statistic measures (a residual share that contrast does not change, a fixed point that a
re-rendering reaches)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from collapseguard.detectors import DetectorError, create
from collapseguard.detectors.fixedpoint import rerender
from collapseguard.detectors.npr import SHARE_REF, crop_features
from collapseguard.training_data_tools.chains import run_chain


@pytest.fixture(scope="module")
def sources(photos):
    return [p[:192, :192] for p in photos[:3]]


def _chain(img, family, seed):
    _, steps = run_chain(img, family, 10, keep=[0, 10], seed=seed)
    return steps[0][1], steps[-1][1]


def test_npr_rises_where_a_chain_resamples_the_top_octave_away(sources):
    """super_resolution (down, up, sharpen, each step); texture_simplify is not asserted: on some
    crops it flattens texture into edges, which raises the share (benchmarks/signals.py)."""
    det, family = create("npr"), "super_resolution"
    for i, img in enumerate(sources):
        first, last = _chain(img, family, seed=i)
        a, b = det.score_detailed([first, last])["share"]
        assert b < a, (family, i, a, b)  # the chain took detail out of the top octave
        s0, s10 = det.score([first, last])
        assert s10 > s0, (family, i, s0, s10)


@pytest.mark.parametrize("family", ["super_resolution", "learned"])
def test_fixedpoint_rises_along_rerendering_chains(sources, family):
    det = create("fixedpoint")
    for i, img in enumerate(sources):
        first, last = _chain(img, family, seed=10 + i)
        s0, s10 = det.score([first, last])
        assert s10 > s0, (family, i, s0, s10)


def test_fixedpoint_falls_when_noise_moves_an_image_off_it(sources):
    """Its stated limit: noise is new detail the next pass removes, so a noisy chain reads as fresh."""
    det = create("fixedpoint")
    for i, img in enumerate(sources):
        first, last = _chain(img, "noise_tint", seed=20 + i)
        s0, s10 = det.score([first, last])
        assert s10 < s0, (i, s0, s10)


def test_a_rerendered_image_is_nearer_the_fixed_point(sources):
    det = create("fixedpoint")
    for img in sources:
        once = rerender(img, "resample")
        assert det.score([once])[0] > det.score([img])[0]


def test_the_npr_share_does_not_read_contrast(sources):
    """Halving an image's contrast (content unchanged) leaves the share where it was, and the
    photos sit near the reference share."""
    for img in sources:
        full = crop_features(img)["share"]
        low = crop_features((img.astype(np.float32) * 0.5 + 64).round().astype(np.uint8))["share"]
        assert abs(np.log(low / full)) < 0.1, (full, low)
        assert abs(np.log(full / SHARE_REF)) < 0.5, full


def test_npr_reads_a_2x_nearest_upscale_as_periodic(sources):
    det = create("npr")
    for img in sources:
        half = np.asarray(Image.fromarray(img).resize((96, 96), Image.BICUBIC))
        up = np.asarray(Image.fromarray(half).resize((192, 192), Image.NEAREST))
        assert det.score_detailed([up])["grid"][0] > 0.3 > det.score_detailed([img])["grid"][0]


def test_fixedpoint_render_options():
    assert create("fixedpoint").version != create("fixedpoint", render="jpeg").version
    with pytest.raises(DetectorError, match="render"):
        create("fixedpoint", render="blur")


@pytest.mark.parametrize("spec", ["npr", "fixedpoint"])
def test_gray_tiny_and_flat_images_score(spec, sources):
    """A single-channel array scores as its RGB stack; an 8x8 thumbnail and a flat image score
    finite (the crops are padded; flat crops have no residual to divide)."""
    det = create(spec)
    gray = sources[0][..., 1]
    a, b = det.score([gray, np.repeat(gray[..., None], 3, axis=2)])
    assert a == b
    s = det.score([sources[1][:8, :8], np.full((64, 64, 3), 128, np.uint8)])
    assert np.isfinite(s).all(), s
