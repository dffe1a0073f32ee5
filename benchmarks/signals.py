"""Training-free signals (`npr`, `fixedpoint`) beside the `cnn`, and fused with it, on families a
fusion never saw.

    python benchmarks/signals.py [--manifest EVAL/stored/manifest.csv [--manifest MORE.csv]]
        [--storage png --storage "jpeg q90 4:2:0"] [--sources 120] [--fit-families A,B,...]
        [--web-history WEB/manifest.csv] [--cache /work/data/signals]

On the evaluation set's chains (recipes/eval_set.sh) in the storages asked for, every family:
AUROC step 0 vs 5 and 0 vs 10 of each signal alone, and of logistic regressions on the cnn score
plus the new signals, each fitted leave-one-family-out (fitted on the other families' step 0
against steps 5 and 10, then scoring the held-out family), so a fused figure is a held-out figure;
and of a fit-free fusion, the larger of the cnn's and npr's robust z-scores against the other
families' step-0 scores. With --fit-families, the fusions of a family outside that list are fitted
on all of its families (e.g. the simulated ones, scoring held-out networks); a chain that more
than one --manifest lists is read from the first.
With --web-history (a manifest with a kind and a `png`/`jpeg90` path per clean picture): the share
of those clean pictures that score above the 99th percentile of the evaluation set's step-0
scores in the same storage (fusions fitted on every family), and the spread of the evaluation
set's step-0 medians across kinds, in units of the step-0 standard deviation. With
--resampled-cnn, the cnn's own fixed point joins the signals: ``cnnfp = cnn(R(x)) - cnn(x)``, R
one bicubic round trip to half size, alone and fused (``cnn+cnnfp``). Scores are cached per
detector version under --cache, so a rerun only scores what is new.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from collapseguard.detectors import create
from collapseguard.evaluation.metrics import auroc

SIGNALS = ("cnn", "npr", "fixedpoint")
#: fused score -> the columns its logistic regression reads
FUSIONS = {
    "cnn+npr": ["cnn", "npr"],
    "cnn+fixedpoint": ["cnn", "fixedpoint"],
    "cnn+both": ["cnn", "npr", "fixedpoint"],
    "cnn+parts": ["cnn", "npr.log_share", "npr.grid", "fixedpoint", "fixedpoint.log_e1"],
}
#: fit-free fusions: the largest of the signals, each as a robust z-score against the step-0 scores
#: of the other families (median and IQR), so a rise in either one flags the image
MAX_FUSIONS = {"max(cnn,npr)": ["cnn", "npr"]}
STORAGE_COLUMN = {"png": "png", "jpeg q90 4:2:0": "jpeg90"}


def load_rgb(path: str) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def load_resampled(path: str) -> np.ndarray:
    """The image after one more resampling: bicubic to half size and back."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        half = im.resize((max(1, w // 2), max(1, h // 2)), Image.BICUBIC)
        return np.asarray(half.resize((w, h), Image.BICUBIC))


