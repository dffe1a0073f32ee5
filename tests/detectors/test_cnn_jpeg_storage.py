"""The shipped cnn and its default threshold through JPEG 4:2:0 storage, as web datasets hold images:
a JPEG q90 4:2:0 copy of a strongly degraded image (step 20 of a replicator family) is still
dropped, and the same copy of the clean source is not (storage is never the signal).

For the shipped weights, the families whose step-20 image of this picture scores under the
threshold (noise and tint, wrinkles, scattered dots, simplified texture, aspect drift) score under
it as PNG too: the misses are the detector's, not the storage's (MODEL_CARD.md, "Limits"). They
are strict xfails, so the test reports the day the shipped weights catch them, and any other
family failing is a plain failure; a test checks that the PNG copies are missed as well, so the
stated reason stays the measured one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapseguard.detectors import create
from collapseguard.io.calibration_file import default_calibration
from collapseguard.training.storage import Storage, apply_storage
from collapseguard.training_data_tools import chains, sources

#: families whose step-20 image the weights score under the shipped threshold 3.1796 as PNG and
#: as JPEG q90 4:2:0, with the measured scores (PNG, JPEG q90 4:2:0)
KNOWN_MISSES = {"49cd8979952f": {"noise_tint": (2.54, 1.32), "contour_wrinkles": (1.69, 0.75),
                                 "scattered_dots": (2.73, 3.01), "texture_simplify": (2.00, 1.01),
                                 "aspect_drift": (1.78, 1.63)}}
JPEG90 = Storage("jpeg420", 90)


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    det = create("cnn")
    cal = default_calibration("cnn", det.version)
    assert cal is not None, "the packaged calibration does not match the packaged weights"
    src = dict(sources.resolve_sources("bundled", seed=0))["skimage/astronaut"][64:320, 128:384].copy()
    return det, float(cal.threshold), src


def test_a_clean_jpeg_copy_is_kept(shipped):
    det, thr, src = shipped
    png, jpeg = det.score([src, apply_storage(src, JPEG90)])
    assert png < thr and jpeg < thr


@pytest.mark.parametrize("family", chains.list_families())
def test_a_jpeg_420_copy_of_a_degraded_image_is_dropped(shipped, family, request):
    det, thr, src = shipped
    miss = KNOWN_MISSES.get(det.version, {}).get(family)
    if miss is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            f"weights {det.version} score {family}'s step 20 under the threshold as PNG too "
            f"({miss[0]:.2f}; {miss[1]:.2f} as JPEG q90 4:2:0): the miss is the detector's, not the storage's")))
    score = float(det.score([apply_storage(_step20(src, family), JPEG90)])[0])
    assert score > thr, f"{family} step 20 as JPEG q90 4:2:0 scored {score:.2f} <= threshold {thr:.2f}"


def _step20(src, family):
    _, kept = chains.run_chain(src, family, 20, (20,), np.random.SeedSequence(0))
    return {k: x for k, x, _ in kept}[20]


def test_the_known_misses_are_missed_as_png_too(shipped):
    """The xfail reason above is the measured one: each known miss scores under the threshold
    before any storage, at the scores stated."""
    det, thr, src = shipped
    misses = KNOWN_MISSES.get(det.version)
    if not misses:
        pytest.skip(f"no known misses listed for weights {det.version}")
    for family, (png_score, jpeg_score) in misses.items():
        step20 = _step20(src, family)
        png, jpeg = (float(v) for v in det.score([step20, apply_storage(step20, JPEG90)]))
        assert png <= thr, f"{family}: the PNG is dropped ({png:.2f}): the miss is the storage's"
        assert abs(png - png_score) < 0.01 and abs(jpeg - jpeg_score) < 0.01, (family, png, jpeg)
