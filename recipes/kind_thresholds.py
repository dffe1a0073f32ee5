"""Decisions per kind: a cheap kind predictor and per-kind thresholds against one pooled threshold.

    nice -n 15 python recipes/kind_thresholds.py [--eval /work/data/eval] \
        [--scores /work/data/signals/cnn-49cd8979952f.csv] [--web /work/data/web_history] \
        [--cache /work/data/kinds] [--folds 5] [--units pictures|images] [--rule bound|quantile]
        [--alpha 0.01] [--split package|picture] [--features hand|cnn|both]
        [--web-scores SCORES.csv] [--threshold T]

``--scores`` and ``--web-scores`` are one weights' scores (``--web-scores``: a ``name,png,jpeg90``
table, or a ``path,score`` cache such as ``recipes/judge_cnn.py --cache`` writes for both sets);
``--threshold`` is that weights' calibrated threshold (the ``shipped`` column), and the crop
features are the packaged cnn's (cached per weights version).

Data: the evaluation set's chains (``EVAL/stored/manifest.csv``) with the cnn's cached scores of
steps 0 and 10 as PNG and JPEG q90 4:2:0 (``--scores``, written by ``benchmarks/signals.py``), and
the web-history clean set (``WEB/manifest.csv`` + ``WEB/scores_shipped.csv``: one web history of
each of the evaluation set's source pictures, as PNG and JPEG q90). The evaluation set's 12 kinds
are folded into the 7 a user names (``COARSE``).

Everything is cross-fitted over ``--folds`` folds grouped by Debian package (so by source picture
too, and near-duplicates of one package never straddle a split): a picture's kind is predicted by
a model trained on the other folds' pictures, and its images are dropped or kept by thresholds
calibrated on the other folds' clean images. The kind predictor (``kind_features``: colour count,
flat-area share, edge density, gradient histogram, saturation, run lengths, axis-aligned edges,
noise level), with ``--features cnn``/``both`` the shipped cnn's crop features (mean and spread
over its 24 crops) too; a gradient-boosted tree classifier trains on clean images only (web
history and step 0); its confusion matrix is printed for held-out clean images and held-out
step-10 images. ``--split picture`` makes the folds by picture instead of package.

Thresholds, each from ``bounds`` (alpha 1 %, confidence 95 %; the k-th largest clean score with
the binomial order statistic's k, or the largest score, k = 1, where there are fewer than the
bound needs, and the rate that k guarantees is printed): ``shipped`` (the packaged calibration's
threshold), ``pooled`` (one threshold over the calibration folds' clean scores), ``kind-safe``
(one threshold, the largest of the per-kind ones: ``calibrate --per-kind``), ``per-kind oracle``
(each image judged by its own kind's threshold, with the true kind) and ``per-kind predicted``
(the same thresholds, picked by the predicted kind). ``--units pictures`` (the default, what
``calibrate`` does) counts one score per picture, its highest clean score; ``images`` counts
every clean image. ``--rule quantile`` takes k = ceil(alpha n) instead of the bound's k (the plain
empirical quantile, no guarantee at these sizes). A last column, ``pooled @ oracle's clean
share``, is one threshold set on the reported clean images themselves to drop as many of them as
the per-kind oracle thresholds do: the comparison at equal clean cost (it flatters the pooled side).
Printed: clean share dropped per kind (web history PNG and JPEG q90, evaluation step 0) and
step-10 share dropped per family, for each way of deciding.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from collapseguard.calibration.bounds import guaranteed_rate, order_statistic_rank

#: the evaluation set's kinds -> the kinds a user names
COARSE = {
    "photo": "photo", "foliage": "photo", "night_photo": "photo",
    "illustration": "illustration", "portrait": "illustration", "game_render": "illustration",
    "flat_art": "illustration",
    "diagram_text": "diagram", "screenshot": "screenshot", "anime": "anime",
    "pixel_art": "pixel_art", "game_texture": "texture",
}
KINDS = ("photo", "illustration", "diagram", "screenshot", "anime", "pixel_art", "texture")
ALPHA, CONFIDENCE = 0.01, 0.95
#: the threshold of the weights whose scores --scores holds by default: cnn 49cd8979952f, packaged
#: when the first tables of docs/KINDS.md were measured (``--threshold`` for other weights)
SHIPPED_THRESHOLD = 3.1796


# -- the kind predictor's features -------------------------------------------------------------

FEATURES = ("log_colours", "top16_share", "flat0", "flat_small", "edge", "edge_strong",
            "g0", "g1", "g2", "g3", "g4", "g5", "sat_mean", "sat_std", "sat_high", "grey_share",
            "val_mean", "val_std", "white_share", "black_share", "axis_edges", "noise",
            "lap_over_grad", "log_run", "dx2_zero_over_dx1")


def kind_features(img: np.ndarray, side: int = 384) -> np.ndarray:
    """Hand statistics of an RGB uint8 image's centre ``side`` window (native pixels): what tells a
    drawing from a photo from a screenshot, and hardly moves with damage of a few steps."""
    h, w = img.shape[:2]
    y, x = max(0, (h - side) // 2), max(0, (w - side) // 2)
    a = np.ascontiguousarray(img[y : y + side, x : x + side, :3])
    f = a.astype(np.int16)
    n = a.shape[0] * a.shape[1]
    packed = (a[..., 0].astype(np.int32) << 16) | (a[..., 1].astype(np.int32) << 8) | a[..., 2]
    _, counts = np.unique(packed, return_counts=True)
    top16 = np.sort(counts)[::-1][:16].sum() / n
    dx = np.abs(np.diff(f, axis=1)).sum(axis=2)[:-1, :]
    dy = np.abs(np.diff(f, axis=0)).sum(axis=2)[:, :-1]
    gm = dx + dy
    edges = gm > 60
    hist = np.histogram(gm, bins=[0, 1, 5, 17, 49, 129, 10_000])[0] / max(gm.size, 1)
    mx, mn = a.max(axis=2).astype(np.float32), a.min(axis=2).astype(np.float32)
    sat = (mx - mn) / (mx + 1e-3)
    grey = 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]
    lap = np.abs(4 * grey[1:-1, 1:-1] - grey[:-2, 1:-1] - grey[2:, 1:-1] - grey[1:-1, :-2] - grey[1:-1, 2:])
    busy = gm[1:, 1:] > 0
    lo, hi = np.minimum(dx, dy), np.maximum(dx, dy)
    axis = float(np.mean(lo[edges] < 0.2 * hi[edges])) if edges.any() else 0.0
    same = np.all(a[:, 1:] == a[:, :-1], axis=2)
    runs = n / max(1, int((~same).sum()) + a.shape[0])  # mean horizontal run of identical pixels
    dx2 = np.abs(f[:, 2:] - f[:, :-2]).sum(axis=2)
    z1, z2 = float(np.mean(~same)), float(np.mean(dx2 > 0))
    return np.array([
        np.log10(len(counts)), top16, float(np.mean(gm == 0)), float(np.mean(gm <= 6)),
        float(np.mean(edges)), float(np.mean(gm > 150)), *hist,
        float(sat.mean()), float(sat.std()), float(np.mean(sat > 0.5)), float(np.mean(mx - mn < 8)),
        float(mx.mean() / 255), float(mx.std() / 255), float(np.mean(mn > 240)), float(np.mean(mx < 16)),
        axis, float(np.median(lap[busy[: lap.shape[0], : lap.shape[1]]])) if busy.any() else 0.0,
        float(lap.mean() / (gm.mean() + 1e-3)), np.log10(runs), z2 / (z1 + 1e-3),
    ], dtype=np.float32)


def features_for(paths: list[str], cache: Path) -> pd.DataFrame:
    """``kind_features`` of every path, read from and added to ``cache/features.csv``."""
    file = cache / "features.csv"
    have = pd.read_csv(file) if file.exists() else pd.DataFrame(columns=["path", *FEATURES])
    todo = sorted(set(paths) - set(have["path"]))
    if todo:
        rows = []
        for i, p in enumerate(todo):
            with Image.open(p) as im:
                rows.append([p, *kind_features(np.asarray(im.convert("RGB")))])
            if (i + 1) % 500 == 0:
                print(f"  features {i + 1}/{len(todo)}", flush=True)
        have = pd.concat([have, pd.DataFrame(rows, columns=["path", *FEATURES])], ignore_index=True)
        cache.mkdir(parents=True, exist_ok=True)
        have.to_csv(file, index=False)
    return have.set_index("path").loc[paths].reset_index()


def cnn_features_for(paths: list[str], cache: Path) -> pd.DataFrame:
    """The shipped cnn's crop features (``DegradationNet.crop_features`` on its 24 crops), mean and
    standard deviation over the crops, of every path; read from and added to
    ``cache/cnn_features-VERSION.csv`` (the weights' version: features of other weights are
    never read back)."""
    from collapseguard.detectors import create

    det = create("cnn")
    file = cache / f"cnn_features-{det.version}.csv"
    have = pd.read_csv(file) if file.exists() else None
    done = set() if have is None else set(have["path"])
    todo = sorted(set(paths) - done)
    if todo:
        import torch

        from collapseguard.detectors.crops import image_crops

        torch.set_num_threads(1)
        rows = []
        with torch.inference_mode():
            for i, p in enumerate(todo):
                with Image.open(p) as im:
                    crops = image_crops(np.asarray(im.convert("RGB")), det.net.config.crop_size, det.n_crops)
                f = det.net.crop_features(torch.from_numpy(crops[None]))[0].numpy()
                rows.append([p, *f.mean(axis=0), *f.std(axis=0)])
                if (i + 1) % 500 == 0:
                    print(f"  cnn features {i + 1}/{len(todo)}", flush=True)
        d = len(rows[0]) - 1
        new = pd.DataFrame(rows, columns=["path", *[f"cnn{j}" for j in range(d)]])
        have = new if have is None else pd.concat([have, new], ignore_index=True)
        cache.mkdir(parents=True, exist_ok=True)
        have.to_csv(file, index=False)
    return have.set_index("path").loc[paths].reset_index()


def predictor():
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(max_iter=200, learning_rate=0.08, max_leaf_nodes=15,
                                          l2_regularization=1.0, class_weight="balanced", random_state=0)


# -- thresholds -----------------------------------------------------------------------------------

def threshold(scores: np.ndarray, confidence: float, alpha: float = ALPHA,
              rule: str = "bound") -> tuple[float, int, int, float]:
    """(threshold, n, k, guaranteed rate): the k-th largest score, k >= 1, with the bound's k
    (``rule="bound"``) or k = ceil(alpha * n), the plain empirical quantile (``"quantile"``, whose
    guarantee at ``confidence`` is the rate printed)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))[::-1]
    n = len(s)
    if rule == "bound":
        k = max(1, order_statistic_rank(n, alpha, confidence))
    else:
        k = max(1, int(np.ceil(alpha * n)))
    return float(s[k - 1]), n, k, guaranteed_rate(n, k, confidence)


