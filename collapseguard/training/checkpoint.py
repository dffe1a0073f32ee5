"""Training checkpoints: everything a run needs to go on exactly where it stopped, without pickle.

A checkpoint is a pair of files beside the weights being trained: ``<base>.ckpt.json`` (the step,
the run's settings, a fingerprint of its training data, the numpy and Python random states, the
optimiser's settings, the log so far) and ``<base>.ckpt-<step>.safetensors`` (the network's
weights, the optimiser's moments, torch's random states, the weight average, the clean scores of
hard-negative mining). The JSON is written last and names its tensors file, so a run killed while
saving leaves the previous pair whole; older tensors files are removed after the JSON is replaced.

``train_net`` saves one every ``every_minutes`` / ``every_steps`` (the clock decides when, never
what: saving draws no random number) and at ``stop_at``; ``resume`` loads it and refuses one made
with other settings or other data. A resumed run gives the same weights, bit for bit, as one that
never stopped (same machine, same torch, same threads).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collapseguard.errors import CollapseguardError

FORMAT = "collapseguard-train-checkpoint"
VERSION = 1
#: a tensors file name the JSON may name: a plain name, in the checkpoint's own folder
_TENSORS_NAME = re.compile(r"^[^/\\]+\.ckpt-\d{9}\.safetensors$")


class CheckpointError(CollapseguardError, ValueError):
    """A checkpoint that is missing, damaged, or made by a different run."""


class TrainingStopped(CollapseguardError):
    """``stop_at`` reached: the checkpoint is saved and the run ends without weights."""

    def __init__(self, step: int, path: Path):
        super().__init__(f"stopped after step {step}; checkpoint {path}")
        self.step, self.path = step, path


@dataclass
class Checkpointing:
    """Where and how often ``train_net`` saves, and whether it resumes."""

    #: the JSON file of the pair (``checkpoint_path(out)`` for weights ``out``)
    path: Path
    every_minutes: float = 5.0
    every_steps: int = 0
    resume: bool = False
    #: stop after this many steps (a checkpoint is saved there): splits a run across sessions
    stop_at: int | None = None

    def __post_init__(self):
        self.path = Path(self.path)
        if not self.path.name.endswith(".ckpt.json"):
            raise ValueError(f"a checkpoint file ends with .ckpt.json, got {self.path.name!r}")
        if self.every_minutes < 0 or self.every_steps < 0:
            raise ValueError("checkpoint intervals must be >= 0")
        if self.stop_at is not None and self.stop_at < 1:
            raise ValueError(f"stop_at must be >= 1, got {self.stop_at!r}")

    def due(self, step: int, last_step: int, seconds_since: float) -> bool:
        if self.stop_at is not None and step == self.stop_at:
            return True
        if self.every_steps and step % self.every_steps == 0:
            return True
        return bool(self.every_minutes) and step > last_step and seconds_since >= 60 * self.every_minutes


def checkpoint_path(weights: str | Path) -> Path:
    """The checkpoint JSON of a run writing ``weights`` (``x.safetensors`` -> ``x.ckpt.json``)."""
    w = Path(weights)
    stem = w.name.removesuffix(".safetensors")
    return w.with_name(stem + ".ckpt.json")


def data_fingerprint(*banks) -> str:
    """A hash of the crop banks a run trains on (their crops and labels), so that a resume on
    other data is refused rather than silently mixed."""
    h = hashlib.sha256()
    for bank in banks:
        if bank is None:
            h.update(b"none")
            continue
        crops = np.ascontiguousarray(bank.crops)
        h.update(repr((crops.shape, str(crops.dtype))).encode())
        flat = crops.reshape(-1).view(np.uint8)
        for i in range(0, len(flat), 1 << 26):
            h.update(flat[i: i + (1 << 26)])
        h.update(bank.meta.reset_index(drop=True).to_csv(index=False).encode())
    return h.hexdigest()


def _python_random_state() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _set_python_random_state(state: list) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def _numpy_global_state() -> list:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def _set_numpy_global_state(state: list) -> None:
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_checkpoint(ck: Checkpointing, *, step: int, cfg: dict, fingerprint: str, net: torch.nn.Module,
                    opt: torch.optim.Optimizer, gen: torch.Generator, sampler_rng: np.random.Generator,
                    clean_score: np.ndarray, average: Any, history: list, acc: dict,
                    seconds: float) -> Path:
    """Write the pair for ``step`` (tensors first, then the JSON naming them); returns the JSON."""
    from safetensors.torch import save_file

    from collapseguard.io.atomic import replaced_when_done

    tensors: dict[str, torch.Tensor] = {}
    for k, v in net.state_dict().items():
        tensors[f"net.{k}"] = v.detach().cpu().contiguous()
    sd = opt.state_dict()
    for idx, state in sd["state"].items():
        for k, v in state.items():
            if not torch.is_tensor(v):
                raise CheckpointError(f"optimiser state {k!r} is not a tensor")
            tensors[f"opt.{idx}.{k}"] = v.detach().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.augment"] = gen.get_state()
    tensors["sampler.clean_score"] = torch.from_numpy(np.ascontiguousarray(clean_score, dtype=np.float32))
    for k, v in average.mean.items():
        tensors[f"average.{k}"] = v.contiguous()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    ck.path.parent.mkdir(parents=True, exist_ok=True)
    base = ck.path.name[: -len(".ckpt.json")]
    tname = f"{base}.ckpt-{step:09d}.safetensors"
    with replaced_when_done(ck.path.with_name(tname), suffix=".tmp") as tmp:
        save_file(tensors, tmp)
    digest = hashlib.sha256(ck.path.with_name(tname).read_bytes()).hexdigest()
    doc = {
        "format": FORMAT, "version": VERSION, "step": step, "tensors": tname, "tensors_sha256": digest,
        "config": cfg, "data_fingerprint": fingerprint,
        "rng": {"sampler": sampler_rng.bit_generator.state, "python": _python_random_state(),
                "numpy_global": _numpy_global_state()},
        "optimizer": {"param_groups": groups, "state_keys": {str(i): sorted(s) for i, s in sd["state"].items()}},
        "average_n": average.n, "history": history, "acc": acc, "seconds": seconds,
    }
    with replaced_when_done(ck.path, suffix=".tmp") as tmp:
        Path(tmp).write_text(json.dumps(doc))
    for old in ck.path.parent.glob(f"{base}.ckpt-*.safetensors"):
        if old.name != tname and _TENSORS_NAME.match(old.name):
            old.unlink(missing_ok=True)
    return ck.path


def resumed_from(ck: Checkpointing | None) -> tuple[int, float]:
    """``(step, seconds of training)`` of the checkpoint a run resumes, ``(0, 0.0)`` when it
    starts afresh: what a resumed run's summary adds to its own time. A checkpoint that cannot be
    read counts as none here (``load_checkpoint`` refuses it when the run resumes)."""
    if ck is None or not ck.resume:
        return 0, 0.0
    try:
        doc = json.loads(Path(ck.path).read_text())
        step, seconds = int(doc["step"]), float(doc["seconds"])
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return 0, 0.0
    return step, seconds


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint JSON and its tensors files (once the run's weights are written)."""
    path = Path(path)
    base = path.name[: -len(".ckpt.json")]
    for f in path.parent.glob(f"{base}.ckpt-*.safetensors"):
        if _TENSORS_NAME.match(f.name):
            f.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The checkpoint's JSON and tensors, checked to belong together."""
    from safetensors.torch import load as load_bytes

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint to resume: {path} does not exist")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a checkpoint ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a {FORMAT} version {VERSION} file")
    missing = [k for k in ("step", "config", "data_fingerprint", "rng", "optimizer", "average_n", "history",
                           "acc", "seconds") if k not in doc]
    if missing:
        raise CheckpointError(f"{path}: not a whole checkpoint (no {', '.join(missing)})")
    tname = doc.get("tensors")
    if not isinstance(tname, str) or not _TENSORS_NAME.match(tname):
        raise CheckpointError(f"{path}: names no tensors file in its own folder ({tname!r})")
    tpath = path.with_name(tname)
    if not tpath.is_file():
        raise CheckpointError(f"{path}: its tensors file {tpath} is missing")
    data = tpath.read_bytes()
    if hashlib.sha256(data).hexdigest() != doc.get("tensors_sha256"):
        raise CheckpointError(f"{tpath} does not match {path} (sha256 differs): not the pair it names")
    return doc, load_bytes(data)


