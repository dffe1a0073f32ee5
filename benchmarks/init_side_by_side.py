"""cnn weights side by side on the training split's held-out chains and clean files, per storage.

    python benchmarks/init_side_by_side.py WEIGHTS [WEIGHTS ...] --chains DIR [--chains DIR ...]
        [--clean DIR ...] [--eval MANIFEST] [--threads 1] [--ensemble] [--json OUT]

Splits the chains as ``collapseguard train`` does (by source, salt "cnn") and the ``--clean``
files as it does (by name; held-out files whose picture is a training chain source left out, as
``--shared-clean drop``). Every held-out image is scored as stored (PNG) and re-encoded as JPEG
q90 4:2:0 (``training.storage``), as a web dataset holds it. Printed per weights file and
storage: AUROC of step 0 vs step 5 and vs step 10 per family and over all chains; the weights'
threshold at the 99th percentile of their own PNG clean scores (held-out clean files and the
held-out chains' step 0), and the share of clean images and of step-10 images above it in each
storage. ``--eval`` adds a chain manifest that no training run touched (e.g. the one
``recipes/eval_set.sh`` writes), its images scored as they are stored there, split by its
``storage`` column when it has one (``--eval-storage``, ``--eval-chains N`` take a part of it),
with the share of its step-0 images above the threshold per clean kind when the manifest has a
``kind`` column. Also the scoring time per image of each weights file (all timed in this run,
one after the other). ``--ensemble`` adds the weights together: each one's
scores standardised by the mean and standard deviation of its own PNG clean scores, then averaged,
with its own threshold and figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from collapseguard.detectors.cnn import CNNDetector
from collapseguard.evaluation.metrics import auroc
from collapseguard.images import load_image
from collapseguard.training.negatives import list_images, split_clean
from collapseguard.training.run import load_chains, split_chains, without_pictures_of
from collapseguard.training.storage import Storage, apply_storage
from collapseguard.training_data_tools.manifest import read_manifest

STORAGES = {"png": None, "jpeg q90 4:2:0": Storage("jpeg420", 90)}
STEPS = (0, 5, 10)


def family_aurocs(df: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """{family (and "all"): (AUROC 0v5, AUROC 0v10)} of a frame with family, step, score."""
    out = {}
    for fam, g in [*sorted(df.groupby("family")), ("all", df)]:
        s0 = g.loc[g["step"] == 0, "score"]
        out[fam] = tuple(auroc(s0, g.loc[g["step"] == k, "score"]) for k in (5, 10))
    return out


def score_all(det: CNNDetector, images: list[np.ndarray], batch: int = 16) -> np.ndarray:
    return np.concatenate([det.score(images[i:i + batch]) for i in range(0, len(images), batch)]) \
        if images else np.zeros(0, np.float32)


def clean_png_scores(scores: dict, test_df: pd.DataFrame) -> np.ndarray:
    """The PNG clean scores: held-out clean files and the held-out chains' step 0."""
    png_chain, png_clean = scores["png"]
    return np.concatenate([png_clean, png_chain[test_df["step"].to_numpy() == 0]])


def ensemble_scores(members: list, test_df: pd.DataFrame):
    """The mean of the members' scores, each standardised by the mean and standard deviation of its
    own PNG clean scores (so no member's scale dominates); ``members`` are (scores, ev_scores)."""
    stats = []
    for scores, _ in members:
        c = clean_png_scores(scores, test_df)
        stats.append((float(c.mean()), float(c.std()) or 1.0))
    scores = {s: tuple(np.mean([(m[0][s][j] - mu) / sd for m, (mu, sd) in zip(members, stats)], axis=0)
                       for j in (0, 1)) for s in members[0][0]}
    ev_scores = None
    if members[0][1] is not None:
        ev_scores = np.mean([(m[1] - mu) / sd for m, (mu, sd) in zip(members, stats)], axis=0)
    return scores, ev_scores


