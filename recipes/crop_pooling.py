"""Context and coverage without retraining: more crops, other poolings and a downscaled whole-image
view, each against the shipped cnn on the same images.

    nice -n 15 python recipes/crop_pooling.py [--eval /work/data/eval] [--web /work/data/web_history]
        [--chains-per-cell 4] [--max-tiles 96] [--cache /work/data/kinds/pooling2.csv]

Images: a stratified subset of the evaluation set (``--chains-per-cell`` chains of every family x
kind, PNG storage, steps 0, 5 and 10; the chains are the first by a hash of their id) and the
web-history clean set (every picture as PNG and as JPEG q90). Each image is read by the shipped
weights in three ways:

- ``grid24``: the shipped score (24 crops of 48 px on ``crops.crop_grid``; crop logits pooled by
  the net's mean + soft maximum, plus its context term over the crops), and its two parts:
  ``grid24.crops`` (the pooled crop logits) and ``grid24.context`` (the context term);
- ``dense``: a tiling of the whole image (``crop_grid`` with as many crops as 48 px tiles fit,
  at most ``--max-tiles``), pooled by the net's own formula (``dense.net``) and by plain
  statistics of the crop logits: mean, max, 90th and 75th percentile, 10-90 % trimmed mean, and
  the spread (standard deviation);
- ``whole``: the net's score of the image downscaled (Lanczos) to 144 px on its longer side,
  9 crops; and ``grid24-whole``, the native score less the whole-view score.

Printed per reading: family-mean and worst-family AUROC step 0 vs 5 on the evaluation subset, the
spread of the step-0 medians across the evaluation set's 12 kinds (max - min, and in units of the
step-0 standard deviation), and the worst clean kind's share dropped on the web-history set at a
threshold that drops the same share of all clean images (web history + step 0) as the shipped
threshold drops of the shipped score (so each reading is judged at the same overall clean cost).
Per-image results are cached in ``--cache``; a rerun scores only what is new.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

from collapseguard.calibration.thresholds import default_calibration
from collapseguard.detectors import create
from collapseguard.detectors.crops import image_crops
from collapseguard.evaluation.metrics import auroc

CROP = 48
WHOLE_SIDE, WHOLE_CROPS = 144, 9
READINGS = ("grid24", "grid24.crops", "grid24.context", "dense.net", "dense.mean", "dense.max", "dense.q90", "dense.q75",
            "dense.trim", "dense.std", "whole", "grid24-whole")


def subset(eval_dir: Path, per_cell: int) -> pd.DataFrame:
    m = pd.read_csv(eval_dir / "stored" / "manifest.csv")
    m = m[(m["storage"] == "png") & m["step"].isin([0, 5, 10])].copy()
    m["path"] = str(eval_dir / "stored") + "/" + m["path"]
    chains = m.drop_duplicates("chain_id")[["chain_id", "family", "kind"]].copy()
    chains["h"] = [hashlib.sha1(c.encode()).hexdigest() for c in chains["chain_id"]]
    keep = chains.sort_values("h").groupby(["family", "kind"]).head(per_cell)["chain_id"]
    m = m[m["chain_id"].isin(set(keep))]
    return pd.DataFrame({"path": m["path"], "set": "eval", "family": m["family"], "kind": m["kind"],
                         "step": m["step"], "chain": m["chain_id"]})


def web_rows(web: Path) -> pd.DataFrame:
    wm = pd.read_csv(web / "manifest.csv")
    return pd.concat([pd.DataFrame({"path": wm[c], "set": "web_" + c, "family": "", "kind": wm["kind"],
                                    "step": 0, "chain": wm["name"]}) for c in ("png", "jpeg90")],
                     ignore_index=True)


@torch.inference_mode()
def read(net, img: np.ndarray, max_tiles: int) -> dict:
    """Every reading of one image (``READINGS``)."""
    parts = {}

    def net_score(crops: np.ndarray) -> tuple[float, np.ndarray]:
        x = torch.from_numpy(np.ascontiguousarray(crops[None]))
        f = net.crop_features(x)
        logits = net.head(f).squeeze(-1)
        s = net.aggregate(logits)
        parts["crops"], parts["context"] = float(s[0]), 0.0
        if net.config.context:
            parts["context"] = float(net.context_logit(f)[0])
            s = s + parts["context"]
        return float(s[0]), logits[0].numpy()

    out = {}
    out["grid24"], _ = net_score(image_crops(img, CROP, 24))
    out["grid24.crops"], out["grid24.context"] = parts["crops"], parts["context"]
    h, w = img.shape[:2]
    n = int(min(max_tiles, max(2, int(np.ceil(h / CROP)) * int(np.ceil(w / CROP)))))
    out["dense.net"], lg = net_score(image_crops(img, CROP, n))
    out["dense.mean"], out["dense.max"] = float(lg.mean()), float(lg.max())
    out["dense.q90"], out["dense.q75"] = float(np.quantile(lg, 0.9)), float(np.quantile(lg, 0.75))
    lo, hi = np.quantile(lg, [0.1, 0.9])
    mid = lg[(lg >= lo) & (lg <= hi)]
    out["dense.trim"] = float(mid.mean()) if len(mid) else float(lg.mean())
    out["dense.std"] = float(lg.std())
    scale = WHOLE_SIDE / max(h, w)
    small = np.asarray(Image.fromarray(img).resize((max(CROP, round(w * scale)), max(CROP, round(h * scale))),
                                                   Image.LANCZOS))
    out["whole"], _ = net_score(image_crops(small, CROP, WHOLE_CROPS))
    out["grid24-whole"] = out["grid24"] - out["whole"]
    out["tiles"] = n
    return out


def scored(rows: pd.DataFrame, cache: Path, max_tiles: int) -> pd.DataFrame:
    have = pd.read_csv(cache) if cache.exists() else pd.DataFrame(columns=["path"])
    todo = [p for p in dict.fromkeys(rows["path"]) if p not in set(have["path"])]
    if todo:
        torch.set_num_threads(1)
        net = create("cnn").net.eval()
        new = []
        for i, p in enumerate(todo):
            with Image.open(p) as im:
                new.append({"path": p, **read(net, np.asarray(im.convert("RGB")), max_tiles)})
            if (i + 1) % 100 == 0 or i + 1 == len(todo):
                print(f"  scored {i + 1}/{len(todo)}", flush=True)
                have = pd.concat([have, pd.DataFrame(new)], ignore_index=True)
                new = []
                cache.parent.mkdir(parents=True, exist_ok=True)
                have.to_csv(cache, index=False)
    return rows.merge(have, on="path", how="left")


def family_mean_auroc(ev: pd.DataFrame, reading: str) -> float:
    per = []
    for _, e in ev.groupby("family"):
        per.append(auroc(e.loc[e["step"] == 0, reading].to_numpy(), e.loc[e["step"] == 5, reading].to_numpy()))
    return float(np.mean(per))


def bootstrap_gain(ev: pd.DataFrame, reading: str, n: int = 200, seed: int = 0) -> tuple[float, float]:
    """90 % interval of (reading - grid24) family-mean AUROC 0v5, chains resampled within families."""
    rng = np.random.default_rng(seed)
    groups = {fam: {c: g for c, g in e.groupby("chain")} for fam, e in ev.groupby("family")}
    gains = []
    for _ in range(n):
        parts = []
        for chains in groups.values():
            ids = list(chains)
            pick = rng.choice(len(ids), len(ids), replace=True)
            parts += [chains[ids[i]] for i in pick]
        b = pd.concat(parts, ignore_index=True)
        gains.append(family_mean_auroc(b, reading) - family_mean_auroc(b, "grid24"))
    lo, hi = np.quantile(gains, [0.05, 0.95])
    return float(lo), float(hi)


def shipped() -> tuple[str, float]:
    """The packaged weights' version and their shipped threshold."""
    version = create("cnn").version
    cal = default_calibration("cnn", version)
    if cal is None:
        raise SystemExit(f"no packaged calibration for cnn {version}")
    return version, float(cal.threshold)


