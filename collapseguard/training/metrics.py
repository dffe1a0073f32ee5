"""Held-out metrics for a trained detector: AUROC of clean vs step k per family, and the clean
false-positive rate at the threshold that drops a given share of step-10 images."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.detectors.base import Detector
from collapseguard.evaluation.metrics import auroc
from collapseguard.images import DecodeError
from collapseguard.io.terminal import first_of
from collapseguard.scoring.records import score_records

EVAL_STEPS = (1, 2, 3, 5, 10, 20)


def score_paths(detector: Detector, paths: Sequence[str], batch: int = 16,
                progress: Callable[[int, int], None] | None = None,
                transform: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Score image files with ``detector`` through the one scoring loop (files decoded at native
    resolution; ``transform``, e.g. a JPEG re-encoding, is applied to each decoded image first).

    Held-out metrics need every image: a file that cannot be read or decoded raises
    :class:`DecodeError` naming each such file and why, once all were tried. A NaN score stays NaN.
    """
    out = np.full(len(paths), np.nan, dtype=np.float32)
    bad: list[str] = []

    def members(i):
        try:
            return [(str(paths[i]), Path(paths[i]).read_bytes())]
        except OSError as exc:
            bad.append(f"{paths[i]}: {exc.strerror or exc}")
            return []

    for i, res in score_records(range(len(paths)), detector, members_of=members, batch_size=batch,
                                images_only=False, transform=transform):
        if res.status == "decode_error":
            bad.append(res.error)
        elif res.status == "ok":
            out[i] = res.score
        if progress and ((i + 1) % batch == 0 or i + 1 == len(paths)):
            progress(i + 1, len(paths))
    if bad:
        raise DecodeError(first_of(bad))
    return out


def score_images(detector: Detector, images: Iterable[np.ndarray], batch: int = 16) -> np.ndarray:
    """Score decoded images with ``detector`` through the one scoring loop (NaN where it cannot)."""
    scored = score_records(((i, img) for i, img in enumerate(images)), detector,
                           members_of=lambda r: [(f"image {r[0]}", r[1])], batch_size=batch,
                           images_only=False)
    return np.array([res.score for _, res in scored], dtype=np.float32)


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
