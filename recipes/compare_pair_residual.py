"""Full-reference pair features against the packaged comparator, per family, leave one family out.

    python recipes/compare_pair_residual.py EVAL/chains --work WORK [--families F,G,...] [--mix-shipped]

For each chain of the evaluation set's chains as made (EVAL/chains/manifest_<family>.csv, PNG),
the pairs (step 0, step 5), (step 0, step 10) and (step 1, step 5) are set side by side, the
later step resized onto the earlier one (Lanczos) where a family changed the size. Per pair
(cached in WORK, a file per family keyed by its manifest and the comparator):

- ``comp``: the packaged comparator's logit of P(later step worse);
- ``dh``: the change of the luminance's log Laplacian energy (fine detail and noise);
- ``r``: where the difference lies, the log ratio of the difference's high-pass energy at the
  20% strongest edges of the smoother copy to that at its 30% flattest pixels: near 1 for noise
  and dots (everywhere), 3-10 for smoothing and re-rendering (at edges and texture);
- ``dj``: the change of the log JPEG q90 size of the luminance (how much there is to code);
- ``dsat``, ``dstd``, ``dmean``: saturation, log contrast and brightness changes;
- with ``--mix-shipped``, ``wh``: the shipped detector's ``cnn`` score change.

The products ``dh * r`` and ``dj * r`` let a linear model read more detail as damage where the
difference is spread like noise and less detail as damage where it follows edges, which one
weight per per-image feature cannot (docs/history/comparator_history.md). For each set of inputs
it prints, per family, the share of pairs ordered right by a logistic model without intercept
(both orders of every pair) fitted on the other families' pairs: leave one family out, so a
family is never ranked by weights that saw it. ``comp`` alone is the packaged comparator as is.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from scipy import ndimage

PAIRS = ((0, 5), (0, 10), (1, 5))
SETS = {
    "comp": ["comp"],
    "pair": ["dh", "dhr"],
    "comp+pair": ["comp", "dh", "dhr"],
    "comp+pair+tone": ["comp", "dh", "dhr", "dsat", "dstd", "dmean"],
    "comp+jpeg": ["comp", "dj", "djr"],
    "comp+jpeg+pair": ["comp", "dj", "djr", "dh", "dhr"],
}
MIX_SETS = {"wh": ["wh"], "comp+wh": ["comp", "wh"], "comp+wh+jpeg": ["comp", "wh", "dj", "djr"]}


def _as_float(img: np.ndarray, size=None) -> np.ndarray:
    """``img`` (RGB uint8) as float in [0, 1], resized (Lanczos) to ``size`` (w, h) if it differs."""
    if size is not None and (img.shape[1], img.shape[0]) != size:
        img = np.asarray(Image.fromarray(img).resize(size, Image.Resampling.LANCZOS))
    return img.astype(np.float32) / 255.0


def _lum(x):
    return 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]


def _hf(y) -> float:
    lap = ndimage.laplace(y)
    return float(np.log((lap * lap).mean() + 1e-6))


def _jpeg_size(y) -> float:
    bio = io.BytesIO()
    Image.fromarray((np.clip(y, 0, 1) * 255 + 0.5).astype(np.uint8)).save(bio, "JPEG", quality=90)
    return float(np.log(len(bio.getvalue())))


def pair_features(img_a: np.ndarray, img_b: np.ndarray) -> dict:
    """The module text's features of one pair of RGB uint8 images (``b`` the later step)."""
    a = _as_float(img_a)
    b = _as_float(img_b, (a.shape[1], a.shape[0]))
    ya, yb = _lum(a), _lum(b)
    d = yb - ya
    smoother = ya if _hf(ya) < _hf(yb) else yb
    g = ndimage.gaussian_gradient_magnitude(smoother, 1.0)
    dd = d - ndimage.gaussian_filter(d, 1.5)
    e = ndimage.uniform_filter(dd * dd, 5)
    flat, edge = np.quantile(g, [0.3, 0.8])
    r = float(np.log((e[g >= edge].mean() + 1e-9) / (e[g <= flat].mean() + 1e-9)))
    sat = lambda x: float((x.max(-1) - x.min(-1)).mean())  # noqa: E731
    return {"dh": _hf(yb) - _hf(ya), "r": r, "dj": _jpeg_size(yb) - _jpeg_size(ya),
            "dsat": sat(b) - sat(a), "dmean": float(yb.mean() - ya.mean()),
            "dstd": float(np.log(yb.std() + 1e-6) - np.log(ya.std() + 1e-6))}


_COMP = _SHIPPED = None