def scored(paths: list[str], spec: str, cache: Path, batch: int = 16,
           load=load_rgb, tag: str = "") -> pd.DataFrame:
    """Scores (and detail columns) of ``paths`` by ``spec``, read from and added to the cache
    (``load`` reads an image; ``tag`` names a cache of another reading)."""
    det = create(spec)
    cache.mkdir(parents=True, exist_ok=True)
    file = cache / f"{spec}{tag}-{det.version}.csv"
    have = pd.read_csv(file) if file.exists() else pd.DataFrame(columns=["path"])
    todo = sorted(set(paths) - set(have["path"]))
    for i in range(0, len(todo), batch):
        part = todo[i:i + batch]
        out = det.score_detailed([load(p) for p in part])
        rows = pd.DataFrame({"path": part, **{k: np.asarray(v, dtype=np.float64) for k, v in out.items()}})
        rows.to_csv(file, mode="a", header=not file.exists() or file.stat().st_size == 0, index=False)
        done = min(i + batch, len(todo))
        if done == len(todo) or (i // batch) % 50 == 0:  # a line per 800 images, not per batch
            print(f"  {spec}{tag}: {done}/{len(todo)}", flush=True)
    if todo:
        have = pd.read_csv(file)
    have = have.drop_duplicates("path").set_index("path")
    return have.loc[paths]


def signal_table(paths: list[str], cache: Path, resampled: bool = False) -> pd.DataFrame:
    cols = {}
    for spec in SIGNALS:
        s = scored(paths, spec, cache)
        cols[spec] = s["score"].to_numpy()
        if spec == "npr":
            cols["npr.log_share"] = np.log(s["share"].to_numpy())
            cols["npr.grid"] = s["grid"].to_numpy()
        if spec == "fixedpoint":
            cols["fixedpoint.log_e1"] = np.log(s["e1"].to_numpy() + 0.05)
    if resampled:
        again = scored(paths, "cnn", cache, load=load_resampled, tag="R")["score"].to_numpy()
        cols["cnnfp"] = again - cols["cnn"]
    return pd.DataFrame(cols, index=paths)


def fit(frame: pd.DataFrame, cols: list[str]):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = frame[cols].to_numpy()
    y = (frame["step"] > 0).to_numpy().astype(int)
    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000)).fit(x, y)


