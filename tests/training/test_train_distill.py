"""Distillation: a student trained on a teacher detector's labels ranks held-out images like it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from collapseguard.cli import main
from collapseguard.detectors import register
from collapseguard.detectors.base import Detector
from collapseguard.training.distill import soft_targets
from collapseguard.training.losses import ranking_loss


class HighPassTeacher(Detector):
    """A deterministic stand-in for a slow judge: mean absolute high-pass energy."""

    name = "test-highpass"
    version = "hp1"

    def score(self, images):
        out = []
        for im in images:
            x = np.asarray(im, float).mean(axis=2)
            out.append(np.abs(x[1:-1, 1:-1] * 4 - x[:-2, 1:-1] - x[2:, 1:-1] - x[1:-1, :-2] - x[1:-1, 2:]).mean())
        return np.asarray(out, np.float32)


def test_soft_targets_and_soft_pairs():
    t = soft_targets(np.array([3.0, 1.0, 2.0, 2.0]))
    assert t[1] < t[2] == t[3] < t[0] and 0 < t.min() and t.max() < 1
    logits = torch.tensor([0.0, 1.0])
    groups = torch.zeros(2, dtype=torch.long)
    near_tie = ranking_loss(logits, groups, torch.tensor([0.0, 0.01]), soft_scale=1.0)
    sure = ranking_loss(logits, groups, torch.tensor([0.0, 100.0]), soft_scale=1.0)
    assert sure < near_tie  # a confident teacher pair is fitted better by s_j > s_i


def test_student_ranks_held_out_images_like_the_teacher(tmp_path):
    register("test-highpass", HighPassTeacher)
    rng = np.random.default_rng(0)
    folder = tmp_path / "imgs"
    folder.mkdir()
    yy, xx = np.mgrid[0:64, 0:64] / 64.0
    for i in range(70):
        c = rng.uniform(0.2, 0.8, 3)
        base = np.stack([c[k] + 0.2 * (yy if k else xx) for k in range(3)], axis=2) * 255
        img = base + rng.normal(0, rng.uniform(0, 25), base.shape)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"im{i:02d}.png")
    out = tmp_path / "student.safetensors"
    res = CliRunner().invoke(main, ["train", "--teacher", "test-highpass", "--images", str(folder),
                                    "--out", str(out), "--steps", "150", "--threads", "1",
                                    "--width", "6", "--crop-size", "32"])
    assert res.exit_code == 0, res.output
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["n_heldout"] >= 8 and summary["teacher_version"] == "hp1"
    assert summary["heldout_spearman_vs_teacher"] > 0.8
    assert out.with_suffix(".labels.parquet").is_file()  # the teacher's labels are cached
    card = out.with_suffix(".md").read_text()  # the model card the docs promise beside the weights
    assert "`test-highpass`" in card and f"{summary['heldout_spearman_vs_teacher']:.3f}" in card
    assert f"{summary['n_labelled']} ({summary['n_train']} to train" in card
    bad = CliRunner().invoke(main, ["train", "--teacher", "test-highpass", "--out", str(out)])
    assert bad.exit_code != 0 and "go together" in bad.output


def test_the_held_out_split_follows_file_names_not_folders():
    from collapseguard.training.distill import heldout_mask

    names = [f"im{i:03d}.png" for i in range(200)]
    a = heldout_mask([f"/data/one/{n}" for n in names], 0.2)
    b = heldout_mask([f"/tmp/pytest-7/x/{n}" for n in names], 0.2)
    np.testing.assert_array_equal(a, b)
    assert 20 < a.sum() < 60  # about a fifth
    assert not heldout_mask(names, 0.0).any() and heldout_mask(names, 1.0).all()


def _refuse(constant):
    raise ValueError(f"bare {constant} in JSON")


def test_too_few_held_out_images_give_null_agreement_not_bare_nan(tmp_path):
    """Under 3 held-out images there is no Spearman correlation: the summary says null (strict
    JSON, readable by jq and JSON.parse) and the card says n/a, instead of a bare NaN."""
    from collapseguard.training.distill import heldout_mask

    register("test-highpass", HighPassTeacher)
    names = [f"im{i:03d}.png" for i in range(200)]
    held = heldout_mask(names, 0.2)
    pick = [n for n, h in zip(names, held) if not h][:7] + [n for n, h in zip(names, held) if h][:1]
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for n in pick:
        Image.fromarray(rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(folder / n)
    out = tmp_path / "student.safetensors"
    res = CliRunner().invoke(main, ["train", "--teacher", "test-highpass", "--images", str(folder),
                                    "--out", str(out), "--steps", "5", "--threads", "1",
                                    "--width", "6", "--crop-size", "32"])
    assert res.exit_code == 0, res.output
    summary = json.loads(out.with_suffix(".json").read_text(), parse_constant=_refuse)
    assert summary["n_heldout"] == 1 and summary["heldout_spearman_vs_teacher"] is None
    assert "n/a (fewer than 3 held-out images" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("extra, named", [
    (["--exclude-family", "codec"], "--exclude-family"), (["--no-eval"], "--no-eval"),
    (["--hard-clean", "0.5"], "--hard-clean"), (["--cache", "CACHE"], "--cache"),
])
def test_teacher_refuses_chain_training_options_it_would_not_read(tmp_path, extra, named):
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(folder / "a.png")
    extra = [str(tmp_path / "c") if e == "CACHE" else e for e in extra]
    res = CliRunner().invoke(main, ["train", "--teacher", "nss", "--images", str(folder), "--steps", "2",
                                    "--out", str(tmp_path / "w.safetensors"), *extra])
    assert res.exit_code == 2 and named in res.output and "not used with --teacher" in res.output
    assert not (tmp_path / "w.safetensors").exists()


class LowPassTeacher(HighPassTeacher):
    """The high-pass teacher's ranking reversed."""

    name = "test-lowpass"

    def score(self, images):
        return -super().score(images)


