"""The shipped cnn on clean photos that have travelled the web: two JPEG saves (q85, then q80,
4:2:0) around a 0.7x Lanczos resize. Such a copy is as clean as the photo: it must be kept, and
should score within the range of the plain photos of its kind (the detector reads damage, not an
image's history)."""

from __future__ import annotations

import pytest
import torch

from collapseguard.detectors import create
from collapseguard.io.calibration_file import default_calibration
from collapseguard.training_data_tools.web_history import Op, apply_history

HISTORY = [Op("jpeg", {"quality": 85}), Op("resize", {"scale": 0.7, "filter": "lanczos"}),
           Op("jpeg", {"quality": 80})]


@pytest.fixture(scope="module")
def scored(photos):
    torch.set_num_threads(1)
    det = create("cnn")
    cal = default_calibration("cnn", det.version)
    assert cal is not None, "the packaged calibration does not match the packaged weights"
    plain = [float(s) for s in det.score(photos)]
    web = [float(s) for s in det.score([apply_history(p, HISTORY) for p in photos])]
    return det.version, float(cal.threshold), plain, web


def test_a_photo_with_a_web_history_is_kept(scored):
    _, thr, _, web = scored
    assert max(web) < thr, (web, thr)


def test_a_photo_with_a_web_history_scores_within_the_range_of_plain_photos(scored):
    _, _, plain, web = scored
    assert max(web) <= max(plain), (plain, web)  # no copy above the clean range (lower is clean too)
