"""Training the cnn detector: losses, crop banks, a tiny run on tiny chains, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from cg_chains import (
    held_out_chains,
    make_clean_dir,
    make_tiny_chains,
    smooth_art,
    trivial_degrade,
)
from click.testing import CliRunner
from PIL import Image

from collapseguard.cli import main
from collapseguard.detectors.cnn_model import NetConfig
from collapseguard.training.bank import chain_bank, image_bank, step_label
from collapseguard.training.loop import TrainConfig, train_net
from collapseguard.training.losses import (
    classification_loss,
    pair_indices,
    ranking_loss,
)
from collapseguard.training.metrics import (
    auroc,
    chain_auroc_table,
    clean_false_positive_rate,
)


def test_step_labels():
    assert step_label(0) == (0.0, 1.0)
    assert step_label(1)[1] == 0.0 and step_label(2)[1] == 0.0
    assert 0 < step_label(3)[1] < 1
    assert step_label(10) == (1.0, 1.0)


def test_classification_loss_soft_targets_and_zero_weights():
    logits = torch.tensor([0.0, 2.0, -2.0])
    w = torch.tensor([1.0, 1.0, 0.0])
    soft = classification_loss(logits, torch.tensor([0.5, 1.0, 1.0]), w)
    expected = (np.log(2) + np.log1p(np.exp(-2.0))) / 2
    assert soft.item() == pytest.approx(expected, rel=1e-5)
    assert classification_loss(logits, torch.ones(3), torch.zeros(3)).item() == 0.0


def test_ranking_pairs_stay_within_groups_and_order():
    groups = torch.tensor([0, 0, 0, 1, 1, -1])
    order = torch.tensor([0, 5, 10, 3, 1, 0])
    i, j = pair_indices(groups, order)
    pairs = set(zip(i.tolist(), j.tolist()))
    assert pairs == {(0, 1), (0, 2), (1, 2), (4, 3)}
    good = torch.tensor([0.0, 5.0, 10.0, 5.0, 0.0, 0.0])
    bad = torch.tensor([10.0, 5.0, 0.0, 0.0, 5.0, 0.0])
    assert ranking_loss(good, groups, order) < 0.01 < ranking_loss(bad, groups, order)


def test_metrics_arithmetic():
    assert auroc([0, 1], [2, 3]) == 1.0
    assert auroc([2, 3], [0, 1]) == 0.0
    assert auroc([0, 2], [1, 3]) == 0.75
    thr, fpr = clean_false_positive_rate(np.array([0.0, 1.0, 5.0, 9.0]), np.arange(101, dtype=float), drop=0.95)
    assert thr == pytest.approx(5.0) and fpr == 0.25
    df = pd.DataFrame({"family": ["a"] * 4, "chain_id": ["1", "1", "2", "2"], "step": [0, 5, 0, 5],
                       "score": [0.0, 1.0, 2.0, 3.0]})
    tab = chain_auroc_table(df, steps=(5,))
    assert tab.loc["a", "auroc_0v5"] == 0.75 and tab.loc["ALL", "n_chains"] == 2


def test_chain_bank_shares_positions_within_a_chain(tmp_path):
    from collapseguard.training_data_tools.manifest import read_manifest

    df = read_manifest(make_tiny_chains(tmp_path, n_sources=2, steps=(0, 5)))
    bank = chain_bank(df, size=32, per_image=4, seed=1)
    assert bank.crops.shape == (8, 4, 32, 32, 3) and bank.meta["aligned"].all()
    # same positions: step-0 and step-5 crops of one chain differ only by the added noise
    a, b = bank.crops[0].astype(float), bank.crops[1].astype(float)
    other = bank.crops[2].astype(float)  # the next chain (another source): unrelated content
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.8 > np.corrcoef(a.ravel(), other.ravel())[0, 1]
    from collapseguard.training.bank import cache_key, cached

    key = cache_key(sorted(df["path"]), size=32)
    assert key != cache_key(sorted(df["path"]), size=48)
    calls = []
    first = cached(tmp_path / "cache", key, lambda: calls.append(1) or bank)
    again = cached(tmp_path / "cache", key, lambda: calls.append(1) or bank)
    assert calls == [1] and first is bank
    np.testing.assert_array_equal(again.crops, bank.crops)
    assert again.meta.equals(bank.meta)
    # a save that fails after writing the crops (here parquet refuses a column; in use, a full
    # disk) leaves neither a cache entry nor a half-written temp folder behind
    from collapseguard.training.bank import CropBank

    broken = CropBank(bank.crops, bank.meta.assign(bad=[object() for _ in range(len(bank.meta))]))
    with pytest.raises(Exception):
        cached(tmp_path / "cache", "other-key", lambda: broken)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [key]
    small = image_bank([("tiny", np.zeros((10, 12, 3), np.uint8))], size=32, per_image=2, seed=0)
    assert small.crops.shape == (1, 2, 32, 32, 3) and small.meta["target"].iloc[0] == 0.0


def test_chain_bank_delivery_jpeg_encodes_whole_chains_at_one_quality(tmp_path):
    from collapseguard.training.bank import DELIVERY_QUALITY
    from collapseguard.training.negatives import jpeg
    from collapseguard.training_data_tools.manifest import read_manifest

    df = read_manifest(make_tiny_chains(tmp_path, n_sources=6, steps=(0, 3, 5)))
    plain = chain_bank(df, size=32, per_image=3, seed=4)
    assert (plain.meta["jpeg_quality"] == 0).all()
    half = chain_bank(df, size=32, per_image=3, seed=4, delivery_jpeg=0.5)
    # the JPEG choice has its own random stream: same crop positions as without it
    q = half.meta.groupby("chain_id")["jpeg_quality"].agg(["min", "max"])
    assert (q["min"] == q["max"]).all()  # one decision and one quality per chain
    coded = q["min"] > 0
    assert 0 < coded.sum() < len(q)
    assert q.loc[coded, "min"].between(*DELIVERY_QUALITY).all()
    i = int(np.flatnonzero(half.meta["jpeg_quality"] > 0)[0])
    img = np.asarray(Image.open(half.meta.loc[i, "path"]).convert("RGB"))
    full = jpeg(img, int(half.meta.loc[i, "jpeg_quality"]))
    assert not np.array_equal(half.crops[i], plain.crops[i])
    # the crop is cut from the re-encoded image at the position the PNG's crop was cut from
    at = [(y, x) for y in range(img.shape[0] - 31) for x in range(img.shape[1] - 31)
          if np.array_equal(plain.crops[i][0], img[y:y + 32, x:x + 32])]
    assert at and any(np.array_equal(half.crops[i][0], full[y:y + 32, x:x + 32]) for y, x in at)
    uncoded = half.meta["jpeg_quality"].to_numpy() == 0
    np.testing.assert_array_equal(half.crops[uncoded], plain.crops[uncoded])
    with pytest.raises(ValueError, match="delivery_jpeg"):
        chain_bank(df, size=32, per_image=3, seed=4, delivery_jpeg=1.5)
    # per image: decisions and qualities vary within a chain; positions still those of the PNGs
    per_img = chain_bank(df, size=32, per_image=3, seed=4, delivery_jpeg=0.5, delivery_per="image")
    qi = per_img.meta.groupby("chain_id")["jpeg_quality"]
    assert (qi.nunique() > 1).any()
    uncoded = per_img.meta["jpeg_quality"].to_numpy() == 0
    assert 0 < uncoded.sum() < len(uncoded)
    np.testing.assert_array_equal(per_img.crops[uncoded], plain.crops[uncoded])
    with pytest.raises(ValueError, match="delivery_per"):
        chain_bank(df, size=32, per_image=3, seed=4, delivery_jpeg=0.5, delivery_per="shard")


def _tiny_training_setup(tmp_path):
    from collapseguard.training_data_tools.manifest import read_manifest

    df = read_manifest(make_tiny_chains(tmp_path))
    bank = chain_bank(df, size=32, per_image=4, seed=0)
    rng = np.random.default_rng(3)
    clean = image_bank([(f"c{i}", smooth_art(rng)) for i in range(6)], size=32, per_image=4, seed=0)
    return bank, clean


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tiny_training_lowers_loss(tmp_path, precision):
    bank, clean = _tiny_training_setup(tmp_path)
    cfg = TrainConfig(iterations=60, chains_per_batch=6, clean_per_batch=4, crops_per_image=2,
                      lr=5e-3, threads=1, log_every=10, precision=precision,
                      net=NetConfig(width=6, crop_size=32))
    net, hist = train_net(bank, clean, cfg, log=lambda s: None)
    assert len(hist) == 6
    assert hist[-1]["loss"] < 0.7 * hist[0]["loss"]
    assert not net.training
    assert all(p.dtype == torch.float32 for p in net.parameters())
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_on_cuda_follows_the_cpu_run(tmp_path, precision):
    """Same seed, same batches: a CUDA run lowers its loss and tracks the CPU run's losses."""
    bank, clean = _tiny_training_setup(tmp_path)
    runs = {}
    for device in ("cpu", "cuda"):
        cfg = TrainConfig(iterations=60, chains_per_batch=6, clean_per_batch=4, crops_per_image=2,
                          lr=5e-3, threads=1, log_every=10, precision=precision, device=device,
                          net=NetConfig(width=6, crop_size=32))
        runs[device] = train_net(bank, clean, cfg, log=lambda s: None)
    net, hist = runs["cuda"]
    assert hist[-1]["loss"] < 0.7 * hist[0]["loss"]
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in net.parameters())
    assert not net.training
    # the first ten iterations see identical batches and start from identical weights
    first_cpu, first_cuda = runs["cpu"][1][0]["loss"], hist[0]["loss"]
    assert abs(first_cuda - first_cpu) < (0.05 if precision == "bf16" else 0.01) * first_cpu


