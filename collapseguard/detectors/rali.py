"""``rali:<checkpoint dir>`` — the RALI quality scorer on CLIP image features.

Scoring, per image:

1. CLIP image embedding ``x`` (``CLIPModel.get_image_features``, the projected embedding) from the
   CLIP model in ``best/``.
2. PCA whitening as scikit-learn does it: ``z = ((x - mean) @ components.T) / sqrt(var)`` with the
   PCA's ``mean_``, ``components_`` and ``explained_variance_`` (always whitened, whatever the
   pickled PCA's own ``whiten`` flag says).
3. ``z`` is L2-normalised and compared by cosine similarity with the prototype vectors
   (``basis.npz: vectors``, also L2-normalised).
4. ``w = softmax(similarities / temperature)``; ``quality = w @ basis.npz: scores``.

RALI predicts quality (higher = better), so the detector score is ``-quality`` (higher = more
degraded) and the quality is kept as ``raw``.

Checkpoint layout (the published one, plus the converted alternative):

=================  ========================================  ===================================
file               published (needs ``trust_pickle=True``)   converted (no pickle)
=================  ========================================  ===================================
CLIP model         ``best/`` (transformers CLIPModel)        ``best/`` with ``model.safetensors``
PCA                ``pca.pkl`` (pickled sklearn PCA)         ``pca.npz`` (mean, components,
                                                             explained_variance)
prototypes         ``basis.npz`` (vectors, scores)           ``basis.npz``
head / extras      ``ckpt.pt`` (torch, ``state_dict``)       ``head.safetensors`` + ``rali.json``
=================  ========================================  ===================================

Converted files win when both are present, so after a one-time
``python -m collapseguard.detectors.rali_convert DIR`` (run knowingly, with the pickle trusted) the
folder loads without the flag. Without the flag and without converted files the detector refuses to
load (``DetectorError``): ``pickle`` and ``torch.load`` can run arbitrary code.

Assumptions where the published layout is not documented (see docs/JUDGES.md):

- ``ckpt.pt``'s ``state_dict`` entries whose names (after stripping ``module.``/``model.``/
  ``clip.`` prefixes) match CLIPModel parameters are loaded into the CLIP model (fine-tuned
  weights); a scalar ``temperature`` (or ``tau``) entry sets the softmax temperature; anything
  else is listed in ``ignored_keys`` and not used.
- The temperature is, in order: the ``temperature`` argument, the checkpoint's value, ``rali.json``,
  ``basis.npz: temperature``, else 0.07 (CLIP's usual softmax temperature).
- Images are preprocessed with ``best/``'s CLIPImageProcessor (resize + centre crop to the CLIP
  input size) because that is what the scorer was fitted on; ``preprocess="crop"`` instead takes a
  native-resolution centre crop of the CLIP input size (no resizing), as the rest of collapseguard
  does.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from collapseguard.detectors.base import (
    Detector,
    DetectorError,
    params_version,
    resolve_device,
)

DEFAULT_TEMPERATURE = 0.07
_PREFIXES = ("module.", "model.", "clip.", "clip_model.")
_TEMPERATURE_KEYS = ("temperature", "tau")
CONVERTED_MARKER = "rali.json"


def _refuse(path: Path, what: str, checkpoint: Path | None = None) -> DetectorError:
    """``checkpoint``: the RALI folder to convert, when ``path`` lies below it (best/...)."""
    return DetectorError(
        f"refusing to load {path} ({what}) without trust: unpickling can run arbitrary code. "
        "Pass trust_pickle=True (the score, audit and filter commands: --trust-pickle) if you trust "
        "its source, or convert it once (what every other command reads) "
        f"with: python -m collapseguard.detectors.rali_convert {checkpoint or path.parent}"
    )


def _converted_from(meta_path: Path, ckpt: Path) -> bool:
    """True when the folder's conversion record names exactly this ckpt.pt as its source."""
    if not meta_path.is_file():
        return False
    from collapseguard.detectors.rali_convert import _sha

    try:
        recorded = json.loads(meta_path.read_text()).get("converted_from", {}).get("ckpt.pt")
    except (ValueError, AttributeError):
        return False
    return recorded == _sha(ckpt)


