"""One-time conversion of a RALI checkpoint folder to pickle-free files.

    python -m collapseguard.detectors.rali_convert CKPT_DIR [--out OUT_DIR]

Reads (and therefore unpickles — run it only on files you trust) ``pca.pkl`` and ``ckpt.pt`` and
writes ``pca.npz``, ``head.safetensors`` and ``rali.json`` (plus ``best/model.safetensors`` when the
CLIP model only had a ``pytorch_model.bin``). Afterwards ``rali:CKPT_DIR`` (or ``rali:OUT_DIR``)
loads without ``trust_pickle``. By default the files are written next to the originals.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from collapseguard.detectors.base import DetectorError
from collapseguard.detectors.rali import (
    CONVERTED_MARKER,
    load_basis,
    load_head,
    load_pca,
)
from collapseguard.io.atomic import replaced_when_done

FORMAT = "collapseguard-rali-v1"


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_savez(path: Path, **arrays) -> None:
    with replaced_when_done(path, suffix=".npz.tmp") as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)


def convert(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """Convert ``ckpt_dir`` (published RALI layout) to pickle-free files in ``out_dir``.

    Unpickles ``pca.pkl`` and loads ``ckpt.pt``: call it only on files you trust. Returns the
    output folder. Idempotent: re-running overwrites the converted files with the same content.
    """
    src = Path(ckpt_dir).expanduser()
    if not src.is_dir():
        raise DetectorError(f"RALI checkpoint folder not found: {ckpt_dir}")
    out = Path(out_dir).expanduser() if out_dir is not None else src
    out.mkdir(parents=True, exist_ok=True)
    best_src, best_out = src / "best", out / "best"
    if not (best_src / "config.json").is_file():
        raise DetectorError(f"{src}: best/config.json (the CLIP model) not found")

    pca = load_pca(src, trust_pickle=True)
    basis = load_basis(src)  # validates before anything is written
    tensors, scalars = load_head(src, trust_pickle=True)

    # CLIP model: keep safetensors as they are; re-save a .bin-only model as safetensors.
    if any(best_src.glob("*.safetensors")):
        if best_out != best_src:
            shutil.copytree(best_src, best_out, dirs_exist_ok=True)
    else:
        from transformers import CLIPModel

        model = CLIPModel.from_pretrained(str(best_src), local_files_only=True, use_safetensors=False)
        model.save_pretrained(str(best_out), safe_serialization=True)
        if best_out != best_src:
            for p in best_src.iterdir():
                if p.is_file() and p.suffix == ".json" and not (best_out / p.name).exists():
                    shutil.copy2(p, best_out / p.name)

    _atomic_savez(out / "pca.npz", mean=pca["mean"], components=pca["components"],
                  explained_variance=pca["explained_variance"])
    if out != src:
        _atomic_savez(out / "basis.npz", **{k: v for k, v in basis.items()})
    if tensors:
        from safetensors.torch import save_file

        with replaced_when_done(out / "head.safetensors", suffix=".safetensors.tmp") as tmp:
            save_file(tensors, tmp, metadata={"format": FORMAT})  # the umask's mode, not 0600
    sources = {n: _sha(src / n) for n in ("pca.pkl", "ckpt.pt", "basis.npz") if (src / n).is_file()}
    meta = {"format": FORMAT, "scalars": scalars, "converted_from": sources}
    (out / CONVERTED_MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m collapseguard.detectors.rali_convert",
        description="Convert a RALI checkpoint (pca.pkl, ckpt.pt) to pickle-free files. "
        "This unpickles the files once: run it only on a checkpoint you trust.",
    )
    ap.add_argument("ckpt_dir")
    ap.add_argument("--out", default=None, help="output folder (default: next to the originals)")
    args = ap.parse_args(argv)
    try:
        out = convert(args.ckpt_dir, args.out)
    except DetectorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"converted {args.ckpt_dir} -> {out} (pca.npz, rali.json"
          f"{', head.safetensors' if (out / 'head.safetensors').is_file() else ''}); "
          f"load it with rali:{out} (no --trust-pickle needed)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