def test_train_device_errors(tmp_path):
    with pytest.raises(RuntimeError):
        TrainConfig(device="bogus")
    chains = make_tiny_chains(tmp_path / "chains", n_sources=4)
    out = tmp_path / "w.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(out), "--steps", "1",
                                    "--device", "bogus"])
    assert res.exit_code == 2 and "--device" in res.output
    if not torch.cuda.is_available():
        res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(out), "--steps", "1",
                                        "--device", "cuda"])
        assert res.exit_code == 2 and "no CUDA device" in res.output
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(out), "--steps", "1",
                                    "--context", "--bank-crops", "1"])
    assert res.exit_code == 2 and "--context needs --bank-crops >= 2" in res.output
    assert not out.exists()
    # no untrained weights written as if trained; an unwritable --out fails before training
    for bad in (["--steps", "0"], ["--epochs", "0"]):
        res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(out), *bad])
        assert res.exit_code == 2 and bad[0] in res.output
    (tmp_path / "afile").write_text("x")
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out",
                                    str(tmp_path / "afile" / "w.safetensors"), "--steps", "1"])
    assert res.exit_code == 1 and "cannot write --out" in res.output and "scoring" not in res.output
    assert not out.exists()


def test_hard_clean_draws_the_clean_images_scored_highest():
    from collapseguard.training.loop import Batcher

    rng = np.random.default_rng(5)
    clean = image_bank([(f"c{i}", smooth_art(rng)) for i in range(40)], size=32, per_image=2, seed=0)
    uniform = Batcher(None, clean, TrainConfig(clean_per_batch=8, crops_per_image=1))
    hard = Batcher(None, clean, TrainConfig(clean_per_batch=8, crops_per_image=1, hard_clean=0.5))
    b = hard.batch()
    start, rows = b["clean_at"]
    assert start == 0 and len(set(rows.tolist())) == 8
    # score every clean image once: rows 30..39 score highest
    scores = np.arange(40, dtype=np.float32)
    for _ in range(20):
        b = hard.batch()
        _, rows = b["clean_at"]
        hard.observe(b, torch.from_numpy(scores[rows]))
    assert np.isfinite(hard.clean_score).all()
    picks = np.concatenate([hard.batch()["clean_at"][1][:4] for _ in range(30)])
    assert set(picks.tolist()) <= set(range(30, 40))  # the hard half comes from the top quarter
    # the default draw is uniform and ignores scores
    picks = np.concatenate([uniform.batch()["clean_at"][1] for _ in range(30)])
    assert picks.min() < 30


