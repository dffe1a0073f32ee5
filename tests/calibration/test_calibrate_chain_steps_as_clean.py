"""`calibrate --clean` on a location that holds replication chains: the steps after 0 are degraded
copies, and counted as clean pictures they raised the threshold with no word. A chains manifest
naming them is proof, so the run is refused; chain-step names without a manifest get a warning.
Real images (skimage.data crops, degraded by cg_testutil.degrade), the real `nss` detector."""

import numpy as np
import pandas as pd
import pytest
import skimage.data as sd
from cg_testutil import degrade
from click.testing import CliRunner
from PIL import Image

from collapseguard.calibration.thresholds import load_calibration
from collapseguard.cli import main
from collapseguard.training_data_tools.manifest import write_manifest

LOOSE = ["--detector", "nss", "--max-false-drop", "0.3", "--confidence", "0.6", "--holdout", "0",
         "--no-plot", "-q"]


def _crops(n, size=64):
    pics = [sd.astronaut(), sd.chelsea(), sd.coffee(), sd.rocket()]
    rng = np.random.default_rng(0)
    for i in range(n):
        s = pics[i % len(pics)]
        y, x = rng.integers(0, s.shape[0] - size), rng.integers(0, s.shape[1] - size)
        yield np.ascontiguousarray(s[y:y + size, x:x + size])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A "clean" folder that also holds a chains/ subfolder with its manifest (``chains make``'s
    layout: FAMILY/CHAIN/step_NNN.png), and a copy of the chains without a manifest."""
    root = tmp_path_factory.mktemp("mixed")
    rows = []
    for i, img in enumerate(_crops(6)):
        cid = f"c{i}"
        for step, pic in ((0, img), (5, degrade(img, rounds=5, seed=i))):
            for where in ("data/chains", "bare"):
                p = root / where / "noise" / cid / f"step_{step:03d}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pic).save(p)
            rows.append({"chain_id": cid, "source_image": f"s{i}", "family": "noise", "task": "t",
                         "step": step, "path": str(root / "data/chains/noise" / cid / f"step_{step:03d}.png")})
    write_manifest(pd.DataFrame(rows), root / "data/chains/manifest.csv")
    photos = root / "data/photos"
    photos.mkdir()
    for i, img in enumerate(_crops(12)):
        Image.fromarray(img[::-1]).save(photos / f"p{i}.png")
    return root


def _calibrate(*args):
    return CliRunner().invoke(main, ["calibrate", *map(str, args)])


@pytest.mark.parametrize("clean", ["data", "data/chains", "data/chains/noise", "data/chains/noise/c0"])
def test_a_clean_location_holding_chains_of_a_manifest_is_refused(root, tmp_path, clean):
    """The folder, the chains folder itself, a family folder under it (its manifest is above): each
    holds step-5 images the manifest names, refused before scoring with the fix."""
    out = tmp_path / "cal.json"
    res = _calibrate("--clean", root / clean, "--out", out, *LOOSE)
    assert res.exit_code != 0
    assert "chain images at steps after 0 of the chains manifest" in res.output, res.output
    assert "manifest.csv" in res.output and "step_005.png" in res.output
    assert "--chains" in res.output and "step-0 images" in res.output
    assert not out.exists()


def test_the_same_chains_given_as_chains_are_no_error(root, tmp_path):
    """--chains names them: the chain images under --clean are scored once, as chain images."""
    out = tmp_path / "cal.json"
    res = _calibrate("--chains", root / "data/chains", "--clean", root / "data", "--out", out, *LOOSE)
    assert res.exit_code == 0, res.output
    assert "are also chain images of --chains" in res.output
    assert load_calibration(out).n_clean == 12 + 6


def test_step_zero_images_alone_are_clean(root, tmp_path):
    """Only the originals of the chains (step 0) under --clean: no refusal."""
    out = tmp_path / "cal.json"
    res = _calibrate(*[a for c in range(6) for a in ("--clean", root / f"data/chains/noise/c{c}/step_000.png")],
                     "--clean", root / "data/photos", "--out", out, *LOOSE)
    assert res.exit_code == 0, res.output
    assert "steps after 0" not in res.output


def test_chain_step_names_without_a_manifest_are_warned_about(root, tmp_path):
    """FAMILY/CHAIN/step_005.png beside step_000.png and no manifest: the run goes on (names
    alone prove nothing) with a warning naming the images and the fix."""
    out = tmp_path / "cal.json"
    res = _calibrate("--clean", root / "bare", "--clean", root / "data/photos", "--out", out, *LOOSE)
    assert res.exit_code == 0, res.output
    assert "warning: 6 --clean image(s) are named like chain steps after 0" in res.output
    assert "step_005.png" in res.output and "--chains" in res.output
    res = _calibrate("--clean", root / "data/photos", "--out", tmp_path / "b.json", *LOOSE)
    assert res.exit_code == 0 and "named like chain steps" not in res.output


def test_nested_clean_locations_walk_each_tree_once_and_find_the_same_manifests(tmp_path, monkeypatch):
    """A folder, its subfolders and one of them twice as --clean locations: every location finds
    the manifests it finds alone (in it, under it, above it: the rglob rule), the refusal names the
    same manifests and images, and no folder is listed twice in the search."""
    import os
    from pathlib import Path

    from collapseguard.calibration.scoring import (
        _manifests_near,
        chain_steps_in_clean,
        clean_items,
    )
    from collapseguard.training_data_tools.manifest import MANIFEST_NAMES

    top = (tmp_path / "a").resolve()
    crops = _crops(3)
    for chains, name, cid in ((top, "manifest.csv", "c0"), (top / "b", "manifest.parquet", "c1"),
                              (top / "b" / "d", "manifest.csv", "c2")):
        img, rows = next(crops), []
        for step, pic in ((0, img), (5, degrade(img, rounds=5, seed=1))):
            p = chains / "noise" / cid / f"step_{step:03d}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pic).save(p)
            rows.append({"chain_id": cid, "source_image": cid, "family": "noise", "task": "t",
                         "step": step, "path": str(p)})
        write_manifest(pd.DataFrame(rows), chains / name)
    (top / "b" / "e").mkdir()
    Image.fromarray(next(_crops(1))).save(top / "b" / "e" / "photo.png")

    def rglob_rule(loc):  # what a location's own search finds: above it, then rglob per name
        p = Path(loc).resolve()
        found = [f / n for f in [p, *p.parents] for n in MANIFEST_NAMES if (f / n).is_file()]
        found += [f for n in MANIFEST_NAMES for f in sorted(p.rglob(n)) if f.is_file()]
        return list(dict.fromkeys(found))

    locations = [top / "b", top, top / "b" / "d", ("shots", top / "b"), top / "b" / "e"]
    for loc in locations:
        path = loc[1] if isinstance(loc, tuple) else loc
        assert _manifests_near(path) == rglob_rule(path), path
    items = clean_items(locations)[0]
    listed = []
    real_scandir = os.scandir

    def scandir(path="."):
        listed.append(os.path.realpath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = chain_steps_in_clean(locations, items)
    monkeypatch.undo()
    assert [str(d) for d in listed if listed.count(d) > 1] == []  # each folder listed once
    assert {top / "b" / "d", top / "b" / "e"} <= {Path(d) for d in listed}
    step5 = {c: str(w / "noise" / c / "step_005.png") for w, c in
             ((top, "c0"), (top / "b", "c1"), (top / "b" / "d", "c2"))}
    assert found == [(top / "b" / "manifest.parquet", [step5["c1"]]), (top / "manifest.csv", [step5["c0"]]),
                     (top / "b" / "d" / "manifest.csv", [step5["c2"]])]
    # a location alone: the manifests in it and above it, nearest first
    d, b, a = ((m, [step5[c]]) for m, c in ((top / "b" / "d" / "manifest.csv", "c2"),
                                            (top / "b" / "manifest.parquet", "c1"), (top / "manifest.csv", "c0")))
    assert chain_steps_in_clean([top / "b" / "d"], items) == [d, b, a]
    assert chain_steps_in_clean([top / "b" / "e", top / "b" / "e"], items) == [b, a]
