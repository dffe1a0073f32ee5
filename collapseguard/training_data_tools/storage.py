"""Store a chain manifest's images several ways (PNG, JPEG at a quality and chroma subsampling, WebP),
so that every chain exists in each storage, the way datasets hold images.

``store_chains(manifest, storages, out_dir)`` decodes every image once and writes one copy per
storage under ``out_dir/<tag>/<family>/<chain_id>/step_XXX.<ext>``. Each stored copy of a chain is a
chain of its own in the written manifest: ``chain_id`` becomes ``<chain_id>~<tag>``, ``stored_from``
holds the original chain id and ``storage`` the storage's label (``"png"``, ``"jpeg q90 4:2:0"``,
``"webp q80"``: the label ``images.storage_label`` reads back from such a file's header, except that
lossy WebP does not record its quality). ``source_image`` and every other column are kept, so a
split by source keeps all storages of one picture on one side.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import re
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from collapseguard.images import load_image
from collapseguard.training_data_tools.manifest import MANIFEST_NAME, write_manifest

#: the four storages of the evaluation set: lossless, web JPEG at two qualities, web WebP
DEFAULT_STORAGES = ("png", "jpeg:90:420", "jpeg:75:420", "webp:80")

_SUBSAMPLING = {"444": (0, "4:4:4"), "422": (1, "4:2:2"), "420": (2, "4:2:0")}


@dataclass(frozen=True)
class Storage:
    """One way to store an image: ``format`` png/jpeg/webp, ``quality`` (jpeg, lossy webp),
    ``subsampling`` (jpeg: Pillow's code, 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0), ``lossless`` (webp)."""

    format: str
    quality: int | None = None
    subsampling: int | None = None
    lossless: bool = False

    @property
    def label(self) -> str:
        """What the manifest's ``storage`` column says: ``png``, ``jpeg q90 4:2:0``, ``webp q80``."""
        if self.format == "jpeg":
            sub = {v[0]: v[1] for v in _SUBSAMPLING.values()}[self.subsampling]
            return f"jpeg q{self.quality} {sub}"
        if self.format == "webp":
            return "webp lossless" if self.lossless else f"webp q{self.quality}"
        return self.format

    @property
    def tag(self) -> str:
        """A file-name-safe short name: ``png``, ``jpeg90-420``, ``webp80``, ``webp-lossless``."""
        if self.format == "jpeg":
            sub = {v[0]: k for k, v in _SUBSAMPLING.items()}[self.subsampling]
            return f"jpeg{self.quality}-{sub}"
        if self.format == "webp":
            return "webp-lossless" if self.lossless else f"webp{self.quality}"
        return self.format

    @property
    def extension(self) -> str:
        return {"jpeg": "jpg"}.get(self.format, self.format)

    def encode(self, arr: np.ndarray) -> bytes:
        """The (H, W, 3) uint8 image stored this way, as file bytes."""
        img = Image.fromarray(np.ascontiguousarray(arr, dtype=np.uint8))
        buf = io.BytesIO()
        if self.format == "png":
            img.save(buf, format="PNG", compress_level=3)
        elif self.format == "jpeg":
            img.save(buf, format="JPEG", quality=self.quality, subsampling=self.subsampling)
        elif self.lossless:
            img.save(buf, format="WEBP", lossless=True)
        else:
            img.save(buf, format="WEBP", quality=self.quality, method=4)
        return buf.getvalue()


def parse_storage(spec: str) -> Storage:
    """``png``, ``jpeg:Q`` (4:2:0, Pillow's and most cameras' default), ``jpeg:Q:420|422|444``,
    ``webp:Q`` or ``webp:lossless``; Q is 1-100. Raises ValueError naming the bad spec."""
    s = str(spec).strip().lower()
    if s == "png":
        return Storage("png")
    if s == "webp:lossless":
        return Storage("webp", lossless=True)
    m = re.fullmatch(r"(jpeg|jpg|webp):(\d{1,3})(?::(\d{3}))?", s)
    if not m or not 1 <= int(m.group(2)) <= 100 or (m.group(1) == "webp" and m.group(3)):
        raise ValueError(f"unknown storage {spec!r}; use png, jpeg:Q, jpeg:Q:420|422|444, webp:Q or "
                         "webp:lossless (Q in 1-100)")
    q = int(m.group(2))
    if m.group(1) == "webp":
        return Storage("webp", quality=q)
    sub = m.group(3) or "420"
    if sub not in _SUBSAMPLING:
        raise ValueError(f"unknown chroma subsampling {sub!r} in storage {spec!r}; use 420, 422 or 444")
    return Storage("jpeg", quality=q, subsampling=_SUBSAMPLING[sub][0])


def parse_storages(specs: str | Sequence[str]) -> list[Storage]:
    """A comma-separated list (or a sequence) of storage specs; a storage named twice is an error."""
    items = [s for s in (specs.split(",") if isinstance(specs, str) else specs) if str(s).strip()]
    out = [parse_storage(s) for s in items]
    if not out:
        raise ValueError("no storage given")
    tags = [s.tag for s in out]
    if len(set(tags)) != len(tags):
        raise ValueError(f"storage given twice: {', '.join(tags)}")
    return out


def _store_chain(job: dict) -> list[dict]:
    """Worker: every image of one chain, decoded once, written in every storage."""
    rows = []
    for row in job["rows"]:
        arr = load_image(row["path"])
        for st in job["storages"]:
            folder = Path(job["out_dir"]) / st.tag / _safe(row["family"]) / _safe(row["chain_id"])
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"step_{int(row['step']):03d}.{st.extension}"
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(st.encode(arr))
            os.replace(tmp, path)
            rows.append({**row, "chain_id": f"{row['chain_id']}~{st.tag}", "stored_from": row["chain_id"],
                         "storage": st.label, "path": str(path)})
    return rows


def _safe(name) -> str:
    """A folder name from a chain id or family (ids come from untrusted manifests); a name that had
    to be changed gets a short hash of itself, so two ids never share a folder."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip(".-")[:100] or "x"
    if s != str(name):
        s += "-" + hashlib.sha256(str(name).encode()).hexdigest()[:8]
    return s


def store_chains(manifest: pd.DataFrame, storages: Sequence[Storage | str] = DEFAULT_STORAGES,
                 out_dir: str | Path = "stored", *, workers: int = 1,
                 manifest_name: str = MANIFEST_NAME) -> pd.DataFrame:
    """Write every image of ``manifest`` (absolute paths, as ``read_manifest`` returns them) once per
    storage under ``out_dir`` and return the new manifest (also written to ``out_dir/manifest.csv``).

    A manifest that already has a ``storage`` column is refused (its chains were stored once:
    storing them again would stack two storages' losses under one label)."""
    sts = [parse_storage(s) if isinstance(s, str) else s for s in storages]
    if not sts:
        raise ValueError("no storage given")
    if len({s.tag for s in sts}) != len(sts):
        raise ValueError(f"storage given twice: {', '.join(s.tag for s in sts)}")
    if "storage" in manifest.columns:
        raise ValueError("these chains are already stored (the manifest has a 'storage' column); "
                         "store the chains they were made from")
    if len(manifest) == 0:
        raise ValueError("no chain images to store")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [{"rows": g.to_dict("records"), "storages": sts, "out_dir": str(out_dir)}
            for _, g in manifest.groupby("chain_id", sort=True)]
    rows: list[dict] = []
    if workers <= 1:
        for job in jobs:
            rows += _store_chain(job)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
            for part in ex.map(_store_chain, jobs, chunksize=4):
                rows += part
    df = pd.DataFrame(rows).sort_values(["chain_id", "step"], kind="stable").reset_index(drop=True)
    write_manifest(df, out_dir / manifest_name)
    return df