def _job(args) -> dict:
    global _COMP, _SHIPPED
    from collapseguard.detectors.base import create
    from collapseguard.detectors.compare import Comparator

    fam, chain, sa, sb, pa, pb, mix = args
    if _COMP is None:
        _COMP = Comparator()
        _SHIPPED = create("cnn") if mix else None
    imgs = [np.asarray(Image.open(p).convert("RGB")) for p in (pa, pb)]
    p = _COMP.prob(*_COMP.describe(imgs))
    out = {"family": fam, "chain": chain, "sa": sa, "sb": sb, **pair_features(*imgs),
           "comp": float(np.log(p + 1e-12) - np.log(1 - p + 1e-12))}
    if _SHIPPED is not None:
        s = _SHIPPED.score(imgs)
        out["wh"] = float(s[1] - s[0])
    return out


def leave_one_family_out(df: pd.DataFrame, sets: dict) -> pd.DataFrame:
    """Per family and pair kind (``0v5+``: step 0 against 5 and 10; ``1v5``), the share of pairs
    whose fitted logit is positive, each family ranked by a fit on the others."""
    from sklearn.linear_model import LogisticRegression

    df = df.assign(dhr=df["dh"] * df["r"], djr=df["dj"] * df["r"])
    res = {}
    for name, cols in sets.items():
        for fam in sorted(df["family"].unique()):
            tr, te = df[df["family"] != fam], df[df["family"] == fam]
            if len(cols) == 1:
                w = np.ones(1)  # one score as is: its sign orders the pair
            else:
                x = tr[cols].to_numpy()
                m = LogisticRegression(fit_intercept=False, max_iter=1000).fit(
                    np.vstack([x, -x]), np.r_[np.ones(len(x)), np.zeros(len(x))])
                w = m.coef_[0]
            z = te[cols].to_numpy() @ w
            res[(fam, "0v5+", name)] = float(np.mean(z[te["sa"].to_numpy() == 0] > 0))
            res[(fam, "1v5", name)] = float(np.mean(z[te["sa"].to_numpy() == 1] > 0))
    return pd.Series(res).unstack(2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("chains", help="the evaluation set's chains folder (EVAL/chains)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--families", default="", help="comma-separated (default: every manifest_<family>.csv)")
    ap.add_argument("--mix-shipped", action="store_true", help="also the shipped cnn's score change (wh)")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    root, work = Path(args.chains), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    fams = [f for f in args.families.split(",") if f] or sorted(
        p.stem[len("manifest_"):] for p in root.glob("manifest_*.csv"))
    from collapseguard.detectors.compare import Comparator

    comp_version = Comparator().version
    frames = []
    for fam in fams:
        # one file per family, keyed by what its rows depend on: the manifest (path and bytes), the
        # comparator's weights and cnn, and whether the shipped cnn's column was asked for
        manifest = root / f"manifest_{fam}.csv"
        key = hashlib.sha256(repr((str(manifest.resolve()), hashlib.sha256(manifest.read_bytes()).hexdigest(),
                                   comp_version, args.mix_shipped)).encode()).hexdigest()[:12]
        cache = work / f"pairs-{fam}-{key}.csv"
        if cache.exists():
            frames.append(pd.read_csv(cache))
            continue
        m = pd.read_csv(manifest)
        jobs = []
        for chain, g in m.groupby("chain_id"):
            path = dict(zip(g["step"], g["path"]))
            jobs += [(fam, chain, sa, sb, str(root / path[sa]), str(root / path[sb]), args.mix_shipped)
                     for sa, sb in PAIRS if sa in path and sb in path]
        if not jobs:
            continue
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as ex:
                new = pd.DataFrame(list(ex.map(_job, jobs, chunksize=4)))
        else:
            new = pd.DataFrame([_job(j) for j in jobs])
        new.to_csv(cache, index=False)
        frames.append(new)
    if not frames:
        ap.error(f"no chain pairs (steps {PAIRS}) in {root} for {', '.join(fams)}")
    df = pd.concat(frames, ignore_index=True)
    df = df[df["family"].isin(fams)]
    late = df[df["sa"] == 0]
    print("step 0 against steps 5 and 10: share with more fine detail (dh > 0), a larger JPEG (dj > 0), "
          "median r")
    print(late.groupby("family").agg(dh_up=("dh", lambda v: (v > 0).mean()), dj_up=("dj", lambda v: (v > 0).mean()),
                                     r_median=("r", "median")).round(2).to_string())
    sets = {**SETS, **(MIX_SETS if args.mix_shipped else {})}
    table = leave_one_family_out(df, sets)
    pd.set_option("display.width", 250)
    print(table.round(3).to_string())
    for kind in ("0v5+", "1v5"):
        t = table.xs(kind, level=1)
        print(f"{kind} worst: " + ", ".join(f"{c} {t[c].min():.3f} ({t[c].idxmin()})" for c in t.columns))
        print(f"{kind} mean:  " + ", ".join(f"{c} {t[c].mean():.3f}" for c in t.columns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
