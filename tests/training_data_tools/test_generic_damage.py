"""Damage ladders (training.generic_damage): classic distortions at rising strength, as chains."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from skimage import data

from collapseguard.training.bank import ladder_bank, step_label
from collapseguard.training_data_tools.generic_damage import (
    DAMAGES,
    RUNGS,
    apply_ladder,
    damage_ladders,
    draw_ladder,
    ladder_sources,
)


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return data.astronaut()[100:260, 120:300]


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_each_distortion_grows_with_strength(photo, name):
    fn, draw = DAMAGES[name]
    params = draw(np.random.default_rng(7))
    ladder = [(name, params)]
    assert apply_ladder(photo, ladder, 0.0) is photo
    outs = [apply_ladder(photo, ladder, s) for _, s in RUNGS[1:]]
    for out in outs:
        assert out.shape == photo.shape and out.dtype == np.uint8
    d = [_diff(photo, o) for o in outs]
    assert d[-1] > 0.3, f"{name} at full strength barely changes the image: {d}"
    assert d[0] < d[-1], f"{name}: strength 0.3 changes as much as 1.0: {d}"
    # the same parameters give the same pixels (seeded noise, spots and warps)
    np.testing.assert_array_equal(outs[-1], apply_ladder(photo, ladder, 1.0))


def test_ladders_are_seeded_and_named_by_their_distortions(photo):
    images = [("a.png", photo), ("b.png", photo[::-1].copy())]
    rungs = list(damage_ladders(images, per_image=3, seed=4))
    assert len(rungs) == 2 * 3 * len(RUNGS)
    assert [r[2] for r in rungs[: len(RUNGS)]] == [s for s, _ in RUNGS]
    ids = {r[0] for r in rungs}
    assert ids == {f"generic/{n}/{j}" for n in ("a.png", "b.png") for j in range(3)}
    for ladder_id, kind, step, img in rungs:
        assert kind.startswith("generic:")
        assert set(kind[len("generic:"):].split("+")) <= set(DAMAGES)
        if step == 0:  # every ladder starts from the clean image itself
            src = photo if "/a.png/" in ladder_id else photo[::-1]
            np.testing.assert_array_equal(img, src)
    again = list(damage_ladders(images, per_image=3, seed=4))
    assert all(np.array_equal(x[3], y[3]) and x[:3] == y[:3] for x, y in zip(rungs, again))
    other = list(damage_ladders(images, per_image=3, seed=5))
    assert any(not np.array_equal(x[3], y[3]) for x, y in zip(rungs, other))


def test_pairs_of_distortions_are_drawn_sometimes():
    rng = np.random.default_rng(0)
    sizes = [len(draw_ladder(rng)) for _ in range(200)]
    assert set(sizes) == {1, 2}
    assert 0.15 < sizes.count(2) / 200 < 0.45
    assert all(len(draw_ladder(rng, pair_share=0.0)) == 1 for _ in range(20))


def test_ladder_bank_shares_crop_positions_and_labels_like_chains(photo):
    rungs = list(damage_ladders([("a.png", photo)], per_image=2, seed=1))
    bank = ladder_bank(rungs, size=32, per_image=5, seed=0)
    assert len(bank) == 2 * len(RUNGS) and bank.crops.shape == (8, 5, 32, 32, 3)
    m = bank.meta
    assert m["aligned"].all() and (m["kind"] == "generic").all()
    assert (m["source_image"] == "a.png").all()
    for r in m.itertuples():
        assert (r.target, r.weight) == step_label(r.step)
    # rung 0 of both ladders is the clean image: with shared positions per ladder, the clean
    # crops of a ladder equal the clean image at those positions, and later rungs differ there
    first = m.index[m["chain_id"] == "generic/a.png/0"]
    assert np.any(bank.crops[first[0]] != bank.crops[first[-1]])
    h, w = photo.shape[:2]
    for c in bank.crops[first[0]]:
        hits = [(y, x) for y in range(h - 31) for x in range(w - 31)
                if np.array_equal(photo[y:y + 32, x:x + 32], c)]
        assert hits, "a rung-0 crop is not a crop of the clean image"


def test_ladder_sources_windows_and_skips_unreadable_files(tmp_path):
    big = np.random.default_rng(0).integers(0, 255, (700, 900, 3), dtype=np.uint8)
    Image.fromarray(big).save(tmp_path / "big.png")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    out = list(ladder_sources(sorted(tmp_path.iterdir()), seed=0, side=256))
    assert [n for n, _ in out] == ["big.png"]
    assert out[0][1].shape == (256, 256, 3)


def test_train_cli_with_damage_ladders_and_a_larger_crop_bank(tmp_path):
    from cg_chains import make_clean_dir, make_tiny_chains

    from collapseguard.cli import main

    chains = make_tiny_chains(tmp_path / "chains", n_sources=8)
    clean = make_clean_dir(tmp_path / "clean")
    out = tmp_path / "w.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(clean), "--out", str(out),
                                    "--steps", "20", "--threads", "1", "--width", "6", "--crop-size", "32",
                                    "--n-crops", "8", "--generic-ladders", "2", "--bank-crops", "6",
                                    "--no-eval"])
    assert res.exit_code == 0, res.output
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["config"]["generic_ladders"] == 2
    assert summary["data"]["crops_per_bank_image"] == 6
    card = out.with_suffix(".md").read_text()
    assert "- damage ladders: 2 per clean training file" in card and "- crop bank: 6 crops" in card
    n_clean_train = summary["data"]["n_clean_train_files"]
    assert f"{2 * n_clean_train} damage ladders" in res.output


def test_damage_ladders_without_clean_files_is_a_clear_error(tmp_path):
    from cg_chains import make_tiny_chains

    from collapseguard.cli import main

    chains = make_tiny_chains(tmp_path / "chains", n_sources=4)
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(tmp_path / "w.safetensors"),
                                    "--steps", "2", "--generic-ladders", "1", "--no-eval"])
    assert res.exit_code != 0
    assert "--generic-ladders makes its ladders from the --clean files" in res.output
    assert not (tmp_path / "w.safetensors").exists()


def test_ladders_of_two_files_of_one_name_stay_two_chains(tmp_path):
    from collapseguard.training.loop import Batcher, TrainConfig

    files = []
    for k, folder in enumerate(("a", "b")):  # photo.png in two --clean folders: two pictures
        (tmp_path / folder).mkdir()
        img = (np.random.default_rng(k).random((96, 96, 3)) * 255).astype(np.uint8)
        Image.fromarray(img).save(tmp_path / folder / "photo.png")
        files.append(tmp_path / folder / "photo.png")
    bank = ladder_bank(damage_ladders(ladder_sources(files, seed=3), 1, seed=4), 32, 4, seed=5)
    steps = bank.meta.groupby("chain_id")["step"].apply(list)
    assert len(steps) == 2 and all(s == [0, 3, 5, 10] for s in steps), steps
    rows = Batcher(bank, None, TrainConfig(threads=1)).chain_rows
    assert sorted(len(r) for r in rows) == [4, 4]  # each ladder ranked on its own
