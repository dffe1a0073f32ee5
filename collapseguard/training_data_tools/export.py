"""Export chains as WebDataset shards.

Each kept image becomes one sample: its image file's bytes copied unchanged (never re-encoded)
under its own extension, plus a ``.json`` with ``chain_id, source_image, family, task, step``
and any other manifest columns (``params`` is decoded back into an object). Keys are
``<chain>__s<step>`` with unsafe characters replaced (and a short hash of the chain id when it
holds characters other than letters, digits, ``-``, ``_``, ``/``), so they never contain dots or slashes.
Shards are written to a temporary name and renamed when complete.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.training_data_tools.loaders import load_chains


def sample_key(chain_id: str, step: int) -> str:
    """A WebDataset-safe key: letters, digits, ``-`` and ``_`` only.

    A chain id with other characters than those and ``/`` (``flux2/猫``, ``a b``) also gets a
    short hash of itself, so ids that differ only in such characters keep apart.
    """
    cid = str(chain_id)
    key = re.sub(r"[^A-Za-z0-9_-]+", "_", cid)
    if re.search(r"[^A-Za-z0-9_/-]", cid):
        key += "-" + hashlib.sha256(cid.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{key}__s{int(step):04d}"


def _meta(row: pd.Series) -> dict:
    out = {}
    for k, v in row.items():
        if k == "path":
            continue
        if isinstance(v, (np.integer,)):
            v = int(v)
        elif isinstance(v, (np.floating, float)):
            if math.isnan(v):
                continue
            v = float(v)
        if k == "params" and isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                pass
        out[k] = v
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


#: what a shard file name prefix may hold (it names files in ``out_dir``)
PREFIX_RULE = re.compile(r"[A-Za-z0-9_-]+")


def export_shards(chains: str | Path | pd.DataFrame, out_dir: str | Path, maxcount: int = 1000,
                  prefix: str = "chains", shuffle_seed: int | None = None,
                  notes: list[str] | None = None) -> list[Path]:
    """Write chains (a manifest DataFrame or anything ``load_chains`` reads) as ``.tar`` shards.

    ``shuffle_seed`` shuffles samples across shards (seeded); by default they stay in chain/step
    order. ``notes``: as ``load_chains``'s. Returns the shard paths.
    """
    df = chains if isinstance(chains, pd.DataFrame) else load_chains(chains, notes=notes)
    if maxcount < 1:
        raise ValueError("maxcount must be >= 1")
    if not PREFIX_RULE.fullmatch(prefix):
        raise ValueError(f"shard prefix must be letters, digits, - or _: {prefix!r}")
    df = df.sort_values(["chain_id", "step"], kind="stable").reset_index(drop=True)
    if shuffle_seed is not None:
        df = df.iloc[np.random.default_rng(shuffle_seed).permutation(len(df))].reset_index(drop=True)
    keys = [sample_key(c, s) for c, s in zip(df["chain_id"], df["step"])]
    if len(set(keys)) != len(keys):
        raise ValueError("two chains map to the same sample key; rename chains to differ in "
                         "letters or digits")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    old = sorted(p.name for p in out_dir.glob(f"{prefix}-*.tar"))
    if old:  # a second export beside a first one would leave its extra shards: samples twice
        raise ValueError(f"{out_dir} already holds {len(old)} {prefix}-*.tar shard(s) (e.g. {old[0]}); "
                         "export into an empty folder or use another --prefix")
    n_shards = max(1, math.ceil(len(df) / maxcount))
    width = max(6, len(str(n_shards - 1)))
    paths = []
    for i in range(n_shards):
        part = df.iloc[i * maxcount:(i + 1) * maxcount]
        final = out_dir / f"{prefix}-{i:0{width}d}.tar"
        tmp = final.with_name(final.name + ".tmp")
        with tarfile.open(tmp, "w") as tar:
            for key, (_, row) in zip(keys[i * maxcount:(i + 1) * maxcount], part.iterrows()):
                path = Path(row["path"])
                ext = path.suffix.lower().lstrip(".") or "png"
                ext = "jpg" if ext == "jpeg" else ext
                _add(tar, f"{key}.{ext}", path.read_bytes())
                _add(tar, f"{key}.json", json.dumps(_meta(row), sort_keys=True).encode())
        tmp.replace(final)
        paths.append(final)
    return paths