def test_weight_average_is_the_mean_of_the_snapshots():
    from collapseguard.training.loop import WeightAverage

    net = torch.nn.Linear(3, 2)
    avg = WeightAverage()
    for k in range(3):
        with torch.no_grad():
            net.weight.fill_(float(k))
            net.bias.copy_(torch.tensor([k * 2.0, -1.0]))
        avg.update(net)
    avg.load_into(net)
    assert avg.n == 3
    torch.testing.assert_close(net.weight, torch.full((2, 3), 1.0))
    torch.testing.assert_close(net.bias, torch.tensor([2.0, -1.0]))
    assert net.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="average_from"):
        TrainConfig(average_from=1.0)


def test_train_cli_writes_weights_card_and_metrics(tmp_path):
    chains = make_tiny_chains(tmp_path / "chains", n_sources=10)
    clean = make_clean_dir(tmp_path / "clean")
    out = tmp_path / "w" / "tiny.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(clean), "--out", str(out),
                                    "--steps", "40", "--threads", "1", "--width", "6", "--crop-size", "32",
                                    "--n-crops", "10", "--seed", "1", "--exclude-family", "grain2"])
    assert res.exit_code == 0, res.output
    assert "iter 40/40" in res.output and "held-out" in res.output
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["data"]["families_train"] == ["noise"]
    assert summary["data"]["families_excluded"] == ["grain2"]
    assert summary["data"]["n_chains_train"] + summary["data"]["n_chains_test"] == 10
    assert "Held-out metrics" in out.with_suffix(".md").read_text()
    from collapseguard.detectors import create

    det = create("cnn", weights=str(out))
    assert det.version == summary["version"]
    assert det.n_crops == 10 and summary["config"]["net"]["n_crops"] == 10  # stored with the weights
    bad = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(out),
                                    "--exclude-family", "nope", "--no-eval", "--steps", "1"])
    assert bad.exit_code != 0 and "not among families" in bad.output


