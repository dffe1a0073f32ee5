"""Clean image sources: bundled photos, procedural art, folders, shards, CLI specs."""

import hashlib
import io
import re
import tarfile

import numpy as np
import pytest
from PIL import Image

from collapseguard.training_data_tools.sources import (
    SourceError,
    bundled_photos,
    flat_art,
    folder_images,
    photo_views,
    photo_windows,
    procedural_art,
    resolve_sources,
    shard_images,
)


def test_bundled_photos_are_rgb_and_named_uniquely():
    photos = bundled_photos()
    assert len(photos) >= 5
    names = [n for n, _ in photos]
    assert len(set(names)) == len(names)
    for _, a in photos:
        assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3 and min(a.shape[:2]) >= 64


def test_procedural_art_deterministic_varied_sizes():
    a = procedural_art(4, seed=5, min_side=64, max_side=160)
    b = procedural_art(4, seed=5, min_side=64, max_side=160)
    for (na, xa), (nb, xb) in zip(a, b):
        assert na == nb
        np.testing.assert_array_equal(xa, xb)
        assert xa.dtype == np.uint8 and max(xa.shape[:2]) <= 160
    assert len({x.shape for _, x in a}) > 1
    # smooth, but not flat: many distinct colours and mostly small neighbour differences
    x = a[0][1].astype(int)
    assert len(np.unique(x.reshape(-1, 3), axis=0)) > 100
    assert np.median(np.abs(np.diff(x, axis=1))) <= 3
    c = procedural_art(1, seed=6, min_side=64, max_side=160)
    assert not np.array_equal(c[0][1], a[0][1]) or c[0][1].shape != a[0][1].shape
    with pytest.raises(SourceError):
        procedural_art(1, min_side=100, max_side=50)


def test_procedural_art_dither_levels_change_only_the_noise():
    from scipy.ndimage import uniform_filter

    from collapseguard.training_data_tools.sources import DITHER_LEVELS, SourceError

    base = procedural_art(6, seed=5, min_side=96, max_side=160)
    same = procedural_art(6, seed=5, min_side=96, max_side=160, dither=0.6)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(base, same))  # 0.6 is the default

    def fine_noise(img):  # std of the image minus its 3x3 local mean, in flat areas
        x = img.astype(float)
        r = x - uniform_filter(x, size=(3, 3, 1))
        flat = np.abs(uniform_filter(x, size=(9, 9, 1)) - x).max(axis=2) < 2.0
        return r[flat].std()

    noise = {d: [fine_noise(a) for _, a in procedural_art(6, seed=5, min_side=96, max_side=160, dither=d)]
             for d in (0.0, 1.6)}
    assert all(lo < hi for lo, hi in zip(noise[0.0], noise[1.6]))
    vary = procedural_art(6, seed=5, min_side=96, max_side=160, dither="vary")
    for (na, a), (nb, b) in zip(base, vary):  # the same pictures: only the fine noise differs
        assert na == nb and a.shape == b.shape
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 2.0
    levels = {float(np.random.default_rng([5, i, 104729]).choice(DITHER_LEVELS)) for i in range(6)}
    assert len(levels) > 1
    with pytest.raises(SourceError, match="dither"):
        procedural_art(1, dither=-1.0)
    with pytest.raises(SourceError, match="dither"):
        procedural_art(1, dither="lots")


