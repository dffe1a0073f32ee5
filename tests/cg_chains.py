"""Tiny chains and clean folders for training tests (and benchmarks/fingerprint.py): smooth
generated pictures and a stand-in replicator whose noise grows with the step."""

from __future__ import annotations

import numpy as np
import pandas as pd
from PIL import Image

from collapseguard.training_data_tools.manifest import write_manifest


def smooth_art(rng: np.random.Generator, h: int = 72, w: int = 88) -> np.ndarray:
    """A smooth gradient with a flat disc: the look of a clean render."""
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    c = rng.uniform(0, 1, (3, 3))
    img = np.stack([c[i, 0] * yy + c[i, 1] * xx + c[i, 2] * 0.5 for i in range(3)], axis=2)
    cy, cx, r = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w, rng.uniform(0.15, 0.3) * h
    disc = (np.mgrid[0:h, 0:w][0] - cy) ** 2 + (np.mgrid[0:h, 0:w][1] - cx) ** 2 < r * r
    img[disc] = rng.uniform(0, 1, 3)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def trivial_degrade(img: np.ndarray, step: int, rng: np.random.Generator) -> np.ndarray:
    """Noise that grows with the step: a stand-in replicator for tests."""
    noise = rng.standard_normal(img.shape) * 3.0 * step
    return np.clip(img.astype(float) + noise, 0, 255).astype(np.uint8)


def make_tiny_chains(root, n_sources: int = 10, steps=(0, 1, 3, 5, 10), families=("noise", "grain2")):
    rng = np.random.default_rng(0)
    rows = []
    for s in range(n_sources):
        src = smooth_art(rng)
        for fam in families:
            cid = f"{fam}-{s}"
            for k in steps:
                img = trivial_degrade(src, k if fam == "noise" else 2 * k, rng)
                p = root / fam / f"{cid}_{k}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(img).save(p)
                rows.append({"chain_id": cid, "source_image": f"src{s}", "family": fam,
                             "task": "t", "step": k, "path": str(p)})
    write_manifest(pd.DataFrame(rows), root / "manifest.csv")
    return root


def make_clean_dir(folder, n: int = 4, seed: int = 5, prefix: str = "photo"):
    """A folder of ``n`` smooth-art PNGs (80 x 96), as a --clean folder."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(smooth_art(rng, 80, 96)).save(folder / f"{prefix}{i}.png")
    return folder


def held_out_chains(tmp_path, name="chains"):
    """Tiny chains with one held-out source (src22 of 30, salt "cnn") and that source's rows."""
    from collapseguard.training.run import split_chains
    from collapseguard.training_data_tools.manifest import read_manifest

    chains = make_tiny_chains(tmp_path / name, n_sources=30)
    _, test_df = split_chains(read_manifest(chains))
    assert sorted(set(test_df["source_image"])) == ["src22"], "the fixture needs src22 held out"
    return chains, test_df
