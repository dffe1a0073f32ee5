"""Exporting a cnn network to ONNX, for ``cnn_onnx`` to run without torch.

``DegradationNet`` writes its input channels in place into slices of one buffer (fast in torch),
which the TorchScript exporter cannot follow and which the dynamo exporter turns into scatter
operations that make onnxruntime ~10x slower than torch. ``ExportNet`` computes the same function
from whole-tensor operations: the same pixels scaled the same way, the 3x3 (and 7x7) box means as
average pools over the pixels inside the crop, the same colour statistics, then the network's own
body, head, aggregation and context term. The stem's TensorFlow "same" padding at stride 2 pads
one more pixel on the bottom and right than on the top and left, which torch's convolutions
cannot state, so the exporter writes it as a Pad before the convolution; onnxruntime runs that Pad
as a copy of the activations and reorders them around it, about a quarter of the graph's time.
``fold_pads`` moves each such zero padding into its convolution's own (asymmetric) ``pads``,
which computes the same sums. Every export is checked against the network it came from before it
is used (``export_onnx``).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from collapseguard.detectors.cnn_model import DegradationNet


def _std(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Unbiased standard deviation of (N, C, H, W) over H and W, as (N, C)."""
    d = x - mean
    return ((d * d).sum(dim=(2, 3)) / (x.shape[2] * x.shape[3] - 1)).sqrt()


class ExportNet(nn.Module):
    """``DegradationNet.forward`` for (B, n_crops, S, S, 3) uint8 crops, in exportable form."""

    def __init__(self, net: DegradationNet, n_crops: int):
        super().__init__()
        self.net = net
        self.n_crops = int(n_crops)

    def forward(self, crops: torch.Tensor) -> torch.Tensor:
        cfg = self.net.config
        s = cfg.crop_size
        x = crops.reshape(-1, s, s, 3).permute(0, 3, 1, 2).float() * (1.0 / 255.0)
        local = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
        rgb = x - 0.5
        if cfg.stem:  # the ImageNet weights expect RGB in [-1, 1]
            rgb = rgb * 2.0
        parts = [rgb, (x - local) * cfg.residual_gain]
        if cfg.bandpass:
            wide = F.avg_pool2d(x, 7, 1, 3, count_include_pad=False)
            parts.append((local - wide) * (cfg.residual_gain / 2))
        net_in = torch.cat(parts, dim=1)
        mean = x.mean(dim=(2, 3), keepdim=True)
        std = _std(x, mean)
        mean = mean.flatten(1)
        r, g, b = mean[:, 0:1], mean[:, 1:2], mean[:, 2:3]
        chroma = torch.cat([g - (r + b) / 2, b - r], dim=1) * 4.0
        colour = torch.cat([mean - 0.5, std * 4.0, chroma], dim=1)
        h = self.net.body(net_in)
        hm = h.mean(dim=(2, 3), keepdim=True)
        pooled = torch.cat([hm.flatten(1), _std(h, hm)], dim=1)
        feats = torch.cat([pooled, colour], dim=1)
        feats = feats.reshape(-1, self.n_crops, feats.shape[1])
        out = self.net.aggregate(self.net.head(feats).squeeze(-1))
        if cfg.context:
            out = out + self.net.context_logit(feats)
        return out