def _net_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The network's own tensors of a checkpoint (saved under ``net.``), by their module names."""
    return {k[4:]: v for k, v in tensors.items() if k.startswith("net.")}


def snapshot_weights(path: Path, out: Path) -> tuple[int, int]:
    """Write the network of the checkpoint ``path`` (a ``.ckpt.json``) as a cnn weights file
    ``out``, readable by ``cnn:OUT`` like a finished run's weights: a look at a long run part-way
    (judge it, calibrate it) that leaves the run itself untouched. The weights are the run's last
    ones at that step, not the weight average ``--average-from`` returns at the end. Returns
    ``(step, iterations)``; the file's metadata names both (``checkpoint_step``, ``iterations``)."""
    from collapseguard.detectors.cnn_model import DegradationNet, NetConfig, save_net

    doc, tensors = load_checkpoint(path)
    net_cfg = doc["config"].get("net") if isinstance(doc["config"], dict) else None
    if not isinstance(net_cfg, dict):
        raise CheckpointError(f"{path}: its config names no network")
    step, iterations = doc["step"], doc["config"].get("iterations")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (step, iterations)):
        raise CheckpointError(f"{path}: its step and iterations must be whole numbers, got {step!r}, {iterations!r}")
    try:
        net = DegradationNet(NetConfig.from_dict(net_cfg))
        net.load_state_dict(_net_state(tensors), strict=True)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: tensors that do not fit
        raise CheckpointError(f"{path}: its network cannot be rebuilt ({exc})") from None
    save_net(net.eval(), out, metadata={"checkpoint_step": str(step), "iterations": str(iterations)})
    return step, iterations


