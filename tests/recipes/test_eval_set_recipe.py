"""recipes/eval_set.py: picking clean sources by rule, and the family plan."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def _recipe(name: str = "eval_set"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pick_sources_takes_native_windows_by_rule(tmp_path, photos, monkeypatch):
    rec = _recipe()
    pkg = tmp_path / "x" / "somepkg" / "usr" / "share"
    (pkg / "pics").mkdir(parents=True)
    big = np.concatenate([photos[0], photos[0]], axis=1)  # 256 x 640: a window is cut from it
    Image.fromarray(big).save(pkg / "pics" / "big.png")
    Image.fromarray(photos[1]).save(pkg / "pics" / "copy1.jpg", quality=95)
    Image.fromarray(photos[1]).save(pkg / "pics" / "copy2.jpg", quality=95)  # a duplicate: taken once
    Image.fromarray(photos[2][:100, :100]).save(pkg / "pics" / "small.png")  # under MIN_SIDE
    Image.new("RGB", (200, 200), (90, 90, 90)).save(pkg / "pics" / "blank.png")  # one grey: skipped
    monkeypatch.setattr(rec, "RULES", (("photo", "somepkg", "*/pics/*.png|*/pics/*.jpg", 5, "centre"),))
    monkeypatch.setattr(rec, "SIDE", 192)
    got = rec.pick_sources(tmp_path / "x", tmp_path / "src", tmp_path / "sources.csv")
    table = pd.read_csv(tmp_path / "sources.csv")
    assert len(got) == 2 and set(table["kind"]) == {"photo"}
    assert sorted(Path(f).name for f in table["file"]) == ["big.png", "copy1.jpg"]
    name = table.loc[table["file"].str.endswith("big.png"), "name"].iloc[0]
    win = np.asarray(Image.open(tmp_path / "src" / f"{name}.png"))
    assert win.shape == (192, 192, 3)
    y, x = (256 - 192) // 2, (640 - 192) // 2  # the centre window, pixel for pixel
    assert np.array_equal(win, big[y:y + 192, x:x + 192])


def test_every_family_gets_enough_chains_and_every_kind_meets_every_family():
    rec = _recipe()
    kinds = [k for k in ("photo", "screenshot", "anime") for _ in range(60)]
    plan = {}
    for i, k in enumerate(kinds):
        for fam in rec.families_for(i):
            plan.setdefault(fam, []).append(k)
    assert set(plan) == set(rec.FAMILIES)
    assert all(len(v) >= 40 for v in plan.values())
    assert all(set(v) == {"photo", "screenshot", "anime"} for v in plan.values())
    assert all(len(set(rec.families_for(i))) == 2 for i in range(16))


def test_no_package_of_the_shipped_recipes():
    rec = _recipe()
    text = " ".join((ROOT / "recipes" / n).read_text() for n in ("train_cnn.sh", "make_default_calibration.sh",
                                                                   "fresh_set.sh", "nightsky.sh",
                                                                   "compare_chains.sh"))
    used = {w for w in text.replace("\\", " ").split() if w in rec.PACKAGES}
    assert used == set(), used


def test_calibration_kinds_stores_each_picture_as_png_and_jpeg_420_as_one_source(tmp_path, photos, monkeypatch):
    from collapseguard.calibration.scoring import _variant_source

    rec = _recipe("calibration_kinds")
    pkg = tmp_path / "debs" / "x" / "somepkg" / "usr" / "share" / "pics"
    pkg.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(photos[i]).save(pkg / f"p{i}.png")
    monkeypatch.setattr(rec, "RULES", (("photo", "somepkg", "*/pics/*.png", 2, "centre"),))
    sources = rec.package_images.pick_sources(tmp_path / "debs" / "x", tmp_path / "win", tmp_path / "s.csv",
                                              rec.RULES, rec.SIDE, rec.MIN_SIDE)
    assert len(sources) == 2 and {k for _, k in sources} == {"photo"}
    assert rec.write_stored(tmp_path / "win", sources, tmp_path / "out", seed=1) == 4
    files = sorted((tmp_path / "out" / "photo").iterdir())
    pngs = [f for f in files if f.suffix == ".png"]
    jpgs = [f for f in files if f.suffix == ".jpg"]
    assert len(pngs) == len(jpgs) == 2
    for name, _ in sources:
        png = next(f for f in pngs if f.name.startswith(name + "__"))
        jpg = next(f for f in jpgs if f.name.startswith(name + "__"))
        assert _variant_source(png.name) == _variant_source(jpg.name) == name  # one source in the split
        assert np.array_equal(np.asarray(Image.open(png)), np.asarray(Image.open(tmp_path / "win" / f"{name}.png")))
        with Image.open(jpg) as im:
            from PIL import JpegImagePlugin

            assert JpegImagePlugin.get_sampling(im) == 2  # 4:2:0, as web-scale sets store JPEG
        q = int(jpg.stem.rsplit("__q", 1)[1])
        assert 60 <= q <= 95


def test_calibration_kinds_reads_no_package_of_training_evaluation_or_fresh_set():
    kinds, ev = _recipe("calibration_kinds"), _recipe()
    assert not set(kinds.PACKAGES) & set(ev.PACKAGES)
    text = " ".join((ROOT / "recipes" / n).read_text() for n in ("train_cnn.sh", "fresh_set.sh", "nightsky.sh",
                                                                   "textures.py", "lxqt_photos.sh"))
    used = {w for w in text.replace("\\", " ").split() if w in kinds.PACKAGES}
    assert used == set(), used


def test_only_makes_the_families_named_and_a_later_run_adds_the_rest(tmp_path, photos, monkeypatch):
    """``--only`` makes some families now (the MAXIM ones take minutes a chain); a later run makes
    the rest and reuses what exists, and a family the plan does not hold is refused by name."""
    import pytest

    rec = _recipe()
    monkeypatch.setattr(rec, "STEPS", 2)
    monkeypatch.setattr(rec, "KEEP", (0, 1, 2))
    monkeypatch.setattr(rec, "FAMILIES", ("codec", "aspect_drift"))
    src = tmp_path / "src"
    src.mkdir()
    sources = []
    for i in range(2):
        Image.fromarray(photos[i][:48, :48]).save(src / f"p{i}.png")
        sources.append((f"p{i}", "photo"))
    out = tmp_path / "chains"
    first = rec.make_all_chains(src, sources, out, workers=1, only=("codec",))
    assert set(first["family"]) == {"codec"} and set(first["kind"]) == {"photo"}
    made = sorted(p.stat().st_mtime_ns for p in (out / "codec").rglob("*.png"))
    second = rec.make_all_chains(src, sources, out, workers=1, only=("aspect_drift",))
    assert set(second["family"]) == {"codec", "aspect_drift"}  # the merged manifest keeps codec
    both = rec.make_all_chains(src, sources, out, workers=1)
    assert set(both["family"]) == {"codec", "aspect_drift", *rec.NET_FAMILIES}  # every 10th: source 0
    assert sorted(p.stat().st_mtime_ns for p in (out / "codec").rglob("*.png")) == made  # not redone
    assert both[both["family"] != "super_resolution"].equals(second)
    with pytest.raises(SystemExit, match="no such family here: maxim_retouch"):
        rec.make_all_chains(src, sources, out, workers=1, only=("maxim_retouch",))