def test_a_teacher_beside_chains_trains_the_chain_recipe_and_resumes_bit_for_bit(tmp_path):
    """`train --chains --clean --teacher --images`: the teacher's ranking is one more term of the
    chain recipe (a student of the reversed teacher ranks differently), the held-out chains'
    images, copies of them under other names and a clean photo of a held-out chain's picture are
    never labelled, and a stopped run resumes to the unbroken run's weights."""
    import shutil

    from cg_chains import make_clean_dir, make_tiny_chains, smooth_art
    from cg_testutil import same_weights
    from scipy.stats import spearmanr

    from collapseguard.detectors.cnn import CNNDetector
    from collapseguard.training.metrics import score_paths
    from collapseguard.training.negatives import file_digest, list_images, split_clean
    from collapseguard.training.run import load_chains, split_chains

    register("test-highpass", HighPassTeacher)
    register("test-lowpass", LowPassTeacher)
    chains = make_tiny_chains(tmp_path / "chains", n_sources=24)  # src22 is held out
    clean = make_clean_dir(tmp_path / "clean", n=8)
    _, test_df = split_chains(load_chains([str(chains)]))
    extra = tmp_path / "extra"
    extra.mkdir()
    copied = extra / "renamed_copy.png"
    shutil.copy(test_df["path"].iloc[-1], copied)  # a held-out chain image under another name
    # a photo of a held-out chain's picture, named as its source (bytes of its own)
    Image.fromarray(smooth_art(np.random.default_rng(22), 80, 96)).save(extra / "src22.png")
    base = ["train", "--chains", str(chains), "--clean", str(clean), "--threads", "1", "--width", "6",
            "--crop-size", "32", "--n-crops", "6", "--bank-crops", "4", "--steps", "24", "--seed", "5",
            "--checkpoint-minutes", "0"]
    taught = [*base, "--images", str(chains), "--images", str(clean), "--images", str(extra),
              "--images", str(chains / "noise")]  # a folder given twice: labelled once

    def run(args, out):
        res = CliRunner().invoke(main, [*args, "--out", str(out)])
        assert res.exit_code == 0, res.output
        return res

    whole, split, reverse = (tmp_path / d / "w.safetensors" for d in ("whole", "split", "reverse"))
    run([*taught, "--teacher", "test-highpass"], whole)
    run([*taught, "--teacher", "test-lowpass"], reverse)
    probe = sorted(str(p) for p in list_images([chains]))[::3]
    hp = HighPassTeacher().score([np.asarray(Image.open(p).convert("RGB")) for p in probe])
    agree = [spearmanr(score_paths(CNNDetector(weights=w, device="cpu"), probe), hp).statistic
             for w in (whole, reverse)]
    assert agree[0] > agree[1] + 0.05  # the teacher term trained: its ranking shows in the student
    res = run([*taught, "--teacher", "test-highpass", "--stop-at-step", "11"], split)
    assert "stopped after step 11" in res.output
    assert "at step 11/24" in run([*taught, "--teacher", "test-highpass", "--resume"], split).output
    assert same_weights(split, whole)

    summary = json.loads(whole.with_suffix(".json").read_text())
    t = summary["teacher"]
    _, clean_held = split_clean(list_images([clean]))
    held = [*test_df["path"], *clean_held]
    held_bytes = {file_digest(p) for p in held}
    labelled = pd.read_parquet(whole.with_suffix(".labels.parquet"))["path"]
    assert len(test_df) and len(labelled) and summary["heldout_auroc"]  # the held-out evaluation ran
    assert not {file_digest(p) for p in labelled} & held_bytes  # neither the files nor copies of them
    assert str((extra / "src22.png").resolve()) not in set(labelled)
    given = {p.resolve() for p in list_images([chains, clean, extra])}
    expected = {file_digest(p) for p in given if file_digest(p) not in held_bytes and p.name != "src22.png"}
    assert t["n_train"] + t["n_heldout"] == len(labelled) == len(expected)
    assert t["n_not_labelled"] == len(given) - len(expected)
    card = whole.with_suffix(".md").read_text()
    assert "teacher `test-highpass` (version hp1)" in card and f"{t['n_not_labelled']} of the images" in card
    assert "held-out Spearman(student, teacher)" in run([*taught, "--teacher", "test-highpass"],
                                                        tmp_path / "again" / "w.safetensors").output