def robust_z(ref: pd.DataFrame, frame: pd.DataFrame, cols: list[str]) -> np.ndarray:
    """Each column of ``frame`` against the step-0 rows of ``ref``: (x - median) / IQR."""
    base = ref[ref["step"] == 0]
    z = [(frame[c] - base[c].median()) / (base[c].quantile(0.75) - base[c].quantile(0.25) + 1e-9)
         for c in cols]
    return np.max(np.stack([np.asarray(v, dtype=np.float64) for v in z]), axis=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", action="append", default=None,
                    help="chain manifest(s) (default /work/data/eval/stored/manifest.csv)")
    ap.add_argument("--fit-families", default=None,
                    help="comma-separated families the fusions are fitted on (default: all)")
    ap.add_argument("--storage", action="append", default=None,
                    help="storage column value(s) to keep (default: png and jpeg q90 4:2:0)")
    ap.add_argument("--sources", type=int, default=120, help="at most this many sources per family")
    ap.add_argument("--web-history", default=None, help="clean web-history manifest (kind, png, jpeg90)")
    ap.add_argument("--resampled-cnn", action="store_true",
                    help="add cnnfp = cnn(R(x)) - cnn(x), R a bicubic round trip to half size")
    ap.add_argument("--cache", default="/work/data/signals")
    args = ap.parse_args()
    if args.resampled_cnn:
        FUSIONS["cnn+cnnfp"] = ["cnn", "cnnfp"]
    storages = args.storage or ["png", "jpeg q90 4:2:0"]
    cache = Path(args.cache)
    parts = []
    for man in args.manifest or ["/work/data/eval/stored/manifest.csv"]:
        part = pd.read_csv(man)
        part["file"] = [str(Path(man).parent / p) for p in part["path"]]
        parts.append(part)
    m = pd.concat(parts, ignore_index=True).drop_duplicates(["chain_id", "step", "storage"])
    m = m[m["storage"].isin(storages) & m["step"].isin([0, 5, 10])].copy()
    fit_fams = set(args.fit_families.split(",")) if args.fit_families else set(m["family"])
    keep = set()
    for fam, g in m.groupby("family"):
        keep |= {(fam, s) for s in sorted(g["source_image"].unique())[: args.sources]}
    m = m[[(f, s) in keep for f, s in zip(m["family"], m["source_image"])]]
    print(f"evaluation set: {len(m)} images, {m['chain_id'].nunique()} chains, storages {storages}")
    sig = signal_table(list(m["file"]), cache, args.resampled_cnn)
    m = pd.concat([m.reset_index(drop=True), sig.reset_index(drop=True)], axis=1)

    # held-out fusions: fit on the other families, score this one
    for name, cols in FUSIONS.items():
        m[name] = np.nan
        for fam in m["family"].unique():
            held = m["family"] == fam
            model = fit(m[~held & m["family"].isin(fit_fams)], cols)
            m.loc[held, name] = model.decision_function(m.loc[held, cols].to_numpy())
    for name, cols in MAX_FUSIONS.items():
        m[name] = np.nan
        for fam in m["family"].unique():
            held = m["family"] == fam
            m.loc[held, name] = robust_z(m[~held & m["family"].isin(fit_fams)], m[held], cols)
    names = list(SIGNALS) + ["cnnfp"] * args.resampled_cnn + list(FUSIONS) + list(MAX_FUSIONS)

    rows = []
    for (storage, fam), g in m.groupby(["storage", "family"]):
        r = {"storage": storage, "family": fam, "chains": g["chain_id"].nunique()}
        for n in names:
            for k in (5, 10):
                r[f"{n} 0v{k}"] = auroc(g.loc[g["step"] == 0, n], g.loc[g["step"] == k, n])
        rows.append(r)
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    for k in (5, 10):
        cols = [f"{n} 0v{k}" for n in names]
        t = table[["storage", "family", "chains", *cols]].copy()
        t.columns = ["storage", "family", "chains", *names]
        print(f"\nAUROC step 0 vs {k} (fusions: leave-one-family-out)")
        print(t.round(3).to_string(index=False))
        for storage, g in t.groupby("storage"):
            print(f"  {storage}: mean " + "  ".join(f"{n} {g[n].mean():.3f}" for n in names)
                  + "\n  " + " " * len(storage) + "  worst " + "  ".join(f"{n} {g[n].min():.3f}" for n in names))

    # content: spread of step-0 medians across kinds, in step-0 standard deviations
    print("\nstep-0 median by kind: spread (max - min) / step-0 SD, per storage")
    fitted_all = {name: fit(m[m["family"].isin(fit_fams)], cols) for name, cols in FUSIONS.items()}
    for name, cols in FUSIONS.items():  # in-sample fusions for the clean-set questions
        m[name] = fitted_all[name].decision_function(m[cols].to_numpy())
    for name, cols in MAX_FUSIONS.items():
        m[name] = robust_z(m[m["family"].isin(fit_fams)], m, cols)
    for storage, g in m[m["step"] == 0].groupby("storage"):
        med = g.groupby("kind")[names].median()
        print(f"  {storage}: " + "  ".join(f"{n} {(med[n].max() - med[n].min()) / g[n].std():.2f}" for n in names))

    if args.web_history:
        web = pd.read_csv(args.web_history)
        print(f"\nweb-history clean set: {len(web)} pictures, {web['kind'].nunique()} kinds; share above "
              "the evaluation set's step-0 99th percentile (same storage)")
        for storage in storages:
            col = STORAGE_COLUMN.get(storage)
            if col is None or col not in web:
                continue
            paths = [p for p in web[col] if isinstance(p, str) and Path(p).exists()]
            w = signal_table(paths, cache, args.resampled_cnn)
            for name, cols in FUSIONS.items():
                w[name] = fitted_all[name].decision_function(w[cols].to_numpy())
            for name, cols in MAX_FUSIONS.items():
                w[name] = robust_z(m[m["family"].isin(fit_fams)], w, cols)
            w["kind"] = web.set_index(col).loc[paths, "kind"].to_numpy()
            ref = m[(m["step"] == 0) & (m["storage"] == storage)]
            line = []
            worst = []
            for n in names:
                q = np.quantile(ref[n], 0.99)
                above = w[n] > q
                line.append(f"{n} {above.mean():.3f}")
                worst.append(f"{n} {above.groupby(w['kind']).mean().max():.3f}")
            print(f"  {storage}: all kinds " + "  ".join(line))
            print(f"  {' ' * len(storage)}  worst kind " + "  ".join(worst))


if __name__ == "__main__":
    main()
