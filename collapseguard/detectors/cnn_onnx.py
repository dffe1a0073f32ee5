"""The ``cnn`` detector run by onnxruntime on the CPU, without torch in the process.

The shipped weights come with their exported graph inside the package
(``collapseguard/weights/cnn.onnx`` and ``cnn.onnx.json``, written by
``python -m collapseguard.detectors.cnn_export``), and so do the weights the comparator reads
(``compare_cnn.onnx``, see ``compare.CNN_WEIGHTS_NAME``); a graph's metadata names the SHA-256 of
the weights file it was exported from, so a graph left stale by new weights is never used. Other weights (or
another crop count) are exported once (``cnn_export``, which needs torch and onnx: the ``[train]``
extra) and cached under ``$COLLAPSEGUARD_CACHE/cnn-onnx/`` (default ``~/.cache/collapseguard``),
keyed by the SHA-256 of the weights file, the crops per image and the export format; a process that
finds the export shipped or cached imports neither torch nor onnx. The detector reads the same native-resolution crops
as ``cnn.CNNDetector`` (``crops.image_crops``), batched across images, and its scores equal that
detector's within ``SCORE_TOLERANCE``; it carries the same name and version, so calibrations of
the weights apply to it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from collapseguard.detectors.base import Detector, DetectorError
from collapseguard.detectors.crops import CROP_LAYOUT, image_crops

#: largest absolute difference from the torch network's score allowed (checked at every export
#: and by tests/detectors/test_cnn_onnx.py; measured differences are around 1e-5)
SCORE_TOLERANCE = 1e-4
#: images per onnxruntime call (``OnnxCNNDetector.run_images``): on a CPU a call's cost per image
#: grows with the images in it, as the crops' activations leave the cache (one image a call: 5.0 ms
#: at 1024x768 on one thread, four: 6.6 ms; ``benchmarks/detector_speed.py --threads 1
#: --detectors cnn --runtime onnx --run-images 1 2 4``),
#: and its buffers grow too (32 images of 48 crops held ~560 MB at peak)
RUN_IMAGES = 1
#: bump when ExportNet changes what it writes: older cached exports are then not used
EXPORT_FORMAT = 2
#: the shipped weights' graph and its metadata, beside ``cnn_family.WEIGHTS_NAME`` in the package
SHIPPED_GRAPH = "cnn.onnx"
SHIPPED_META = "cnn.onnx.json"
#: the other packaged graphs (``NAME.onnx`` beside ``NAME.onnx.json``): the comparator's cnn
PACKAGED_GRAPHS = ("compare_cnn",)


class ExportUnavailable(DetectorError):
    """No cached export of these weights, and torch or onnx, needed to make one, is missing."""


def available() -> bool:
    """Is onnxruntime importable here?"""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def cache_dir() -> Path:
    env = os.environ.get("COLLAPSEGUARD_CACHE")
    base = Path(env) if env else Path(os.path.expanduser("~")) / ".cache" / "collapseguard"
    return base / "cnn-onnx"


def _export(data: bytes, n_crops: int | None) -> tuple[bytes, dict]:
    """Export the weights in ``data`` (torch and onnx needed); returns (graph, metadata)."""
    try:
        import onnx  # noqa: F401  (torch's exporter needs it)
        import torch  # noqa: F401
    except ImportError as exc:
        raise ExportUnavailable(
            f"these cnn weights have no exported ONNX graph here, and making one needs torch and onnx "
            f"({exc}): pip install 'collapseguard[train]'") from None
    from collapseguard.detectors.cnn import crops_for, weights_version
    from collapseguard.detectors.cnn_export import export_onnx
    from collapseguard.detectors.cnn_model import load_weights

    net, _ = load_weights(data)
    k = crops_for(net, n_crops)
    try:
        # the graph reads every view: the crops, and with ``mirror`` the mirror image's as many
        graph = export_onnx(net, 2 * k if net.config.mirror else k, SCORE_TOLERANCE)
    except RuntimeError as exc:
        raise ExportUnavailable(str(exc)) from None
    meta = {"format": EXPORT_FORMAT, "weights_sha256": hashlib.sha256(data).hexdigest(),
            "version": weights_version(net, k), "crop_size": net.config.crop_size, "n_crops": k,
            "mirror": net.config.mirror, "crop_layout": CROP_LAYOUT}  # the version holds it: an export of another layout is redone
    return graph, meta


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _valid(graph: bytes, meta: object, sha: str) -> bool:
    """Is ``graph`` with ``meta`` an export of the weights whose SHA-256 is ``sha``, in this
    module's format and crop layout, unchanged since it was written?"""
    return (isinstance(meta, dict) and meta.get("weights_sha256") == sha
            and meta.get("format") == EXPORT_FORMAT and meta.get("crop_layout") == CROP_LAYOUT
            and meta.get("graph_sha256") == hashlib.sha256(graph).hexdigest())


