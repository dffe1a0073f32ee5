"""recipes/textures.py decides which game textures become clean training negatives: check its
rules on generated files (no download)."""

from pathlib import Path

import numpy as np
from PIL import Image


def _jpg(path: Path, size=(512, 512), flat=False, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arr = np.full((size[1], size[0], 3), 128, np.uint8) if flat else \
        rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, quality=90)


def test_selection_rules(tmp_path, recipe_script):
    mod = recipe_script("textures.py")
    data = tmp_path / "data"
    _jpg(data / "textures" / "sand.jpg", seed=1)
    _jpg(data / "textures" / "rock_nm.jpg", seed=2)              # normal map: not a picture
    _jpg(data / "textures" / "grass_gloss.jpg", seed=3)          # gloss map
    _jpg(data / "textures" / "small.jpg", size=(256, 256), seed=4)
    _jpg(data / "textures" / "grey.jpg", flat=True)              # flat
    _jpg(data / "karts" / "tux" / "body.jpg", seed=5)            # kart skin
    _jpg(data / "tracks" / "a" / "bark.jpg", seed=6)
    (data / "tracks" / "b").mkdir(parents=True)
    (data / "tracks" / "b" / "bark_copy.jpg").write_bytes((data / "tracks" / "a" / "bark.jpg").read_bytes())
    (data / "textures" / "broken.jpg").write_bytes(b"not an image")
    got = [p.relative_to(data).as_posix() for p in mod.select(data)]
    assert got == ["textures/sand.jpg", "tracks/a/bark.jpg"]


def test_main_links_into_out_dir_with_flat_names(tmp_path, recipe_script):
    mod = recipe_script("textures.py")
    deb = tmp_path / "debs"
    data = deb / "x/usr/share/games/supertuxkart/data"
    _jpg(data / "tracks" / "a" / "bark.jpg", seed=6)
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.jpg").write_bytes(b"old")
    assert mod.main([str(deb), str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["tracks__a__bark.jpg"]
    assert (out / names[0]).resolve() == (data / "tracks" / "a" / "bark.jpg").resolve()


def test_link_images_keeps_versions_of_one_picture_on_one_side(tmp_path, recipe_script):
    mod = recipe_script("link_images.py")
    root = tmp_path / "HTML"
    for i in range(12):
        for lang in ("en", "de", "ru"):
            _jpg(root / lang / "app" / f"shot-{i}.jpg", size=(320, 320), seed=100 * i + len(lang) + ord(lang[0]))
    _jpg(root / "en" / "app" / "tiny.jpg", size=(64, 64), seed=7)
    train, test = tmp_path / "train", tmp_path / "test"
    assert mod.main([str(root), "--out", str(train), "--test-out", str(test), "--test-fraction", "0.5"]) == 0
    sides = {}
    for side in (train, test):
        for p in side.iterdir():
            sides.setdefault(p.name.split("__")[-1], set()).add(side.name)
    assert len(sides) == 12 and all(len(v) == 1 for v in sides.values())  # never split across sides
    assert {next(iter(v)) for v in sides.values()} == {"train", "test"}
    assert sum(1 for _ in train.iterdir()) + sum(1 for _ in test.iterdir()) == 36  # tiny.jpg left out