def load_pca(folder: Path, trust_pickle: bool = False) -> dict[str, np.ndarray]:
    """PCA parameters (mean, components, explained_variance) from pca.npz, or pca.pkl if trusted."""
    npz = folder / "pca.npz"
    if npz.is_file():
        try:
            with np.load(npz, allow_pickle=False) as z:
                pca = {k: np.asarray(z[k], dtype=np.float64) for k in ("mean", "components", "explained_variance")}
        except KeyError as exc:
            raise DetectorError(f"{npz} must hold 'mean', 'components' and 'explained_variance' "
                                f"(missing {exc})") from None
        except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise DetectorError(f"{npz} is not a readable PCA file ({type(exc).__name__}: {exc})") from None
    else:
        pkl = folder / "pca.pkl"
        if not pkl.is_file():
            raise DetectorError(f"{folder}: neither pca.npz nor pca.pkl found")
        if not trust_pickle:
            raise _refuse(pkl, "pickled scikit-learn PCA")
        with open(pkl, "rb") as fh:
            obj = pickle.load(fh)
        get = (lambda k: obj[k]) if isinstance(obj, dict) else (lambda k: getattr(obj, k))
        try:
            pca = {
                "mean": np.asarray(get("mean_"), dtype=np.float64),
                "components": np.asarray(get("components_"), dtype=np.float64),
                "explained_variance": np.asarray(get("explained_variance_"), dtype=np.float64),
            }
        except (KeyError, AttributeError) as exc:
            raise DetectorError(f"{pkl} is not a fitted PCA (missing {exc})") from None
    k, d = pca["components"].shape if pca["components"].ndim == 2 else (0, 0)
    if not k or pca["mean"].shape != (d,) or pca["explained_variance"].shape != (k,):
        raise DetectorError(
            f"{folder}: inconsistent PCA shapes: components {pca['components'].shape}, "
            f"mean {pca['mean'].shape}, explained_variance {pca['explained_variance'].shape}"
        )
    if not np.all(pca["explained_variance"] > 0):
        raise DetectorError(f"{folder}: PCA explained_variance must be positive to whiten")
    return pca


def load_basis(folder: Path) -> dict[str, np.ndarray]:
    """Prototype vectors (K, k) and their scores (K,) from basis.npz (no pickle allowed)."""
    path = folder / "basis.npz"
    if not path.is_file():
        raise DetectorError(f"{folder}: basis.npz not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {"vectors": np.asarray(z["vectors"], dtype=np.float64),
                   "scores": np.asarray(z["scores"], dtype=np.float64).ravel()}
            if "temperature" in z.files:
                out["temperature"] = np.asarray(z["temperature"], dtype=np.float64)
    except KeyError as exc:
        raise DetectorError(f"{path} must hold 'vectors' and 'scores' (missing {exc})") from None
    except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DetectorError(f"{path}: {type(exc).__name__}: {exc}") from None
    v, s = out["vectors"], out["scores"]
    if v.ndim != 2 or v.shape[0] != s.shape[0] or v.shape[0] == 0:
        raise DetectorError(f"{path}: vectors {v.shape} and scores {s.shape} do not match")
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(s))):
        raise DetectorError(f"{path}: non-finite prototype vectors or scores")
    return out


def load_head(folder: Path, trust_pickle: bool = False) -> tuple[dict, dict]:
    """(tensor state_dict, scalar extras) from head.safetensors + rali.json, or ckpt.pt if trusted.

    Returns empty dicts when the folder has neither (the head is optional).
    """
    safe = folder / "head.safetensors"
    meta_path = folder / CONVERTED_MARKER
    extras: dict = {}
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError as exc:
            raise DetectorError(f"{meta_path}: invalid JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise DetectorError(f"{meta_path}: expected a JSON object")
        extras = {k: v for k, v in meta.get("scalars", {}).items() if isinstance(v, (int, float))}
    if safe.is_file():
        from safetensors.torch import load_file

        return load_file(str(safe)), extras
    ckpt = folder / "ckpt.pt"
    if not ckpt.is_file() or _converted_from(meta_path, ckpt):
        return {}, extras  # converted in place, and ckpt.pt held only the scalars kept above
    if not trust_pickle:
        raise _refuse(ckpt, "torch checkpoint")
    import torch

    try:
        obj = torch.load(str(ckpt), map_location="cpu", weights_only=True)
    except Exception:
        obj = torch.load(str(ckpt), map_location="cpu", weights_only=False)  # trusted by the user
    sd = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(sd, dict):
        raise DetectorError(f"{ckpt}: expected a dict with a 'state_dict'")
    tensors, scalars = split_state_dict(sd)
    scalars.update(extras)
    return tensors, scalars


def split_state_dict(sd: dict) -> tuple[dict, dict]:
    """Split a checkpoint state_dict into tensors (>0-dim) and plain scalars (0-dim, numbers)."""
    import torch

    tensors, scalars = {}, {}
    for k, v in sd.items():
        if not isinstance(k, str):
            continue
        if isinstance(v, torch.Tensor):
            if v.ndim == 0:
                scalars[k] = float(v)
            else:
                tensors[k] = v.detach().cpu().contiguous()
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            scalars[k] = float(v)
    return tensors, scalars


def _strip(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p) :], True
    return name