def test_clean_variants_and_camera_noise(tmp_path):
    from collapseguard.training.negatives import (
        clean_variants,
        list_images,
        sensor_noise,
        split_clean,
    )

    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(smooth_art(rng, 300, 400)).save(tmp_path / f"p{i}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    files = list_images([tmp_path])
    assert [f.name for f in files] == ["p0.png", "p1.png", "p2.png"]
    train, held = split_clean(files, holdout=0.5)
    assert sorted(train + held) == files and split_clean(files, holdout=0.5) == (train, held)
    out = list(clean_variants(files[:1], 3, seed=1, long_side=(200, 250), window_side=128))
    assert [n for n, _ in out] == ["p0.png#0", "p0.png#1", "p0.png#2"]  # a file name no other file has
    assert max(out[0][1].shape[:2]) <= 250 and max(out[1][1].shape[:2]) <= 128 * 1.6 + 1
    flat = np.full((200, 200, 3), 128, np.uint8)
    noisy = sensor_noise(flat, np.random.default_rng(2), iso_sigma=4.0).astype(float)
    assert 2.0 < noisy.std() < 6.0 and abs(noisy.mean() - 128) < 1
    with pytest.raises(FileNotFoundError):
        list_images([tmp_path / "missing"])


def test_jpeg_round_trip_keeps_pillows_default_and_can_keep_full_chroma():
    from collapseguard.training.negatives import jpeg

    # fine red/green checkerboard on grey: luma is nearly flat, all detail is in the chroma
    yy, xx = np.mgrid[0:64, 0:64]
    board = ((yy + xx) % 2).astype(np.float32)[..., None]
    img = np.clip(128 + 60 * board * np.array([1, -1, 0]) + 60 * (1 - board) * np.array([-1, 1, 0]),
                  0, 255).astype(np.uint8)
    err = {s: np.abs(jpeg(img, 95, subsampling=s).astype(float) - img).mean() for s in (None, 0, 2)}
    # 4:2:0 averages the chroma of every 2x2 block, which erases this pattern; 4:4:4 keeps it
    assert err[0] < 0.25 * err[2]
    # the default is Pillow's 4:2:0, the storage that made the shipped weights (training delivery)
    assert err[None] == err[2]


def test_jpeg_crops_codes_each_crop_as_if_alone():
    from collapseguard.training.loop import jpeg_crops
    from collapseguard.training.negatives import jpeg

    rng = np.random.default_rng(1)
    crops = np.stack([trivial_degrade(smooth_art(rng, 48, 48), 3, rng) for _ in range(5)])
    coded = jpeg_crops(crops, 80)
    assert coded.shape == crops.shape and coded.dtype == np.uint8
    coding_error = np.abs(coded.astype(float) - crops).mean()
    assert coding_error > 1.0  # it really is JPEG-coded
    alone = np.stack([jpeg(c, 80, subsampling=2) for c in crops])
    # 48 px = three 16 px chroma cells: only the decoder's chroma upsampling looks across the
    # seam, so away from the crops' left and right edges the strip codes each crop exactly alone
    inner = (slice(None), slice(None), slice(2, -2))
    np.testing.assert_array_equal(coded[inner], alone[inner])
    assert np.abs(coded.astype(float) - alone).mean() < 0.1 * coding_error


def test_storage_consistency_batches_and_training(tmp_path):
    from collapseguard.training.loop import Batcher
    from collapseguard.training_data_tools.manifest import read_manifest

    df = read_manifest(make_tiny_chains(tmp_path, n_sources=8))
    bank = chain_bank(df, size=32, per_image=4, seed=0, delivery_jpeg=0.5)
    rng = np.random.default_rng(3)
    clean = image_bank([(f"c{i}", smooth_art(rng)) for i in range(6)], size=32, per_image=4, seed=0)
    kw = dict(chains_per_batch=6, clean_per_batch=4, crops_per_image=2, threads=1,
              net=NetConfig(width=6, crop_size=32))
    plain = Batcher(bank, clean, TrainConfig(**kw)).batch()
    withc = Batcher(bank, clean, TrainConfig(storage_consistency=1.0, consistency_images=5, **kw)).batch()
    n = len(plain["target"])
    assert len(plain["cons_src"]) == 0 and len(plain["crops"]) == n
    # the batch itself is drawn exactly as without the option; the JPEG copies come after it
    np.testing.assert_array_equal(withc["crops"][:n].numpy(), plain["crops"].numpy())
    src = withc["cons_src"].numpy()
    assert len(withc["crops"]) == n + len(src) and 0 < len(src) <= 5
    assert (src < 6 * 3).all()  # copies only of chain images ...
    assert (bank.meta["jpeg_quality"] == 0).any() and (bank.meta["jpeg_quality"] > 0).any()
    copies = withc["crops"][n:].numpy()
    from collapseguard.training.loop import CONSISTENCY_QUALITY, jpeg_crops
    for j, p in enumerate(src):  # ... and of PNG-delivered images' crops, JPEG-coded at one quality
        original = plain["crops"][p].numpy()
        assert any(np.array_equal(copies[j], jpeg_crops(original, q))
                   for q in range(CONSISTENCY_QUALITY[0], CONSISTENCY_QUALITY[1] + 1))
    # images already JPEG-delivered get no copy: with every chain delivered there is none
    coded = chain_bank(df, size=32, per_image=4, seed=0, delivery_jpeg=1.0)
    assert len(Batcher(coded, clean, TrainConfig(storage_consistency=1.0, **kw)).batch()["cons_src"]) == 0
    with pytest.raises(ValueError, match="storage_consistency"):
        TrainConfig(storage_consistency=-1)

    # training with the loss brings the scores of JPEG copies closer to their originals'
    gaps = {}
    for w in (0.0, 0.3):
        cfg = TrainConfig(iterations=80, lr=5e-3, log_every=20, storage_consistency=w,
                          consistency_images=12, **kw)
        net, hist = train_net(bank, clean, cfg, log=lambda s: None)
        assert hist[-1]["cls"] < hist[0]["cls"]
        png = bank.crops[(bank.meta["jpeg_quality"] == 0).to_numpy() & (bank.meta["step"] >= 5).to_numpy()]
        coded = np.stack([jpeg_crops(c, 75) for c in png])
        with torch.no_grad():
            a, b = net(torch.from_numpy(png)), net(torch.from_numpy(coded))
        gaps[w] = float((a - b).abs().mean())
        assert (hist[-1]["cons"] > 0) == (w > 0)
    assert gaps[0.3] < 0.5 * gaps[0.0], gaps


def test_train_names_a_corrupt_chain_image_and_reads_a_repeated_chains_folder_once(tmp_path):
    from collapseguard.training.run import load_chains
    chains = make_tiny_chains(tmp_path / "chains", n_sources=4)
    assert len(load_chains([chains, chains])) == len(load_chains([chains]))
    from pathlib import Path
    victims = sorted(p for p in Path(chains).rglob("*.png") if p.stem.endswith("1"))
    assert victims
    for v in victims:  # every step-1 image, so training cannot miss them all
        v.write_bytes(b"not a png")
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(tmp_path / "w.safetensors"),
                                    "--steps", "1", "--no-eval"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert any(str(v) in res.output for v in victims) and "cannot identify image file" in res.output


def test_train_warns_about_splits_that_leave_nothing_out_and_refuses_an_empty_clean_folder(tmp_path):
    from collapseguard.training.run import TEST_FRACTION, split_chains

    chains = make_tiny_chains(tmp_path / "chains", n_sources=2, families=("noise",))
    df = pd.read_csv(chains / "manifest.csv")
    assert split_chains(df)[1].empty, "the fixture needs both sources in the training split"
    assert TEST_FRACTION < 0.5
    common = ["train", "--chains", str(chains), "--steps", "2", "--threads", "1", "--width", "4",
              "--crop-size", "32", "--n-crops", "4", "--bank-crops", "4"]
    res = CliRunner().invoke(main, common + ["--out", str(tmp_path / "a.safetensors")])
    assert res.exit_code == 0, res.output
    assert "warning: no --clean folders" in res.output
    assert "warning: the split by source held out no chains (2 source images" in res.output
    assert "no chain has a step of 3 or more" not in res.output
    early = make_tiny_chains(tmp_path / "early", n_sources=2, steps=(0, 1, 2), families=("noise",))
    res = CliRunner().invoke(main, [*common[:2], str(early), *common[3:], "--no-eval",
                                    "--out", str(tmp_path / "early.safetensors")])
    assert res.exit_code == 0, res.output
    assert ("warning: no chain has a step of 3 or more (the highest is 2): the clean-vs-degraded "
            "term has no degraded image") in res.output
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "notes.txt").write_text("no images here")
    res = CliRunner().invoke(main, common + ["--clean", str(empty), "--out", str(tmp_path / "b.safetensors")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert f"--clean {empty}: no image files in it" in res.output
    assert not (tmp_path / "b.safetensors").exists()
    one = make_clean_dir(tmp_path / "one", n=1)
    res = CliRunner().invoke(main, common + ["--clean", str(one), "--no-eval", "--out", str(tmp_path / "c.safetensors")])
    assert res.exit_code == 0, res.output
    assert "no --clean folders" not in res.output and "held out no chains" not in res.output  # --no-eval
    from collapseguard.training.negatives import split_clean

    train_files, held_files = split_clean(sorted(one.iterdir()))
    if held_files:
        assert "warning: all 1 --clean files fell in the held-out quarter" in res.output
    else:
        assert "fell in the held-out quarter" not in res.output
        res = CliRunner().invoke(main, common + ["--clean", str(one), "--out", str(tmp_path / "d.safetensors")])
        assert res.exit_code == 0 and ("warning: no held-out --clean file is left (none of the 1 files "
                                       "fell in the held-out quarter)") in res.output


TINY = ["--threads", "1", "--width", "4", "--crop-size", "32", "--n-crops", "4", "--bank-crops", "4"]


def test_train_refuses_a_chain_given_in_two_chains_folders(tmp_path):
    import shutil

    a = make_tiny_chains(tmp_path / "a", n_sources=4)
    b = tmp_path / "b"
    shutil.copytree(a, b)  # the same chain ids (other files): they must not merge into one chain
    res = CliRunner().invoke(main, ["train", "--chains", str(a), "--chains", str(b), "--steps", "1",
                                    "--no-eval", "--out", str(tmp_path / "w.safetensors"), *TINY])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "is in two --chains manifests" in res.output and "with --repeats" in res.output


def test_train_cli_checks_threads_width_net_settings_and_the_card_paths_first(tmp_path):
    chains = make_tiny_chains(tmp_path / "chains", n_sources=4)
    common = ["train", "--chains", str(chains), "--steps", "1", "--no-eval", "--out", str(tmp_path / "w.safetensors")]
    for bad in (["--threads", "-1"], ["--threads", "0"], ["--width", "0"]):
        res = CliRunner().invoke(main, common + bad)
        assert res.exit_code == 2 and "Traceback" not in res.output, (bad, res.output)
        assert bad[0] in res.output
    for size in ("7", "5000"):  # 5000 px crops would fill memory in the crop banks
        res = CliRunner().invoke(main, common + ["--crop-size", size])
        assert res.exit_code == 2 and "--crop-size" in res.output and "8<=x<=256" in res.output, res.output
        assert "Traceback" not in res.output and "--device" not in res.output
    with pytest.raises(ValueError, match="between 8 and 256 pixels"):  # weights claiming it too
        NetConfig(crop_size=5000)
    (tmp_path / "w.json").mkdir()  # the summary cannot be written: say so before training
    res = CliRunner().invoke(main, common + TINY)
    assert res.exit_code == 1 and "cannot write" in res.output and "w.json" in res.output
    assert "iter" not in res.output and not (tmp_path / "w.safetensors").exists()


def test_train_names_an_undecodable_held_out_image_and_leaves_no_card_of_other_weights(tmp_path):
    from pathlib import Path

    from collapseguard.detectors import create

    chains, test_df = held_out_chains(tmp_path)
    out = tmp_path / "w.safetensors"
    args = ["train", "--chains", str(chains), "--steps", "3", "--out", str(out), *TINY]
    assert CliRunner().invoke(main, args + ["--seed", "1"]).exit_code == 0
    victim = Path(test_df.loc[test_df["step"] == 5, "path"].iloc[0])
    victim.write_bytes(b"not a png")
    res = CliRunner().invoke(main, args + ["--seed", "2"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert str(victim) in res.output
    summary = json.loads(out.with_suffix(".json").read_text())  # this run's, without metrics
    assert summary["version"] == create("cnn", weights=str(out)).version
    assert summary["config"]["seed"] == 2 and summary["heldout_auroc"] == []
    assert summary["version"] in out.with_suffix(".md").read_text()


def test_train_warns_when_a_chain_source_is_a_clean_file_on_the_other_side(tmp_path):
    from collapseguard.training.negatives import split_clean

    chains, _ = held_out_chains(tmp_path)
    clean = tmp_path / "clean"
    clean.mkdir()
    rng = np.random.default_rng(1)
    for name in ("src22", "src0", "other"):  # src22: held-out source; src0: a training source
        Image.fromarray(smooth_art(rng)).save(clean / f"{name}.png")
    train_files, held_files = split_clean(sorted(clean.iterdir()))
    assert clean / "src22.png" in train_files and clean / "src0.png" in held_files
    args = ["train", "--chains", str(chains), "--clean", str(clean), "--steps", "2",
            "--out", str(tmp_path / "w.safetensors"), *TINY]
    res = CliRunner().invoke(main, args + ["--shared-clean", "keep"])
    assert res.exit_code == 0, res.output
    assert "warning: 1 of 1 held-out chain sources share their name with a --clean file" in res.output
    assert "(e.g. src22)" in res.output and "(e.g. src0)" in res.output
    assert "warning: 1 of 29 training chain sources" in res.output
    assert "clean files 2 train / 1 held-out" in res.output
    summary = json.loads((tmp_path / "w.json").read_text())  # what the run needs to be repeated
    assert summary["data"]["clean_dirs"] == [str(clean)]
    assert summary["data"]["chain_dirs"] == [str(chains)]
    assert summary["data"]["shared_clean"] == "keep"
    # the default leaves both out: src22 is not a training negative, src0 not a held-out clean image
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "share their name" not in res.output
    assert ("left out 1 training --clean files whose picture is a held-out chain source and 1 "
            "held-out --clean files whose picture is a training chain source") in res.output
    assert "clean files 1 train / 0 held-out" in res.output
    data = json.loads((tmp_path / "w.json").read_text())["data"]
    assert data["shared_clean"] == "drop" and data["clean_left_out"] == {"train": 1, "heldout": 1}
    assert data["n_clean_train_files"] == 1 and data["n_clean_heldout_files"] == 0


def test_train_uses_a_picture_given_under_two_names_once(tmp_path):
    import shutil

    from collapseguard.training.negatives import drop_identical, split_clean

    chains = make_tiny_chains(tmp_path / "chains", n_sources=4)
    clean = make_clean_dir(tmp_path / "clean", n=3)
    first = sorted(clean.iterdir())[0]
    # a name that split_clean puts on the other side than the original: one picture would be a
    # training negative and a held-out clean image at once
    side = split_clean([first])[1] == [first]
    twin = next(clean / f"copy{k}{first.suffix}" for k in range(200)
                if (split_clean([clean / f"copy{k}{first.suffix}"])[1] == []) == side)
    shutil.copyfile(first, twin)
    files = sorted(clean.iterdir())
    kept, dropped = drop_identical(files)
    assert len(kept) == 3 and len(dropped) == 1 and {dropped[0][0], dropped[0][1]} == {first, twin}
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(clean), "--steps", "1",
                                    "--out", str(tmp_path / "w.safetensors"), *TINY])
    assert res.exit_code == 0, res.output
    assert "warning: 1 --clean files are byte-identical to another and are used once" in res.output
    train_n, held_n = (len(x) for x in split_clean(kept))
    assert f"clean files {train_n} train / {held_n} held-out" in res.output


def test_colour_permute_reorders_whole_chains_and_each_clean_image():
    from collapseguard.training.bank import CropBank
    from collapseguard.training.loop import CHANNEL_ORDERS, Batcher

    def bank(n_images, chain_len):
        # every pixel is (10, 100, 200) plus the image's index: the channel order is readable
        crops = np.zeros((n_images, 4, 16, 16, 3), np.uint8)
        crops[...] = np.array([10, 100, 200], np.uint8)
        crops += np.arange(n_images, dtype=np.uint8)[:, None, None, None, None]
        meta = pd.DataFrame({"chain_id": [f"c{i // chain_len}" if chain_len else "" for i in range(n_images)],
                             "step": [i % chain_len if chain_len else -1 for i in range(n_images)],
                             "target": 0.0, "weight": 1.0, "aligned": True})
        return CropBank(crops, meta)

    chains, clean = bank(30, 3), bank(40, 0)
    cfg = dict(chains_per_batch=10, steps_per_chain=3, clean_per_batch=40, crops_per_image=2)

    def orders(crops):  # (N, K, S, S, 3) -> the channel order of each image, as a tuple
        order = np.argsort(crops[:, 0, 0, 0, :].astype(int), axis=1)
        return [tuple(int(c) for c in o) for o in order]

    plain = Batcher(chains, clean, TrainConfig(**cfg)).batch()["crops"].numpy()
    assert set(orders(plain)) == {(0, 1, 2)}  # the shipped recipe: colours as stored
    permuted = [Batcher(chains, clean, TrainConfig(**cfg, colour_permute=1.0, seed=s)).batch()["crops"].numpy()
                for s in range(3)]
    for crops in permuted:
        seen = orders(crops)
        inverse = {tuple(int(i) for i in np.argsort(o)) for o in CHANNEL_ORDERS}
        assert set(seen) <= inverse  # always one of the five other orders, never R, G, B
        # a chain's three steps share one order: damage is compared in one colour frame
        assert all(len(set(seen[i:i + 3])) == 1 for i in range(0, 30, 3))
        # the clean images draw their orders on their own
        assert len(set(seen[30:])) >= 3
        # pixel values are moved between channels, never changed
        ordered = np.sort(crops.astype(int), axis=-1)
        assert (ordered[..., 1] - ordered[..., 0] == 90).all() and (ordered[..., 2] - ordered[..., 1] == 100).all()
    half = Batcher(chains, clean, TrainConfig(**cfg, colour_permute=0.5)).batch()["crops"].numpy()
    assert 0 < orders(half).count((0, 1, 2)) < len(half)
    with pytest.raises(ValueError, match="colour_permute"):
        TrainConfig(colour_permute=1.5)


def test_shared_clean_drop_finds_chain_pictures_whose_names_were_cleaned(tmp_path):
    """Chain sources made from ``IMG 0001.jpg``, ``café.jpg`` and ``logo@2x.jpg`` (views named
    ``<picture>@native``/``@web``) are matched to those very clean files, so ``--shared-clean
    drop`` leaves none of them among the negatives."""
    import numpy as np
    import pandas as pd
    from PIL import Image

    from collapseguard.training.run import sources_among_clean, without_pictures_of
    from collapseguard.training_data_tools.sources import photo_views

    names = ["IMG 0001.jpg", "café.jpg", "logo@2x.jpg", "plain.jpg"]
    files = []
    for i, n in enumerate(names):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (96, 96, 3), dtype=np.uint8)).save(tmp_path / n)
        files.append(tmp_path / n)
    views = [name for name, _ in photo_views(files, side=32, both=True)]
    chains = pd.DataFrame({"source_image": views})
    kept, gone = without_pictures_of(chains, files)
    assert kept == [] and gone == len(files)
    assert len(sources_among_clean(chains, files)) == len(views)
    other = tmp_path / "IMG_0001.jpg"  # another picture, whose name "IMG 0001" cleans close to
    Image.fromarray(np.zeros((96, 96, 3), np.uint8)).save(other)
    assert without_pictures_of(chains, [other]) == ([other], 0)


