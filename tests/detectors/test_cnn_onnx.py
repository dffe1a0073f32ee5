"""The cnn run by onnxruntime: the same scores as torch within SCORE_TOLERANCE for every network
option, a cached export that spares a worker torch, the fallback when onnxruntime is missing, and
filter outputs that do not depend on the runtime."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cg_testutil import make_shard, read_members
from click.testing import CliRunner

from collapseguard.detectors import DetectorError, create
from collapseguard.detectors.cnn import CNNDetector
from collapseguard.detectors.cnn_model import DegradationNet, NetConfig, save_net

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from collapseguard.detectors.cnn_onnx import (
    SCORE_TOLERANCE,
    ExportUnavailable,
    OnnxCNNDetector,
    cache_dir,
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("COLLAPSEGUARD_CACHE", str(tmp_path_factory.getbasetemp() / "cg-cache"))


def test_shipped_weights_score_the_same_on_both_runtimes(photos):
    torch.set_num_threads(1)
    onnx = create("cnn", device="cpu", runtime="onnx")
    ref = create("cnn", device="cpu", runtime="torch")
    assert isinstance(onnx, OnnxCNNDetector) and isinstance(ref, CNNDetector)
    assert (onnx.name, onnx.version, onnx.n_crops) == (ref.name, ref.version, ref.n_crops)
    a, b = onnx.score(photos), ref.score(photos)
    assert a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=0, atol=SCORE_TOLERANCE)
    np.testing.assert_array_equal(a, onnx.score(photos))  # deterministic
    # crops of small and odd images (padding, repeated crops) go the same way
    odd = [photos[0][:40, :70], photos[1][:300, :51], np.ascontiguousarray(photos[2][::3, ::2])]
    np.testing.assert_allclose(onnx.score(odd), ref.score(odd), rtol=0, atol=SCORE_TOLERANCE)


def test_images_per_onnxruntime_call_change_no_score(photos):
    """One image a call (the default) or several: the same scores within float rounding, in order;
    a count under 1 is refused when set, not at scoring time."""
    det = create("cnn", device="cpu", runtime="onnx")
    assert det.run_images == 1
    images = photos + [photos[0][:40, :70], np.ascontiguousarray(photos[1][::3, ::2])]
    session, calls = det.session, []

    class Counting:  # the real session, each call's image count recorded
        def run(self, names, feeds):
            calls.append(len(feeds["crops"]))
            return session.run(names, feeds)

    det.session = Counting()
    one = det.score(images)
    assert calls == [1] * len(images)
    for n in (2, 4, len(images) + 3):
        det.run_images = n
        calls.clear()
        np.testing.assert_allclose(det.score(images), one, rtol=0, atol=1e-5)
        assert calls == [min(n, len(images) - k) for k in range(0, len(images), n)]
    for bad in (0, -1, 1.5, True, None, float("nan"), "2"):
        with pytest.raises(DetectorError, match="run_images"):
            det.run_images = bad
    assert det.run_images == len(images) + 3


def test_the_shipped_graph_is_the_export_of_the_shipped_weights(photos):
    """The graph in the package was made from the weights beside it (rerun
    ``python -m collapseguard.detectors.cnn_export`` after changing them), it is what the onnx
    runtime uses without exporting, and it scores as torch does within SCORE_TOLERANCE."""
    import hashlib

    from collapseguard.detectors.cnn_family import default_weights_bytes
    from collapseguard.detectors.cnn_onnx import shipped_export

    shipped = shipped_export()
    assert shipped is not None, "collapseguard/weights/cnn.onnx(.json) missing"
    graph, meta = shipped
    ref = create("cnn", device="cpu", runtime="torch")
    assert meta["weights_sha256"] == hashlib.sha256(default_weights_bytes()).hexdigest(), \
        "stale graph: run python -m collapseguard.detectors.cnn_export"
    assert (meta["version"], meta["n_crops"]) == (ref.version, ref.n_crops)
    assert meta["graph_sha256"] == hashlib.sha256(graph).hexdigest()
    onnx = create("cnn", device="cpu", runtime="onnx")
    assert not list(cache_dir().glob(f"{meta['weights_sha256'][:32]}-kdefault-*"))  # not exported
    np.testing.assert_allclose(onnx.score(photos), ref.score(photos), rtol=0, atol=SCORE_TOLERANCE)


def test_the_comparators_cnn_runs_from_its_packaged_graph(photos):
    """The comparator reads its own pinned cnn weights (compare_cnn), not the shipped cnn's: the
    onnx runtime finds their packaged graph (nothing exported or cached), and it scores as torch
    does."""
    import hashlib
    from importlib import resources

    from collapseguard.detectors.cnn_onnx import packaged_export
    from collapseguard.detectors.compare import (
        CNN_WEIGHTS_NAME,
        Comparator,
        comparator_cnn,
    )

    data = (resources.files("collapseguard") / "weights" / CNN_WEIGHTS_NAME).read_bytes()
    _, meta = packaged_export("compare_cnn.onnx", "compare_cnn.onnx.json")
    assert meta["weights_sha256"] == hashlib.sha256(data).hexdigest(), \
        "stale graph: python -m collapseguard.detectors.cnn_export --name compare_cnn"
    onnx = comparator_cnn(runtime="onnx")
    ref = comparator_cnn(runtime="torch")
    assert onnx.version == ref.version == meta["version"]
    assert not list(cache_dir().glob(f"{meta['weights_sha256'][:32]}-*"))  # not exported
    np.testing.assert_allclose(onnx.score(photos), ref.score(photos), rtol=0, atol=SCORE_TOLERANCE)
    assert Comparator().cnn.version == meta["version"]
    # the shipped detector's cnn is other weights: the comparator's weights refuse it, unless asked
    shipped = create("cnn", device="cpu", runtime="torch")
    assert shipped.version != meta["version"]
    with pytest.raises(DetectorError, match="fitted on cnn"):
        Comparator(cnn=shipped)
    other = Comparator(cnn=shipped, other_cnn=True)
    # and its descriptions, made with another cnn, are never reused for the comparator's own
    assert other.description_version != Comparator().description_version


def test_a_stale_shipped_graph_is_not_used(monkeypatch, photos):
    from collapseguard.detectors import cnn_onnx
    from collapseguard.detectors.cnn_family import default_weights_bytes

    graph, meta = cnn_onnx.shipped_export()
    # the graph of other weights, say: its metadata names another weights file
    monkeypatch.setattr(cnn_onnx, "shipped_export",
                        lambda: (graph, {**meta, "weights_sha256": "0" * 64}))
    got, got_meta = cnn_onnx.load_export(default_weights_bytes(), None)
    assert got_meta["weights_sha256"] == meta["weights_sha256"]  # exported from the real weights
    # and cached, not taken from the package
    assert list(cache_dir().glob(f"{meta['weights_sha256'][:32]}-kdefault-*.onnx"))


def _random_weights(path: Path, noise=0.3, **options) -> Path:
    torch.manual_seed(0)
    cfg = {"width": 6, "crop_size": 32, "n_crops": 4, **options}
    net = DegradationNet(NetConfig(**cfg))
    with torch.no_grad():  # weights far from zero, so a wrongly exported branch shows
        for p in net.parameters():
            p.add_(torch.randn_like(p) * noise)
        net.agg.copy_(torch.tensor([0.7, 0.4, 0.1]))
    save_net(net, path)
    return path


@pytest.mark.parametrize("options", [{"bandpass": True}, {"context": True, "n_crops": 5},
                                     {"mirror": True, "context": True, "n_crops": 5}])
def test_every_network_option_exports_to_the_same_scores(tmp_path, photos, options):
    w = _random_weights(tmp_path / "w.safetensors", **options)
    onnx = create(f"cnn:{w}", device="cpu", runtime="onnx")
    ref = create(f"cnn:{w}", device="cpu", runtime="torch")
    assert onnx.version == ref.version
    a, b = onnx.score(photos[:3]), ref.score(photos[:3])
    assert np.ptp(b) > 1e-3  # the scores tell the photos apart: the test compares something
    np.testing.assert_allclose(a, b, rtol=0, atol=SCORE_TOLERANCE)


def test_a_mirror_net_scores_an_image_and_its_mirror_image_alike_on_both_runtimes(tmp_path, photos):
    """``NetConfig.mirror``: the crops of the image and of its mirror image are one set of views,
    so mirroring changes no score; the same tensors without it do move, and its version differs.
    Odd widths put the crop grid off-centre, where mirroring the crops alone would not do."""
    plain = _random_weights(tmp_path / "plain.safetensors", context=True, n_crops=5)
    mirror = _random_weights(tmp_path / "mirror.safetensors", context=True, n_crops=5, mirror=True)
    images = [photos[0], photos[1][:, :301], photos[2][:200, :97], photos[3][:20, :45]]
    flipped = [np.ascontiguousarray(im[:, ::-1]) for im in images]
    moved = create(f"cnn:{plain}", device="cpu", runtime="torch")
    assert np.abs(moved.score(images) - moved.score(flipped)).max() > 1e-2
    for runtime in ("torch", "onnx"):
        det = create(f"cnn:{mirror}", device="cpu", runtime=runtime)
        assert det.mirror and det.version != moved.version and det.n_crops == 5
        np.testing.assert_allclose(det.score(images), det.score(flipped), rtol=0, atol=1e-5)


@pytest.mark.parametrize("stem,noise", [("efficientnet-lite0:2", 0.3), ("efficientnet-lite2:7", 0.2)])
def test_the_imagenet_stem_exports_and_its_batch_norms_stay_in_eval_mode(tmp_path, photos, stem, noise):
    # the stem folds batch norm into its convolutions at run time; the exporter restores each
    # module's training flag afterwards, so a wrapper left in training mode would put the stem's
    # batch norms on batch statistics and the check would compare against the wrong scores.
    # (a smaller noise keeps the deeper random body's scores at trained weights' size, about -10
    # with a spread of about 1, where the absolute tolerance is meant to hold)
    w = _random_weights(tmp_path / "w.safetensors", noise=noise, stem=stem, context=True, n_crops=3)
    ref = create(f"cnn:{w}", device="cpu", runtime="torch")
    onnx = create(f"cnn:{w}", device="cpu", runtime="onnx")
    a, b = onnx.score(photos[:3]), ref.score(photos[:3])
    assert np.ptp(b) > 1e-3
    np.testing.assert_allclose(a, b, rtol=0, atol=SCORE_TOLERANCE)

    from collapseguard.detectors.cnn_export import export_onnx

    net = ref.net
    graph = export_onnx(net, 3, SCORE_TOLERANCE)
    assert not any(m.training for m in net.modules())
    np.testing.assert_array_equal(ref.score(photos[:3]), b)  # the torch detector is untouched
    # the "same" padding of every stride-2 convolution is folded into the convolution itself
    # (asymmetric pads), not run as a Pad that copies the activations
    import onnx as onnx_lib

    nodes = onnx_lib.load_from_string(graph).graph.node
    assert "Pad" not in [n.op_type for n in nodes]
    assert [0, 0, 1, 1] in [list(a.ints) for n in nodes if n.op_type == "Conv" for a in n.attribute
                            if a.name == "pads"]


def test_a_network_the_export_gets_wrong_is_scored_by_torch(tmp_path, photos, monkeypatch):
    from collapseguard.detectors import cnn_export

    w = _random_weights(tmp_path / "w.safetensors", context=True, n_crops=3)
    ref = create(f"cnn:{w}", device="cpu", runtime="torch")
    real = cnn_export.ExportNet.forward
    monkeypatch.setattr(cnn_export.ExportNet, "forward", lambda self, crops: real(self, crops) + 0.5)
    with pytest.raises(ExportUnavailable, match="does not reproduce"):
        create(f"cnn:{w}", device="cpu", runtime="onnx")
    auto = create(f"cnn:{w}", device="cpu", runtime="auto")
    assert isinstance(auto, CNNDetector)  # refused export: auto scores with torch
    np.testing.assert_allclose(auto.score(photos[:3]), ref.score(photos[:3]), rtol=0,
                               atol=SCORE_TOLERANCE)


def test_a_cached_export_is_used_without_torch_and_a_damaged_one_is_redone(photos):
    # another crop count than the shipped graph's: exported once, then cached
    create("cnn", device="cpu", runtime="onnx", n_crops=12)
    graphs = sorted(cache_dir().glob("*.onnx"))
    assert graphs
    code = ("import sys; from collapseguard.detectors import create; import numpy as np; "
            "d = create('cnn', device='cpu', runtime='auto', n_crops=12); "
            "s = d.score([np.full((200, 300, 3), 128, np.uint8)]); "
            "print(type(d).__name__, 'torch' in sys.modules, 'onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["OnnxCNNDetector", "False", "False"]
    for g in graphs:
        g.write_bytes(g.read_bytes()[:-10])  # a cut-short cached graph is not trusted
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["OnnxCNNDetector", "True", "True"]  # exported again


def test_auto_falls_back_to_torch_without_onnxruntime_and_onnx_refuses_a_gpu():
    code = ("import sys; sys.modules['onnxruntime'] = None; from collapseguard.detectors import "
            "create; print(type(create('cnn', device='cpu', runtime='auto')).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "CNNDetector"
    with pytest.raises(DetectorError, match="CPU only"):
        create("cnn", device="cuda", runtime="onnx")
    with pytest.raises(DetectorError, match="CPU only"):
        create("cnn", device="cpu", runtime="onnx").to("cuda")
    with pytest.raises(DetectorError, match="unknown cnn runtime"):
        create("cnn", runtime="tensorflow")


def test_filter_outputs_do_not_depend_on_the_runtime(tmp_path, photos):
    from collapseguard.cli import main

    shard = tmp_path / "in" / "s-000.tar"
    shard.parent.mkdir()
    members = make_shard(shard, photos[:4])
    scores = create("cnn", device="cpu", runtime="torch").score(
        [np.asarray(v) for v in photos[:4]])
    t = float(np.median(scores)) + 0.01  # a threshold no score lies within the tolerance of
    outs = {}
    for rt in ("torch", "onnx"):
        res = CliRunner().invoke(main, ["filter", str(shard), "--out", str(tmp_path / rt),
                                        "--threshold", str(t), "--workers", "2", "--runtime", rt,
                                        "--quiet"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        outs[rt] = Path(tmp_path / rt)
    for part in ("kept", "rejected"):
        assert (outs["torch"] / part / "s-000.tar").read_bytes() == \
            (outs["onnx"] / part / "s-000.tar").read_bytes()
    kept = read_members(outs["onnx"] / "kept/s-000.tar")
    rej = read_members(outs["onnx"] / "rejected/s-000.tar")
    assert collections.Counter(members) == collections.Counter(kept + rej) and kept and rej
    a = pd.read_parquet(outs["torch"] / "scores/s-000.parquet")
    b = pd.read_parquet(outs["onnx"] / "scores/s-000.parquet")
    assert list(a["decision"]) == list(b["decision"])
    assert list(a["detector_version"]) == list(b["detector_version"])
    np.testing.assert_allclose(a["score"], b["score"], rtol=0, atol=SCORE_TOLERANCE)


def test_the_process_wide_detector_follows_the_runtime_asked_for(monkeypatch):
    """Engines reuse one detector per process: one made under --runtime onnx is never served to a
    later run under --runtime torch in the same process (dedup's kept-copy pass scored with the
    wrong runtime, and its table's bytes differed from a torch run's)."""
    pytest.importorskip("onnxruntime")
    from collapseguard.detectors.cnn import CNNDetector
    from collapseguard.detectors.cnn_family import RUNTIME_ENV
    from collapseguard.detectors.cnn_onnx import OnnxCNNDetector
    from collapseguard.engines.local import get_detector

    monkeypatch.setenv(RUNTIME_ENV, "onnx")
    onnx = get_detector("cnn")
    assert isinstance(onnx, OnnxCNNDetector) and get_detector("cnn") is onnx
    monkeypatch.setenv(RUNTIME_ENV, "torch")
    assert isinstance(get_detector("cnn"), CNNDetector)
    monkeypatch.setenv(RUNTIME_ENV, "onnx")
    assert get_detector("cnn") is onnx


def _pad_conv_graph(mode="constant", value=None, pads=(0, 0, 0, 0, 0, 0, 1, 1), second_user=False):
    """crops (B, 2, 8, 8) -> Pad -> Conv 3x3 stride 2 (-> also Relu of the Pad when
    ``second_user``), the pad amounts as an initializer."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w")]
    pad_in = ["crops", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
        pad_in.append("value")
    nodes = [helper.make_node("Pad", pad_in, ["padded"], mode=mode),
             helper.make_node("Conv", ["padded", "w"], ["score"], kernel_shape=[3, 3], strides=[2, 2])]
    outputs = [helper.make_tensor_value_info("score", TensorProto.FLOAT, None)]
    if second_user:
        nodes.append(helper.make_node("Relu", ["padded"], ["other"]))
        outputs.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("crops", TensorProto.FLOAT,
                                                                        [None, 2, 8, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("kind", ["zero", "zero_value", "reflect", "nonzero_value", "negative", "shared"])
def test_fold_pads_folds_exactly_the_zero_paddings_a_conv_alone_reads(kind):
    import onnx
    import onnxruntime as ort

    from collapseguard.detectors.cnn_export import fold_pads

    graph = {"zero": lambda: _pad_conv_graph(),
             "zero_value": lambda: _pad_conv_graph(value=0.0),
             "reflect": lambda: _pad_conv_graph(mode="reflect"),
             "nonzero_value": lambda: _pad_conv_graph(value=0.5),
             "negative": lambda: _pad_conv_graph(pads=(0, 0, 0, 0, 0, 0, -1, 1)),
             "shared": lambda: _pad_conv_graph(second_user=True)}[kind]()
    x = np.random.default_rng(1).standard_normal((3, 2, 8, 8)).astype(np.float32)
    folded = fold_pads(graph, x)
    run = lambda g: ort.InferenceSession(g, providers=["CPUExecutionProvider"]).run(None, {"crops": x})  # noqa: E731
    for a, b in zip(run(graph), run(folded)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    model = onnx.load_from_string(folded)
    ops = [n.op_type for n in model.graph.node]
    if kind in ("zero", "zero_value"):
        assert "Pad" not in ops
        (conv,) = [n for n in model.graph.node if n.op_type == "Conv"]
        assert [list(a.ints) for a in conv.attribute if a.name == "pads"] == [[0, 0, 1, 1]]
        assert {i.name for i in model.graph.initializer} == {"w"}  # nothing left unread
    else:
        assert folded == graph


def test_both_runtimes_refuse_missing_and_junk_weights_alike(tmp_path):
    """Weights are read one way for both runtimes: a missing file or one that is no weights is a
    DetectorError naming the cause, whichever runtime was asked for."""
    (tmp_path / "junk.safetensors").write_bytes(b"not weights")
    for runtime in ("torch", "onnx"):
        with pytest.raises(DetectorError, match="cnn weights not found: .*missing.safetensors"):
            create(f"cnn:{tmp_path / 'missing.safetensors'}", device="cpu", runtime=runtime)
        with pytest.raises(DetectorError, match="cannot load cnn weights"):
            create(f"cnn:{tmp_path / 'junk.safetensors'}", device="cpu", runtime=runtime)
    # a config is data: a 170-byte file asking for a net 10 million channels wide is refused
    # before anything is allocated (it took 4 GB and 9 s to fail)
    import json
    import time

    from safetensors.torch import save_file
    wide = tmp_path / "wide.safetensors"
    save_file({"x": torch.zeros(1)}, str(wide),
              metadata={"format": "collapseguard-cnn", "config": json.dumps({"width": 10_000_000})})
    for runtime in ("torch", "onnx"):
        t0 = time.perf_counter()
        with pytest.raises(DetectorError, match="width must be between 1 and 256"):
            create(f"cnn:{wide}", device="cpu", runtime=runtime)
        assert time.perf_counter() - t0 < 5