def _dir_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode())
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


#: longest side / shortest side handed to the CLIP processor (see ``_trim_aspect``)
MAX_CLIP_ASPECT = 4


def _trim_aspect(a: np.ndarray) -> np.ndarray:
    """The centre of an image longer than ``MAX_CLIP_ASPECT`` times its short side (native pixels).

    The CLIP processor resizes the short side to the input size and keeps the centre square, so
    the far ends of a strip never reach the model; but it resizes the whole strip first, and a
    1 x 20000 banner would become a 224 x 4.5-million-pixel image (gigabytes) on the way. Images
    up to the ratio are handed over untouched."""
    h, w = a.shape[:2]
    short = max(1, min(h, w))
    keep = MAX_CLIP_ASPECT * short
    if h > keep:
        y = (h - keep) // 2
        a = a[y : y + keep]
    if w > keep:
        x = (w - keep) // 2
        a = a[:, x : x + keep]
    return np.ascontiguousarray(a)


def whiten(feats: np.ndarray, pca: dict[str, np.ndarray]) -> np.ndarray:
    """sklearn-style PCA whitening: ((x - mean) @ components.T) / sqrt(explained_variance)."""
    return ((feats - pca["mean"]) @ pca["components"].T) / np.sqrt(pca["explained_variance"])


def prototype_quality(z: np.ndarray, vectors: np.ndarray, scores: np.ndarray, temperature: float) -> np.ndarray:
    """Softmax(cosine(z, vectors) / T)-weighted prototype scores, one per row of ``z``."""
    zn = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    vn = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    logits = (zn @ vn.T) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=1, keepdims=True)
    return w @ scores


