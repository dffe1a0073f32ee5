"""Drawn clean kinds: pixel art and screens, deterministic per seed, each looking like its kind."""

import numpy as np
import pytest

from collapseguard.training_data_tools.drawn_kinds import pixel_art, screens
from collapseguard.training_data_tools.sources import SourceError, resolve_sources


def _blocks_of(img: np.ndarray) -> int:
    """The largest whole factor f such that the image is made of f x f blocks of one colour."""
    for f in (8, 6, 4, 3, 2):
        h, w = img.shape[0] // f * f, img.shape[1] // f * f
        x = img[:h, :w]
        if np.array_equal(x, np.repeat(np.repeat(x[::f, ::f], f, 0), f, 1)):
            return f
    return 1


def test_pixel_art_is_nearest_neighbour_upscaled_palette_art():
    arts = pixel_art(12, seed=4)
    assert [n for n, _ in arts] == [f"pixel/4-{i}" for i in range(12)]
    again = pixel_art(12, seed=4)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(arts, again))
    assert not np.array_equal(arts[0][1], pixel_art(1, seed=5)[0][1])
    blocky = 0
    for _, a in arts:
        assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3 and min(a.shape[:2]) >= 64
        assert len(np.unique(a.reshape(-1, 3), axis=0)) <= 64  # a small palette
        blocky += _blocks_of(a) >= 2
    assert blocky >= 9  # all but the few drawn with a pixel grid are whole blocks


def test_screens_are_flat_with_text_and_edges():
    shots = screens(6, seed=2)
    assert [n for n, _ in shots] == [f"screen/2-{i}" for i in range(6)]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(shots, screens(6, seed=2)))
    for _, a in shots:
        assert a.dtype == np.uint8 and a.shape[2] == 3 and min(a.shape[:2]) >= 240
        flat = (np.abs(np.diff(a.astype(int), axis=1)).sum(-1) == 0).mean()
        assert flat > 0.6  # mostly flat areas
        assert len(np.unique(a.reshape(-1, 3), axis=0)) > 20  # anti-aliased text and shapes


def test_specs_reach_the_drawn_kinds():
    got = list(resolve_sources("pixel:2,screen:1", seed=3))
    assert [n for n, _ in got] == ["pixel/3-0", "pixel/3-1", "screen/3-0"]
    with pytest.raises(SourceError, match="pixel:N"):
        list(resolve_sources("pixel:x"))
    with pytest.raises(SourceError):
        pixel_art(-1)


def test_write_folder_writes_pngs_and_seeded_420_jpegs(tmp_path):
    from PIL import Image

    from collapseguard.training_data_tools.drawn_kinds import main, write_folder

    names = write_folder(tmp_path / "a", 2, seed=7, jpeg=True)
    assert sorted(names) == sorted(f"{k}-7-{i}.{e}" for k in ("pixel", "screen") for i in range(2)
                                   for e in ("png", "jpg"))
    png = np.asarray(Image.open(tmp_path / "a/pixel-7-0.png"))
    np.testing.assert_array_equal(png, pixel_art(1, seed=7)[0][1])
    with Image.open(tmp_path / "a/screen-7-1.jpg") as im:
        assert im.format == "JPEG" and im.layer[1][1:3] == (1, 1)  # chroma at half resolution: 4:2:0
    main([str(tmp_path / "b"), "2", "--seed", "7", "--jpeg"])
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
