"""Held-out metrics for a trained detector: AUROC of clean vs step k per family, and the clean
false-positive rate at the threshold that drops a given share of step-10 images."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from collapseguard.detectors.base import Detector
from collapseguard.evaluation.metrics import auroc
from collapseguard.images import DecodeError, load_image

EVAL_STEPS = (1, 2, 3, 5, 10, 20)


def _load_named(path) -> np.ndarray:
    """``load_image``, with the file named in the error: one bad image in thousands is hard to find."""
    try:
        return load_image(path)
    except DecodeError as exc:
        raise DecodeError(f"{path}: {exc}") from None


def score_paths(detector: Detector, paths: Sequence[str], batch: int = 16,
                progress: Callable[[int, int], None] | None = None,
                transform: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Score image files with ``detector`` (files are decoded at native resolution; ``transform``,
    e.g. a JPEG re-encoding, is applied to each decoded image first)."""
    out = np.empty(len(paths), dtype=np.float32)
    for s in range(0, len(paths), batch):
        chunk = paths[s : s + batch]
        imgs = [_load_named(p) for p in chunk]
        if transform is not None:
            imgs = [transform(im) for im in imgs]
        out[s : s + len(chunk)] = detector.score(imgs)
        if progress:
            progress(s + len(chunk), len(paths))
    return out


def score_images(detector: Detector, images: Iterable[np.ndarray], batch: int = 16) -> np.ndarray:
    out, buf = [], []
    for img in images:
        buf.append(img)
        if len(buf) == batch:
            out.append(detector.score(buf))
            buf = []
    if buf:
        out.append(detector.score(buf))
    return np.concatenate(out) if out else np.zeros(0, np.float32)



def chain_auroc_table(scored: pd.DataFrame, steps: Sequence[int] = EVAL_STEPS) -> pd.DataFrame:
    """AUROC(step 0 vs step k) per family and for all families together ("ALL").

    ``scored`` is a manifest with a ``score`` column. Rows: family; columns: ``n_chains`` and
    ``auroc_0v{k}`` for every k present.
    """
    rows = []
    groups = [(f, g) for f, g in scored.groupby("family", sort=True)] + [("ALL", scored)]
    for fam, g in groups:
        rec = {"family": fam, "n_chains": int(g["chain_id"].nunique())}
        neg = g.loc[g["step"] == 0, "score"].to_numpy()
        for k in steps:
            pos = g.loc[g["step"] == k, "score"].to_numpy()
            if len(pos):
                rec[f"auroc_0v{k}"] = auroc(neg, pos)
        rows.append(rec)
    return pd.DataFrame(rows).set_index("family")


def clean_false_positive_rate(clean: np.ndarray, degraded: np.ndarray, drop: float = 0.95) -> tuple[float, float]:
    """(threshold, share of clean scores above it) where the threshold drops ``drop`` of
    ``degraded`` (the (1 - drop) quantile of the degraded scores)."""
    degraded = np.asarray(degraded, float)
    if len(degraded) == 0 or len(clean) == 0:
        return float("nan"), float("nan")
    thr = float(np.quantile(degraded, 1.0 - drop))
    return thr, float(np.mean(np.asarray(clean, float) > thr))
