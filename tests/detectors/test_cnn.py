"""The shipped `cnn` detector: registry, packaged weights, determinism, direction of the score."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from collapseguard.detectors import Detector, DetectorError, create
from collapseguard.detectors.cnn import default_weights_bytes, image_crops
from collapseguard.detectors.cnn_model import (
    DegradationNet,
    NetConfig,
    load_net,
    save_net,
)
from collapseguard.evaluation.metrics import auroc


@pytest.fixture(scope="module")
def det():
    torch.set_num_threads(1)
    return create("cnn", device="cpu")


@pytest.fixture(scope="module")
def photos():
    from collapseguard.training_data_tools.sources import bundled_photos

    keep = ("skimage/chelsea", "skimage/coffee", "sklearn/china", "skimage/astronaut")
    return [a for n, a in bundled_photos() if n in keep]


def test_registry_round_trip(det):
    assert isinstance(det, Detector)
    assert det.name == "cnn"
    data = default_weights_bytes()
    assert len(data) < 5 * 2**20
    assert len(det.version) == 12 and det.version == create("cnn").version


@pytest.mark.parametrize("family", ["cnn:", "vlm:", "rali:", "ens:", "pyiqa:"])
def test_a_bare_family_name_is_a_clear_error(family):
    # the family keys are registry entries too; they used to be called with no argument
    with pytest.raises(DetectorError, match=f"detector '{family}' needs an argument after the colon"):
        create(family)


def test_shipped_weights_are_deterministic(det, photos):
    a = det.score(photos)
    b = det.score(photos)
    c = create("cnn", device="cpu").score(photos[::-1])[::-1]
    assert a.dtype == np.float32 and a.shape == (len(photos),)
    assert np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, c, rtol=0, atol=1e-5)


def _visibly_degraded(img: np.ndarray, seed: int) -> np.ndarray:
    """Ten rounds of sharpened, accumulating noise with a slight green cast."""
    rng = np.random.default_rng(seed)
    x = img.astype(np.float32)
    for _ in range(10):
        x = x + rng.normal(0, 5.0, x.shape)
        x[..., 1] += 1.0
        blur = (x + np.roll(x, 1, 0) + np.roll(x, -1, 0) + np.roll(x, 1, 1) + np.roll(x, -1, 1)) / 5
        x = np.clip(x + 0.4 * (x - blur), 0, 255)
    return x.astype(np.uint8)


def test_degraded_scores_higher_than_clean(det, photos):
    clean = det.score(photos)
    bad = det.score([_visibly_degraded(p, i) for i, p in enumerate(photos)])
    assert (bad - clean).min() > 1.0, (clean, bad)


def test_input_checks_and_small_images(det):
    grey = np.full((40, 30), 128, np.uint8)
    s = det.score([grey, np.zeros((5, 7, 3), np.uint8), np.zeros((50, 60, 4), np.uint8)])
    assert np.isfinite(s).all()
    with pytest.raises(ValueError, match="uint8"):
        det.score([np.zeros((64, 64, 3), np.float32)])
    with pytest.raises(ValueError, match="RGB"):
        det.score([np.zeros((64, 64, 2), np.uint8)])
    assert image_crops(np.zeros((70, 70, 3), np.uint8), 64, 5).shape == (5, 64, 64, 3)


def test_save_load_round_trip_and_bad_files(tmp_path):
    torch.manual_seed(0)
    net = DegradationNet(NetConfig(width=4, crop_size=32, n_crops=3)).eval()
    path = tmp_path / "w.safetensors"
    save_net(net, path, metadata={"families": ["a", "b"]})
    net2, meta = load_net(path.read_bytes())
    assert net2.config == net.config and meta["families"] == '["a", "b"]'
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # readable by a team, as open() makes files
    x = torch.randint(0, 256, (2, 3, 32, 32, 3), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(net(x), net2(x))
    d = create("cnn", weights=str(path), device="cpu")
    assert d.n_crops == 3
    # the version follows the tensors, not the file bytes: saved again with metadata in another
    # order (safetensors' key order varies between processes) it is the same; other tensors differ
    save_net(net, tmp_path / "again.safetensors", metadata={"z": "1", "families": ["a", "b"]})
    assert (tmp_path / "again.safetensors").read_bytes() != path.read_bytes()
    assert create("cnn", weights=str(tmp_path / "again.safetensors"), device="cpu").version == d.version
    with torch.no_grad():
        next(net.parameters()).add_(1e-3)
    save_net(net, tmp_path / "changed.safetensors")
    assert create("cnn", weights=str(tmp_path / "changed.safetensors"), device="cpu").version != d.version
    (tmp_path / "junk.safetensors").write_bytes(b"not weights")
    with pytest.raises(DetectorError):
        create("cnn", weights=str(tmp_path / "junk.safetensors"))
    with pytest.raises(DetectorError, match="not found"):
        create("cnn", weights=str(tmp_path / "missing.safetensors"))


def test_cnn_spec_with_weights_path(tmp_path, det):
    from collapseguard.calibration.thresholds import NoThresholdError, resolve_threshold

    torch.manual_seed(1)
    path = tmp_path / "mine.safetensors"
    save_net(DegradationNet(NetConfig(width=4, crop_size=32, n_crops=2)).eval(), path)
    mine = create(f"cnn:{path}", device="cpu")
    assert mine.name == f"cnn:{path}" and mine.n_crops == 2
    assert mine.version == create("cnn", weights=str(path), device="cpu").version != det.version
    img = np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    np.testing.assert_array_equal(mine.score([img]), create("cnn", weights=str(path), device="cpu").score([img]))
    # the packaged calibration belongs to the packaged weights: other weights need their own
    with pytest.raises(NoThresholdError):
        resolve_threshold(mine)
    with pytest.raises(DetectorError, match="not found"):
        create(f"cnn:{tmp_path / 'missing.safetensors'}")


def test_config_defaults_bandpass_and_legacy_files():
    with pytest.raises(ValueError):
        NetConfig(n_crops=0)
    with pytest.raises(ValueError):
        NetConfig(crop_size=4)
    new = DegradationNet(NetConfig(width=4, crop_size=32, bandpass=True))
    x = torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8)
    inp, colour = new._inputs(x)
    assert inp.shape == (3, 9, 32, 32) and colour.shape == (3, 8)
    # the band-pass channels are zero (to float rounding) on a flat crop and not on a textured one
    flat = torch.full((1, 32, 32, 3), 128, dtype=torch.uint8)
    assert new._inputs(flat)[0][:, 6:].abs().max() < 1e-6
    assert inp[:, 6:].abs().max() > 0.01
    # files written before the band-pass channels existed (no "bandpass" key) load as 6 channels
    legacy = NetConfig.from_dict({"width": 4, "crop_size": 32, "n_crops": 3, "residual_gain": 8.0})
    assert not legacy.bandpass and DegradationNet(legacy)._inputs(x)[0].shape[1] == 6
    assert "bandpass" not in legacy.to_dict() and NetConfig.from_dict(new.config.to_dict()).bandpass


def test_context_term_sees_how_crops_relate(tmp_path):
    """``NetConfig(context=True)``: starts as the crop-only model; trained on a property of the
    crop set that no single crop has, the set-level term takes part (it moves and separates the
    classes; the crop-only mean/soft-max can separate these sets too, so the AUROC alone would not
    show the term working); round-trips through safetensors."""
    torch.manual_seed(0)
    cfg = NetConfig(width=4, crop_size=16, n_crops=4, context=True)
    net = DegradationNet(cfg)
    assert "context" not in NetConfig(width=4).to_dict() and cfg.to_dict()["context"] is True
    with pytest.raises(ValueError, match="context"):
        NetConfig(n_crops=1, context=True)
    from collapseguard.training.loop import TrainConfig
    with pytest.raises(ValueError, match="context"):
        TrainConfig(crops_per_image=1, net=cfg)
    rng = np.random.default_rng(0)

    def crops(n, same):
        # four flat crops per image: all one grey level ("same") or four different levels; the
        # mean level is matched, so a crop on its own says nothing about the label
        lv = rng.uniform(60, 190, (n, 1)) + (0 if same else rng.normal(0, 40, (n, 4)))
        lv = np.broadcast_to(np.clip(lv, 0, 255), (n, 4))
        return torch.from_numpy(np.broadcast_to(lv[:, :, None, None, None], (n, 4, 16, 16, 3)).astype(np.uint8))

    x = torch.cat([crops(64, True), crops(64, False)])
    y = torch.cat([torch.zeros(64), torch.ones(64)])
    with torch.no_grad():  # zero-initialised: exactly the crop-only score
        torch.testing.assert_close(net(x), net.aggregate(net.crop_logits(x)))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(150):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        test = torch.cat([crops(32, True), crops(32, False)])
        s = net(test)
    assert auroc(s[:32].numpy(), s[32:].numpy()) > 0.9
    with torch.no_grad():  # the set-level term took part: it moved and it varies between images
        ctx = net.context_logit(net.crop_features(test))
    assert net.ctx_rho.weight.abs().max() > 0 and ctx[32:].mean() - ctx[:32].mean() > 0.1
    path = tmp_path / "ctx.safetensors"
    save_net(net, path)
    again, _ = load_net(path.read_bytes())
    assert again.config.context
    with torch.no_grad():
        torch.testing.assert_close(again(test), s)


def test_fast_box_means_match_torch_pooling():
    import torch.nn.functional as F

    from collapseguard.detectors.cnn_model import _box_means

    x = torch.rand(2, 3, 21, 17)
    fast = _box_means(x, (3, 7))  # separable sums of shifted slices, clipped at the border
    for m, k in zip(fast, (3, 7)):
        ref = F.avg_pool2d(x, k, stride=1, padding=k // 2, count_include_pad=False)
        assert m.shape == x.shape
        torch.testing.assert_close(m, ref, atol=1e-5, rtol=0)


def test_input_colour_statistics_match_torch_reference():
    # the fast two-pass std in _inputs must agree with torch's own mean / std per channel
    net = DegradationNet(NetConfig(width=4, crop_size=24))
    x = torch.randint(0, 256, (5, 24, 24, 3), dtype=torch.uint8)
    _, colour = net._inputs(x)
    ref = x.permute(0, 3, 1, 2).float() / 255.0
    torch.testing.assert_close(colour[:, :3], ref.mean(dim=(2, 3)) - 0.5, atol=1e-6, rtol=0)
    torch.testing.assert_close(colour[:, 3:6], ref.std(dim=(2, 3)) * 4.0, atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_scores_match_cpu(det, photos):
    """The shipped weights give the CPU's scores on CUDA (other kernels: to float tolerance)."""
    from collapseguard.training_data_tools.replicators import create_replicator

    rng = np.random.default_rng(0)
    rep = create_replicator("noise_tint", rng)
    images = list(photos)
    for p in photos:
        x = p
        for _ in range(6):
            x = rep.step(x, rng)
        images.append(x)
    cpu = det.score(images)
    cuda_det = create("cnn", device="cuda")
    assert cuda_det.device.type == "cuda"
    gpu = cuda_det.score(images)
    np.testing.assert_allclose(gpu, cpu, atol=1e-4, rtol=0)  # 1.9e-6 measured (gpu_check.py)
    np.testing.assert_array_equal(cuda_det.score(images), gpu)  # repeatable on the GPU
    assert np.argsort(gpu).tolist() == np.argsort(cpu).tolist()


def test_one_crop_is_refused_for_weights_whose_context_term_needs_two(tmp_path):
    """The shipped weights read the spread over the crops: one crop would score NaN everywhere."""
    from collapseguard.detectors import DetectorError, create

    with pytest.raises(DetectorError, match="at least 2 crops"):
        create("cnn", n_crops=1)
    with pytest.raises(DetectorError, match=">= 1"):
        create("cnn", n_crops=0)
    assert create("cnn", n_crops=2).n_crops == 2