def test_folder_images_skips_junk_and_cleans_names(tmp_path):
    (tmp_path / "sub").mkdir()
    Image.new("RGB", (20, 10), (255, 0, 0)).save(tmp_path / "sub" / "a b.png")
    Image.new("L", (8, 8), 7).save(tmp_path / "g.jpg")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    (tmp_path / "notes.txt").write_text("x")
    got = dict(folder_images(tmp_path))
    ab = "sub/a_b-" + hashlib.sha256(b"a b").hexdigest()[:6]  # cleaned, so told apart by a hash
    assert set(got) == {"g", ab}
    assert got[ab].shape == (10, 20, 3) and got["g"].shape == (8, 8, 3)
    with pytest.raises(SourceError, match="not a folder"):
        list(folder_images(tmp_path / "missing"))
    # one picture name in two formats: both kept, told apart by their format (no duplicate name)
    Image.new("RGB", (8, 8), (0, 0, 255)).save(tmp_path / "sub" / "x.bmp")
    Image.new("RGB", (8, 8), (0, 255, 0)).save(tmp_path / "sub" / "x.tiff")
    got = dict(folder_images(tmp_path))
    assert set(got) == {"g", ab, "sub/x_bmp", "sub/x_tiff"}
    assert got["sub/x_bmp"][0, 0, 2] == 255 and got["sub/x_tiff"][0, 0, 1] == 255


def _png(color):
    buf = io.BytesIO()
    Image.new("RGB", (12, 9), color).save(buf, format="PNG")
    return buf.getvalue()


def test_shard_images_reads_first_image_per_sample(tmp_path):
    path = tmp_path / "shard-000.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [("s1.png", _png((1, 2, 3))), ("s1.json", b"{}"), ("s1.jpg", _png((9, 9, 9))),
                           ("s2.png", b"garbage"), ("s3.webp", _png((5, 5, 5)))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    got = list(shard_images(str(path)))
    assert [n for n, _ in got] == ["shard-000/s1", "shard-000/s3"]
    assert tuple(got[0][1][0, 0]) == (1, 2, 3)
    with pytest.raises(SourceError, match="no shards"):
        list(shard_images(str(tmp_path / "none-*.tar")))


def test_resolve_sources_specs(tmp_path):
    Image.new("RGB", (16, 16)).save(tmp_path / "x.png")
    names = [n for n, _ in resolve_sources(f"art:2:64-96,folder:{tmp_path}")]
    assert names == ["art/0-0", "art/0-1", "x"]
    assert [n for n, _ in resolve_sources(str(tmp_path))] == ["x"]
    with pytest.raises(SourceError, match="unknown source"):
        list(resolve_sources("what:ever"))
    with pytest.raises(SourceError, match="bad art spec"):
        list(resolve_sources("art:many"))
    # dither in the spec reaches procedural_art
    plain = [a for _, a in resolve_sources("art:2:64-96")]
    for spec, kw in (("art:2:64-96:dither=0", {"dither": 0.0}), ("art:2:64-96:dither=vary", {"dither": "vary"})):
        got = [a for _, a in resolve_sources(spec)]
        want = [a for _, a in procedural_art(2, seed=0, min_side=64, max_side=96, **kw)]
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert not np.array_equal(plain[0], [a for _, a in resolve_sources("art:2:64-96:dither=0")][0])
    with pytest.raises(SourceError, match="bad art spec"):
        list(resolve_sources("art:2:dither=lots"))


def test_photo_views_native_window_and_web_downscale(tmp_path):
    rng = np.random.default_rng(3)
    big = rng.integers(0, 256, (700, 1000, 3), dtype=np.uint8)
    for name in ("a.png", "b.png"):
        Image.fromarray(big).save(tmp_path / name)
    (tmp_path / "junk.png").write_bytes(b"not an image")
    files = [tmp_path / "a.png", tmp_path / "junk.png", tmp_path / "b.png"]
    views = list(photo_views(files, side=128, seed=0))
    # junk is skipped; "a" (position 0) gives a native window, "b" (position 2) too
    assert [n for n, _ in views] == ["a@native", "b@native"]
    for _, v in views:
        assert v.shape == (128, 128, 3)
        # a native window: the exact pixels of some place of the photo, nothing resampled
        ys, xs = np.nonzero((big[:, :, 0] == v[0, 0, 0]) & (big[:, :, 1] == v[0, 0, 1]))
        assert any(np.array_equal(big[y:y + 128, x:x + 128], v) for y, x in zip(ys, xs))
    both = dict(photo_views([tmp_path / "a.png"], side=128, seed=0, both=True))
    assert set(both) == {"a@native", "a@web"}
    assert both["a@web"].shape == (134, 192, 3)  # long side 1.5 x 128, aspect kept
    assert next(iter(resolve_sources(f"views:{tmp_path}:128")))[0] == "a@native"
    with pytest.raises(SourceError):
        list(photo_views(files, side=8))