def test_a_corrected_manifest_over_the_same_images_does_not_reuse_the_cached_bank(tmp_path, monkeypatch):
    """``--cache`` keys the chain bank by the manifest's labels too: the same manifest again reuses
    the bank, a family renamed over the same images builds it anew."""
    import collapseguard.training.run as run_mod
    from collapseguard.training_data_tools.manifest import read_manifest, write_manifest

    built = []
    real = run_mod.chain_bank
    monkeypatch.setattr(run_mod, "chain_bank", lambda df, *a, **k: built.append(sorted(set(df["family"])))
                        or real(df, *a, **k))
    chains = make_tiny_chains(tmp_path / "chains", n_sources=10)
    cache = tmp_path / "cache"
    args = ["train", "--chains", str(chains), "--steps", "2", "--threads", "1", "--width", "6",
            "--crop-size", "32", "--no-eval", "--cache", str(cache)]
    for name in ("a", "b"):
        res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / f"{name}.safetensors")])
        assert res.exit_code == 0, res.output
    assert len(built) == 1  # the same manifest: the cached bank
    m = read_manifest(chains)
    m["family"] = m["family"].replace({"grain2": "grain3"})
    write_manifest(m, chains / "manifest.csv")
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "c.safetensors")])
    assert res.exit_code == 0, res.output
    assert len(built) == 2 and "grain3" in built[-1]


