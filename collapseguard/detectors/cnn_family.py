"""Creating a ``cnn`` detector (``cnn`` or ``cnn:WEIGHTS``) on the runtime asked for, without
importing torch unless it is the one that runs.

``runtime``:
- ``"torch"``: ``cnn.CNNDetector``, the network as trained (CPU or CUDA);
- ``"onnx"``: ``cnn_onnx.OnnxCNNDetector``, the same network exported to ONNX and run by
  onnxruntime on the CPU. It reads the same crops and gives the same scores within
  ``cnn_onnx.SCORE_TOLERANCE`` (tests/detectors/test_cnn_onnx.py), with the same name and version, so a
  calibration of the weights holds for both. A worker that scores this way never imports torch
  (about 500 MB of resident memory less per process);
- ``"auto"``: onnx when onnxruntime is installed, the device is the CPU (``device`` "cpu", or
  unset on a machine without an NVIDIA driver) and the export can be made or is cached; torch
  otherwise. ``collapseguard filter`` and ``dedup`` score this way by default (``--runtime``).

A detector created without ``runtime`` takes ``$COLLAPSEGUARD_CNN_RUNTIME``, else torch where torch
is installed and onnx where it is not (the core install: torch comes with the ``[train]`` extra);
``filter`` and ``dedup`` set the variable for their run, so the worker processes they spawn
inherit it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from collapseguard.detectors.base import Detector, DetectorError

WEIGHTS_NAME = "cnn.safetensors"
RUNTIMES = ("torch", "onnx", "auto")
RUNTIME_ENV = "COLLAPSEGUARD_CNN_RUNTIME"


def default_weights_bytes() -> bytes:
    """The packaged weights (raises DetectorError when the package was built without them)."""
    ref = resources.files("collapseguard") / "weights" / WEIGHTS_NAME
    try:
        return ref.read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise DetectorError(f"packaged cnn weights missing ({exc}); train some with "
                            "`collapseguard train` and pass weights=PATH") from None


def weights_bytes(weights: str | Path | None) -> bytes:
    """The bytes of a cnn weights file, or the packaged weights for ``None`` (both runtimes load
    weights this way, so a missing file reads the same whichever runs)."""
    if weights is None:
        return default_weights_bytes()
    p = Path(weights)
    if not p.is_file():
        raise DetectorError(f"cnn weights not found: {p}")
    try:
        return p.read_bytes()
    except OSError as exc:
        raise DetectorError(f"cannot read cnn weights {p}: {exc.strerror or exc}") from None


def is_cnn_family(name: str) -> bool:
    """Does the detector spec ``name`` create a cnn detector (the ones that take ``runtime``)?"""
    name = (name or "").strip()
    return name == "cnn" or name.startswith("cnn:")


def torch_installed() -> bool:
    """Can torch be imported here (found without importing it)?"""
    return importlib.util.find_spec("torch") is not None


def default_runtime() -> str:
    """The runtime of a cnn detector created without one: ``$COLLAPSEGUARD_CNN_RUNTIME``, else
    torch where it is installed, else onnx."""
    return os.environ.get(RUNTIME_ENV, "").strip() or ("torch" if torch_installed() else "onnx")


def set_default_runtime(runtime: str) -> Callable[[], None]:
    """Make ``runtime`` the default of this process and of the processes it starts from now on;
    returns the function that puts the earlier default back."""
    if runtime not in RUNTIMES:
        raise DetectorError(f"unknown cnn runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
    before = os.environ.get(RUNTIME_ENV)
    os.environ[RUNTIME_ENV] = runtime

    def restore() -> None:
        if before is None:
            os.environ.pop(RUNTIME_ENV, None)
        else:
            os.environ[RUNTIME_ENV] = before

    return restore


def _cpu_only(device: str | None) -> bool:
    """Will a detector with this ``device`` run on the CPU? Unset means CUDA when there is a GPU,
    which is told without importing torch by the NVIDIA driver's control device."""
    if device is None or not str(device).strip():
        return not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia"))
    return str(device).strip() == "cpu"


def create_cnn(weights: str | Path | None = None, device: str | None = None,
               n_crops: int | None = None, runtime: str | None = None) -> Detector:
    """The registry's factory for ``cnn`` and ``cnn:WEIGHTS`` (see the module docstring)."""
    runtime = runtime or default_runtime()
    if runtime not in RUNTIMES:
        raise DetectorError(f"unknown cnn runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
    if runtime != "torch":
        from collapseguard.detectors import cnn_onnx

        if runtime == "onnx":
            if device is not None and str(device).strip() and not _cpu_only(device):
                raise DetectorError(f"the onnx runtime scores on the CPU only, not {device!r}; "
                                    "use runtime torch for a GPU")
            return cnn_onnx.OnnxCNNDetector(weights, n_crops=n_crops)
        # without torch an unset device is the CPU, whatever GPU the machine has
        unset = device is None or not str(device).strip()
        if (_cpu_only(device) or (unset and not torch_installed())) and cnn_onnx.available():
            try:
                return cnn_onnx.OnnxCNNDetector(weights, n_crops=n_crops)
            except cnn_onnx.ExportUnavailable:
                if not torch_installed():
                    raise
                # no exporter here and nothing cached: the network as trained
    if not torch_installed():
        raise DetectorError("the cnn's torch runtime needs torch: pip install 'collapseguard[train]' "
                            "(or score with runtime onnx, on the CPU)")
    from collapseguard.detectors.cnn import CNNDetector

    return CNNDetector(weights, device=device, n_crops=n_crops)
