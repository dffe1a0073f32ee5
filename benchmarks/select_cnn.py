"""Compare cnn weights on an independent set: the default calibration's chains and clean images.

    python benchmarks/select_cnn.py WEIGHTS [WEIGHTS ...] --work DIR
                                    [--n-crops N] [--out scores_dir] [--jpeg Q]
    python benchmarks/select_cnn.py --out scores_dir --from-scores V1 V2 --ensemble V1+V2

The set is made by ``recipes/make_default_calibration.sh`` (Debian ukui/plasma wallpapers and
procedural art of another seed, none of them used in training). This is where candidate weights
are compared before one is shipped: held-out sources of the training generator flatter a model
(docs/history/model_history.md). Printed per weights file: AUROC of step 0 vs steps 5, 10
and 20 (all chains, wallpaper-photo chains, art chains), and step 0 of every photo chain vs step 10
of each family's photo chains; the share of clean images (chain step 0
plus the extra clean folder) above the threshold that drops 95% of step-10 images; and the share
of step-5/10/20 images dropped at the empirical 99th percentile of the clean scores, at the highest
and second-highest clean score (where a 1% guarantee from a few hundred clean scores puts the
threshold), and at each ``--threshold`` (with the share of the set's distinct clean images above
it); and the share of the set's night-sky photos (clean/nightsky, see recipes/nightsky.sh) above
each of those cuts.

``--jpeg Q [--subsampling 444]`` re-encodes every image (chains and clean) as JPEG at quality Q (chroma
4:2:0 by default, as Pillow and most cameras write it) before scoring, as a web
dataset would store them: a detector that reads JPEG blocks as "clean" falls apart here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.detectors.cnn import CNNDetector
from collapseguard.evaluation.metrics import auroc
from collapseguard.training.metrics import clean_false_positive_rate, score_paths
from collapseguard.training.negatives import list_images
from collapseguard.training_data_tools.manifest import read_manifest


def summarise(chains: pd.DataFrame, clean: np.ndarray, clean_paths=None, thresholds=()) -> dict:
    out = {}
    if clean_paths is not None:  # every clean image of a kind (step 0 + extra clean) vs step k
        is_photo = np.array(["/photos/" in str(p) for p in clean_paths])
        is_night = np.array(["/nightsky/" in str(p) for p in clean_paths])
        for name, mask, sel in (("photo", is_photo, chains["source_image"].str.startswith("wp-")),
                                ("art", ~is_photo & ~is_night, ~chains["source_image"].str.startswith("wp-"))):
            g = chains[sel]
            neg = np.concatenate([g.loc[g["step"] == 0, "score"].drop_duplicates().to_numpy(), clean[mask]])
            for k in (5, 10):
                out[f"{name} allclean 0v{k}"] = auroc(neg, g.loc[g["step"] == k, "score"].to_numpy())
    kinds = {"all": chains, "photo": chains[chains["source_image"].str.startswith("wp-")],
             "art": chains[~chains["source_image"].str.startswith("wp-")]}
    for name, g in kinds.items():
        neg = g.loc[g["step"] == 0, "score"].to_numpy()
        for k in (5, 10, 20):
            out[f"{name} 0v{k}"] = auroc(neg, g.loc[g["step"] == k, "score"].to_numpy())
    photo = kinds["photo"]
    neg = photo.loc[photo["step"] == 0, "score"].to_numpy()
    for fam, g in photo.groupby("family", sort=True):
        out[f"photo {fam} 0v10"] = auroc(neg, g.loc[g["step"] == 10, "score"].to_numpy())
    allclean = np.concatenate([chains.loc[chains["step"] == 0, "score"].to_numpy(), clean])
    s10 = chains.loc[chains["step"] == 10, "score"].to_numpy()
    out["clean>thr95@10"] = clean_false_positive_rate(allclean, s10, drop=0.95)[1]
    t99 = np.quantile(allclean, 0.99)
    # a strict guarantee from few clean scores sits at the very top of them: the highest and the
    # second-highest distinct clean image (each chain original counted once), and any given cut
    distinct = np.sort(np.concatenate([chains.loc[chains["step"] == 0, "score"].drop_duplicates().to_numpy(),
                                       clean]))[::-1]
    cuts = {"99%clean": t99, "top clean": distinct[0], "2nd clean": distinct[1]}
    out["top clean score"], out["2nd clean score"] = float(distinct[0]), float(distinct[1])
    cuts.update({f"thr {t:g}": t for t in thresholds})
    for t in thresholds:  # the false drops a given threshold makes on this set's clean images
        out[f"clean>thr {t:g}"] = float(np.mean(distinct > t))
    for name, t in cuts.items():
        for k in (5, 10, 20):
            out[f"drop@{name} s{k}"] = float(np.mean(chains.loc[chains["step"] == k, "score"] > t))
    if clean_paths is not None and is_night.any():  # night-sky photos (recipes/nightsky.sh)
        night = clean[is_night]
        out["nightsky n"] = int(is_night.sum())
        for name, t in cuts.items():
            out[f"nightsky>{name}"] = float(np.mean(night > t))
    return out


def ensemble_scores(folder: Path, versions: list[str], tag: str = "") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The mean of several weights' saved scores (chains and clean CSVs in ``folder``), each
    version's scores first scaled by the median and interquartile range of its clean scores."""
    frames = [(pd.read_csv(folder / f"chains_{v}{tag}.csv"), pd.read_csv(folder / f"clean_{v}{tag}.csv"))
              for v in versions]
    scaled = []
    for ch, cl in frames:
        med, (q1, q3) = np.median(cl["score"]), np.percentile(cl["score"], [25, 75])
        scaled.append(((ch["score"] - med) / (q3 - q1), (cl["score"] - med) / (q3 - q1)))
    ch, cl = frames[0]
    return (ch.assign(score=np.mean([a for a, _ in scaled], axis=0)),
            cl.assign(score=np.mean([b for _, b in scaled], axis=0)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="*")
    ap.add_argument("--work", required=True, help="the work folder of recipes/make_default_calibration.sh "
                    "(its CG_CALIB_WORK) or of recipes/fresh_set.sh")
    ap.add_argument("--n-crops", type=int, default=None)
    ap.add_argument("--out", default=None, help="folder for per-image score CSVs")
    ap.add_argument("--jpeg", type=int, default=None, help="re-encode every image as JPEG at this quality")
    ap.add_argument("--subsampling", choices=("420", "444"), default=None,
                    help="chroma subsampling of --jpeg (default: Pillow's, 4:2:0; file names get _444)")
    ap.add_argument("--threshold", type=float, nargs="*", default=[],
                    help="also print the share of step-5/10/20 images above these scores (e.g. a calibration's)")
    ap.add_argument("--from-scores", nargs="*", default=[], help="VERSION names of CSV pairs in --out to "
                    "summarise again without scoring")
    ap.add_argument("--ensemble", nargs="*", default=[], help="V1+V2+...: summarise the mean of these "
                    "versions' saved scores in --out, each scaled by its clean scores' median and IQR")
    args = ap.parse_args(argv)
    work = Path(args.work)
    chains = read_manifest(work / "chains")
    clean_files = [str(p) for p in list_images([work / "clean"])]
    rows = []
    transform, tag = None, ""
    if args.jpeg:
        from functools import partial

        from collapseguard.training.negatives import jpeg
        code = {None: None, "420": 2, "444": 0}[args.subsampling]
        transform = partial(jpeg, quality=args.jpeg, subsampling=code)
        tag = f"_q{args.jpeg}" + ("_444" if args.subsampling == "444" else "")
    for v in args.from_scores:
        sc = pd.read_csv(Path(args.out) / f"chains_{v}.csv")
        cl = pd.read_csv(Path(args.out) / f"clean_{v}.csv")
        rows.append({"weights": v, "version": v, "n_crops": 0,
                     **summarise(sc, cl["score"].to_numpy(), cl["path"].tolist(), args.threshold)})
    for spec in args.ensemble:
        sc, cl = ensemble_scores(Path(args.out), spec.split("+"), tag)
        rows.append({"weights": spec, "version": spec, "n_crops": 0,
                     **summarise(sc, cl["score"].to_numpy(), cl["path"].tolist(), args.threshold)})
    for w in args.weights:
        det = CNNDetector(weights=w, device="cpu", n_crops=args.n_crops)
        sc = chains.copy()
        sc["score"] = score_paths(det, sc["path"].tolist(), transform=transform)
        clean = score_paths(det, clean_files, transform=transform)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            sc.to_csv(Path(args.out) / f"chains_{det.version}{tag}.csv", index=False)
            pd.DataFrame({"path": clean_files, "score": clean}).to_csv(
                Path(args.out) / f"clean_{det.version}{tag}.csv", index=False)
        rows.append({"weights": Path(w).name, "version": det.version, "n_crops": det.n_crops,
                     **summarise(sc, clean, clean_files, args.threshold)})
        print(pd.DataFrame(rows[-1:]).T.to_string(), flush=True)
    if not rows:
        ap.error("give weights files or --from-scores")
    print(pd.DataFrame(rows).set_index("weights").T.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
