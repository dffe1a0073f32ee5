"""Rank figures of comparator weights on an evaluation set's chains, grouped by picture.

    python recipes/compare_eval.py EVAL/stored/manifest.csv --work WORK [--weights W.safetensors ...]
        [--max-step 10] [--workers 2] [--psnr-bands 30,35,40,45] [--cnn CNN.safetensors] [--cnn-mix L]

Every chain image at steps <= ``--max-step`` (every storage) is described once by the comparator's
own cnn and the ``pair_features`` ladder (``Comparator.describe``, all features), cached in WORK
(``eval-descriptions-*.npz``, keyed by the manifest's path and bytes and what the descriptions
depend on). Then,
for each weights file (default: the packaged ``compare.safetensors``), the images of one source
picture (all its families and storages, as ``dedup`` would group them) are ranked by
``group_utilities`` at the largest scale all of them reach, and per family it prints how often
step 0 ranks below a step >= 3 image of the same family and how often step 1 ranks below step 5
(every storage on either side), with the worst family and the mean of each.

``--psnr-bands`` also splits the step 0 vs step >= 3 pairs by how much the damage changed the
picture: the PSNR between the two steps as stored in PNG (``content_psnr``, cached in WORK), so
misses on pairs the damage barely touched can be told from misses on visible damage.

This is the ranking half of ``benchmarks/dedup_scale.py --chains`` with grouping taken as perfect
(each picture is one group, no harmless copies or unrelated pictures), so the figures are close to
that benchmark's but not the same: it takes seconds per weights file once the descriptions are
cached, where the benchmark runs ``dedup`` end to end. Weights fitted on a cnn other than the
one describing (``compare_weights.py --cnn``; ``--cnn`` here) are skipped: their descriptions
differ. ``--cnn-mix L`` adds L times the shipped detector's score to the cnn input (``compare.MixedCnn``;
the shipped cnn's scores cached in WORK as ``eval-shipped-cnn-*.npz``) and ranks only weights fitted
so (``compare_weights.py --cnn-mix L``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd


def describe_manifest(manifest: str, work: Path, max_step: int, workers: int, cnn_weights: str | None = None):
    """``(rows, cnn, ladders)`` of the manifest's chain images at steps <= ``max_step``
    (``read_manifest``: paths checked, inside the manifest's folder), the cnn input read by the
    cnn ``cnn_weights`` (default: the comparator's own)."""
    from collapseguard.dedup.fit import (
        describe_all,
        describer_pool,
        untrained_comparator,
    )
    from collapseguard.images import load_image
    from collapseguard.io.atomic import replaced_when_done
    from collapseguard.training_data_tools.manifest import read_manifest

    comp = untrained_comparator(cnn_weights)
    rows = read_manifest(manifest)
    rows = rows[rows["step"] <= max_step].reset_index(drop=True)
    digest = hashlib.sha256(Path(manifest).read_bytes()).hexdigest()
    key = hashlib.sha256(repr((str(Path(manifest).resolve()), digest, max_step,
                               comp.description_version)).encode()).hexdigest()[:12]
    cache = work / f"eval-descriptions-{key}.npz"
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        if len(z["cnn"]) == len(rows):
            return rows, z["cnn"], z["lad"]
    t0 = time.time()
    cnn, lad = [], []
    chunk = 512  # images held at once
    with describer_pool(workers, cnn_weights) if workers > 1 else contextlib.nullcontext() as pool:
        for i in range(0, len(rows), chunk):
            imgs = [load_image(p) for p in rows["path"][i: i + chunk]]
            for d in describe_all(comp, imgs, pool=pool):
                cnn.append(d["cnn"])
                lad.append(d["ladder"])
    cnn, lad = np.array(cnn), np.array(lad)
    work.mkdir(parents=True, exist_ok=True)
    with replaced_when_done(cache, suffix=".npz") as tmp:
        np.savez(tmp, cnn=cnn, lad=lad)
    print(f"described {len(rows)} images in {time.time() - t0:.0f} s", file=sys.stderr)
    return rows, cnn, lad


def utilities(rows: pd.DataFrame, cnn: np.ndarray, lad: np.ndarray, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Each image's utility among its picture's images (``group_utilities``), by rows' index."""
    from collapseguard.detectors.compare import group_utilities

    u = np.full(len(cnn), np.nan)  # by rows' index: the images' positions in cnn and lad
    for _, g in rows.groupby("source_image"):
        idx = g.index.to_numpy()
        u[idx] = group_utilities([{"cnn": cnn[i], "ladder": lad[i]} for i in idx], w, s)
    return u


def content_psnr(rows: pd.DataFrame, work: Path) -> dict:
    """PSNR (dB) between two steps of one chain as stored in PNG: how much the damage changed the
    picture, storage aside; ``{(chain, step_a, step_b): dB}`` for every two steps, both orders.
    The chain is the manifest's ``stored_from`` (the chain every storage was made from). The
    later image is resized to the earlier one's size when they differ (bicubic). Cached in WORK."""
    from PIL import Image

    from collapseguard.images import load_image

    origin = rows["stored_from"] if "stored_from" in rows else rows["chain_id"]
    png = rows[rows["storage"] == "png"] if "storage" in rows else rows
    key = hashlib.sha256(repr(sorted(zip(png["path"], origin[png.index], png["step"]))).encode()).hexdigest()[:12]
    cache = work / f"eval-psnr-{key}.csv"
    if cache.exists():
        t = pd.read_csv(cache)
    else:
        recs = []
        for chain, g in png.groupby(origin[png.index]):
            imgs = {int(st): load_image(p).astype(np.float64) for st, p in zip(g["step"], g["path"])}
            for a in imgs:
                for b in imgs:
                    if a < b:
                        x, y = imgs[a], imgs[b]
                        if x.shape != y.shape:
                            y = np.asarray(Image.fromarray(y.astype(np.uint8)).resize(
                                (x.shape[1], x.shape[0]), Image.Resampling.BICUBIC), np.float64)
                        mse = max(float(np.mean((x - y) ** 2)), 1e-10)
                        recs.append({"chain": chain, "a": a, "b": b, "db": 10 * np.log10(255.0 ** 2 / mse)})
        t = pd.DataFrame(recs, columns=["chain", "a", "b", "db"])
        work.mkdir(parents=True, exist_ok=True)
        t.to_csv(cache, index=False)
    out = {}
    for r in t.itertuples():
        out[(r.chain, r.a, r.b)] = out[(r.chain, r.b, r.a)] = float(r.db)
    return out


def psnr_band_figures(rows: pd.DataFrame, u: np.ndarray, psnr: dict, bands: list[float]) -> dict:
    """Step 0 vs step >= 3 pairs of one chain (as ``rank_figures``, every storage) per family and
    per band of their content PSNR (``content_psnr``; band edges in dB): [share ordered right,
    pairs] per band; ``pairs_without_psnr`` counts the pairs left out (two chains of one picture
    and family, or a step without a PNG copy)."""
    origin = rows["stored_from"] if "stored_from" in rows else rows["chain_id"]
    edges = [-np.inf, *sorted(bands), np.inf]
    names = [f"<{edges[1]:g}", *(f"{lo:g}-{hi:g}" for lo, hi in itertools.pairwise(edges[1:-1])), f">={edges[-2]:g}"]
    right = defaultdict(lambda: defaultdict(list))
    unmatched = 0
    for (_, fam), g in rows.groupby(["source_image", "family"]):
        for i in g.index[g["step"] == 0]:
            for j in g.index[g["step"] >= 3]:
                db = psnr.get((origin[i], int(rows.at[i, "step"]), int(rows.at[j, "step"])))
                if origin[i] != origin[j] or db is None:  # two chains of one picture: no PSNR
                    unmatched += 1
                    continue
                band = names[int(np.searchsorted(edges, db, side="right")) - 1]
                right[fam][band].append(u[i] < u[j])
    out = {fam: {b: [round(float(np.mean(v)), 3), len(v)] for b in names if (v := by[b])}
           for fam, by in sorted(right.items())}
    return {**out, "pairs_without_psnr": unmatched}


def rank_figures(rows: pd.DataFrame, cnn: np.ndarray, lad: np.ndarray, w: np.ndarray,
                 s: np.ndarray) -> dict:
    """Per family, the share of (step 0, step >= 3) and (step 1, step 5) pairs of one picture
    ranked right by ``group_utilities`` over the picture's images; [share, pairs]. ``rows``'
    index gives each image's position in ``cnn`` and ``lad`` (a subset of rows ranks a subset)."""
    right0, right15 = ranked_right(rows, utilities(rows, cnn, lad, w, s))
    out = {}
    for name, right in (("step0_vs_ge3", right0), ("step1_vs_5", right15)):
        out[name], out[name + "_worst"], out[name + "_mean"] = shares(right)
    return out


def ranked_right(rows: pd.DataFrame, u: np.ndarray) -> tuple[dict, dict]:
    """Per family, whether each (step 0, step >= 3) and each (step 1, step 5) pair of one
    picture is ranked right by the scores ``u`` (by ``rows``' index; lower = less degraded):
    two ``{family: [bool, ...]}``."""
    right0, right15 = defaultdict(list), defaultdict(list)
    for (_, fam), g in rows.groupby(["source_image", "family"]):
        step, ug = g["step"].to_numpy(), u[g.index.to_numpy()]
        right0[fam] += list((ug[step == 0][:, None] < ug[step >= 3][None, :]).ravel())
        right15[fam] += list((ug[step == 1][:, None] < ug[step == 5][None, :]).ravel())
    return right0, right15


def shares(right: dict) -> tuple[dict, float | None, float | None]:
    """``({family: [share right, pairs]}, worst share, mean share)`` of per-family lists of
    booleans; families without pairs are left out, worst and mean are None when none has any."""
    fams = {f: [round(float(np.mean(v)), 3), len(v)] for f, v in sorted(right.items()) if v}
    if not fams:
        return fams, None, None
    return fams, min(v[0] for v in fams.values()), round(float(np.mean([v[0] for v in fams.values()])), 3)


def shipped_cnn_scores(det, rows, work: Path, manifest: str) -> np.ndarray:
    """The score of ``det`` (the shipped detector's ``cnn``) on each row's image, cached in
    ``work`` (``eval-shipped-cnn-*.npz``, keyed by the manifest's path and bytes, the rows' paths
    and the cnn's version): the second score of ``--cnn-mix``."""
    from collapseguard.images import load_image
    from collapseguard.io.atomic import replaced_when_done

    digest = hashlib.sha256(Path(manifest).read_bytes()).hexdigest()
    key = hashlib.sha256(repr((str(Path(manifest).resolve()), digest, list(rows["path"]),
                               det.version)).encode()).hexdigest()[:12]
    cache = work / f"eval-shipped-cnn-{key}.npz"
    if cache.exists():
        score = np.load(cache, allow_pickle=False)["score"]
        if len(score) == len(rows):
            return score
    paths = list(rows["path"])
    score = np.concatenate([np.asarray(det.score([load_image(p) for p in paths[i: i + 8]]), np.float64)
                            for i in range(0, len(paths), 8)])
    with replaced_when_done(cache, suffix=".npz") as tmp:
        np.savez(tmp, score=score)
    return score


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest", help="a chain manifest (recipes/eval_set.sh writes EVAL/stored/manifest.csv)")
    ap.add_argument("--work", required=True, help="folder for the description cache")
    ap.add_argument("--weights", nargs="*", default=[None],
                    help="comparator weights files (default: the packaged ones)")
    ap.add_argument("--max-step", type=int, default=10)
    ap.add_argument("--workers", type=int, default=1, help="processes that describe the images")
    ap.add_argument("--cnn", default=None, metavar="FILE",
                    help="cnn weights whose score is the cnn input (default: the comparator's own); "
                         "only weights fitted on that cnn (compare_weights.py --cnn FILE) are ranked")
    ap.add_argument("--cnn-mix", type=float, default=None, metavar="LAMBDA",
                    help="the cnn input plus LAMBDA times the shipped detector's score (compare.MixedCnn): "
                         "only weights fitted so (compare_weights.py --cnn-mix LAMBDA) are ranked")
    ap.add_argument("--psnr-bands", default="",
                    help="band edges in dB, e.g. 35,40: also print step 0 vs >= 3 per family in bands "
                         "of the two steps' PSNR as PNG (how much the damage changed the picture)")
    args = ap.parse_args(argv)
    if args.max_step < 5:
        ap.error("--max-step: at least 5 (the figures compare step 0 with steps >= 3, step 1 with step 5)")

    from collapseguard.detectors.base import create
    from collapseguard.detectors.compare import MixedCnn, comparator_cnn, load_weights

    rows, cnn, lad = describe_manifest(args.manifest, Path(args.work), args.max_step, args.workers, args.cnn)
    describing = create("cnn", weights=args.cnn) if args.cnn else comparator_cnn()
    own = describing.version
    if args.cnn_mix is not None:  # the mix the weights must name: MixedCnn's sum and version
        shipped = create("cnn")
        cnn = cnn + args.cnn_mix * shipped_cnn_scores(shipped, rows, Path(args.work), args.manifest)
        own = MixedCnn(describing, shipped, args.cnn_mix).version
    try:
        bands = [float(b) for b in args.psnr_bands.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--psnr-bands: numbers in dB separated by commas, got {args.psnr_bands!r}")
    psnr = content_psnr(rows, Path(args.work)) if bands else {}
    for path in args.weights:
        t = load_weights(path)
        fitted_on = t["meta"].get("cnn")
        if fitted_on and fitted_on != own:
            print(f"{path}: fitted on cnn {fitted_on}, not the cnn describing ({own}); skipped",
                  file=sys.stderr)
            continue
        figures = rank_figures(rows, cnn, lad, t["w"], t["s"])
        if bands:
            u = utilities(rows, cnn, lad, t["w"], t["s"])
            figures["step0_vs_ge3_by_psnr"] = psnr_band_figures(rows, u, psnr, bands)
        print(json.dumps({"weights": path or "packaged", "version": t["version"],
                          "inputs": t["meta"].get("inputs"), **figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
