"""The shipped cnn and its default threshold through JPEG 4:2:0 storage, as web datasets hold images:
a JPEG q90 4:2:0 copy of a strongly degraded image (step 20 of a replicator family) is still
dropped, and the same copy of the clean source is not (storage is never the signal).

For the shipped weights the families whose step-20 damage is subtle after 4:2:0 storage (noise
and tint, wrinkles, simplified texture, aspect drift on this picture) are known to fail
(MODEL_CARD.md, "Limits"): they are strict xfails, so the test reports the day the shipped
weights catch them, and any other family failing is a plain failure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapseguard.detectors import create
from collapseguard.io.calibration_file import default_calibration
from collapseguard.training.storage import Storage, apply_storage
from collapseguard.training_data_tools import chains, sources

#: families whose step-20 JPEG q90 4:2:0 copy the weights score under the default threshold
# at the shipped threshold 3.1796 (bound over pictures); scattered_dots reads 3.01 here as JPEG q90 4:2:0
KNOWN_MISSES = {"49cd8979952f": {"noise_tint", "contour_wrinkles", "texture_simplify", "aspect_drift",
                                 "scattered_dots"}}
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
    if family in KNOWN_MISSES.get(det.version, set()):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"weights {det.version} lose "
                                              f"{family} damage in 4:2:0 storage"))
    _, kept = chains.run_chain(src, family, 20, (20,), np.random.SeedSequence(0))
    step20 = {k: x for k, x, _ in kept}[20]
    score = float(det.score([apply_storage(step20, JPEG90)])[0])
    assert score > thr, f"{family} step 20 as JPEG q90 4:2:0 scored {score:.2f} <= threshold {thr:.2f}"
