"""Distillation: train the fast ``cnn`` on a slow judge's labels.

The teacher (any detector: ``vlm:...``, ``rali:...``, ``nss``, ``pyiqa:...``) labels the images
once through ``scoring.label_cache`` (cached and resumable). Its scores become soft targets: the
classification target of an image is its percentile among the teacher's scores, and every pair of
images gets the target probability ``sigmoid((t_j - t_i) / scale)`` (scale = a quarter of the
teacher's score spread), so the student learns the teacher's ranking. Images are split 80 / 20 by
a hash of their file name; the summary reports the student's Spearman correlation with the teacher on
the held-out 20%. ``run_distillation`` trains on the teacher's labels alone;
``training.run.run_training`` takes a teacher beside chains and clean images (the whole chain
recipe, its held-out evaluation and its checkpoints, plus the teacher's ranking as one more term).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata, spearmanr

from collapseguard.detectors.base import Detector
from collapseguard.images import DecodeError, load_image
from collapseguard.training.bank import CropBank, image_bank
from collapseguard.training.card import render_distill_card, write_summary
from collapseguard.training.loop import TrainConfig, train_net
from collapseguard.training.negatives import list_images
from collapseguard.training_data_tools.manifest import source_bucket


def teacher_labels(teacher: Detector, paths: Sequence[str | Path], cache_path: str | Path) -> pd.DataFrame:
    """``path, score`` for every image the teacher could score (cached in ``cache_path``)."""
    from collapseguard.scoring.label_cache import label_images

    df = label_images(teacher, [str(p) for p in paths], cache_path)
    ok = df[df["status"] == "ok"][["path", "score"]].reset_index(drop=True)
    if len(ok) < 4:
        raise ValueError(f"the teacher scored only {len(ok)} of {len(df)} images; need at least 4")
    return ok


def soft_targets(scores: np.ndarray) -> np.ndarray:
    """Percentile of each score among all of them, in (0, 1) (ties share a rank)."""
    r = rankdata(scores)
    return ((r - 0.5) / len(r)).astype(np.float32)


def teacher_bank(labels: pd.DataFrame, size: int, per_image: int, seed: int) -> CropBank:
    """Crop bank of teacher-labelled images: ``target`` = soft target, ``teacher_score`` kept."""
    bank = image_bank(((p, load_image(p)) for p in labels["path"]), size, per_image, seed,
                      kind="teacher")
    bank.meta["target"] = soft_targets(labels["score"].to_numpy(float))
    bank.meta["teacher_score"] = labels["score"].to_numpy(float)
    return bank


def heldout_mask(paths: Sequence[str | Path], holdout: float) -> np.ndarray:
    """Which labelled images distillation holds out: whole pictures, so that no held-out image
    has a copy or a re-rendering among the training ones. Images ``dedup`` would group (the steps
    of a chain, a photo and its re-saves) are one picture, held out together, by a stable hash
    of its first image's folder and file name (a chain folder's ``step_000.png`` names nothing on
    its own); any other image by a stable hash of its file name, as ``negatives.split_clean``
    splits, so the split does not move when the folder does. An image that cannot be read, or
    that ``dedup`` cannot group (a flat picture), is split by its file name alone."""
    from collapseguard.dedup.groups import group_ids
    from collapseguard.detectors.fingerprint import fingerprint_arrays

    names = [f"{Path(p).parent.name}/{Path(p).name}" for p in paths]
    prints, rows = [], []  # the windows too: crops group as dedup groups them
    for i, p in enumerate(paths):
        try:
            prints.append(fingerprint_arrays([load_image(p)]))  # one image held at a time
        except (OSError, DecodeError):
            continue
        rows.append(i)
    labels = np.full(len(names), -1, np.int64)
    if rows:
        hashes, thumbs, whashes, wthumbs = (np.concatenate(a) for a in zip(*prints))
        labels[rows] = group_ids(hashes, thumbs, window_hashes=whashes, window_thumbs=wthumbs)[0]
    first: dict[int, str] = {}
    for i in np.argsort(names, kind="stable"):
        if labels[i] >= 0:
            first.setdefault(int(labels[i]), names[i])
    keys = [first[int(g)] if g >= 0 else Path(p).name for p, g in zip(paths, labels)]
    return np.array([source_bucket(k, "distill") < holdout for k in keys], dtype=bool)


def teacher_files(image_paths: Sequence[str | Path], leave_out: Sequence[str | Path] = (),
                  log: Callable[[str], None] = print) -> tuple[list[Path], int]:
    """The files of ``image_paths`` the teacher labels, and how many files were given: each once
    (by resolved path, then by content), without the ``leave_out`` files or byte-identical copies
    of them (a chain run's held-out images: a student that learned the teacher's ranking of them
    would flatter its held-out figures). Each file is read once. Raises ValueError when nothing is
    left."""
    from collapseguard.training.negatives import file_digest

    given = list(dict.fromkeys(Path(p).resolve() for p in list_images(image_paths)))
    if not given:
        raise ValueError("no images given to label")
    skip = {Path(p).resolve() for p in leave_out}
    skip_bytes = {file_digest(p) for p in skip if p.is_file()}
    kept: list[Path] = []
    seen: set[str] = set()
    left = same = 0
    for p in given:
        digest = file_digest(p)
        if p in skip or digest in skip_bytes:
            left += 1
        elif digest in seen:
            same += 1
        else:
            seen.add(digest)
            kept.append(p)
    if left:
        log(f"left out {left} --images files that are (or copy) held-out chain or "
            "clean images, or images of an excluded family")
    if same:
        log(f"{same} --images files are byte-identical to another and are labelled once")
    if not kept:
        raise ValueError(f"all {len(given)} --images files are held-out chain or clean images (or copies of "
                         "them): nothing is left for the teacher to label")
    return kept, len(given)


def teacher_side(teacher: Detector, paths: Sequence[Path], cfg: TrainConfig, cache_path: str | Path,
                 crops_per_bank_image: int, holdout: float = 0.2, log: Callable[[str], None] = print
                 ) -> tuple[CropBank, float, pd.DataFrame, pd.DataFrame]:
    """Label ``paths`` (``teacher_files``) with the teacher and build the student's teacher bank:
    ``(bank, pair scale, training labels, held-out labels)``."""
    log(f"labelling {len(paths)} images with {teacher.name}@{teacher.version} (cache {cache_path})")
    labels = teacher_labels(teacher, paths, cache_path)
    held = heldout_mask(labels["path"], holdout)
    train_l, test_l = labels[~held].reset_index(drop=True), labels[held].reset_index(drop=True)
    if len(train_l) < 2:
        raise ValueError("too few labelled training images after the hold-out split")
    bank = teacher_bank(train_l, cfg.net.crop_size, crops_per_bank_image, cfg.seed)
    spread = float(np.subtract(*np.quantile(train_l["score"], [0.9, 0.1])))
    return bank, max(spread / 4.0, 1e-6), train_l, test_l


def agreement(weights: str | Path, test_labels: pd.DataFrame) -> float:
    """Spearman correlation of the student's scores with the teacher's on its held-out labelled
    images (NaN under 3 of them)."""
    from collapseguard.detectors.cnn import CNNDetector
    from collapseguard.training.metrics import score_paths

    if len(test_labels) < 3:
        return float("nan")
    student = score_paths(CNNDetector(weights=weights, device="cpu"), test_labels["path"].tolist())
    return float(spearmanr(student, test_labels["score"]).statistic)


def run_distillation(teacher: Detector, image_paths: Sequence[str | Path], out: str | Path, cfg: TrainConfig,
                     cache_path: str | Path | None = None, holdout: float = 0.2,
                     crops_per_bank_image: int = 16, log: Callable[[str], None] = print) -> dict:
    """Label, train the student on the teacher's labels alone, save weights to ``out``, report
    held-out agreement (``training.run.run_training`` takes a teacher beside chains)."""
    from collapseguard.detectors.cnn import weights_version
    from collapseguard.detectors.cnn_model import save_net

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cache_path = Path(cache_path) if cache_path else out.with_suffix(".labels.parquet")
    files, _ = teacher_files(image_paths, log=log)
    tb, scale, train_l, test_l = teacher_side(teacher, files, cfg, cache_path, crops_per_bank_image, holdout,
                                              log=log)
    labels_n = len(train_l) + len(test_l)
    t1 = time.time()
    net, history = train_net(None, None, cfg, log=log, teacher=tb, teacher_scale=scale)
    save_net(net, out, metadata={"teacher": f"{teacher.name}@{teacher.version}", "seed": str(cfg.seed)})
    rho = agreement(out, test_l)
    summary = {"name": "cnn", "weights_file": out.name, "version": weights_version(net, net.config.n_crops),
               "teacher": teacher.name, "teacher_version": teacher.version,
               "n_labelled": labels_n, "n_train": len(train_l), "n_heldout": len(test_l),
               "n_parameters": int(sum(p.numel() for p in net.parameters())),
               "weights_bytes": out.stat().st_size,
               "heldout_spearman_vs_teacher": rho, "config": cfg.to_dict(), "history": history,
               "seconds_labels_and_data": t1 - t0, "seconds_train": time.time() - t1}
    write_summary(summary, out.with_suffix(".json"))
    out.with_suffix(".md").write_text(render_distill_card(summary))
    # the held-out agreement is the summary's (``heldout_spearman_vs_teacher``), printed by the caller
    log(f"wrote {out}, {out.with_suffix('.json').name}, {out.with_suffix('.md').name} "
        f"({len(test_l)} held-out images)")
    return summary