class RALIDetector(Detector):
    """RALI: CLIP features -> PCA whitening -> cosine to prototypes -> softmax-weighted scores.

    Args:
        ckpt_dir: the checkpoint folder (see module docstring for its layout).
        trust_pickle: allow ``pca.pkl`` (pickle) and ``ckpt.pt`` (torch.load) to be loaded.
        temperature: softmax temperature (default: from the checkpoint, else 0.07).
        device: torch device; default CUDA when available, else CPU.
        preprocess: ``"clip"`` (the CLIP processor: resize + centre crop; default) or ``"crop"``
            (native-resolution centre crop of the CLIP input size, no resizing).
        batch_size: images per forward pass.
    """


    def __init__(
        self,
        ckpt_dir: str,
        trust_pickle: bool = False,
        temperature: float | None = None,
        device: str | None = None,
        preprocess: str = "clip",
        batch_size: int = 32,
    ):
        try:
            import torch  # noqa: F401  (the [vlm] extra: torch and transformers)
            from transformers import CLIPImageProcessor, CLIPModel
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise DetectorError(f"{exc.name or 'torch or transformers'} is not installed ({exc}); "
                                f"pip install 'collapseguard[vlm]'") from exc

        folder = Path(str(ckpt_dir)).expanduser()
        if not folder.is_dir():
            raise DetectorError(f"RALI checkpoint folder not found: {ckpt_dir}")
        best = folder / "best"
        if not (best / "config.json").is_file():
            raise DetectorError(f"{folder}: best/config.json (the CLIP model) not found")
        if preprocess not in ("clip", "crop"):
            raise DetectorError(f"preprocess must be 'clip' or 'crop', got {preprocess!r}")
        has_safe = any(best.glob("*.safetensors"))
        if not has_safe and not (best / "pytorch_model.bin").is_file():
            raise DetectorError(f"{best}: no CLIP weights (model.safetensors or pytorch_model.bin)")
        if not has_safe and not trust_pickle:
            raise _refuse(best / "pytorch_model.bin", "CLIP weights without safetensors", folder)

        self.pca = load_pca(folder, trust_pickle)
        self.basis = load_basis(folder)
        tensors, scalars = load_head(folder, trust_pickle)
        if self.basis["vectors"].shape[1] != self.pca["components"].shape[0]:
            raise DetectorError(
                f"{folder}: prototype vectors have {self.basis['vectors'].shape[1]} dims but the PCA "
                f"keeps {self.pca['components'].shape[0]} components"
            )

        self.device = resolve_device(device)
        try:
            self.model = CLIPModel.from_pretrained(str(best), local_files_only=True, use_safetensors=has_safe)
        except Exception as exc:
            raise DetectorError(f"cannot load the CLIP model in {best}: {type(exc).__name__}: {exc}") from exc
        own = self.model.state_dict()
        overlay, self.ignored_keys = {}, []
        for k, v in tensors.items():
            name = _strip(k)
            if name in own and tuple(own[name].shape) == tuple(v.shape):
                overlay[name] = v.to(own[name].dtype)
            else:
                self.ignored_keys.append(k)
        if overlay:
            self.model.load_state_dict(overlay, strict=False)
        self.n_overlaid = len(overlay)
        self.model.to(self.device).eval()
        if self.pca["components"].shape[1] != self.model.config.projection_dim:
            raise DetectorError(
                f"{folder}: PCA expects {self.pca['components'].shape[1]}-dim features but the CLIP "
                f"model projects to {self.model.config.projection_dim}"
            )

        ckpt_t = next((scalars[k] for k in _TEMPERATURE_KEYS if k in scalars), None)
        basis_t = self.basis.get("temperature")
        if temperature is not None:
            t = float(temperature)
        elif ckpt_t is not None:
            t = float(ckpt_t)
        elif basis_t is not None and np.size(basis_t) == 1:
            t = float(basis_t)
        else:
            t = DEFAULT_TEMPERATURE
        if not (np.isfinite(t) and t > 0):
            raise DetectorError(f"temperature must be a positive number, got {t}")
        self.temperature = t

        if (best / "preprocessor_config.json").is_file():
            self.processor = CLIPImageProcessor.from_pretrained(str(best), local_files_only=True)
        else:
            size = int(self.model.config.vision_config.image_size)
            self.processor = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
        self.input_size = int(self.model.config.vision_config.image_size)
        self.preprocess = preprocess
        self.batch_size = max(1, int(batch_size))
        self.version = params_version(
            "rali", _dir_digest(best), *(self.pca[k].tobytes() for k in ("mean", "components", "explained_variance")),
            self.basis["vectors"].tobytes(), self.basis["scores"].tobytes(), self.temperature,
            sorted((k, hashlib.sha256(v.float().numpy().tobytes()).hexdigest()) for k, v in overlay.items()),
            preprocess,
        )
        self.name = f"rali:{ckpt_dir}"

    # -----------------------------------------------------------------------------------------
    def _pixels(self, images: Sequence[np.ndarray]):
        import torch
        from PIL import Image

        if self.preprocess == "clip":
            inputs = self.processor(images=[Image.fromarray(_trim_aspect(a)) for a in images],
                                    return_tensors="pt")
            return inputs["pixel_values"]
        from collapseguard.detectors.crops import crop_grid

        crops = np.stack([crop_grid(a, self.input_size, 1)[0] for a in images]).astype(np.float32) / 255.0
        mean = np.asarray(self.processor.image_mean, dtype=np.float32)
        std = np.asarray(self.processor.image_std, dtype=np.float32)
        return torch.from_numpy((crops - mean) / std).permute(0, 3, 1, 2).contiguous()

    def features(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """CLIP image embeddings (N, projection_dim), float64."""
        import torch

        for i, img in enumerate(images):
            a = np.asarray(img)
            if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
                raise DetectorError(f"image {i}: expected (H, W, 3) uint8, got {a.shape} {a.dtype}")
        out = []
        for s in range(0, len(images), self.batch_size):
            px = self._pixels([np.asarray(a) for a in images[s : s + self.batch_size]])
            with torch.inference_mode():
                f = self.model.get_image_features(pixel_values=px.to(self.device, self.model.dtype))
            if not isinstance(f, torch.Tensor):
                f = f.pooler_output
            out.append(f.float().cpu().numpy().astype(np.float64))
        dim = int(self.model.config.projection_dim)
        return np.concatenate(out) if out else np.zeros((0, dim))

    def quality(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """RALI quality (higher = better)."""
        feats = self.features(images)
        if not len(feats):
            return np.zeros(0)
        z = whiten(feats, self.pca)
        return prototype_quality(z, self.basis["vectors"], self.basis["scores"], self.temperature)

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        q = self.quality(images)
        return {"score": (-q).astype(np.float32), "raw": q.astype(np.float32)}

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]

    def to(self, device: str) -> RALIDetector:
        device = resolve_device(device)
        self.model.to(device)
        self.device = device
        return self


def is_converted(folder: str | os.PathLike) -> bool:
    """True when a folder holds the pickle-free files written by ``rali_convert``."""
    f = Path(folder)
    return (f / "pca.npz").is_file() and (f / CONVERTED_MARKER).is_file()
