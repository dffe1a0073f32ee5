"""The built-in demo: a small WebDataset of clean photos and model-degraded copies, filtered.

Everything comes from packages every install has (scikit-image and scikit-learn ship sample
photos), so it runs offline and builds the same shards with or without extras. Degraded copies are made by running a simulated replicator
(``training_data_tools.replicators``) for a number of re-renderings, as an editing model would when
fed its own output. Each sample's json records the truth, so the demo can say how the filter did.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np

from collapseguard.images import encode_jpeg

#: the packages whose sample photos the demo uses: both core dependencies
DEMO_PACKAGES = ("skimage", "sklearn")
DEMO_FAMILIES = ("noise_tint", "scattered_dots", "contour_wrinkles", "texture_simplify", "codec")
MAX_SIDE = 640


def _fit(img: np.ndarray, max_side: int = MAX_SIDE) -> np.ndarray:
    """Centre-crop (never resize) to at most ``max_side`` pixels per side."""
    h, w = img.shape[:2]
    y, x = max(0, (h - max_side) // 2), max(0, (w - max_side) // 2)
    return img[y: y + max_side, x: x + max_side]


def demo_pairs(steps: int, rng: np.random.Generator, quiet: bool = True):
    """Yield ``(i, name, clean, degraded, family)`` for every bundled photo: the photo
    centre-cropped to ``MAX_SIDE`` and a copy re-rendered ``steps`` times by one replicator family
    (families in turn). Draws from ``rng`` in a fixed order, so a seed gives the same pairs.
    Unless ``quiet``, a bar counts the photos done."""
    from collapseguard.scoring.progress import progress_bar
    from collapseguard.training_data_tools.replicators import (
        create_replicator,
        list_families,
    )
    from collapseguard.training_data_tools.sources import bundled_photos

    families = [f for f in DEMO_FAMILIES if f in list_families()]
    photos = list(bundled_photos(min_side=256, packages=DEMO_PACKAGES))
    bar = progress_bar(len(photos), desc="demo: build shards", unit="photo", quiet=quiet)
    for i, (name, img) in enumerate(photos):
        img = _fit(img)
        fam = families[i % len(families)]
        rep = create_replicator(fam, rng)
        x = img
        for _ in range(steps):
            x = rep.step(x, rng)
        yield i, name, img, x, fam
        bar.update(1)
    bar.close()


def build_demo_shards(out_dir: str | Path, steps: int = 12, n_shards: int = 3, seed: int = 0,
                      quiet: bool = True) -> list[Path]:
    """Write ``n_shards`` shards of clean photos and degraded copies; returns the shard paths
    (a progress bar unless ``quiet``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    samples = []
    for i, name, img, x, fam in demo_pairs(steps, rng, quiet=quiet):
        samples.append((f"{i:03d}_clean", img, {"truth": "clean", "source": name}))
        samples.append((f"{i:03d}_degraded", x, {"truth": "degraded", "source": name,
                                                 "family": fam, "steps": steps}))
    order = rng.permutation(len(samples))
    paths = []
    for s in range(n_shards):
        p = out / f"demo-{s:03d}.tar"
        with tarfile.open(p, "w") as tf:
            for j in order[s::n_shards]:
                key, img, meta = samples[j]
                for ext, data in (("jpg", encode_jpeg(img, 95)),
                                  ("txt", f"a photo ({meta['source']})".encode()),
                                  ("json", json.dumps(meta).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        paths.append(p)
    return paths


def demo_truth_table(out_dir: str | Path) -> dict[str, dict[str, int]]:
    """Count decisions per truth label from a demo filter run's scores (truth is in the key)."""
    import pandas as pd
    frames = [pd.read_parquet(p) for p in sorted(Path(out_dir, "scores").glob("*.parquet"))]
    df = pd.concat(frames, ignore_index=True)
    df["truth"] = np.where(df["key"].str.endswith("_degraded"), "degraded", "clean")
    table: dict[str, dict[str, int]] = {}
    for (truth, decision), n in df.groupby(["truth", "decision"]).size().items():
        table.setdefault(truth, {})[decision] = int(n)
    return table