def _with_defaults(saved: dict, cfg: dict, defaults: dict) -> dict:
    """``saved`` with each setting it does not name (one newer than the checkpoint, at any depth:
    a network option sits in ``net``) filled in where ``cfg`` has it at its default value."""
    out = dict(saved)
    for k, v in defaults.items():
        if k not in out:
            if cfg.get(k) == v:
                out[k] = v
        elif isinstance(v, dict) and isinstance(out[k], dict) and isinstance(cfg.get(k), dict):
            out[k] = _with_defaults(out[k], cfg[k], v)
    return out


def restore(doc: dict, tensors: dict[str, torch.Tensor], *, cfg: dict, fingerprint: str,
            net: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
            sampler_rng: np.random.Generator, clean_score: np.ndarray, average: Any,
            defaults: dict | None = None) -> dict:
    """Put a loaded checkpoint's state into a freshly built run; returns the JSON's log fields
    (step, history, acc, seconds). Refuses a checkpoint of other settings or other data; a
    setting the checkpoint does not name (added to the code since) passes when it is at its
    value in ``defaults``."""
    saved = _with_defaults(doc["config"], cfg, defaults or {})
    if saved != cfg:
        diff = sorted(k for k in set(cfg) | set(saved) if cfg.get(k) != saved.get(k))
        raise CheckpointError(f"the checkpoint was made with other settings ({', '.join(diff)}): "
                              "resume with the options of the run that made it")
    if doc["data_fingerprint"] != fingerprint:
        raise CheckpointError("the checkpoint was made on other training data (the crop banks differ): "
                              "resume with the same --chains, --clean, --teacher, --images and bank options")
    net.load_state_dict(_net_state(tensors), strict=True)
    state: dict[int, dict] = {}
    for idx, keys in doc["optimizer"]["state_keys"].items():
        state[int(idx)] = {k: tensors[f"opt.{idx}.{k}"] for k in keys}
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()}
              for g in doc["optimizer"]["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(tensors["rng.torch"])
    gen.set_state(tensors["rng.augment"])
    sampler_rng.bit_generator.state = doc["rng"]["sampler"]
    _set_python_random_state(doc["rng"]["python"])
    _set_numpy_global_state(doc["rng"]["numpy_global"])
    score = tensors["sampler.clean_score"].numpy()
    if score.shape != clean_score.shape:
        raise CheckpointError("the checkpoint's clean-image count differs from this run's")
    clean_score[:] = score
    average.n = int(doc["average_n"])
    average.mean = {k[len("average."):]: v for k, v in tensors.items() if k.startswith("average.")}
    return {k: doc[k] for k in ("step", "history", "acc", "seconds")}