def report(res: dict, scores: dict, ev_scores, test_df: pd.DataFrame, ev) -> dict:
    """Print and return the figures of one set of scores (one weights file or the ensemble)."""
    clean_png = clean_png_scores(scores, test_df)
    thr = float(np.quantile(clean_png, 0.99))
    res["threshold_p99_png_clean"] = thr
    res["storages"] = {}
    print(f"threshold {thr:.3f} = 99th percentile of {len(clean_png)} PNG clean scores")
    for sname, (sc, scl) in scores.items():
        d = test_df.assign(score=sc)
        fa = family_aurocs(d)
        step0 = sc[test_df["step"].to_numpy() == 0]
        clean_s = np.concatenate([scl, step0])
        s10 = sc[test_df["step"].to_numpy() == 10]
        rec = {"auroc": {f: {"0v5": a, "0v10": b} for f, (a, b) in fa.items()},
               "mean_family_0v5": float(np.nanmean([a for f, (a, _) in fa.items() if f != "all"])),
               "mean_family_0v10": float(np.nanmean([b for f, (_, b) in fa.items() if f != "all"])),
               "clean_above": float((clean_s > thr).mean()), "n_clean": len(clean_s),
               "clean_files_above": float((scl > thr).mean()) if len(scl) else float("nan"),
               "step10_above": float((s10 > thr).mean())}
        res["storages"][sname] = rec
        print(f"-- {sname}: mean over families 0v5 {rec['mean_family_0v5']:.3f}, 0v10 "
              f"{rec['mean_family_0v10']:.3f}; clean above threshold {rec['clean_above']:.3f} "
              f"(n={rec['n_clean']}; clean files {rec['clean_files_above']:.3f}), step 10 above "
              f"{rec['step10_above']:.3f}")
        for f, (a, b) in fa.items():
            print(f"   {f:<18} 0v5 {a:.3f}  0v10 {b:.3f}")
    if ev is not None:
        res["eval"] = {}
        for sname, g in ev.assign(score=ev_scores).groupby("storage"):
            fa = family_aurocs(g)
            mean5 = float(np.nanmean([a for f, (a, _) in fa.items() if f != "all"]))
            s0 = g.loc[g["step"] == 0, "score"].to_numpy()
            s10 = g.loc[g["step"] == 10, "score"].to_numpy()
            res["eval"][str(sname)] = {"auroc": {f: {"0v5": a, "0v10": b} for f, (a, b) in fa.items()},
                                       "mean_family_0v5": mean5, "step0_above": float((s0 > thr).mean()),
                                       "step10_above": float((s10 > thr).mean())}
            print(f"-- --eval {sname}: mean over families 0v5 {mean5:.3f}; step 0 above threshold "
                  f"{(s0 > thr).mean():.3f} (n={len(s0)}), step 10 above {(s10 > thr).mean():.3f}; " + "  ".join(
                      f"{f} {a:.3f}/{b:.3f}" for f, (a, b) in fa.items()))
            if "kind" in g:  # the clean kind of each chain's source picture
                step0 = g[g["step"] == 0]
                by_kind = {str(k): float((kg["score"] > thr).mean()) for k, kg in step0.groupby("kind")}
                res["eval"][str(sname)]["step0_above_by_kind"] = by_kind
                print(f"   step 0 above threshold per kind (largest {max(by_kind.values()):.3f}): " + "  ".join(
                    f"{k} {v:.3f}" for k, v in by_kind.items()))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="+")
    ap.add_argument("--chains", action="append", required=True)
    ap.add_argument("--clean", action="append", default=[])
    ap.add_argument("--eval", default=None, help="an untouched chain manifest (folder or file)")
    ap.add_argument("--eval-storage", action="append", default=[],
                    help="with --eval: score only these values of its storage column (repeatable)")
    ap.add_argument("--eval-chains", type=int, default=0,
                    help="with --eval: only the first N source chains (by id) of each family, in every storage")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ensemble", action="store_true",
                    help="also report the weights together: each one's scores standardised by the mean "
                    "and standard deviation of its own PNG clean scores, then averaged")
    ap.add_argument("--json", default=None, help="write every figure here as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    df = load_chains(args.chains)
    train_df, test_df = split_chains(df)
    test_df = test_df[test_df["step"].isin(STEPS)].reset_index(drop=True)
    held: list[Path] = []
    if args.clean:
        _, held = split_clean(list_images(args.clean))
        held, _ = without_pictures_of(train_df, held)
    print(f"held-out: {test_df['chain_id'].nunique()} chains ({test_df['source_image'].nunique()} sources), "
          f"{len(held)} clean files")
    chain_imgs = [load_image(p) for p in test_df["path"]]
    clean_imgs = [load_image(p) for p in held]
    stored = {name: ([im if st is None else apply_storage(im, st) for im in chain_imgs],
                     [im if st is None else apply_storage(im, st) for im in clean_imgs])
              for name, st in STORAGES.items()}
    ev = ev_imgs = None
    if args.eval:
        ev = read_manifest(args.eval)
        ev = ev[ev["step"].isin(STEPS)].reset_index(drop=True)
        if "storage" not in ev:
            ev["storage"] = "as stored"
        if args.eval_storage:
            ev = ev[ev["storage"].isin(args.eval_storage)].reset_index(drop=True)
        if args.eval_chains > 0:
            base = ev["stored_from"] if "stored_from" in ev else ev["chain_id"]
            firsts = {f: sorted(set(base[ev["family"] == f]))[: args.eval_chains] for f in set(ev["family"])}
            keep = [b in firsts[f] for b, f in zip(base, ev["family"])]
            ev = ev[keep].reset_index(drop=True)
        ev_imgs = [load_image(p) for p in ev["path"]]
        print(f"--eval: {ev['chain_id'].nunique()} chains, storages {sorted(ev['storage'].unique())}")

    results, raw = {}, {}
    for w in args.weights:
        det = CNNDetector(weights=w, device="cpu")
        name = Path(w).stem
        res = {"weights": w, "version": det.version, "n_crops": det.n_crops}
        t0, n_scored = time.perf_counter(), 0
        scores = {}
        for sname, (ci, cl) in stored.items():
            scores[sname] = (score_all(det, ci), score_all(det, cl))
            n_scored += len(ci) + len(cl)
        res["ms_per_image"] = 1000 * (time.perf_counter() - t0) / max(1, n_scored)
        ev_scores = score_all(det, ev_imgs) if ev is not None else None
        raw[name] = (scores, ev_scores)
        print(f"\n== {name} (version {det.version}, {det.n_crops} crops, {res['ms_per_image']:.1f} ms/image "
              f"on {args.threads} thread(s))")
        results[name] = report(res, scores, ev_scores, test_df, ev)
    if args.ensemble and len(raw) > 1:
        scores, ev_scores = ensemble_scores(list(raw.values()), test_df)
        print(f"\n== ensemble of {', '.join(raw)} (each standardised on its own PNG clean scores, then averaged)")
        results["ensemble"] = report({"members": list(raw)}, scores, ev_scores, test_df, ev)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
