"""Leave-one-family-out: for each family, train without it and measure AUROC on it.

The crop banks are cut once (all families, training-split sources, clean files); for every family
F a short training run uses the bank without F's chains, and its weights then score F's chains at
steps 0, 5 and 10 through the real ``cnn`` detector. Reported: AUROC(0 vs 5) and (0 vs 10) on F's
held-out sources (the strict figure) and on all of F's sources (more chains: F itself was never
seen, though the training split's step-0 sources were seen as clean images). As in ``collapseguard
train``, a ``--clean`` file whose picture is a held-out chain source is left out of the clean
negatives by default (``shared_clean="drop"``): otherwise the strict figure is one of pictures
trained on as clean; ``"keep"`` trains on them, as the shipped recipe does.

``eval_chains`` (a chain manifest, e.g. one storage of the evaluation set of
``recipes/eval_set.sh``) adds a third figure per family: AUROC on that manifest's chains of the
left-out family, sources no training run has seen.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from collapseguard.io.strict_json import json_ready
from collapseguard.training.card import write_summary
from collapseguard.training.loop import TrainConfig, train_net
from collapseguard.training.metrics import auroc, score_paths
from collapseguard.training.negatives import list_images, split_clean
from collapseguard.training.run import (
    build_banks,
    load_chains,
    split_chains,
    without_pictures_of,
)


def lofo(chain_dirs: Sequence[str | Path], out_dir: str | Path, cfg: TrainConfig,
         clean_dirs: Sequence[str | Path] = (), families: Sequence[str] | None = None,
         steps: Sequence[int] = (5, 10), log: Callable[[str], None] = print,
         cache_dir: str | Path | None = None, clean_variants_n: int = 4,
         crops_per_bank_image: int = 48, shared_clean: str = "drop",
         eval_chains: pd.DataFrame | None = None, exclude: Sequence[str] = ()) -> pd.DataFrame:
    """Run the study; returns one row per family (also ``out_dir/lofo.json``, rewritten after
    every family so a partial run leaves its results). ``clean_variants_n``: images made from
    each clean file (1 = the file as it is, no camera-like grain/JPEG variants);
    ``crops_per_bank_image``: the crop bank's crops per image (shipped recipe: 48);
    ``shared_clean``: "drop" (default) or "keep" the clean files of held-out chains' pictures;
    ``eval_chains``: more chains to score each left-out family on (columns family, step, path,
    chain_id), reported as ``eval_auroc_0v<k>``; NaN for a family it lacks; ``exclude``: families
    no run trains on (a recipe's ``--exclude-family``), each still left out and scored in turn."""
    from collapseguard.detectors.cnn import CNNDetector
    from collapseguard.detectors.cnn_model import save_net

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df = load_chains(chain_dirs)
    unknown = set(exclude) - set(df["family"])
    if unknown:
        raise ValueError(f"exclude: {sorted(unknown)} not among families {sorted(set(df['family']))}")
    train_df, test_df = split_chains(df)
    test_sources = set(test_df["source_image"])
    if shared_clean not in ("drop", "keep"):
        raise ValueError(f"shared_clean must be 'drop' or 'keep', got {shared_clean!r}")
    clean_train, _ = split_clean(list_images(clean_dirs)) if clean_dirs else ([], [])
    left_out = 0
    if shared_clean == "drop":
        clean_train, left_out = without_pictures_of(test_df, clean_train)
        if left_out:
            log(f"left out {left_out} training --clean files whose picture is a held-out chain source "
                "(shared_clean='keep' uses them)")
    chain_bank, clean_bank = build_banks(train_df, clean_train, cfg, crops_per_bank_image,
                                         clean_variants_n=clean_variants_n, log=log, cache_dir=cache_dir)
    families = list(families or sorted(set(df["family"])))
    rows = []
    for fam in families:
        t0 = time.time()
        log(f"== leave out {fam}")
        never = sorted({fam, *exclude})
        bank = chain_bank.subset(~chain_bank.meta["family"].isin(never))
        if not len(bank.meta):
            raise ValueError(f"leaving out {', '.join(never)} leaves no chain images to train on")
        net, hist = train_net(bank, clean_bank, cfg, log=log)
        w = out_dir / f"lofo_without_{fam}.safetensors"
        save_net(net, w, metadata={"excluded_families": never})
        det = CNNDetector(weights=w, device="cpu")
        fdf = df[(df["family"] == fam) & df["step"].isin([0, *steps])].copy()
        fdf["score"] = score_paths(det, fdf["path"].tolist())
        held = fdf[fdf["source_image"].isin(test_sources)]
        rec = {"family": fam, "n_chains_heldout": int(held["chain_id"].nunique()),
               "n_chains_all": int(fdf["chain_id"].nunique())}
        scopes = [("heldout", held), ("all", fdf)]
        if eval_chains is not None:
            edf = eval_chains[(eval_chains["family"] == fam) & eval_chains["step"].isin([0, *steps])].copy()
            edf["score"] = score_paths(det, edf["path"].tolist())
            rec["n_chains_eval"] = int(edf["chain_id"].nunique())
            scopes.append(("eval", edf))
        for scope, sub in scopes:
            neg = sub.loc[sub["step"] == 0, "score"].to_numpy()
            for k in steps:
                rec[f"{scope}_auroc_0v{k}"] = auroc(neg, sub.loc[sub["step"] == k, "score"].to_numpy())
        rec["final_loss"] = hist[-1]["loss"] if hist else float("nan")
        rec["seconds"] = round(time.time() - t0, 1)
        rows.append(rec)
        log(json.dumps(json_ready(rec)))
        write_summary({"config": cfg.to_dict(), "clean_variants": clean_variants_n,
                       "bank_crops": crops_per_bank_image, "shared_clean": shared_clean,
                       "exclude": sorted(exclude),
                       "clean_left_out": left_out, "rows": rows}, out_dir / "lofo.json")
    return pd.DataFrame(rows)
