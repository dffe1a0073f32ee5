"""The crop grid every crop-based detector reads an image through (``detectors.crops``)."""

import numpy as np
import pytest

from collapseguard.detectors.crops import crop_grid, image_crops


def _positions(h, w, size, n):
    """(y, x) of each crop, found by cropping images whose pixels encode their row and column."""
    yy, xx = np.mgrid[0:h, 0:w]

    def coded(v):
        return np.stack([v // 256, v % 256, np.zeros_like(v)], -1).astype(np.uint8)

    ys = [int(c[0, 0, 0]) * 256 + int(c[0, 0, 1]) for c in crop_grid(coded(yy), size, n)]
    xs = [int(c[0, 0, 0]) * 256 + int(c[0, 0, 1]) for c in crop_grid(coded(xx), size, n)]
    return list(zip(ys, xs))


@pytest.mark.parametrize("h, w", [(1920, 1080), (2000, 1000), (5000, 1000), (3000, 300), (384, 384),
                                  (1080, 1920), (640, 480), (200, 384)])
def test_the_grid_reads_every_image_down_to_its_bottom_and_right_edges(h, w):
    size, n = 48, 24
    pos = _positions(h, w, size, n)
    assert len(pos) == n and len(set(pos)) == n
    assert max(y for y, _ in pos) == h - size  # the bottom row is read (a 9:16 portrait too)
    assert max(x for _, x in pos) == w - size
    assert min(y for y, _ in pos) == 0


def test_damage_in_the_bottom_of_a_portrait_moves_the_cnn_score():
    """A 9:16 portrait whose bottom 300 rows are ruined scores differently from the clean one."""
    from collapseguard.detectors import create

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:1920, 0:1080]
    clean = np.stack([xx % 256, yy % 200, (xx + yy) % 180], -1).astype(np.uint8)
    ruined = clean.copy()
    ruined[-300:] = np.clip(ruined[-300:] + rng.normal(0, 60, ruined[-300:].shape), 0, 255).astype(np.uint8)
    det = create("cnn")
    a, b = det.score([clean, ruined])
    assert abs(float(a) - float(b)) > 1e-3
    assert image_crops(clean, 48, 24).shape == (24, 48, 48, 3)