def units(clean: pd.DataFrame, how: str) -> pd.DataFrame:
    """The calibration's clean scores: one per picture (its highest) or every image."""
    if how == "images":
        return clean
    return clean.groupby("picture", as_index=False).agg(score=("score", "max"), kind=("kind", "first"))


# -- data -------------------------------------------------------------------------------------------

def web_scores(manifest: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """The web-history set's ``png`` and ``jpeg90`` scores in the manifest's row order, from a
    ``name,png,jpeg90`` table or from a ``path,score`` cache (``recipes/judge_cnn.py --cache``,
    ``benchmarks/signals.py``) that holds the manifest's paths. A picture without a score is an
    error, not a NaN that would drop out of every share."""
    if {"path", "score"} <= set(scores.columns):
        by_path = scores.drop_duplicates("path").set_index("path")["score"]
        out = pd.DataFrame({c: by_path.reindex(manifest[c]).to_numpy() for c in ("png", "jpeg90")})
    else:
        out = scores.set_index("name").reindex(manifest["name"])[["png", "jpeg90"]].reset_index(drop=True)
    missing = out.isna().any(axis=1)
    if missing.any():
        raise SystemExit(f"no web-history score for {int(missing.sum())} of {len(out)} pictures "
                         f"(e.g. {manifest['name'][missing].iloc[0]!r})")
    return out


def load(args) -> pd.DataFrame:
    """One row per image: picture, package, kind, set (web_png, web_jpeg90, step0, step10),
    storage, family, score, path."""
    ev = Path(args.eval)
    sources = pd.read_csv(ev / "sources.csv").set_index("name")
    m = pd.read_csv(ev / "stored" / "manifest.csv")
    m["path"] = str(ev / "stored") + "/" + m["path"]
    cached = pd.read_csv(args.scores)
    m = m.merge(cached, on="path")
    m = m[m["step"].isin([0, 10]) & m["storage"].isin(["png", "jpeg q90 4:2:0"])]
    m["picture"] = m["source_image"].str.split("@").str[0]
    rows = pd.DataFrame({"picture": m["picture"], "kind": m["kind"], "family": m["family"],
                         "set": np.where(m["step"] == 0, "step0", "step10"),
                         "storage": np.where(m["storage"] == "png", "png", "jpeg90"),
                         "score": m["score"], "path": m["path"]})
    web = Path(args.web)
    wm = pd.read_csv(web / "manifest.csv")
    ws = web_scores(wm, pd.read_csv(args.web_scores or web / "scores_shipped.csv"))
    for col in ("png", "jpeg90"):
        rows = pd.concat([rows, pd.DataFrame({
            "picture": wm["name"], "kind": wm["kind"], "family": "", "set": "web_" + col,
            "storage": col, "score": ws[col].to_numpy(), "path": wm[col]})],
            ignore_index=True)
    rows["package"] = sources.loc[rows["picture"], "package"].to_numpy()
    rows["fine_kind"] = rows["kind"]
    rows["kind"] = rows["kind"].map(COARSE)
    return rows.reset_index(drop=True)


def folds(rows: pd.DataFrame, k: int, by: str = "package") -> np.ndarray:
    """A fold per row, grouped by ``by`` (package or picture; balanced by picture count,
    deterministic)."""
    pics = rows.groupby(by)["picture"].nunique().sort_values(ascending=False)
    if by == "picture":  # no order by size: spread the kinds over the folds
        pics = pics.sort_index()
    load_, fold_of = np.zeros(k), {}
    for pkg, n in pics.items():  # largest first into the emptiest fold
        f = int(np.argmin(load_))
        fold_of[pkg] = f
        load_[f] += n
    return rows[by].map(fold_of).to_numpy()


# -- the experiment ---------------------------------------------------------------------------------

def run(args) -> None:
    rows = load(args)
    parts = []
    if args.features in ("hand", "both"):
        parts.append(features_for(rows["path"].tolist(), Path(args.cache))[list(FEATURES)].to_numpy(np.float32))
    if args.features in ("cnn", "both"):
        parts.append(cnn_features_for(rows["path"].tolist(), Path(args.cache)).iloc[:, 1:].to_numpy(np.float32))
    X = np.concatenate(parts, axis=1)
    rows["fold"] = folds(rows, args.folds, args.split)
    clean_sets = ("web_png", "web_jpeg90", "step0")
    is_clean = rows["set"].isin(clean_sets).to_numpy()
    G = len(KINDS)
    each = 1.0 - (1.0 - CONFIDENCE) / G
    rows["pred"] = ""
    decisions = {m: np.zeros(len(rows), bool) for m in
                 ("shipped", "pooled", "kind-safe", "per-kind oracle", "per-kind predicted")}
    thr_log = []
    for f in range(args.folds):
        test = (rows["fold"] == f).to_numpy()
        train = ~test & is_clean
        clf = predictor().fit(X[train], rows.loc[train, "kind"])
        rows.loc[test, "pred"] = clf.predict(X[test])
        cal = units(rows[train], args.units)
        t_pool = threshold(cal["score"], CONFIDENCE, args.alpha, args.rule)
        t_kind = {k: threshold(cal.loc[cal["kind"] == k, "score"], each, args.alpha, args.rule) for k in KINDS
                  if (cal["kind"] == k).any()}
        t_safe = max(t[0] for t in t_kind.values())
        thr_log.append((f, t_pool, t_kind))
        s = rows.loc[test, "score"].to_numpy()
        fallback = t_safe  # a kind the calibration folds lack: the kind-safe threshold
        decisions["shipped"][test] = s > args.threshold
        decisions["pooled"][test] = s > t_pool[0]
        decisions["kind-safe"][test] = s > t_safe
        decisions["per-kind oracle"][test] = s > np.array(
            [t_kind.get(k, (fallback,))[0] for k in rows.loc[test, "kind"]])
        decisions["per-kind predicted"][test] = s > np.array(
            [t_kind.get(k, (fallback,))[0] for k in rows.loc[test, "pred"]])

    # one threshold over every clean image reported on, set to drop the same share of them as the
    # per-kind oracle thresholds do: tuned on the reported images, so it flatters the pooled side
    share = float(decisions["per-kind oracle"][is_clean].mean())
    t_same = float(np.quantile(rows.loc[is_clean, "score"], 1.0 - share))
    decisions["pooled @ oracle's clean share"] = rows["score"].to_numpy() > t_same

    print(f"{len(rows)} images of {rows['picture'].nunique()} pictures from {rows['package'].nunique()} "
          f"packages; {args.folds} folds grouped by {args.split}; predictor features: {args.features}; "
          f"units: {args.units}; rule: {args.rule}; alpha {args.alpha:g}, "
          f"confidence {CONFIDENCE:g} pooled, {each:.4f} per kind (Bonferroni over {G} kinds)")
    print(f"pictures per kind: {rows.groupby('kind')['picture'].nunique().to_dict()}; the bound "
          f"needs {int(np.ceil(np.log(1 - CONFIDENCE) / np.log(1 - args.alpha)))} pooled and "
          f"{int(np.ceil(np.log(1 - each) / np.log(1 - args.alpha)))} per kind")

    print("\n## Thresholds per fold (value, n, k, guaranteed false-drop rate)\n")
    print("| fold | pooled | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * G)
    def cell(t):
        return f"{t[0]:.2f} (n {t[1]}, k {t[2]}, {100 * t[3]:.1f}%)"

    for f, tp, tk in thr_log:
        print(f"| {f} | {cell(tp)} | " + " | ".join(cell(tk[k]) if k in tk else "-" for k in KINDS) + " |")

    print("\n## Kind predictor: confusion on held-out pictures (rows true, columns predicted)\n")
    for label, sel in (("clean images (web history + step 0)", is_clean),
                       ("step-10 images", (rows["set"] == "step10").to_numpy())):
        sub = rows[sel]
        cm = pd.crosstab(sub["kind"], sub["pred"]).reindex(index=list(KINDS), columns=list(KINDS),
                                                            fill_value=0)
        acc = float(np.mean(sub["kind"] == sub["pred"]))
        print(f"{label}: accuracy {100 * acc:.1f}% of {len(sub)}\n")
        print("| true \\ predicted | " + " | ".join(KINDS) + " |")
        print("|---|" + "---|" * G)
        for k in KINDS:
            print(f"| {k} | " + " | ".join(str(int(v)) for v in cm.loc[k]) + " |")
        print()

    print("## Clean share dropped per kind: web history PNG / web history JPEG q90 / step 0 (PNG+JPEG q90)\n")
    methods = list(decisions)
    print("| kind | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for k in (*KINDS, "all", "worst kind"):
        cells = []
        for m in methods:
            parts = []
            for st in clean_sets:
                if k == "worst kind":
                    sel_k = [(rows["set"] == st) & (rows["kind"] == kk) for kk in KINDS]
                    parts.append(max(100 * decisions[m][s_.to_numpy()].mean() for s_ in sel_k))
                    continue
                sel = (rows["set"] == st) & ((rows["kind"] == k) if k != "all" else True)
                parts.append(100 * decisions[m][sel.to_numpy()].mean())
            cells.append(" / ".join(f"{p:.1f}" for p in parts))
        print(f"| {k} | " + " | ".join(cells) + " |")

    print("\n## Step-10 share dropped per family (PNG and JPEG q90)\n")
    print("| family | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    s10 = rows["set"] == "step10"
    fams = sorted(rows.loc[s10, "family"].unique())
    per = {m: [100 * decisions[m][(s10 & (rows["family"] == ff)).to_numpy()].mean() for ff in fams]
           for m in methods}
    for i, fam in enumerate(fams):
        print(f"| {fam} | " + " | ".join(f"{per[m][i]:.1f}" for m in methods) + " |")
    print("| family mean | " + " | ".join(f"{np.mean(per[m]):.1f}" for m in methods) + " |")
    print("| worst family | " + " | ".join(f"{min(per[m]):.1f}" for m in methods) + " |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval", default="/work/data/eval")
    p.add_argument("--scores", default="/work/data/signals/cnn-49cd8979952f.csv")
    p.add_argument("--web", default="/work/data/web_history")
    p.add_argument("--web-scores", default=None,
                   help="the web-history set's scores: name,png,jpeg90 or a path,score cache "
                        "(default WEB/scores_shipped.csv)")
    p.add_argument("--threshold", type=float, default=SHIPPED_THRESHOLD,
                   help="the threshold the 'shipped' column applies (default: that of the weights "
                        "--scores holds by default, 49cd8979952f)")
    p.add_argument("--cache", default="/work/data/kinds")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--units", choices=("pictures", "images"), default="pictures")
    p.add_argument("--rule", choices=("bound", "quantile"), default="bound")
    p.add_argument("--alpha", type=float, default=ALPHA)
    p.add_argument("--split", choices=("package", "picture"), default="package")
    p.add_argument("--features", choices=("hand", "cnn", "both"), default="both")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run(args)


if __name__ == "__main__":
    main()
