"""cnn weights side by side on the training split's held-out chains and clean files, per storage.

    python benchmarks/init_side_by_side.py WEIGHTS [WEIGHTS ...] --chains DIR [--chains DIR ...]
        [--clean DIR ...] [--eval MANIFEST] [--threads 1] [--ensemble] [--gap] [--json OUT]

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

``--gap`` (with ``--eval``) asks where a weights file loses AUROC 0v5 on the evaluation set:
the median PSNR of steps 5 and 10 against the chain's own step 0 per family (how much the damage
changed; chains whose size changes left out); per clean kind, the median score of its step-0
and step-5 images and the AUROC of its step 0 against its own step 5 ("within") and of every
kind's step 0 against it ("pooled"), so offsets between kinds larger than the step-5 shift show;
and the family AUROCs of scores rebuilt from the same crop logits (their mean, soft maximum, soft
minimum, median, a logistic regression on those and the context term, the score at half
resolution, and a regression on the native and half-resolution scores), the regressions fitted
on the training split's held-out images, never on the evaluation set. Beside each, the share of
step-10 images above the 98th percentile of the evaluation set's step-0 scores and the largest
share of one kind's step-0 images above it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

from collapseguard.detectors.cnn import CNNDetector
from collapseguard.detectors.crops import image_crops
from collapseguard.evaluation.metrics import auroc
from collapseguard.images import load_image
from collapseguard.training.negatives import list_images, split_clean
from collapseguard.training.run import load_chains, split_chains, without_pictures_of
from collapseguard.training.storage import Storage, apply_storage
from collapseguard.training_data_tools.manifest import read_manifest

STORAGES = {"png": None, "jpeg q90 4:2:0": Storage("jpeg420", 90)}
STEPS = (0, 5, 10)
POOLS = ("mean", "soft max", "soft min", "median")  # --gap: crop-logit poolings


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


def half(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    return np.asarray(Image.fromarray(img).resize((max(1, w // 2), max(1, h // 2)), Image.BOX))


@torch.inference_mode()
def crop_parts(det: CNNDetector, images: list[np.ndarray], batch: int = 32):
    """(N, K) crop logits, (N,) context term (zeros without one) and (N,) scores of ``images``."""
    net, size = det.net, det.net.config.crop_size
    logits, ctx, score = [], [], []
    for i in range(0, len(images), batch):
        crops = torch.from_numpy(np.stack([image_crops(im, size, det.n_crops) for im in images[i:i + batch]]))
        f = net.crop_features(crops)
        lg = net.head(f).squeeze(-1)
        c = net.context_logit(f) if net.config.context else torch.zeros(len(lg))
        logits.append(lg.numpy())
        ctx.append(c.numpy())
        score.append((net.aggregate(lg) + c).numpy())
    return np.concatenate(logits), np.concatenate(ctx), np.concatenate(score)


def pool_features(logits: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """(N, 5) pooled crop logits (``POOLS`` order) plus the context term."""
    k = logits.shape[1]
    m = logits.max(axis=1, keepdims=True)
    smax = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0] - math.log(k)
    mn = logits.min(axis=1, keepdims=True)
    smin = -(np.log(np.exp(-(logits - mn)).sum(axis=1)) - mn[:, 0]) + math.log(k)
    return np.column_stack([logits.mean(axis=1), smax, smin, np.median(logits, axis=1), ctx])


def fit_logistic(x: np.ndarray, y: np.ndarray):
    """A standardised logistic regression; returns a scoring function."""
    from sklearn.linear_model import LogisticRegression

    mu, sd = x.mean(axis=0), x.std(axis=0) + 1e-9
    lr = LogisticRegression(max_iter=2000).fit((x - mu) / sd, y)
    return lambda z: lr.decision_function((z - mu) / sd)


def damage_size(ev: pd.DataFrame) -> pd.DataFrame:
    """Per family, the median PSNR of steps 5 and 10 against the chain's own step 0 (PNG rows
    when the manifest has them; chains whose size changes are left out)."""
    g = ev[ev["storage"] == "png"] if (ev["storage"] == "png").any() else ev
    rows = []
    for fam, gf in g.groupby("family"):
        psnr = {5: [], 10: []}
        for _, gc in gf.groupby("chain_id"):
            first = gc[gc["step"] == 0]
            if first.empty:
                continue
            a = load_image(first["path"].iloc[0]).astype(np.float64)
            for k, values in psnr.items():
                later = gc[gc["step"] == k]
                if later.empty:
                    continue
                b = load_image(later["path"].iloc[0]).astype(np.float64)
                if a.shape == b.shape:
                    mse = float(((a - b) ** 2).mean())
                    values.append(10 * math.log10(255.0 ** 2 / max(mse, 1e-12)))
        med = {k: float(np.median(v)) if v else float("nan") for k, v in psnr.items()}
        rows.append({"family": fam, "chains same size": len(psnr[5]),
                     "PSNR step 5 (dB)": med[5], "PSNR step 10 (dB)": med[10]})
    return pd.DataFrame(rows)


def kind_table(g: pd.DataFrame, s: np.ndarray) -> pd.DataFrame:
    g = g.assign(score=s)
    s0_all = g.loc[g["step"] == 0, "score"]
    rows = []
    for kind, gk in g.groupby("kind"):
        s0, s5 = gk.loc[gk["step"] == 0, "score"], gk.loc[gk["step"] == 5, "score"]
        rows.append({"kind": kind, "chains": len(s0), "median step 0": float(s0.median()),
                     "median step 5": float(s5.median()), "AUROC 0v5 within": auroc(s0, s5),
                     "AUROC 0v5 pooled": auroc(s0_all, s5)})
    return pd.DataFrame(rows)


def pooling_row(name: str, g: pd.DataFrame, s: np.ndarray) -> dict:
    step = g["step"].to_numpy()
    row = {"score": name}
    fams = []
    for fam, gf in g.groupby("family"):
        idx = gf.index.to_numpy()
        a = auroc(s[idx][step[idx] == 0], s[idx][step[idx] == 5])
        row[fam] = a
        fams.append(a)
    row["family mean 0v5"] = float(np.nanmean(fams))
    thr = np.quantile(s[step == 0], 0.98)
    row["step 10 above p98"] = float((s[step == 10] > thr).mean())
    if "kind" in g:
        k0 = g[step == 0]
        row["largest kind above p98"] = max(float((s[kg.index.to_numpy()] > thr).mean()) for _, kg in k0.groupby("kind"))
    return row

def gap_report(det: CNNDetector, stored: dict, test_df: pd.DataFrame, ev: pd.DataFrame, ev_imgs: list) -> dict:
    """``--gap``: kind offsets and rebuilt poolings of one weights file on the evaluation set; the
    logistic regressions are fitted on the training split's held-out images in every storage of
    ``stored`` (chains at steps 0 and >= 5, clean files), never on the evaluation set."""
    step = test_df["step"].to_numpy()
    xs, xh, ys = [], [], []
    for chain_imgs, clean_imgs in stored.values():
        for imgs, is_chain in ((chain_imgs, True), (clean_imgs, False)):
            if not imgs:
                continue
            lg, ctx, sc = crop_parts(det, imgs)
            _, _, sc_half = crop_parts(det, [half(im) for im in imgs])
            keep = ((step == 0) | (step >= 5)) if is_chain else np.ones(len(imgs), bool)
            xs.append(pool_features(lg, ctx)[keep])
            xh.append(np.column_stack([sc, sc_half])[keep])
            ys.append(((step >= 5) if is_chain else np.zeros(len(imgs), bool))[keep].astype(int))
    y = np.concatenate(ys)
    pooled_fit, half_fit = fit_logistic(np.vstack(xs), y), fit_logistic(np.vstack(xh), y)
    print(f"   --gap: regressions fitted on {len(y)} held-out training-split images ({int(y.sum())} at step >= 5)")
    out = {}
    for st, g in ev.groupby("storage"):
        idx = g.index.to_numpy()
        g = g.reset_index(drop=True)
        imgs = [ev_imgs[i] for i in idx]
        lg, ctx, sc = crop_parts(det, imgs)
        _, _, sc_half = crop_parts(det, [half(im) for im in imgs])
        feats = pool_features(lg, ctx)
        rec: dict = {}
        if "kind" in g:
            kt = kind_table(g, sc)
            print(f"   --gap {st}: kind against damage")
            print(kt.round(2).to_string(index=False))
            rec["kinds"] = kt.to_dict("records")
        rows = [pooling_row("shipped aggregation", g, sc)]
        rows += [pooling_row(name, g, feats[:, i]) for i, name in enumerate(POOLS)]
        rows.append(pooling_row("logistic: pools + context", g, pooled_fit(feats)))
        rows.append(pooling_row("half resolution alone", g, sc_half))
        rows.append(pooling_row("logistic: native + half", g, half_fit(np.column_stack([sc, sc_half]))))
        pt = pd.DataFrame(rows)
        print(f"   --gap {st}: the score rebuilt from the same crop logits (AUROC 0v5 per family)")
        print(pt.round(3).to_string(index=False))
        rec["pooling"] = pt.to_dict("records")
        out[str(st)] = rec
    return out


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
    ap.add_argument("--gap", action="store_true",
                    help="with --eval: also where each weights file loses its ranking of the evaluation set "
                    "(damage size per family, kind offsets, the score rebuilt from its crop logits)")
    ap.add_argument("--json", default=None, help="write every figure here as JSON")
    args = ap.parse_args()
    if args.gap and not args.eval:
        ap.error("--gap needs --eval (it reads the evaluation set)")
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
        if args.gap:
            dmg = damage_size(ev)
            print("--gap: damage size (median PSNR against the chain's step 0)")
            print(dmg.round(1).to_string(index=False))

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
        if args.gap and ev is not None:
            results[name]["gap"] = gap_report(det, stored, test_df, ev, ev_imgs)
    if args.ensemble and len(raw) > 1:
        scores, ev_scores = ensemble_scores(list(raw.values()), test_df)
        print(f"\n== ensemble of {', '.join(raw)} (each standardised on its own PNG clean scores, then averaged)")
        results["ensemble"] = report({"members": list(raw)}, scores, ev_scores, test_df, ev)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