def table(df: pd.DataFrame, shipped_threshold: float) -> None:
    ev = df[df["set"] == "eval"]
    clean = pd.concat([ev[ev["step"] == 0], df[df["set"] != "eval"]])
    pooled_share = float(np.mean(clean["grid24"] > shipped_threshold))
    fams = sorted(ev["family"].unique())
    print(f"{len(ev)} evaluation images ({ev['family'].nunique()} families x {ev['kind'].nunique()} kinds, "
          f"PNG, steps 0/5/10), {int((df['set'] != 'eval').sum())} web-history images; shipped threshold "
          f"{shipped_threshold:.4f} drops {100 * pooled_share:.1f}% of all clean images; each reading is "
          f"thresholded at the same overall clean share\n")
    print("| reading | family-mean AUROC 0v5 [gain over grid24, 90% bootstrap] | worst family (AUROC) | "
          "step-0 kind-median spread (raw / in step-0 sd) | worst web-history kind dropped (PNG / JPEG q90) |")
    print("|---|---|---|---|---|")
    for r in READINGS:
        per = {}
        for fam in fams:
            e = ev[ev["family"] == fam]
            a, b = e.loc[e["step"] == 0, r].to_numpy(), e.loc[e["step"] == 5, r].to_numpy()
            per[fam] = auroc(a, b)
        worst = min(per, key=per.get)
        s0 = ev[ev["step"] == 0]
        med = s0.groupby("kind")[r].median()
        spread = float(med.max() - med.min())
        t = (shipped_threshold if r == "grid24"
             else float(np.quantile(clean[r], 1.0 - pooled_share)))
        worst_kind = []
        for st in ("web_png", "web_jpeg90"):
            w = df[df["set"] == st]
            share = (w[r] > t).groupby(w["kind"]).mean()
            k = share.idxmax()
            worst_kind.append(f"{100 * share.max():.1f}% {k} ({int((w.loc[w['kind'] == k, r] > t).sum())}"
                              f"/{int((w['kind'] == k).sum())})")
        gain = "" if r == "grid24" else " [{:+.3f}, {:+.3f}]".format(*bootstrap_gain(ev, r))
        print(f"| {r} | {np.mean(list(per.values())):.3f}{gain} | {worst} ({per[worst]:.3f}) | "
              f"{spread:.2f} / {spread / float(s0[r].std()):.2f} ({med.idxmin()} .. {med.idxmax()}) | "
              f"{' / '.join(worst_kind)} |")
    print("\nAUROC 0v5 per family\n")
    print("| reading | " + " | ".join(fams) + " |")
    print("|---|" + "---|" * len(fams))
    for r in READINGS:
        cells = []
        for fam in fams:
            e = ev[ev["family"] == fam]
            cells.append(f"{auroc(e.loc[e['step'] == 0, r].to_numpy(), e.loc[e['step'] == 5, r].to_numpy()):.3f}")
        print(f"| {r} | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval", default="/work/data/eval")
    p.add_argument("--web", default="/work/data/web_history")
    p.add_argument("--chains-per-cell", type=int, default=4)
    p.add_argument("--max-tiles", type=int, default=96)
    p.add_argument("--cache", default="/work/data/kinds/pooling2.csv",
                   help="per-image cache; the packaged weights' version is added to its name")
    p.add_argument("--no-web", action="store_true", help="the evaluation subset only")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = subset(Path(args.eval), args.chains_per_cell)
    if not args.no_web:
        rows = pd.concat([rows, web_rows(Path(args.web))], ignore_index=True)
    version, thr = shipped()
    cache = Path(args.cache)
    cache = cache.with_name(f"{cache.stem}-{version}{cache.suffix}")
    df = scored(rows, cache, args.max_tiles)
    table(df.dropna(subset=["grid24"]), thr)


if __name__ == "__main__":
    main()
