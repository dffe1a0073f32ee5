"""Web histories (training_data_tools.web_history): what the web does to a clean image, drawn and
applied reproducibly, and used for clean training negatives (``train --web-history``)."""

from __future__ import annotations

import numpy as np
import pytest

from collapseguard.training_data_tools.web_history import (
    MIN_SIDE,
    Op,
    apply_history,
    draw_history,
    history_label,
)


def test_histories_are_one_to_four_420_jpeg_saves_and_what_happens_between(photos):
    kinds, n_jpeg = set(), []
    for i in range(200):
        ops = draw_history(np.random.default_rng(i))
        assert ops == draw_history(np.random.default_rng(i))  # same seed, same history
        q = [op.params["quality"] for op in ops if op.kind == "jpeg"]
        assert 1 <= len(q) <= 4 and all(60 <= v <= 95 for v in q)
        assert ops[-1].kind == "jpeg"  # it ends as a JPEG someone saved
        n_jpeg.append(len(q))
        kinds |= {op.kind for op in ops}
    assert kinds == {"jpeg", "resize", "sharpen", "screenshot"} and set(n_jpeg) == {1, 2, 3, 4}
    img = photos[0]
    ops = [Op("jpeg", {"quality": 85}), Op("resize", {"scale": 0.7, "filter": "lanczos"}),
           Op("sharpen", {"radius": 1.0, "percent": 80}), Op("jpeg", {"quality": 80})]
    out = apply_history(img, ops)
    assert out.dtype == np.uint8 and out.shape == (round(256 * 0.7), round(320 * 0.7), 3)
    assert history_label(ops) == "jpeg85>lanczosx0.70>sharpen80>jpeg80"
    # the last save is a real 4:2:0 JPEG: saving the output again at its quality changes little
    again = apply_history(out, [Op("jpeg", {"quality": 80})])
    assert np.abs(again.astype(int) - out).mean() < 1.5
    # small pictures are not shrunk under MIN_SIDE; screenshots resample and shift tones
    small = apply_history(img[:100, :120], [Op("resize", {"scale": 0.4, "filter": "box"})])
    assert min(small.shape[:2]) == MIN_SIDE
    shot = apply_history(img, [Op("screenshot", {"scale": 1.25, "gamma": 1.05})])
    assert shot.shape[:2] == (320, 400) and shot.mean() < img.mean()
    with pytest.raises(ValueError, match="unknown web-history event"):
        apply_history(img, [Op("print", {})])


def test_clean_variants_give_the_asked_share_a_web_history_and_keep_every_other_draw(tmp_path, photos):
    from PIL import Image

    from collapseguard.training.negatives import clean_variants

    paths = []
    for i, img in enumerate(photos):
        paths.append(tmp_path / f"p{i}.png")
        Image.fromarray(img).save(paths[-1])
    plain = list(clean_variants(paths, 3, seed=1, storage=True))
    none = list(clean_variants(paths, 3, seed=1, storage=True, web_history=0.0))
    every = list(clean_variants(paths, 3, seed=1, storage=True, web_history=1.0))
    assert [n for n, _ in plain] == [n for n, _ in every]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(plain, none))  # 0 is the default
    changed = [a.shape != b.shape or not np.array_equal(a, b) for (_, a), (_, b) in zip(plain, every)]
    assert all(changed)
    half = list(clean_variants(paths, 3, seed=1, storage=True, web_history=0.5))
    same = [a.shape == b.shape and np.array_equal(a, b) for (_, a), (_, b) in zip(plain, half)]
    assert 0 < sum(same) < len(same)  # some variants kept their plain history, some got a web one
