"""One training run end to end: chains + clean folders -> weights, metrics, model card.

Steps: read the chain manifest(s); drop excluded families; split by source image (train / test);
split clean files by name (train / held-out); cut crop banks; train; save safetensors; score the
held-out chains and held-out clean images with the saved weights through the real ``cnn``
detector; write ``<out>.json`` (summary) and ``<out>.md`` (model card) next to the weights.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.detectors.base import Detector
from collapseguard.images import IMAGE_EXTENSIONS
from collapseguard.training.bank import (
    CropBank,
    cache_key,
    cached,
    chain_bank,
    image_bank,
    ladder_bank,
)
from collapseguard.training.card import write_card, write_summary
from collapseguard.training.checkpoint import Checkpointing, remove_checkpoint, resumed_from
from collapseguard.training.loop import TrainConfig, train_net
from collapseguard.training.metrics import (
    chain_auroc_table,
    clean_false_positive_rate,
    score_images,
    score_paths,
)
from collapseguard.training.negatives import (
    clean_labels,
    clean_variants,
    drop_identical,
    list_images,
    split_clean,
)
from collapseguard.training_data_tools.generic_damage import (
    damage_ladders,
    ladder_sources,
)
from collapseguard.training_data_tools.manifest import read_manifest, split_by_source

#: share of source images held out from training (by hash of the source name)
TEST_FRACTION = 0.2
SPLIT_SALT = "cnn"


def load_chains(chain_dirs: Sequence[str | Path], exclude: Sequence[str] = ()) -> pd.DataFrame:
    """Concatenate manifests (folders or files) and drop ``exclude`` families."""
    unique = list(dict.fromkeys(Path(d).resolve() for d in chain_dirs))  # --chains X --chains X
    frames = [read_manifest(d) for d in unique]
    seen: dict[str, Path] = {}
    for d, f in zip(unique, frames):  # one chain in two folders would be ranked as one chain
        for cid in dict.fromkeys(f["chain_id"].astype(str)):
            if cid in seen:
                raise ValueError(f"chain id {cid!r} is in two --chains manifests ({seen[cid]} and {d}); "
                                 "its steps would be ranked against the other chain's. A chain given "
                                 "twice: give it once. Two chains of one picture and family (made "
                                 "with two --seed values, whose ids do not hold the seed): make them "
                                 "in one `chains make` with --repeats, which numbers them")
            seen[cid] = d
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if exclude:
        unknown = set(exclude) - set(df["family"])
        if unknown:
            raise ValueError(f"--exclude-family {sorted(unknown)} not among families {sorted(set(df['family']))}")
        df = df[~df["family"].isin(exclude)].reset_index(drop=True)
    return df


def split_chains(df: pd.DataFrame, test_fraction: float = TEST_FRACTION) -> tuple[pd.DataFrame, pd.DataFrame]:
    parts = split_by_source(df, {"train": 1 - test_fraction, "test": test_fraction}, salt=SPLIT_SALT)
    return parts["train"], parts["test"]


def split_warnings(df: pd.DataFrame, test_df: pd.DataFrame, clean_dirs: Sequence, clean_train: Sequence,
                   clean_held: Sequence, evaluate: bool, held_left_out: int = 0) -> list[str]:
    """What a run's splits leave out that its user should know before an hour of training
    (``held_left_out``: held-out --clean files left out as pictures of training chain sources)."""
    out = []
    if not df.empty and int(df["step"].max()) < 3:  # bank.step_label: steps 1-2 weigh 0 there
        out.append(f"no chain has a step of 3 or more (the highest is {int(df['step'].max())}): the "
                   "clean-vs-degraded term has no degraded image, only the ranking term trains; "
                   "make chains with more steps (chains make --steps 10 --keep 0,1,2,3,5,10)")
    if not clean_dirs:
        out.append("no --clean folders: the only clean images are each chain's step 0, so the net "
                   "never sees grainy or textured clean photos and will flag many of them")
    elif not clean_train:
        out.append(f"all {len(clean_held)} --clean files fell in the held-out quarter: none is "
                   "used as a training negative; give more clean files")
    if evaluate and test_df.empty:
        out.append(f"the split by source held out no chains ({df['source_image'].nunique()} source "
                   f"images, {TEST_FRACTION:.0%} held out by name hash): the card will have no held-out "
                   "AUROC; give more source images")
    if evaluate and clean_dirs and not clean_held:
        why = (f"the {held_left_out} that fell in the held-out quarter are pictures of training chain "
               "sources, left out (--shared-clean drop)" if held_left_out
               else f"none of the {len(clean_train)} files fell in the held-out quarter")
        out.append(f"no held-out --clean file is left ({why}): the card will have no held-out clean "
                   "false-positive rate")
    return out


def sources_among_clean(chains: pd.DataFrame, clean_files: Sequence[Path]) -> list[str]:
    """Chain sources that look like one of ``clean_files`` (the last part of the source's picture
    name is the file's name without its extension, as ``sources`` names photos and folder
    images). Held-out chain sources among the clean *training* files were trained on as clean, so
    their chains' AUROC is not that of unseen sources; training chain sources among the
    *held-out* clean files make the held-out clean false-positive rate one of seen pictures."""
    from collapseguard.training_data_tools.manifest import source_group
    from collapseguard.training_data_tools.sources import picture_name

    stems = {picture_name(Path(p).stem) for p in clean_files}
    return sorted(s for s in set(chains["source_image"])
                  if source_group(s).rsplit("/", 1)[-1] in stems)


def clean_files_of_sources(chains: pd.DataFrame, clean_files: Sequence[Path]) -> list[Path]:
    """The ``clean_files`` that ``sources_among_clean`` matches to a source of ``chains``."""
    from collapseguard.training_data_tools.manifest import source_group
    from collapseguard.training_data_tools.sources import picture_name

    pictures = {source_group(s).rsplit("/", 1)[-1] for s in set(chains["source_image"])}
    return [p for p in clean_files if picture_name(Path(p).stem) in pictures]


def without_pictures_of(chains: pd.DataFrame, clean_files: Sequence[Path]) -> tuple[list[Path], int]:
    """``clean_files`` less those whose picture is a source of ``chains`` (``clean_files_of_sources``),
    and how many were left out: the ``--shared-clean drop`` rule of ``train`` and LOFO."""
    gone = set(clean_files_of_sources(chains, clean_files))
    return [p for p in clean_files if p not in gone], len(gone)


def teacher_leave_out(chain_dirs: Sequence[str | Path], exclude: Sequence[str], test_df: pd.DataFrame,
                      clean_held: Sequence[Path]) -> list[Path]:
    """What a teacher beside chains must not label: the held-out chains' images, the held-out
    clean files, and the images of excluded families (a left-out family must stay unseen)."""
    out = [Path(p) for p in test_df["path"]] + [Path(p) for p in clean_held]
    if exclude:
        every = load_chains(chain_dirs)
        out += [Path(p) for p in every.loc[every["family"].isin(set(exclude)), "path"]]
    return out


def evaluate_weights(weights: str | Path, test_chains: pd.DataFrame, clean_files: Sequence[Path],
                     seed: int = 0, clean_variants_n: int = 2, log: Callable[[str], None] = print) -> dict:
    """Held-out AUROC per family and clean false-positive rates, scored through ``CNNDetector``."""
    from collapseguard.detectors.cnn import CNNDetector

    det = CNNDetector(weights=weights, device="cpu")
    out: dict = {"heldout_auroc": [], "clean": {"threshold": float("nan"), "groups": []}}
    scored = test_chains.copy()
    if len(scored):
        log(f"scoring {len(scored)} held-out chain images")
        scored["score"] = score_paths(det, scored["path"].tolist())
        tab = chain_auroc_table(scored)
        out["heldout_auroc"] = tab.reset_index().to_dict("records")
    groups: dict[str, np.ndarray] = {}
    if len(scored):
        groups["held-out chain step 0"] = scored.loc[scored["step"] == 0, "score"].to_numpy()
    if clean_files:
        log(f"scoring {len(clean_files)} held-out clean files (+ camera-like variants)")
        variants = list(clean_variants(clean_files, clean_variants_n + 1, seed=seed + 7,
                                       long_side=(10**9, 10**9), window_side=1024))
        as_is = [img for name, img in variants if name.endswith("#0")]
        aug = [img for name, img in variants if not name.endswith("#0")]
        groups["held-out clean files, native"] = score_images(det, as_is)
        groups["held-out clean files, grain/JPEG/sharpen variants"] = score_images(det, aug)
    step10 = scored.loc[scored["step"] == 10, "score"].to_numpy() if len(scored) else np.zeros(0)
    allclean = np.concatenate(list(groups.values())) if groups else np.zeros(0)
    thr, fpr = clean_false_positive_rate(allclean, step10)
    out["clean"]["threshold"] = thr
    for name, s in groups.items():
        out["clean"]["groups"].append({"set": name, "n": len(s), "fpr": clean_false_positive_rate(s, step10)[1]})
    out["clean"]["groups"].append({"set": "all held-out clean", "n": len(allclean), "fpr": fpr})
    out["scored"] = scored
    return out


def build_banks(train_df: pd.DataFrame, clean_files: Sequence[Path], cfg: TrainConfig,
                crops_per_bank_image: int = 48, clean_variants_n: int = 4,
                log: Callable[[str], None] = print, cache_dir: str | Path | None = None
                ) -> tuple[CropBank, CropBank | None]:
    """Crop banks of the training chains and of the clean files (with camera-like variants).

    With ``cache_dir``, banks are stored there (crops.npy + meta.parquet) under a key made of the
    file list (names, sizes, mtimes) and settings, and reused by later runs.
    """
    if cfg.generic_ladders > 0 and not clean_files:
        raise ValueError("--generic-ladders makes its ladders from the --clean files: give some")
    t0 = time.time()
    size = cfg.net.crop_size

    def prog(i, n):
        if i % 500 == 0 or i == n:
            log(f"  chain crops {i}/{n}")

    settings = {"size": size, "per_image": crops_per_bank_image, "seed": cfg.seed}
    chain_settings = dict(settings, delivery_jpeg=cfg.delivery_jpeg) if cfg.delivery_jpeg else settings
    if cfg.delivery_jpeg and cfg.delivery_per != "chain":
        chain_settings["delivery_per"] = cfg.delivery_per
    web = cfg.delivery_kind == "web"
    if cfg.delivery_jpeg and web:
        chain_settings["delivery_kind"] = cfg.delivery_kind
    # the manifest's labels too: a manifest corrected over the same images must not reuse the
    # bank of the old labels (steps, families, chains)
    labels = train_df[["path", "chain_id", "step", "family", "source_image"]].astype(str).sort_values(
        ["path", "chain_id"]).to_csv(index=False)
    ckey = cache_key(sorted(train_df["path"]), kind="chains",
                     manifest=hashlib.sha256(labels.encode()).hexdigest()[:16], **chain_settings)
    cb = cached(cache_dir, ckey, lambda: chain_bank(train_df, size, crops_per_bank_image, seed=cfg.seed,
                                                    progress=prog, delivery_jpeg=cfg.delivery_jpeg,
                                                    delivery_per=cfg.delivery_per,
                                                    delivery_kind=cfg.delivery_kind))
    if cfg.generic_ladders > 0:  # clean_files is non-empty (checked above)
        gkey = cache_key(clean_files, kind="generic", ladders=cfg.generic_ladders, **settings)
        gb = cached(cache_dir, gkey, lambda: ladder_bank(
            damage_ladders(ladder_sources(clean_files, seed=cfg.seed + 3), cfg.generic_ladders,
                           seed=cfg.seed + 4), size, crops_per_bank_image, seed=cfg.seed + 5))
        if not len(gb.meta):
            raise ValueError(f"--generic-ladders: none of the {len(clean_files)} clean files could be decoded "
                             "to make damage ladders from")
        log(f"  {gb.meta['chain_id'].nunique()} damage ladders from {len(clean_files)} clean files")
        cb = CropBank.concat([cb, gb])
    clean_bank = None
    if clean_files:
        extra = {"storage": True} if web else {}  # the key of earlier banks stays as it was
        if cfg.web_history:
            extra["web_history"] = cfg.web_history
        if len({Path(f).name for f in clean_files}) < len(clean_files):
            # two files of one name: the bank names their images by path (clean_labels), which
            # unused_clean_files reads; a bank of bare names is not reused
            extra["names"] = "path"
        key = cache_key(clean_files, kind="clean", variants=clean_variants_n, native_windows=True,
                        **extra, **settings)
        clean_bank = cached(cache_dir, key, lambda: image_bank(
            clean_variants(clean_files, clean_variants_n, seed=cfg.seed + 1, native_windows=True,
                           storage=web, web_history=cfg.web_history),
            size, crops_per_bank_image, seed=cfg.seed + 2))
    log(f"crop banks ready in {time.time() - t0:.0f}s: {len(cb)} chain images, "
        f"{len(clean_bank) if clean_bank else 0} clean images")
    return cb, clean_bank


def unused_clean_files(clean_files: Sequence[Path], clean_bank: CropBank | None) -> list[Path]:
    """The clean files none of whose images reached the clean bank (undecodable ones), by the
    names ``clean_variants`` gives their images (``clean_labels``: the path where two files
    share a file name, so they are told apart)."""
    if not clean_files:
        return []
    used = set() if clean_bank is None else {
        str(n).rsplit("#", 1)[0] for n in clean_bank.meta["source_image"]}
    label = clean_labels(clean_files)
    return [f for f in clean_files if label(f) not in used]


def run_training(chain_dirs: Sequence[str | Path], out: str | Path, cfg: TrainConfig,
                 clean_dirs: Sequence[str | Path] = (), exclude: Sequence[str] = (),
                 crops_per_bank_image: int = 48, clean_variants_n: int = 4,
                 evaluate: bool = True, epochs: float | None = None,
                 log: Callable[[str], None] = print, cache_dir: str | Path | None = None,
                 shared_clean: str = "drop", checkpoint: Checkpointing | None = None,
                 teacher: Detector | None = None, teacher_images: Sequence[str | Path] = (),
                 teacher_cache: str | Path | None = None) -> dict:
    """Train on chains (+ clean folders), save weights to ``out``, evaluate, write the card.

    ``shared_clean="drop"`` (with ``evaluate``) leaves out the ``--clean`` files whose picture is
    a chain source on the other side of the source split (``clean_files_of_sources``); ``"keep"``
    trains on them, which flatters the held-out figures of chains whose pictures it trained on.

    ``epochs``, when given, sets ``cfg.iterations`` so that every training chain is drawn about
    ``epochs`` times.

    ``checkpoint`` (training.checkpoint) saves the run's state now and then and resumes it; the
    checkpoint files are removed once the weights are written.

    ``teacher`` (distillation beside the chains): a detector whose scores of ``teacher_images``
    (cached in ``teacher_cache``, default ``<out>.labels.parquet``) train the net to rank as it
    does, one more term of the same objective (``distill.teacher_side``). The held-out chains'
    and clean files' images, byte copies of them, files named as a held-out chain's picture and an
    excluded family's images are never labelled (``teacher_leave_out``, ``distill.teacher_files``),
    so the held-out figures stay those of unseen pictures.
    """
    from collapseguard.detectors.cnn_model import save_net

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if shared_clean not in ("drop", "keep"):
        raise ValueError(f"shared_clean must be 'drop' or 'keep', got {shared_clean!r}")
    t0 = time.time()
    df = load_chains(chain_dirs, exclude)
    if df.empty:
        raise ValueError("no chains left to train on")
    train_df, test_df = split_chains(df)
    if train_df.empty:
        raise ValueError("the source split left no training chains; add more source images")
    if epochs is not None:
        cfg.iterations = max(1, int(np.ceil(epochs * train_df["chain_id"].nunique() / cfg.chains_per_batch)))
    clean_all: list[Path] = []
    for folder in dict.fromkeys(clean_dirs):  # one walk per folder, and each must hold images
        found = list_images([folder])
        if not found:
            raise ValueError(f"--clean {folder}: no image files in it (looked for {', '.join(IMAGE_EXTENSIONS)})")
        clean_all += found
    clean_all, identical = drop_identical(sorted(set(clean_all)))
    if identical:
        log(f"warning: {len(identical)} --clean files are byte-identical to another and are used once "
            f"(e.g. {identical[0][0]} = {identical[0][1]})")
    clean_train, clean_held = split_clean(clean_all)
    left_out = {"train": 0, "heldout": 0}
    if evaluate and shared_clean == "drop":
        # a held-out chain's picture must not be a training negative, nor a training chain's
        # picture a held-out clean image: else the held-out figures are those of seen pictures
        clean_train, left_out["train"] = without_pictures_of(test_df, clean_train)
        clean_held, left_out["heldout"] = without_pictures_of(train_df, clean_held)
        if any(left_out.values()):
            log(f"left out {left_out['train']} training --clean files whose picture is a held-out chain "
                f"source and {left_out['heldout']} held-out --clean files whose picture is a training "
                "chain source (--shared-clean keep uses them)")
    for part, files, side, effect in (
            (test_df, clean_train, "held-out", "their held-out AUROC is not that of unseen sources"),
            (train_df, clean_held, "training", "the held-out clean false-positive rate counts pictures seen in training")):
        shared = sources_among_clean(part, files) if evaluate else []
        if shared:
            log(f"warning: {len(shared)} of {part['source_image'].nunique()} {side} chain sources share "
                f"their name with a --clean file on the other side of the split (e.g. {shared[0]}): "
                f"if they are the same picture, {effect} (--shared-clean drop leaves such files out)")
    for warning in split_warnings(df, test_df, clean_dirs, clean_train, clean_held, evaluate,
                                  left_out["heldout"]):
        log(f"warning: {warning}")
    log(f"chains: {train_df['chain_id'].nunique()} train / {test_df['chain_id'].nunique()} held-out; "
        f"families {sorted(set(train_df['family']))}; clean files {len(clean_train)} train / {len(clean_held)} held-out")
    files: list[Path] = []
    n_given = 0
    if teacher is not None:  # before the banks: a teacher with nothing to label fails in seconds
        from collapseguard.training.distill import teacher_files, teacher_side

        files, n_given = teacher_files(teacher_images, log=log,
                                       leave_out=teacher_leave_out(chain_dirs, exclude, test_df, clean_held))
        if evaluate:  # a held-out chain's picture under another name, as --shared-clean drop does
            files, n_pictures = without_pictures_of(test_df, files)
            if n_pictures:
                log(f"left out {n_pictures} --images files whose picture is a held-out chain source")
            if not files:
                raise ValueError("every --images file is a held-out chain or clean image, or a picture of "
                                 "a held-out chain: nothing is left for the teacher to label")
    cb, clean_bank = build_banks(train_df, clean_train, cfg, crops_per_bank_image, clean_variants_n, log,
                                 cache_dir=cache_dir)
    unread = unused_clean_files(clean_train, clean_bank)
    if unread:  # clean_variants passes over what it cannot decode: said here, and not counted
        shown = ", ".join(str(f) for f in unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
        log(f"note: {len(unread)} of {len(clean_train)} training --clean files could not be decoded and "
            f"are not used: {shown}")
        if len(unread) == len(clean_train):
            log("warning: no --clean file could be used: the net sees no clean negatives but chain "
                "step 0s")
    tb, t_scale, t_info = None, 1.0, None
    if teacher is not None:
        cache = Path(teacher_cache) if teacher_cache else out.with_suffix(".labels.parquet")
        tb, t_scale, t_train, t_test = teacher_side(teacher, files, cfg, cache, crops_per_bank_image, log=log)
        t_info = {"teacher": teacher.name, "teacher_version": teacher.version, "n_train": len(t_train),
                  "n_heldout": len(t_test),
                  "n_not_labelled": n_given - len(files)}
    resumed_step, resumed_seconds = resumed_from(checkpoint)
    t1 = time.time()
    net, history = train_net(cb, clean_bank, cfg, log=log, checkpoint=checkpoint, teacher=tb,
                             teacher_scale=t_scale)
    t2 = time.time()
    families = sorted(set(train_df["family"]))
    meta = {"families": families, "excluded_families": list(exclude), "seed": str(cfg.seed),
            "iterations": str(cfg.iterations)}
    if t_info:
        meta["teacher"] = f"{teacher.name}@{teacher.version}"
    save_net(net, out, metadata=meta)
    if checkpoint is not None:
        remove_checkpoint(checkpoint.path)
    from collapseguard.detectors.cnn import weights_version

    n_bytes = out.stat().st_size
    summary = {
        "name": "cnn",
        "weights_file": out.name,
        "version": weights_version(net, net.config.n_crops),
        "weights_bytes": n_bytes,
        "n_parameters": int(sum(p.numel() for p in net.parameters())),
        "config": cfg.to_dict(),
        "data": {
            "chain_dirs": [str(d) for d in chain_dirs],
            "clean_dirs": [str(d) for d in clean_dirs],  # their order and paths set the draws
            "n_chains_train": int(train_df["chain_id"].nunique()),
            "n_chains_test": int(test_df["chain_id"].nunique()),
            "n_sources_train": int(train_df["source_image"].nunique()),
            "n_sources_test": int(test_df["source_image"].nunique()),
            "families_train": families,
            "families_excluded": list(exclude),
            "steps": sorted(int(s) for s in set(df["step"])),
            "n_clean_train_files": len(clean_train) - len(unread),
            "n_clean_train_files_unreadable": len(unread),
            "n_clean_heldout_files": len(clean_held),
            "shared_clean": shared_clean,  # what happened to --clean files of the other side's sources
            "clean_left_out": left_out,
            "clean_variants": clean_variants_n,
            "crops_per_bank_image": crops_per_bank_image,
        },
        "history": history,
        "first_loss": history[0]["loss"] if history else float("nan"),
        "final_loss": history[-1]["loss"] if history else float("nan"),
        "seconds_data": t1 - t0,
        # the whole run's training, earlier processes' included (their checkpoint's count)
        "seconds_train": t2 - t1 + resumed_seconds,
        "seconds_train_this_process": t2 - t1,
        "resumed_from_step": resumed_step,
        "seconds_eval": 0.0,
        "evaluation": "not run",  # until it has run: a card of a stopped evaluation says so
        "heldout_auroc": [],
        "clean": {"threshold": float("nan"), "groups": []},
    }
    if t_info:
        from collapseguard.training.distill import agreement

        summary["teacher"] = dict(t_info, heldout_spearman_vs_teacher=agreement(out, t_test))
    # the card first without the held-out metrics, so that an evaluation that fails (a held-out
    # image that does not decode) leaves no card of an earlier run beside the new weights
    write_summary(summary, out.with_suffix(".json"))
    write_card(summary, out.with_suffix(".md"))
    if evaluate:
        ev = evaluate_weights(out, test_df, clean_held, seed=cfg.seed, log=log)
        ev.pop("scored")
        summary.update(ev)
        summary["seconds_eval"] = time.time() - t2
        summary["evaluation"] = "done"
    write_summary(summary, out.with_suffix(".json"))
    write_card(summary, out.with_suffix(".md"))
    log(f"wrote {out} ({n_bytes} bytes, version {summary['version']}), {out.with_suffix('.json').name}, "
        f"{out.with_suffix('.md').name}")
    return summary
