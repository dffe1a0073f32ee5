"""Shards made from real photos: one replication chain (a real replicator) split across three
shards, a clean photo beside a recompressed and resized copy of it, and unrelated photos; and
the same chain with an unrelated photo as rows of Parquet files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from cg_testutil import add_member
from PIL import Image

from collapseguard.images import encode_jpeg, encode_png

CHAIN_STEPS = (0, 1, 3, 5, 10)
FAMILY = "noise_tint"


def _resized(img, scale):
    h, w = img.shape[:2]
    return np.asarray(Image.fromarray(img).resize((round(w * scale), round(h * scale)), Image.LANCZOS))


def write_shard(path: Path, samples) -> None:
    import tarfile
    with tarfile.open(path, "w") as tf:
        for key, name, data in samples:
            add_member(tf, f"{key}.{name}", data)
            add_member(tf, f"{key}.txt", f"caption of {key}".encode())


@pytest.fixture(scope="session")
def chain_steps(photos) -> dict:
    """Step -> image of one replication chain of ``photos[0]`` (a real replicator)."""
    from collapseguard.training_data_tools.chains import run_chain

    _, steps = run_chain(photos[0], FAMILY, steps=max(CHAIN_STEPS), keep=CHAIN_STEPS, seed=5)
    return {k: img for k, img, _ in steps}


@pytest.fixture(scope="session")
def dedup_shards(tmp_path_factory, photos, chain_steps):
    root = tmp_path_factory.mktemp("dedup_shards")
    chain = chain_steps
    clean = photos[1]
    a = [("chain_s10", "png", encode_png(chain[10])), ("chain_s1", "png", encode_png(chain[1])),
         ("other_a", "jpg", encode_jpeg(photos[2], 90))]
    b = [("chain_s5", "png", encode_png(chain[5])), ("chain_s0", "jpg", encode_jpeg(chain[0], 90)),
         ("clean_png", "png", encode_png(clean))]
    c = [("chain_s3", "png", encode_png(chain[3])),
         ("clean_copy", "jpg", encode_jpeg(_resized(clean, 0.75), 75)),
         ("other_b", "jpg", encode_jpeg(photos[3], 90))]
    paths = []
    for name, samples in (("a", a), ("b", b), ("c", c)):
        p = root / f"shard-{name}.tar"
        write_shard(p, samples)
        paths.append(p)
    return paths


def png_bytes(img) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


#: the rows of the Parquet files: (key, step of the chain or None for the unrelated photo)
PARQUET_ROWS = (("chain_s10", 10), ("other", None), ("chain_s1", 1), ("chain_s5", 5),
                ("chain_s0", 0), ("chain_s3", 3))


def _parquet_images(photos, chain_steps) -> list[tuple[str, bytes]]:
    """Encoded as in the shards: the re-renderings as PNG, the clean step and the photo as JPEG."""
    out = []
    for key, step in PARQUET_ROWS:
        if step is None:
            out.append((key, encode_jpeg(photos[2], 90)))
        elif step == 0:
            out.append((key, encode_jpeg(chain_steps[0], 90)))
        else:
            out.append((key, encode_png(chain_steps[step])))
    return out


@pytest.fixture(scope="session")
def parquet_rows() -> tuple:
    """``PARQUET_ROWS``: the Parquet files' rows in order, (key, chain step or None)."""
    return PARQUET_ROWS


@pytest.fixture(scope="session")
def dedup_parquets(tmp_path_factory, photos, chain_steps) -> dict[str, Path]:
    """The chain's steps and an unrelated photo, shuffled, as rows of two Parquet files: one
    written by pyarrow (``key``, ``jpg`` bytes, ``caption``; row groups of 2) and one written by
    ``datasets`` (an ``Image`` feature; rows keyed by their index)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("dedup_parquet")
    images = _parquet_images(photos, chain_steps)
    arrow = root / "chain-arrow.parquet"
    pq.write_table(pa.table({"key": [k for k, _ in images],
                             "jpg": pa.array([b for _, b in images], pa.binary()),
                             "caption": [f"caption of {k}" for k, _ in images]}),
                   arrow, row_group_size=2)
    hf = root / "chain-hf.parquet"
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": f"{k}.img"} for k, b in images],
                                     "caption": [f"caption of {k}" for k, _ in images]})
    ds.cast_column("image", datasets.Image()).to_parquet(str(hf))
    return {"pyarrow": arrow, "datasets": hf}
