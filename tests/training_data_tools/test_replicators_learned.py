"""The learned replicator: shipped weights load safely, training is reproducible."""

import os

import numpy as np
from safetensors import safe_open

from collapseguard.training_data_tools.learned_train import train
from collapseguard.training_data_tools.replicators import create_replicator
from collapseguard.training_data_tools.replicators.learned import WEIGHTS, load_model


def test_shipped_weights_are_safetensors_and_small():
    assert WEIGHTS.is_file() and WEIGHTS.stat().st_size < 1_000_000
    with safe_open(str(WEIGHTS), "pt") as f:
        assert f.metadata()["arch"] == "ReplicatorAE-v1"


def test_training_is_reproducible_and_loadable(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    train(a, steps=3, batch=4, size=32, n_art=2, photos=False)
    train(b, steps=3, batch=4, size=32, n_art=2, photos=False)
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))  # (header order may differ; tensors must not)
    umask = os.umask(0o022)
    os.umask(umask)
    assert a.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes files, not safetensors' 0600
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    model = load_model(a)
    with torch.inference_mode():
        y = model(torch.rand(1, 3, 36, 52))
    assert y.shape == (1, 3, 36, 52)


def test_learned_step_runs_at_any_size():
    """A step runs the network at native size on any H, W (padding to its stride and back)."""
    rng = np.random.default_rng(0)
    rep = create_replicator("learned", rng, input_noise=0.5)
    yy, xx = np.mgrid[0:64, 0:96]
    img = np.stack([xx * 2, yy * 3, (xx + yy) % 50 * 5], axis=2).astype(np.uint8)
    out = rep.step(img, rng)
    assert out.shape == img.shape and not np.array_equal(out, img)