def test_settings_that_cannot_work_together_are_refused_before_training(tmp_path):
    chains = make_tiny_chains(tmp_path / "chains", n_sources=4)
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(tmp_path / "w.safetensors"),
                                    "--storage-consistency", "0.5", "--delivery-jpeg", "1", "--steps", "1"])
    assert res.exit_code == 2 and "delivery_jpeg" in res.output and "--device" not in res.output
    empty = tmp_path / "broken"
    empty.mkdir()
    (empty / "a.png").write_bytes(b"not a png")
    (empty / "b.png").write_bytes(b"not a png either")
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(empty), "--generic-ladders", "2",
                                    "--out", str(tmp_path / "w2.safetensors"), "--steps", "1", "--no-eval",
                                    "--threads", "1", "--width", "6", "--crop-size", "32"])
    assert res.exit_code == 1 and "could be decoded" in res.output and "Traceback" not in res.output


def test_a_family_name_that_is_markup_is_shown_as_text_in_the_card_and_in_evaluate(tmp_path):
    """Family names come from manifests: in the model card (its list and table) and in
    ``evaluate``'s results.md (tables and notes) markup is written as entities, never raw."""
    chains = make_tiny_chains(tmp_path / "chains", n_sources=10, families=("<img src=x onerror=alert(1)>", "noise"))
    out = tmp_path / "w.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(out), "--steps", "5", *TINY])
    assert res.exit_code == 0, res.output
    card = out.with_suffix(".md").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in card and "<img" not in card
    res = CliRunner().invoke(main, ["evaluate", "--chains", str(chains), "-d", "nss", "--no-plot", "-q",
                                    "--steps", "5,10", "--out", str(tmp_path / "ev")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "ev" / "results.md").read_text()
    assert "onerror" in md and "<img" not in md


def test_ctrl_c_names_the_checkpoint_and_how_to_go_on(tmp_path):
    """Interrupted (SIGINT, as Ctrl-C sends), train says which step its checkpoint holds and that
    --resume goes on from it, instead of click's bare "Aborted!"."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    chains = make_tiny_chains(tmp_path / "chains", n_sources=6)
    out = tmp_path / "w.safetensors"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", "from collapseguard.cli import main; main()", "train",
                             "--chains", str(chains), "--out", str(out), "--steps", "100000", "--threads", "1",
                             "--width", "6", "--crop-size", "32", "--n-crops", "10", "--no-eval",
                             "--checkpoint-steps", "5"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    ckpt = tmp_path / "w.ckpt.json"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not ckpt.exists():
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it was interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    step = json.loads(ckpt.read_text())["step"]
    assert f"interrupted: the checkpoint {ckpt} holds step {step}" in err, err
    assert "--resume goes on from it" in err


def test_undecodable_clean_files_are_named_and_not_counted(tmp_path):
    """A --clean file that cannot be decoded gave no clean image yet was counted as a training
    negative (summary, card) with no word; it is now named in a note and left out of the count."""
    chains = make_tiny_chains(tmp_path / "chains", n_sources=6)
    clean = make_clean_dir(tmp_path / "clean", n=4)
    for i in range(8):
        (clean / f"broken{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes([i]) * 40)  # each its own bytes
    out = tmp_path / "w.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(clean), "--out", str(out),
                                    "--steps", "2", "--no-eval", *TINY])
    assert res.exit_code == 0, res.output
    data = json.loads(out.with_suffix(".json").read_text())["data"]
    bad = data["n_clean_train_files_unreadable"]
    assert bad > 0 and f"note: {bad} of {data['n_clean_train_files'] + bad} training --clean files could not be decoded" in res.output
    assert "broken" in res.output
    good = [p for p in clean.iterdir() if p.name.startswith("photo")]
    assert data["n_clean_train_files"] <= len(good)
    assert f"clean negatives: {data['n_clean_train_files']} files" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("broken", ["a", "b"])
def test_an_undecodable_clean_file_is_told_from_a_good_one_of_the_same_name(tmp_path, broken):
    """a/img.png and b/img.png, one of them undecodable: the clean bank's images name such files
    by path, so the undecodable one is the one reported, whichever folder holds it."""
    from collapseguard.training.negatives import clean_variants
    from collapseguard.training.run import unused_clean_files

    rng = np.random.default_rng(0)
    files = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "img.png"
        if folder == broken:
            path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
        else:
            Image.fromarray(smooth_art(rng, 80, 96)).save(path)
        files.append(path)
    bank = image_bank(clean_variants(files, 2, seed=1, long_side=(96, 96), window_side=64), 32, 2, seed=0)
    assert len(bank) == 2  # the good file's two variants
    good = files[1] if broken == "a" else files[0]
    assert {str(n).rsplit("#", 1)[0] for n in bank.meta["source_image"]} == {str(good)}
    assert unused_clean_files(files, bank) == [tmp_path / broken / "img.png"]


def test_a_held_out_rate_without_step_10_says_why_it_is_missing(tmp_path):
    """Chains without step 10 leave the 95%-of-step-10 threshold undefined: the held-out clean
    rate says why it is n/a instead of printing nan."""
    chains = make_tiny_chains(tmp_path / "chains", n_sources=10, steps=(0, 1, 3, 5))
    clean = make_clean_dir(tmp_path / "clean", n=12)
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(clean),
                                    "--out", str(tmp_path / "w.safetensors"),
                                    "--steps", "2", *TINY])
    assert res.exit_code == 0, res.output
    assert "n/a (no held-out step-10 image sets the threshold)" in res.output and ": nan" not in res.output


def test_a_held_out_clean_file_left_out_as_a_training_source_is_said_so(tmp_path):
    """split_warnings names why no held-out clean file is left: none fell there, or those that did
    are pictures of training chain sources (--shared-clean drop), not a contradiction of the line
    before it."""
    import pandas as pd

    from collapseguard.training.run import split_warnings

    df = pd.DataFrame({"step": [0, 5], "source_image": ["a", "a"]})
    left = split_warnings(df, df, ["clean"], ["x.png"] * 6, [], True, held_left_out=1)
    assert any("the 1 that fell in the held-out quarter are pictures of training chain sources" in w
               for w in left), left
    none = split_warnings(df, df, ["clean"], ["x.png"] * 6, [], True)
    assert any("none of the 6 files fell in the held-out quarter" in w for w in none), none