def fold_pads(data: bytes, sample: np.ndarray) -> bytes:
    """The ONNX graph ``data`` with each zero-padding Pad whose one consumer is a Conv folded into
    that Conv's ``pads`` attribute. The pad amounts are read by running the graph on ``sample``
    (they follow from the crop size alone, which every input of the graph shares); a Pad on the
    batch or channel axes or on named axes, with a non-zero value, another mode, negative
    amounts or another consumer, is kept, and a graph with control flow is left as it is."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    model = onnx.load_from_string(data)
    nodes = list(model.graph.node)
    consumers: dict[str, list] = {}
    for n in nodes:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    def attr(node, name, default):
        got = [helper.get_attribute_value(a) for a in node.attribute if a.name == name]
        return got[0] if got else default

    def foldable(n) -> bool:
        if n.op_type != "Pad" or len(n.input) < 2 or not n.input[1]:
            return False
        if len(n.input) > 3 and n.input[3]:  # opset 18's axes: pads for other axes than all
            return False
        if attr(n, "mode", b"constant") not in (b"constant", "constant"):
            return False
        if len(n.input) > 2 and n.input[2] and not (
                n.input[2] in consts and not np.any(consts[n.input[2]])):
            return False
        users = consumers.get(n.output[0], [])
        return (len(users) == 1 and users[0].op_type == "Conv" and users[0].input[0] == n.output[0]
                and attr(users[0], "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
                and n.output[0] not in {o.name for o in model.graph.output})

    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in nodes for a in n.attribute):
        return data  # control flow: names read inside subgraphs are not followed here
    pads = [n for n in nodes if foldable(n)]
    if not pads:
        return data
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [n.input[1] for n in pads]
    probe.graph.output.extend(helper.ValueInfoProto(name=name) for name in names if name not in consts)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    wanted = [name for name in names if name not in consts]
    got = dict(zip(wanted, ort.InferenceSession(probe.SerializeToString(), opts, providers=[
        "CPUExecutionProvider"]).run(wanted, {"crops": sample}) if wanted else []))
    got.update({k: v for k, v in consts.items() if k in names})
    for n in pads:
        v = [int(t) for t in np.asarray(got[n.input[1]]).ravel()]
        if len(v) != 8 or min(v) < 0 or v[0] or v[1] or v[4] or v[5]:
            continue  # NCHW only, spatial axes only, no cropping
        (conv,) = consumers[n.output[0]]
        old = list(attr(conv, "pads", [0, 0, 0, 0]))
        kept = [a for a in conv.attribute if a.name != "pads"]
        del conv.attribute[:]
        conv.attribute.extend(kept)
        conv.attribute.append(helper.make_attribute(
            "pads", [old[0] + v[2], old[1] + v[3], old[2] + v[6], old[3] + v[7]]))
        conv.input[0] = n.input[0]
        model.graph.node.remove(n)
    outputs = {o.name for o in model.graph.output}
    while True:  # drop what only computed the folded pad amounts
        used = {name for n in model.graph.node for name in n.input} | outputs
        dead = [n for n in model.graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            model.graph.node.remove(n)
    used = {name for n in model.graph.node for name in n.input} | outputs
    unread = [i for i in model.graph.initializer if i.name not in used]
    for i in unread:  # the folded pad amounts and values, when they were initializers
        model.graph.initializer.remove(i)
    return model.SerializeToString()


def export_onnx(net: DegradationNet, n_crops: int, tolerance: float, seed: int = 0) -> bytes:
    """The ONNX graph of ``net`` scoring ``n_crops`` crops per image (any batch size).

    Raises ``RuntimeError`` unless onnxruntime running the graph and torch running ``net`` agree
    within ``tolerance`` on two images of random crops: a network this export does not cover
    (a new option) is refused, never run with other scores.
    """
    net = net.eval()
    size = net.config.crop_size
    rng = np.random.default_rng(seed)
    sample = torch.from_numpy(rng.integers(0, 256, (2, n_crops, size, size, 3), dtype=np.uint8))
    # The wrapper must be in eval mode too: the exporter puts a module back into the mode it was
    # in, and a new module is in training mode, which would leave ``net``'s batch norms (the
    # ImageNet stem's) using batch statistics after the export.
    wrapper = ExportNet(net, n_crops).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # tracer and deprecation notes of the TorchScript exporter
        want = net(sample).float().numpy()
        torch.onnx.export(wrapper, (sample,), buf, dynamo=False, opset_version=17,
                          input_names=["crops"], output_names=["score"],
                          dynamic_axes={"crops": {0: "batch"}, "score": {0: "batch"}})
    if net.training:
        raise RuntimeError("the ONNX export left the network in training mode")
    data = fold_pads(buf.getvalue(), sample.numpy())
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    got = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]).run(
        None, {"crops": sample.numpy()})[0]
    diff = float(np.max(np.abs(got - want)))
    if not np.isfinite(diff) or diff > tolerance:
        raise RuntimeError(f"the ONNX export does not reproduce the network (max score difference "
                           f"{diff:.3g} > {tolerance:g})")
    return data


def write_shipped_graph(folder: str | Path | None = None, name: str = "cnn") -> tuple[Path, Path]:
    """Export the packaged weights ``collapseguard/weights/NAME.safetensors`` (``cnn``: the shipped
    detector; ``compare_cnn``: the comparator's) with their own crop count and write the graph and
    its metadata (``NAME.onnx``, ``NAME.onnx.json``) into ``folder`` (default: the package's
    weights folder, beside the weights). Returns the two paths. Run it whenever the weights
    change: ``python -m collapseguard.detectors.cnn_export [--name compare_cnn]``."""
    from collapseguard.detectors import cnn_onnx

    weights = Path(__file__).resolve().parent.parent / "weights"
    if name != "cnn" and name not in cnn_onnx.PACKAGED_GRAPHS:
        raise ValueError(f"no packaged graph is named {name!r}; known: cnn, "
                         f"{', '.join(cnn_onnx.PACKAGED_GRAPHS)}")
    out = Path(folder) if folder is not None else weights
    graph, meta = cnn_onnx._export((weights / f"{name}.safetensors").read_bytes(), None)
    out.mkdir(parents=True, exist_ok=True)
    graph_p, meta_p = out / f"{name}.onnx", out / f"{name}.onnx.json"
    graph_p.write_bytes(graph)
    meta_p.write_text(cnn_onnx.export_metadata(graph, meta))
    return graph_p, meta_p


def main(argv: list[str] | None = None) -> int:
    import argparse

    from collapseguard.detectors import cnn_onnx

    ap = argparse.ArgumentParser(
        prog="python -m collapseguard.detectors.cnn_export",
        description="Write the ONNX graph of packaged cnn weights beside them, for scoring "
                    "without torch (needs torch and onnx).")
    ap.add_argument("--out", default=None,
                    help="folder to write NAME.onnx and NAME.onnx.json into (default: the package's "
                         "weights folder)")
    ap.add_argument("--name", default="cnn", choices=("cnn", *cnn_onnx.PACKAGED_GRAPHS),
                    help="the packaged weights to export: cnn (the shipped detector, the default) or "
                         "compare_cnn (the comparator's cnn)")
    args = ap.parse_args(argv)
    for p in write_shipped_graph(args.out, args.name):
        print(p)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
