"""``vlm:<model id or local path>`` — a Qwen2-VL / Qwen2.5-VL quality judge (VisualQuality-R1 style).

The judge asks the model VisualQuality-R1's question (overall quality from 1 to 5, two decimals,
final answer in ``<answer>`` tags; see :mod:`collapseguard.detectors.vlm_prompt`) and turns the
rating into a detector score: ``score = 5 - rating`` so that higher = more degraded; the rating is
kept as ``raw`` in :meth:`VLMJudge.score_detailed`.

- Model class chosen from the config's ``model_type`` (``qwen2_vl`` or ``qwen2_5_vl``).
- Non-thinking ("fast") mode by default; ``thinking=True`` asks for reasoning in ``<think>`` tags
  first (slower: up to ``max_new_tokens`` = 1024 generated tokens per image).
- Greedy decoding (``do_sample=False``): the same image always gets the same rating.
- Batched with left padding; device auto: CUDA when present (bfloat16), else CPU (float32).
- Resolution: each image is first centre-cropped (never resized) to a multiple of the vision
  grid (28 pixels = patch 14 x merge 2), so that Qwen's processor takes it at native resolution;
  a strip with one side over 200x the other (which the processor refuses) keeps its centre part.
  Only images above ``max_pixels`` (default 1536*28*28 ~ 1.2 MP, i.e. at most 1536 visual tokens;
  a 1024 x 1024 image fits) are downscaled by the processor's ``smart_resize`` — the one place
  where the judge shrinks an image, to bound memory. Pass ``max_pixels`` to trade memory for
  detail (VisualQuality-R1's own processor config allows up to 12845056 pixels).
- An answer that cannot be parsed gives NaN, never a made-up score. ``n_parse_errors`` counts them
  and ``last_answers`` / ``last_parse_errors`` keep the most recent raw answers for reporting.

Network: a hub id (e.g. ``TianheWu/VisualQuality-R1-7B``) is downloaded by transformers unless
``HF_HUB_OFFLINE=1``; a local folder never touches the network.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from collapseguard.detectors.base import (
    Detector,
    DetectorError,
    params_version,
    resolve_device,
)
from collapseguard.detectors.vlm_prompt import RATING_MAX, parse_rating, rating_prompt
from collapseguard.io.terminal import printable

#: default cap on image pixels handed to the vision tower: 1536 visual tokens (~1.2 MP), enough
#: for a 1024 x 1024 image to go in at native resolution
DEFAULT_MAX_PIXELS = 1536 * 28 * 28
#: smallest pixel count the processor upsizes to (Qwen2-VL default)
DEFAULT_MIN_PIXELS = 56 * 56
#: longest side / shortest side the Qwen processors accept (``smart_resize`` raises above it)
MAX_ASPECT = 200

_SAMPLING_KEYS = {"do_sample", "temperature", "top_p", "top_k", "num_beams", "num_return_sequences",
                  "max_new_tokens", "generation_config"}

_MODEL_CLASSES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
}


#: content samples read from each weight file for the version (see ``_weights_fingerprint``)
_SAMPLES, _SAMPLE_BYTES = 32, 1 << 16


def _file_digest(path: Path) -> str:
    """SHA-256 of a file's size and of ``_SAMPLES`` blocks spread evenly over it (the whole file
    when small). Two fine-tunes of one architecture have the same sizes, and every block of their
    weights differs; reading 2 MB instead of 16 GB keeps loading fast."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= _SAMPLES * _SAMPLE_BYTES:
            h.update(f.read())
        else:
            for i in range(_SAMPLES):
                f.seek((size - _SAMPLE_BYTES) * i // (_SAMPLES - 1))
                h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def _weights_fingerprint(folder: Path) -> list[tuple[str, str]]:
    """(name, content digest) of the weight, config and template files of a model folder: the
    identity behind a local model's version, so a calibration or label cache made with other
    weights under the same file names is refused."""
    keep = (".safetensors", ".bin", ".json", ".jinja")
    return sorted(
        (p.name, _file_digest(p)) for p in folder.iterdir() if p.is_file() and p.name.endswith(keep)
    )


class VLMJudge(Detector):
    """VisualQuality-R1-style rating with a Qwen2-VL / Qwen2.5-VL model through transformers.

    Args:
        model: a local model folder or a hub id.
        thinking: ask for reasoning in ``<think>`` tags before the answer (slower).
        device: torch device; default CUDA when available, else CPU.
        dtype: torch dtype name; default bfloat16 on CUDA, float32 on CPU.
        batch_size: images per generate call.
        max_new_tokens: generation budget per image (default 64, or 1024 in thinking mode).
        max_pixels / min_pixels: processor pixel bounds per image (see module docstring).
        local_files_only: never contact the hub (default: when ``model`` is a local folder or
            ``HF_HUB_OFFLINE=1``).
        attn_implementation: passed to ``from_pretrained`` (default: transformers' choice).
        keep_answers: how many recent raw answers to keep in ``last_answers``.
        generation_kwargs: extra ``generate`` arguments (e.g. ``logits_processor``,
            ``repetition_penalty``); sampling arguments are refused: decoding stays greedy.
    """


    def __init__(
        self,
        model: str,
        thinking: bool = False,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 4,
        max_new_tokens: int | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        min_pixels: int = DEFAULT_MIN_PIXELS,
        local_files_only: bool | None = None,
        attn_implementation: str | None = None,
        keep_answers: int = 32,
        generation_kwargs: dict | None = None,
    ):
        try:
            import torch
            import transformers
            from transformers import AutoConfig, AutoProcessor
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise DetectorError(f"{exc.name or 'torch or transformers'} is not installed ({exc}); "
                                f"pip install 'collapseguard[vlm]'") from exc

        if not isinstance(model, str) or not model.strip():
            raise DetectorError("vlm: needs a model id or a local folder, e.g. vlm:/models/VisualQuality-R1-7B")
        model = model.strip()
        if int(max_pixels) < int(min_pixels) or int(min_pixels) < 28 * 28:
            raise DetectorError(f"need 28*28 <= min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
        generation_kwargs = dict(generation_kwargs or {})
        sampling = sorted(set(generation_kwargs) & _SAMPLING_KEYS)
        if sampling:
            raise DetectorError(f"decoding is greedy and deterministic; refusing {sampling}")
        local = Path(model).expanduser()
        is_local = local.is_dir()
        if not is_local and (model.startswith((".", "/", "~")) or model.count("/") > 1):
            raise DetectorError(f"model folder not found: {model}")
        if local_files_only is None:
            local_files_only = is_local or os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "yes")
        src = str(local) if is_local else model
        load_kw = {"local_files_only": bool(local_files_only)}

        try:
            config = AutoConfig.from_pretrained(src, **load_kw)
        except Exception as exc:
            first = str(exc).replace("\\n", "\n").strip().splitlines()[0] if str(exc).strip() else ""
            where = ("" if is_local else f"; there is no folder {model!r} here either, so it was taken "
                     "for a model hub id")
            raise DetectorError(f"cannot read the model config of {model!r}: {type(exc).__name__}: "
                                f"{first}{where}") from exc
        model_type = getattr(config, "model_type", "")
        if model_type not in _MODEL_CLASSES:
            raise DetectorError(
                f"{model!r} is a {model_type!r} model; the VLM judge supports {sorted(_MODEL_CLASSES)}"
            )
        cls = getattr(transformers, _MODEL_CLASSES[model_type])

        self.device = resolve_device(device)
        if dtype is None:
            torch_dtype = torch.bfloat16 if str(self.device).startswith("cuda") else torch.float32
        else:
            torch_dtype = getattr(torch, dtype, None)
            if not isinstance(torch_dtype, torch.dtype):
                raise DetectorError(f"unknown torch dtype {dtype!r}")
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        if str(self.device).startswith("cuda"):
            extra["device_map"] = self.device  # load straight onto the GPU (no 16 GB CPU copy)
        try:
            self.processor = AutoProcessor.from_pretrained(src, **load_kw)
            self.model = cls.from_pretrained(src, dtype=torch_dtype, **load_kw, **extra)
        except Exception as exc:
            raise DetectorError(f"cannot load {model!r}: {type(exc).__name__}: {exc}") from exc
        self.model.to(self.device).eval()
        tok = getattr(self.processor, "tokenizer", None)
        if tok is None or not getattr(self.processor, "chat_template", None):
            raise DetectorError(f"{model!r}: the processor has no tokenizer or no chat template")
        tok.padding_side = "left"  # decoder-only batched generation needs left padding
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token

        self.generation_kwargs = generation_kwargs
        self.model_type = model_type
        self.thinking = bool(thinking)
        self.batch_size = max(1, int(batch_size))
        self.max_new_tokens = int(max_new_tokens or (1024 if self.thinking else 64))
        self.max_pixels, self.min_pixels = int(max_pixels), int(min_pixels)
        self.prompt = rating_prompt(self.thinking)
        self.n_parse_errors = 0
        self.last_nan_reasons: list[str] = []  # per image of the last call: why it is NaN
        self.n_scored = 0
        self.last_answers: collections.deque[str] = collections.deque(maxlen=keep_answers)
        self.last_parse_errors: collections.deque[str] = collections.deque(maxlen=keep_answers)

        ident: object
        if is_local:
            ident = _weights_fingerprint(local)
        else:
            ident = getattr(config, "_commit_hash", None) or model
        cfg = {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}  # where, not what
        cfg_json = json.dumps(cfg, sort_keys=True, default=str)
        self.version = params_version(
            "vlm", model_type, hashlib.sha256(cfg_json.encode()).hexdigest(), ident,
            self.prompt, self.max_pixels, self.min_pixels, self.max_new_tokens,
            getattr(self.processor, "chat_template", ""),
            # bf16 (the default on CUDA) and fp32 (on the CPU) give other ratings, and so may
            # another attention kernel: each is its own detector version
            str(self.model.dtype), str(getattr(self.model.config, "_attn_implementation", None) or ""),
            sorted((k, repr(v) if isinstance(v, (int, float, str, bool)) else type(v).__name__)
                   for k, v in self.generation_kwargs.items()),
        )
        self.name = f"vlm:{model}"

    # -----------------------------------------------------------------------------------------
    def _messages(self) -> list[dict]:
        return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": self.prompt}]}]

    def chat_text(self) -> str:
        """The full prompt text (chat template applied) sent with every image."""
        return self.processor.apply_chat_template(
            self._messages(), tokenize=False, add_generation_prompt=True, add_vision_id=True
        )

    @property
    def grid(self) -> int:
        """Pixel multiple the vision tower works in (patch size x spatial merge size)."""
        ip = self.processor.image_processor
        return int(getattr(ip, "patch_size", 14)) * int(getattr(ip, "merge_size", 2))

    def prepare(self, images: Sequence[np.ndarray]):
        """Processor inputs (token ids, pixel patches, grid sizes) for one batch of images."""
        from PIL import Image

        g = self.grid
        pil = []
        for i, img in enumerate(images):
            a = np.asarray(img)
            if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
                raise DetectorError(f"image {i}: expected (H, W, 3) uint8, got {a.shape} {a.dtype}")
            h, w = a.shape[:2]
            ch, cw = (h // g) * g or h, (w // g) * g or w  # tiny images: left to the processor
            # Qwen's processor refuses a side over 200x the other: keep the centre of such a strip
            ch, cw = min(ch, (MAX_ASPECT * cw // g) * g or ch), min(cw, (MAX_ASPECT * ch // g) * g or cw)
            y, x = (h - ch) // 2, (w - cw) // 2
            pil.append(Image.fromarray(np.ascontiguousarray(a[y : y + ch, x : x + cw])))
        return self.processor(
            text=[self.chat_text()] * len(pil),
            images=pil,
            padding=True,
            return_tensors="pt",
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
        )

    def generate(self, images: Sequence[np.ndarray]) -> list[str]:
        """Raw decoded answers (special tokens removed), one per image, greedy decoding."""
        import torch

        answers: list[str] = []
        for s in range(0, len(images), self.batch_size):
            inputs = self.prepare(images[s : s + self.batch_size]).to(self.device)
            with torch.inference_mode():
                out = self.model.generate(
                    **inputs,
                    do_sample=False,
                    num_beams=1,
                    max_new_tokens=self.max_new_tokens,
                    use_cache=True,
                    pad_token_id=self.processor.tokenizer.pad_token_id,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    **self.generation_kwargs,
                )
            new = out[:, inputs["input_ids"].shape[1] :]
            answers.extend(
                self.processor.batch_decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            )
        return answers

    def ratings(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """Ratings in [1, 5] (higher = better quality); NaN for an unparseable answer (counted)."""
        answers = self.generate(images) if len(images) else []
        out = np.full(len(answers), np.nan, dtype=np.float64)
        reasons = [""] * len(answers)
        for i, ans in enumerate(answers):
            self.last_answers.append(ans)
            value = parse_rating(ans)
            if value is None:
                self.n_parse_errors += 1
                self.last_parse_errors.append(ans)
                cut = ans if len(ans) <= 120 else ans[:120] + "..."
                reasons[i] = f"{self.name}: no rating in [1, 5] in its answer {printable(cut)!r}"
            else:
                out[i] = value
        self.n_scored += len(answers)
        self.last_nan_reasons = reasons  # the scoring table's error for each NaN
        return out

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        rating = self.ratings(images)
        return {"score": (RATING_MAX - rating).astype(np.float32), "raw": rating.astype(np.float32)}

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]

    def error_report(self) -> dict:
        """Counts and the most recent unparseable answers, for summaries and logs."""
        return {
            "scored": self.n_scored,
            "parse_errors": self.n_parse_errors,
            "recent_unparseable_answers": list(self.last_parse_errors),
        }

    def to(self, device: str) -> VLMJudge:
        device = resolve_device(device)
        self.model.to(device)
        self.device = device
        return self
