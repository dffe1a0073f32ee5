"""The shipped cnn and its default threshold through JPEG 4:2:0 storage, as web datasets hold images:
a JPEG q90 4:2:0 copy of a strongly degraded image (step 20 of a replicator family) is still
dropped, and the same copy of the clean source is not (storage is never the signal).

For the shipped weights, the families whose step-20 image of this picture scores under the
threshold as JPEG q90 4:2:0 (noise and tint, simplified texture, aspect drift) are dropped as PNG:
these weights lose that damage in 4:2:0 storage (MODEL_CARD.md, "Limits"). They are strict
xfails, so the test reports the day the shipped weights catch them, and any other family failing
is a plain failure. Each reason is built from the measured scores and says whose miss it is (the
storage's when the PNG is dropped, the detector's when the PNG is missed too); a test measures
both copies again, so the stated reason stays the measured one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapseguard.detectors import create
from collapseguard.io.calibration_file import default_calibration
from collapseguard.training.storage import Storage, apply_storage
from collapseguard.training_data_tools import chains, sources

#: families whose step-20 image the weights score under the shipped threshold (2.3421 for
#: 9e0d4b6fcd69) as JPEG q90 4:2:0, with the measured scores (PNG, JPEG q90 4:2:0)
KNOWN_MISSES = {"9e0d4b6fcd69": {"noise_tint": (3.90, 1.87), "texture_simplify": (2.43, 0.18),
                                 "aspect_drift": (2.66, 1.13)}}
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
        request.applymarker(pytest.mark.xfail(strict=True, reason=miss_reason(det.version, family, miss, thr)))
    score = float(det.score([apply_storage(_step20(src, family), JPEG90)])[0])
    assert score > thr, f"{family} step 20 as JPEG q90 4:2:0 scored {score:.2f} <= threshold {thr:.2f}"


def miss_reason(version, family, miss, thr):
    """Whose miss it is, from the measured scores: the storage's when the PNG is dropped."""
    png, jpeg = miss
    if png > thr:
        return (f"weights {version} lose {family}'s damage in 4:2:0 storage: step 20 scores {png:.2f} as PNG "
                f"(dropped) and {jpeg:.2f} as JPEG q90 4:2:0, under the threshold {thr:.2f}")
    return (f"weights {version} score {family}'s step 20 under the threshold {thr:.2f} as PNG too "
            f"({png:.2f}; {jpeg:.2f} as JPEG q90 4:2:0): the miss is the detector's, not the storage's")


def _step20(src, family):
    _, kept = chains.run_chain(src, family, 20, (20,), np.random.SeedSequence(0))
    return {k: x for k, x, _ in kept}[20]


def test_the_known_misses_are_measured(shipped):
    """The xfail reasons above are the measured ones: each known miss scores at the scores stated,
    under the threshold as JPEG q90 4:2:0, and on the side of it as PNG that its reason names."""
    det, thr, src = shipped
    misses = KNOWN_MISSES.get(det.version)
    if not misses:
        pytest.skip(f"no known misses listed for weights {det.version}")
    for family, (png_score, jpeg_score) in misses.items():
        step20 = _step20(src, family)
        png, jpeg = (float(v) for v in det.score([step20, apply_storage(step20, JPEG90)]))
        assert abs(png - png_score) < 0.01 and abs(jpeg - jpeg_score) < 0.01, (family, png, jpeg)
        assert jpeg <= thr, f"{family}: the JPEG q90 4:2:0 copy is dropped ({jpeg:.2f}): no miss"
        says_storage = "in 4:2:0 storage" in miss_reason(det.version, family, (png_score, jpeg_score), thr)
        assert (png > thr) == says_storage, (family, png, thr)