def packaged_export(graph_name: str, meta_name: str) -> tuple[bytes, dict] | None:
    """A graph and its metadata from the package's weights folder, or None when missing."""
    folder = resources.files("collapseguard") / "weights"
    try:
        return (folder / graph_name).read_bytes(), json.loads((folder / meta_name).read_text())
    except (OSError, ValueError):
        return None


def shipped_export() -> tuple[bytes, dict] | None:
    """The graph and metadata shipped beside the packaged weights, or None when missing."""
    return packaged_export(SHIPPED_GRAPH, SHIPPED_META)


def export_metadata(graph: bytes, meta: dict) -> str:
    """``meta`` with the graph's SHA-256, as the JSON text written beside a graph."""
    return json.dumps({**meta, "graph_sha256": hashlib.sha256(graph).hexdigest()}, indent=1,
                      sort_keys=True) + "\n"


def load_export(data: bytes, n_crops: int | None) -> tuple[bytes, dict]:
    """The ONNX graph and metadata for weights ``data``: a packaged graph when it was exported
    from these weights with these crops, else from the cache, else exported (and cached when the
    cache folder is writable)."""
    sha = hashlib.sha256(data).hexdigest()
    readers = [shipped_export, *(lambda n=n: packaged_export(f"{n}.onnx", f"{n}.onnx.json")
                                 for n in PACKAGED_GRAPHS)]
    for read in readers:  # each graph read only when the ones before it do not fit
        shipped = read()
        if (shipped is not None and _valid(*shipped, sha)
                and n_crops in (None, shipped[1].get("n_crops"))):
            return shipped
    stem = f"{sha[:32]}-k{int(n_crops) if n_crops else 'default'}-f{EXPORT_FORMAT}"
    graph_p, meta_p = cache_dir() / f"{stem}.onnx", cache_dir() / f"{stem}.json"
    try:
        meta = json.loads(meta_p.read_text())
        graph = graph_p.read_bytes()
        if _valid(graph, meta, sha):
            return graph, meta
    except (OSError, ValueError):
        pass
    graph, meta = _export(data, n_crops)
    meta["graph_sha256"] = hashlib.sha256(graph).hexdigest()
    try:
        graph_p.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(graph_p, graph)
        _write_atomic(meta_p, json.dumps(meta, sort_keys=True).encode())  # last: marks it complete
    except OSError:
        pass  # an unwritable cache: this process keeps its export in memory
    return graph, meta


def _threads() -> int:
    """Intra-op threads: the engine's per-worker budget (OMP_NUM_THREADS), else every core."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return max(1, os.cpu_count() or 1)


class OnnxCNNDetector(Detector):
    """The cnn's weights scored by onnxruntime (see the module docstring)."""

    batch_size = 32
    runtime = "onnx"

    def __init__(self, weights: str | Path | None = None, n_crops: int | None = None):
        import onnxruntime as ort

        from collapseguard.detectors.cnn_family import weights_bytes

        data = weights_bytes(weights)
        if n_crops is not None and int(n_crops) < 1:  # before any export (crops_for checks the rest)
            raise DetectorError(f"n_crops must be >= 1, got {int(n_crops)}")
        graph, meta = load_export(data, n_crops)
        self.version = str(meta["version"])
        self.n_crops = int(meta["n_crops"])
        self.crop_size = int(meta["crop_size"])
        self.mirror = bool(meta.get("mirror", False))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = _threads()
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # shared cores
        self.session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
        self.run_images = RUN_IMAGES

    @property
    def run_images(self) -> int:
        """Images per onnxruntime call (``RUN_IMAGES`` unless set; at least 1)."""
        return self._run_images

    @run_images.setter
    def run_images(self, n: int) -> None:
        try:
            whole = not isinstance(n, bool) and int(n) == n and int(n) >= 1
        except (TypeError, ValueError, OverflowError):  # None, "x", nan, inf
            whole = False
        if not whole:
            raise DetectorError(f"run_images must be a whole number >= 1, got {n!r}")
        self._run_images = int(n)

    def to(self, device: str) -> OnnxCNNDetector:
        if str(device).strip() != "cpu":
            raise DetectorError(f"the onnx runtime scores on the CPU only, not {device!r}; "
                                "create the detector with runtime torch for a GPU")
        return self

    def crops(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """(B, views, S, S, 3) uint8: the pixels this detector reads of ``images`` (``n_crops``
        views, twice as many with ``mirror``)."""
        views = 2 * self.n_crops if self.mirror else self.n_crops
        out = np.empty((len(images), views, self.crop_size, self.crop_size, 3), np.uint8)
        for i, im in enumerate(images):
            out[i] = image_crops(im, self.crop_size, self.n_crops, self.mirror)
        return out

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """One float32 score per image, higher = more degraded."""
        out = np.empty(len(images), dtype=np.float32)
        for start in range(0, len(images), self.run_images):
            chunk = images[start : start + self.run_images]
            res = self.session.run(None, {"crops": self.crops(chunk)})[0]
            out[start : start + len(chunk)] = res
        return out
