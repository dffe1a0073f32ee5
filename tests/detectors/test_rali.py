"""RALI: a checkpoint in the published layout, made in the test, is refused without trust, scored
with it, and converted once to pickle-free files that load without it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sklearn")

import torch

from collapseguard.detectors import DetectorError, create
from collapseguard.detectors.rali import is_converted
from collapseguard.detectors.rali_convert import main as convert_main

torch.set_num_threads(1)

from cg_models import make_rali_dir  # noqa: E402


def _images():
    rng = np.random.default_rng(1)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), np.full((40, 40, 3), 90, np.uint8),
            rng.integers(0, 256, (70, 50, 3), dtype=np.uint8)]


def _reference_quality(root, proj, pca, images):
    """RALI computed independently: transformers CLIP + sklearn whitening + numpy softmax."""
    from sklearn.decomposition import PCA
    from transformers import CLIPImageProcessor, CLIPModel

    model = CLIPModel.from_pretrained(str(root / "best")).eval()
    with torch.no_grad():
        model.visual_projection.weight.copy_(proj)
        px = CLIPImageProcessor.from_pretrained(str(root / "best"))(images=list(images), return_tensors="pt")
        f = model.get_image_features(**px)
    f = (f if isinstance(f, torch.Tensor) else f.pooler_output).double().numpy()
    white = PCA(n_components=pca.n_components_, whiten=True)
    white.mean_, white.components_ = pca.mean_, pca.components_
    white.explained_variance_, white.n_components_ = pca.explained_variance_, pca.n_components_
    white.n_features_in_ = pca.n_features_in_
    z = white.transform(f)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    b = np.load(root / "basis.npz")
    v = b["vectors"] / np.linalg.norm(b["vectors"], axis=1, keepdims=True)
    logits = z @ v.T / 0.5
    w = np.exp(logits - logits.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    return w @ b["scores"]


@pytest.fixture(scope="module")
def rali_dir(tmp_path_factory):
    return make_rali_dir(tmp_path_factory.mktemp("rali"))


def test_refused_without_trust(rali_dir):
    root, _, _ = rali_dir
    with pytest.raises(DetectorError, match="trust_pickle=True") as info:
        create(f"rali:{root}")
    assert "pca.pkl" in str(info.value) and "rali_convert" in str(info.value)


def test_torch_checkpoint_alone_is_refused_too(rali_dir, tmp_path):
    root, _, pca = rali_dir
    shutil.copytree(root, tmp_path / "r")
    np.savez(tmp_path / "r" / "pca.npz", mean=pca.mean_, components=pca.components_,
             explained_variance=pca.explained_variance_)
    (tmp_path / "r" / "pca.pkl").unlink()
    with pytest.raises(DetectorError, match="ckpt.pt"):
        create(f"rali:{tmp_path / 'r'}")


def test_scores_match_an_independent_computation(rali_dir):
    root, proj, pca = rali_dir
    det = create(f"rali:{root}", trust_pickle=True, device="cpu")
    assert det.temperature == 0.5 and det.n_overlaid == 1 and det.ignored_keys == ["head.unused"]
    imgs = _images()
    out = det.score_detailed(imgs)
    expected = _reference_quality(root, proj, pca, imgs)
    np.testing.assert_allclose(out["raw"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["score"], -out["raw"])  # quality -> higher = more degraded
    assert np.all((out["raw"] >= 1) & (out["raw"] <= 5))  # a convex mix of prototype scores
    assert len(np.unique(np.round(out["raw"], 6))) == 3
    # another temperature is another detector version (calibrations never carry over)
    assert det.version != create(f"rali:{root}", trust_pickle=True, device="cpu", temperature=0.2).version


def test_convert_once_then_load_without_pickle(rali_dir, tmp_path, capsys):
    root, _, _ = rali_dir
    out_dir = tmp_path / "converted"
    assert convert_main([str(root), "--out", str(out_dir)]) == 0
    assert "no --trust-pickle needed" in capsys.readouterr().out
    assert is_converted(out_dir)
    assert not (out_dir / "pca.pkl").exists() and not (out_dir / "ckpt.pt").exists()
    modes = {p.name: p.stat().st_mode & 0o777 for p in out_dir.iterdir() if p.is_file()}
    assert len(set(modes.values())) == 1, modes  # head.safetensors as readable as pca.npz
    det = create(f"rali:{out_dir}", device="cpu")  # no trust flag
    ref = create(f"rali:{root}", trust_pickle=True, device="cpu")
    imgs = _images()
    np.testing.assert_allclose(det.score(imgs), ref.score(imgs), rtol=1e-6)
    assert det.version == ref.version and det.temperature == 0.5


def test_bin_only_clip_needs_trust_and_converts(tmp_path):
    root, _, _ = make_rali_dir(tmp_path, bin_only=True)
    assert not list((root / "best").glob("*.safetensors"))
    with pytest.raises(DetectorError, match="pytorch_model.bin"):
        create(f"rali:{root}")
    trusted = create(f"rali:{root}", trust_pickle=True, device="cpu").score(_images())
    assert convert_main([str(root)]) == 0  # in place
    assert list((root / "best").glob("*.safetensors"))
    (root / "pca.pkl").unlink()
    (root / "ckpt.pt").unlink()
    (root / "best" / "pytorch_model.bin").unlink()
    np.testing.assert_allclose(create(f"rali:{root}", device="cpu").score(_images()), trusted, rtol=1e-6)


def test_native_crop_preprocessing(rali_dir):
    root, _, _ = rali_dir
    det = create(f"rali:{root}", trust_pickle=True, device="cpu", preprocess="crop")
    img = np.random.default_rng(3).integers(0, 256, (100, 120, 3), dtype=np.uint8)
    centre = img[34:66, 44:76]
    # a native crop: only the centre 32x32 pixels matter, nothing is resized
    assert det.score([img])[0] == pytest.approx(det.score([centre])[0], rel=1e-6)


def test_broken_layouts_are_clear_errors(rali_dir, tmp_path):
    root, _, _ = rali_dir
    with pytest.raises(DetectorError, match="not found"):
        create(f"rali:{tmp_path / 'missing'}")
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    np.savez(bad / "basis.npz", vectors=np.ones((4, 3)), scores=np.arange(4.0))
    with pytest.raises(DetectorError, match="3 dims but the PCA keeps 6"):
        create(f"rali:{bad}", trust_pickle=True)
    np.savez(bad / "basis.npz", vectors=np.ones((4, 6)))
    with pytest.raises(DetectorError, match="'vectors' and 'scores'"):
        create(f"rali:{bad}", trust_pickle=True)


def test_a_scalar_only_checkpoint_converted_in_place_loads_without_trust(rali_dir, tmp_path):
    root, _, _ = rali_dir
    r = tmp_path / "r"
    shutil.copytree(root, r)
    torch.save({"state_dict": {"temperature": torch.tensor(0.25)}, "epoch": 3}, r / "ckpt.pt")  # no tensors to keep
    trusted = create(f"rali:{r}", trust_pickle=True, device="cpu")
    assert convert_main([str(r)]) == 0  # in place: ckpt.pt stays, no head.safetensors is written
    assert (r / "ckpt.pt").exists() and not (r / "head.safetensors").exists()
    (r / "pca.pkl").unlink()
    det = create(f"rali:{r}", device="cpu")  # convert said no --trust-pickle is needed: it is not
    assert det.temperature == 0.25 and det.version == trusted.version
    np.testing.assert_allclose(det.score(_images()), trusted.score(_images()), rtol=1e-6)
    torch.save({"state_dict": {"temperature": torch.tensor(0.5)}}, r / "ckpt.pt")  # not what was converted
    with pytest.raises(DetectorError, match="ckpt.pt"):
        create(f"rali:{r}", device="cpu")


def test_the_refusal_of_pickled_clip_weights_names_the_folder_to_convert(tmp_path):
    root, _, _ = make_rali_dir(tmp_path, bin_only=True)
    with pytest.raises(DetectorError) as info:
        create(f"rali:{root}")
    assert str(info.value).endswith(f"rali_convert {root}")  # not {root}/best, where convert fails


def test_a_broken_pca_npz_is_a_clear_error(rali_dir, tmp_path):
    root, _, pca = rali_dir
    r = tmp_path / "r"
    shutil.copytree(root, r)
    np.savez(r / "pca.npz", mean=pca.mean_, components=pca.components_)  # no explained_variance
    with pytest.raises(DetectorError, match="explained_variance"):
        create(f"rali:{r}", trust_pickle=True)
    (r / "pca.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DetectorError, match="pca.npz"):
        create(f"rali:{r}", trust_pickle=True)
    (r / "basis.npz").write_bytes(b"PK\x03\x04 not really a zip")
    (r / "pca.npz").unlink()
    with pytest.raises(DetectorError, match="basis.npz"):
        create(f"rali:{r}", trust_pickle=True)


def test_a_long_strip_is_not_blown_up_before_its_centre_is_taken(rali_dir):
    root, _, _ = rali_dir
    det = create(f"rali:{root}", trust_pickle=True, device="cpu")
    rng = np.random.default_rng(4)
    strip = rng.integers(0, 256, (2, 400_000, 3), dtype=np.uint8)  # resized whole: 32 x 6.4M pixels
    centre = strip[:, 200_000 - 4 : 200_000 + 4]  # what the processor's centre crop comes from
    real, seen = det.processor, []

    class Recording:  # the real processor, noting the size of each image it is handed
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, images, **kw):
            seen.extend(im.size for im in images)
            return real(images=images, **kw)

    det.processor = Recording()
    s = det.score([strip, centre])
    assert np.isfinite(s).all() and s[0] == pytest.approx(s[1], rel=1e-6)
    # at most 4:1 reaches the processor, which would otherwise resize the whole strip to 32 px
    # high first (a 1 x 20000 banner becomes 224 x 4.5 million pixels with a real CLIP)
    assert seen == [(8, 2), (8, 2)]


def test_a_best_folder_without_clip_weights_says_so(tmp_path):
    root, _, _ = make_rali_dir(tmp_path, bin_only=True)
    (root / "best" / "pytorch_model.bin").unlink()
    for trust in (False, True):
        with pytest.raises(DetectorError, match="no CLIP weights") as info:
            create(f"rali:{root}", trust_pickle=trust)
        assert "refusing" not in str(info.value)


def test_quiet_also_quiets_the_model_loading_bar(rali_dir, tmp_path):
    """``-q`` means no progress on stderr: transformers' "Loading weights" bar, drawn while the
    detector loads its CLIP model, is quieted too (a real CLI process, whose stderr is a pipe)."""
    import os
    import subprocess
    import sys

    from PIL import Image

    root, _, _ = rali_dir
    assert convert_main([str(root), "--out", str(tmp_path / "conv")]) == 0
    Image.fromarray(_images()[0]).save(tmp_path / "x.png")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    for quiet in (False, True):
        res = subprocess.run([sys.executable, "-m", "collapseguard.cli", "score", "-d", f"rali:{tmp_path / 'conv'}",
                              str(tmp_path / "x.png"), "-o", str(tmp_path / f"s{quiet}.csv")] + ["-q"] * quiet,
                             capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr
        assert ("Loading weights" in res.stderr) is not quiet, res.stderr