def test_photo_windows_are_native_seeded_per_file_and_skip_small_files(tmp_path):
    rng = np.random.default_rng(5)
    big = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(big).save(tmp_path / "a.png")
    Image.fromarray(big[:200, :200]).save(tmp_path / "small.png")  # under 2 x 128 px: skipped
    Image.fromarray(big[::-1]).save(tmp_path / "b.png")
    (tmp_path / "junk.png").write_bytes(b"not an image")
    files = [tmp_path / n for n in ("a.png", "small.png", "junk.png", "b.png")]
    wins = list(photo_windows(files, side=128, count=2, seed=4))
    assert [n for n, _ in wins] == ["a@native2", "a@native3", "b@native2", "b@native3"]
    a2, a3 = wins[0][1], wins[1][1]
    assert a2.shape == a3.shape == (128, 128, 3) and not np.array_equal(a2, a3)
    # native pixels: the window is a slice of the photo, nothing resampled
    assert any(np.array_equal(big[y:y + 128, x:x + 128], a2) for y in range(173) for x in range(273))
    # a file's windows depend on its name and the seed, not on which other files come before it
    alone = dict(photo_windows([tmp_path / "b.png"], side=128, count=2, seed=4))
    assert np.array_equal(alone["b@native2"], wins[2][1])
    other_seed = dict(photo_windows([tmp_path / "b.png"], side=128, count=2, seed=5))
    assert not np.array_equal(other_seed["b@native2"], alone["b@native2"])
    # views of one picture share a split group with its photo_views views
    from collapseguard.training_data_tools.manifest import source_group

    assert source_group("a@native2") == source_group("a@native") == "a"
    assert list(photo_windows(files, side=128, count=0)) == []
    assert [n for n, _ in photo_windows(files, side=128, count=1, min_side=150)][:2] == ["a@native2", "small@native2"]
    with pytest.raises(SourceError):
        list(photo_windows(files, side=8))
    with pytest.raises(SourceError):
        list(photo_windows(files, side=128, count=-1))


def test_split_keeps_views_of_one_picture_together():
    import pandas as pd

    from collapseguard.training_data_tools.manifest import split_by_source

    names = [f"p{i}@{v}" for i in range(60) for v in ("native", "web")]
    df = pd.DataFrame({"source_image": names, "x": range(len(names))})
    parts = split_by_source(df, {"train": 0.5, "test": 0.5}, salt="s")
    groups = {name: {s.split("@")[0] for s in part["source_image"]} for name, part in parts.items()}
    assert groups["train"] and groups["test"] and not groups["train"] & groups["test"]
    assert len(parts["train"]) + len(parts["test"]) == len(df)


def test_flat_art_is_deterministic_varied_and_textureless():
    a, b = flat_art(12, seed=4, min_side=64, max_side=128), flat_art(12, seed=4, min_side=64, max_side=128)
    assert [n for n, _ in a] == [f"flat/4-{i}" for i in range(12)]
    assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))
    assert any(not np.array_equal(x, y) for (_, x), (_, y) in zip(a, flat_art(12, seed=5, min_side=64, max_side=128)))
    for _, img in a:
        assert img.dtype == np.uint8 and img.ndim == 3 and 64 <= max(img.shape[:2]) <= 128
        # no texture: neighbouring pixels differ by at most a gradient step, except at shape edges
        step = np.abs(np.diff(img.astype(int), axis=1)).max(axis=2)
        assert np.mean(step <= 3) > 0.9
    # solid pictures occur, and not only those
    flat = [np.ptp(img.reshape(-1, 3), axis=0).max() == 0 for _, img in flat_art(40, seed=1)]
    assert 0 < sum(flat) < 40
    with pytest.raises(SourceError):
        flat_art(2, min_side=8)


