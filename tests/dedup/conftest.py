"""Shards made from real photos: one replication chain (a real replicator) split across three
shards, a clean photo beside a recompressed and resized copy of it, and unrelated photos."""

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
def dedup_shards(tmp_path_factory, photos):
    from collapseguard.training_data_tools.chains import run_chain

    root = tmp_path_factory.mktemp("dedup_shards")
    _, steps = run_chain(photos[0], FAMILY, steps=max(CHAIN_STEPS), keep=CHAIN_STEPS, seed=5)
    chain = {k: img for k, img, _ in steps}
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