def test_a_teacher_beside_chains_with_only_held_out_images_is_refused_before_training(tmp_path):
    from cg_chains import make_tiny_chains

    from collapseguard.training.run import load_chains, split_chains

    register("test-highpass", HighPassTeacher)
    chains = make_tiny_chains(tmp_path / "chains", n_sources=24)
    _, test_df = split_chains(load_chains([str(chains)]))
    only = tmp_path / "only"
    only.mkdir()
    for p in test_df["path"]:
        (only / Path(p).name).write_bytes(Path(p).read_bytes())
    out = tmp_path / "w.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--teacher", "test-highpass",
                                    "--images", str(only), "--steps", "3", "--threads", "1", "--width", "6",
                                    "--crop-size", "32", "--out", str(out)])
    assert res.exit_code == 1 and "nothing is left for the teacher to label" in res.output
    assert not out.exists()


def test_an_excluded_family_stays_unseen_by_the_teacher(tmp_path):
    """`--exclude-family X` with a teacher: X's images are among what the teacher must not label,
    beside the held-out chains' images and clean files."""
    from cg_chains import make_tiny_chains

    from collapseguard.training.run import load_chains, split_chains, teacher_leave_out

    chains = make_tiny_chains(tmp_path / "chains", n_sources=24)
    train_df, test_df = split_chains(load_chains([str(chains)], ["grain2"]))
    clean_held = [tmp_path / "held.png"]
    out = {p.resolve() for p in teacher_leave_out([str(chains)], ["grain2"], test_df, clean_held)}
    every = load_chains([str(chains)])
    grain = {Path(p).resolve() for p in every.loc[every["family"] == "grain2", "path"]}
    assert grain and grain <= out and (tmp_path / "held.png").resolve() in out
    assert {Path(p).resolve() for p in test_df["path"]} <= out
    assert not out & {Path(p).resolve() for p in train_df["path"]}  # the training chains stay labelled
    assert teacher_leave_out([str(chains)], [], test_df, []) == [Path(p) for p in test_df["path"]]


def test_the_held_out_split_keeps_each_chain_whole(tmp_path):
    """Chain folders name their files alike (``step_000.png`` in every chain): a split by file
    name held out every chain's step 0 while its other steps trained. A chain's steps, and a
    picture's copies, are held out together."""
    from collapseguard.training.distill import heldout_mask
    from collapseguard.training_data_tools.chains import run_chain
    from collapseguard.training_data_tools.sources import bundled_photos

    paths, chain_of = [], []
    for c, (_, photo) in enumerate(bundled_photos(256)[:10]):
        h, w = photo.shape[:2]
        centre = photo[h // 2 - 96: h // 2 + 96, w // 2 - 96: w // 2 + 96]
        _, steps = run_chain(centre, "noise_tint", steps=3, keep=(0, 1, 2, 3), seed=c)
        for k, img, _ in steps:
            p = tmp_path / f"chain{c}" / f"step_{k:03d}.png"
            p.parent.mkdir(exist_ok=True)
            Image.fromarray(img).save(p)
            paths.append(p)
            chain_of.append(c)
    held = heldout_mask(paths, 0.5)
    by_chain = {c: {bool(h) for h, cc in zip(held, chain_of) if cc == c} for c in set(chain_of)}
    assert all(len(v) == 1 for v in by_chain.values()), by_chain
    assert 0 < sum(held) < len(held)  # some chains held out, some trained