def test_shard_images_groups_samples_as_io_tar_does(tmp_path):
    """A sample is a run of members sharing io.tar's key: a link member ``j`` between two ``k``
    samples still ends the first, and two hidden files (``.a.png``, ``.b.png``) are two samples,
    so no picture is dropped as a second image of its neighbour."""
    from collapseguard.io.tar import iter_samples

    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [("k.png", _png((1, 0, 0))), ("j.png", None), ("k.png", _png((2, 0, 0))),
                           (".a.png", _png((3, 0, 0))), (".b.png", _png((4, 0, 0)))]:
            info = tarfile.TarInfo(name)
            if data is None:  # a symbolic link, not a regular file
                info.type, info.linkname = tarfile.SYMTYPE, "k.png"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    assert len(list(iter_samples(str(path)))) == 5  # io.tar: k, j, k, .a.png, .b.png
    got = list(shard_images(str(path)))
    assert [tuple(a[0, 0]) for _, a in got] == [(1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 0, 0)]
    assert len({n for n, _ in got}) == 4 and got[1][0] == "s/k@repeat1"


def test_shard_images_names_are_unique_when_keys_or_shard_stems_collide(tmp_path):
    """Source names must be distinct, or ``chains make`` refuses the whole run: a real key named
    ``k@repeat1`` beside a repeated ``k``, keys that clean to one name (``a b``, ``a_b``) and two
    shards of one file name in different folders each keep every picture under a name of its own."""
    def write(path, names):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w") as tar:
            for i, name in enumerate(names):
                data = _png((i + 1, 0, 0))
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    write(tmp_path / "a" / "s.tar", ["k.png", "j.png", "k.png", "k@repeat1.png", "a b.png", "a_b.png"])
    write(tmp_path / "b" / "s.tar", ["k.png"])
    got = list(shard_images([str(tmp_path / "a" / "s.tar"), str(tmp_path / "b" / "s.tar")]))
    names = [n for n, _ in got]
    assert len(got) == 7 and len(set(names)) == 7, names
    assert names[:3] == ["s/k", "s/j", "s/k@repeat1"]


def test_names_that_clean_alike_stay_distinct_pictures_whatever_else_is_there(tmp_path):
    """``猫.png`` and ``犬.png`` both clean to ``_``: each gets a hash of its own name, so they are
    two pictures in a split by source and keep their names (and chain seeds) when a file is added."""
    from collapseguard.training_data_tools.manifest import source_group
    from collapseguard.training_data_tools.sources import folder_images

    rng = np.random.default_rng(0)
    for name in ("猫", "犬"):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / f"{name}.png")
    before = [n for n, _ in folder_images(tmp_path)]
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "鳥.png")
    after = [n for n, _ in folder_images(tmp_path)]
    assert len(set(map(source_group, before))) == 2 and set(before) < set(after)
    assert all(re.fullmatch(r"[A-Za-z0-9._/@-]+", n) for n in after)


def test_a_folder_whose_name_holds_a_comma_is_one_source(tmp_path):
    """``folder:odd,dir`` names the folder ``odd,dir`` when it exists, not ``folder:odd`` and
    ``dir``, also beside other parts and as a bare path."""
    odd = tmp_path / "odd,dir"
    odd.mkdir()
    Image.new("RGB", (16, 16)).save(odd / "x.png")
    assert [n for n, _ in resolve_sources(f"folder:{odd}")] == ["x"]
    assert [n for n, _ in resolve_sources(f"art:1:64-96,folder:{odd},art:1:64-96")] == [
        "art/0-0", "x", "art/0-0@repeat1"]
    assert [n for n, _ in resolve_sources(str(odd))] == ["x"]
    assert len(list(resolve_sources(f"views:{odd}:64"))) >= 1
