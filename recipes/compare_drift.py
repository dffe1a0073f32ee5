"""Rank a group's copies by their drift from a root copy, against the comparator's utilities alone.

    python recipes/compare_drift.py EVAL/stored/manifest.csv --work EW [--side 16] [--draws 2] [--seed 0]

A replication chain drifts: each re-rendering moves the picture a little further from the copy
it started from (colours, edges, texture), so a picture's copies lie along paths that leave their
original. ``drift_scores`` ranks a group's copies by their distance from a root copy: the
distance is the RMS difference of two copies' ``--side`` x ``--side`` RGB thumbnails
(box-averaged, so storage and resizing barely move it), the root the copy whose distances to the
others best explain how much more degraded the packaged comparator finds them (the largest
least-squares slope, through the origin, of ``u[j] - u[r]`` on ``D[r, j]``). The comparator
gives the direction, the geometry the order along a path. ``dedup`` does not use it (it keeps
step 0 less often: docs/history/comparator_history.md); ``docs/history/dedup_drift_order.patch``
puts it into ``dedup`` (``--order drift``) to measure it end to end.

Judged as ``recipes/compare_eval.py`` judges weights (its cached descriptions in ``--work``,
every pair of one picture and family, step 0 above step >= 3 and step 1 above step 5), on groups
of four sizes drawn from the evaluation set: each picture's every copy at steps <= 10 (``full``:
its families and four storages, as ``compare_eval.py``), one random storage per family and step
(``one_storage``), and ``--draws`` draws of 3 and of 6 random copies of one of its chains
(``chain3``, ``chain6``; ``--settings`` picks some): what a user's groups look like more often.
``--variant`` measures other root rules (``VARIANTS``). Prints one JSON line per
setting, draw and ranking (``utility``: the comparator alone; ``drift``: the variant), with
``kept_step0``, the share of groups whose first-ranked copy (the one ``dedup`` would keep) is a
step-0 copy, then each figure's mean over the draws (``mean_over_draws``).

``--clean-level FIT_WORK`` also prints what the drift order does to the level: the clean-only
groups of ``recipes/compare_weights.py``'s default ``--clean`` set, or ``--clean`` (each picture as made
and two harmless copies, the recipe's seeds; their descriptions read from its cache in FIT_WORK, or
made and cached there), each group's highest P(worse than the kept copy) with the kept copy the
comparator's least degraded (``utility``) or the drift order's root (``drift``), and the level
``dedup.fit.calibrate_level`` sets on each (``--alpha`` 0.01, ``--confidence`` 0.95).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_eval  # noqa: E402  (a recipe beside this one)


def thumbnail(img: np.ndarray, side: int) -> np.ndarray:
    """One image's ``side`` x ``side`` RGB thumbnail (box filter), flattened float32."""
    return np.asarray(Image.fromarray(img).resize((side, side), Image.Resampling.BOX), np.float32).ravel()


def colour_thumbnails(rows: pd.DataFrame, work: Path, manifest: str, side: int) -> np.ndarray:
    """(n, side * side * 3) float32 RGB thumbnails (box filter) of the rows' images, cached in WORK."""
    from collapseguard.images import load_image
    from collapseguard.io.atomic import replaced_when_done

    digest = hashlib.sha256(Path(manifest).read_bytes()).hexdigest()
    key = hashlib.sha256(repr((str(Path(manifest).resolve()), digest, list(rows["path"]), side)).encode()).hexdigest()[:12]
    cache = work / f"eval-thumbs-{key}.npz"
    if cache.exists():
        return np.load(cache, allow_pickle=False)["thumbs"]
    thumbs = np.stack([thumbnail(load_image(p), side) for p in rows["path"]])
    work.mkdir(parents=True, exist_ok=True)
    with replaced_when_done(cache, suffix=".npz") as tmp:
        np.savez(tmp, thumbs=thumbs)
    return thumbs


CLEAN = "art:1000:256-512,pixel:150,screen:150"  # compare_weights.py's default --clean


def clean_levels(fit_work: Path, side: int, spec: str = CLEAN, alpha: float = 0.01,
                 confidence: float = 0.95) -> dict:
    """The level under each kept-copy rule (``--clean-level``), from ``compare_weights.py``'s
    default clean-only groups."""
    import compare_weights
    from collapseguard.dedup.copies import random_copy
    from collapseguard.dedup.fit import calibrate_level, describe_all, untrained_comparator
    from collapseguard.detectors.compare import group_utilities, load_weights
    from collapseguard.io.atomic import replaced_when_done
    from collapseguard.training_data_tools.sources import resolve_sources

    clean_seed, copies, seed = 7, 2, 0  # compare_weights.py's defaults
    crng = np.random.default_rng([seed, 1])  # its stream of the --clean set
    images, group = [], []
    for g, (_, pic) in enumerate(resolve_sources(spec, seed=clean_seed)):
        images += [pic] + [random_copy(pic, crng, p_resize=0.6, p_crop=0.4)[2] for _ in range(copies)]
        group += [g] * (1 + copies)
    group = np.array(group)
    comp = untrained_comparator()
    key = (spec, clean_seed, copies, seed, comp.description_version)
    cache = fit_work / f"clean-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}.npz"
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        descs = compare_weights.unpack(z["clean_cnn"], z["clean_lad"])
    else:
        descs = describe_all(comp, images)
        kc, kl = compare_weights.pack(descs)
        fit_work.mkdir(parents=True, exist_ok=True)
        with replaced_when_done(cache, suffix=".npz") as tmp:
            np.savez(tmp, clean_cnn=kc, clean_lad=kl, clean_group=group)
    thumbs = np.stack([thumbnail(im, side) for im in images])
    t = load_weights(None)
    maxima, moved = {"utility": [], "drift": []}, 0
    for g in np.unique(group):
        idx = np.flatnonzero(group == g)
        u = group_utilities([descs[i] for i in idx], t["w"], t["s"])
        root = int(np.argmin(drift_scores(u, thumbs[idx])))
        moved += root != int(np.argmin(u))
        maxima["utility"].append(1 / (1 + np.exp(-(u.max() - u.min()))))
        maxima["drift"].append(1 / (1 + np.exp(-(u.max() - u[root]))))
    packaged = float(t["meta"]["level"])
    out = {"clean_groups": int(len(np.unique(group))), "kept_copy_moved": int(moved), "packaged_level": packaged}
    for name, m in maxima.items():
        b = calibrate_level(m, alpha, confidence)
        out[name] = {"level": round(float(b.threshold), 6), "k": int(b.k),
                     "groups_above_the_packaged_level": int((np.array(m) > packaged).sum())}
    return out


def groups_of(rows: pd.DataFrame, setting: str, rng: np.random.Generator) -> list[np.ndarray]:
    """The row indices of each group of a setting (see the module text)."""
    out = []
    for _, g in rows.groupby("source_image"):
        if setting == "full":
            out.append(g.index.to_numpy())
        elif setting == "one_storage":
            out.append(g.groupby(["family", "step"]).sample(1, random_state=int(rng.integers(2**31))).index.to_numpy())
        else:
            k = int(setting.removeprefix("chain"))
            chain = g[g["family"] == rng.choice(sorted(g["family"].unique()))]
            out.append(chain.sample(min(k, len(chain)), random_state=int(rng.integers(2**31))).index.to_numpy())
    return out


def figures(rows: pd.DataFrame, groups: list[np.ndarray], score: np.ndarray) -> dict:
    """``compare_eval``'s pair figures over the groups' rows, plus the share over all pairs, and
    ``kept_step0``: the share of groups holding a step-0 copy whose first-ranked copy (the one
    ``dedup`` keeps) is one."""
    sub = rows.loc[np.concatenate(groups)]
    steps = rows["step"].to_numpy()
    with0 = [idx for idx in groups if (steps[idx] == 0).any()]
    out = {"kept_step0": round(float(np.mean([steps[idx[np.argmin(score[idx])]] == 0 for idx in with0])), 3)
           if with0 else None}
    for name, right in zip(("step0_vs_ge3", "step1_vs_5"), compare_eval.ranked_right(sub, score)):
        fams, worst, mean = compare_eval.shares(right)
        pooled = [x for v in right.values() for x in v]
        out[name] = {"worst_family": min(fams, key=lambda f: fams[f][0]) if fams else None, "worst": worst,
                     "mean": mean, "all_pairs": round(float(np.mean(pooled)), 3) if pooled else None,
                     "realesrgan": fams.get("realesrgan")}
    return out


SETTINGS = ("full", "one_storage", "chain3", "chain6")
VARIANTS = {
    "slope": "the root by the slope (drift_scores)",
    "corr": "the root by the correlation of u[j] - u[r] with D[r, j] instead of the slope",
    "root-only": "the slope's root first, the other copies by the comparator's utilities",
    "cov": "the root by the sum of (u[j] - u[r]) * D[r, j], not divided by the distances' squares",
    "cos": "the root by the cosine of u[j] - u[r] and D[r, j] (neither centred)",
    "min-root": "the root the comparator's least degraded copy, the others by their distance from it",
}


def distances(thumbs: np.ndarray) -> np.ndarray:
    """The RMS distance between every two copies' thumbnails."""
    x = np.asarray(thumbs, np.float64)
    return np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).mean(-1))


def from_root(d: np.ndarray, root: int) -> np.ndarray:
    """Each copy's distance from ``root``, the root first even beside a copy whose thumbnail is
    the root's own."""
    out = d[root].copy()
    out[root] = -1.0
    return out


def drift_scores(u: np.ndarray, thumbs: np.ndarray) -> np.ndarray:
    """Scores that rank a group's copies (lower = nearer the original): each copy's distance from
    the root, the copy ``r`` with the largest slope of ``u - u[r]`` on the distances from ``r``.
    Groups of one or two copies have no geometry to read: their utilities are returned."""
    u = np.asarray(u, np.float64)
    if len(u) < 3:
        return u
    d = distances(thumbs)
    slope = ((u[None, :] - u[:, None]) * d).sum(1) / ((d * d).sum(1) + 1e-9)
    return from_root(d, int(np.argmax(slope)))


def ranked(variant: str, u: np.ndarray, thumbs: np.ndarray) -> np.ndarray:
    """A group's ranking scores under ``--variant`` (lower = nearer the original)."""
    if variant == "slope" or len(u) < 3:
        return drift_scores(u, thumbs)
    d = distances(thumbs)
    if variant == "min-root":
        return from_root(d, int(np.argmin(u)))
    if variant in ("cov", "cos"):
        du = np.asarray(u, np.float64)[None, :] - np.asarray(u, np.float64)[:, None]
        num = (du * d).sum(1)
        if variant == "cos":
            num = num / np.sqrt((d * d).sum(1) * (du * du).sum(1) + 1e-12)
        return d[int(np.argmax(num))]
    if variant == "corr":
        def corr(r):
            a, b = np.delete(d[r], r), np.delete(u - u[r], r)
            return np.corrcoef(a, b)[0, 1] if a.std() > 0 and b.std() > 0 else 0.0
        return d[int(np.argmax([corr(r) for r in range(len(u))]))]
    root = int(np.argmin(drift_scores(u, thumbs)))  # root-only
    out = np.asarray(u, np.float64).copy()
    out[root] = out.min() - 1.0
    return out


def mean_over_draws(printed: list[dict]) -> dict:
    """``{setting: {ranking: {measure: {worst, mean, all_pairs}}}}``: each figure's mean over the draws."""
    out: dict = {}
    for r in printed:
        out.setdefault(r["setting"], {}).setdefault(r["ranking"], []).append(r)
    def mean(vals):
        vals = [v for v in vals if v is not None]
        return round(float(np.mean(vals)), 3) if vals else None

    return {setting: {ranking: {**{m: {k: mean([r[m][k] for r in rs]) for k in ("worst", "mean", "all_pairs")}
                                   for m in ("step0_vs_ge3", "step1_vs_5")},
                                "kept_step0": mean([r["kept_step0"] for r in rs])}
                      for ranking, rs in by.items()} for setting, by in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest", help="the evaluation set's EVAL/stored/manifest.csv")
    ap.add_argument("--work", required=True, help="compare_eval.py's work folder (descriptions, thumbnails)")
    ap.add_argument("--side", type=int, default=16, help="thumbnail side in pixels")
    ap.add_argument("--draws", type=int, default=2, help="draws of each sampled setting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-step", type=int, default=10, help="the highest chain step in the groups")
    ap.add_argument("--clean-level", default=None, metavar="FIT_WORK",
                    help="also print the level under each kept-copy rule (compare_weights.py's work folder)")
    ap.add_argument("--alpha", type=float, default=0.01, help="the level's share of clean-only groups")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--clean", default=CLEAN, help="the clean pictures of --clean-level (compare_weights.py's --clean)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"which groups, of {','.join(SETTINGS)}")
    ap.add_argument("--variant", choices=tuple(VARIANTS), default="slope",
                    help="the drift ranking measured: " + "; ".join(f"{k}: {v}" for k, v in VARIANTS.items()))
    args = ap.parse_args(argv)
    settings = [x.strip() for x in args.settings.split(",") if x.strip()]
    if not settings or set(settings) - set(SETTINGS):
        ap.error(f"--settings: some of {','.join(SETTINGS)}, got {args.settings!r}")

    from collapseguard.detectors.compare import load_weights

    work = Path(args.work)
    rows, cnn, lad = compare_eval.describe_manifest(args.manifest, work, args.max_step, 1)
    thumbs = colour_thumbnails(rows, work, args.manifest, args.side)
    t = load_weights(None)
    rng = np.random.default_rng(args.seed)
    printed = []
    for setting in settings:
        for draw in range(1 if setting == "full" else args.draws):
            groups = groups_of(rows, setting, rng)
            util, drift = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
            for idx in groups:
                util[idx] = compare_eval.utilities(rows.loc[idx], cnn, lad, t["w"], t["s"])[idx]
                drift[idx] = ranked(args.variant, util[idx], thumbs[idx])
            for name, score in (("utility", util), ("drift", drift)):
                printed.append({"setting": setting, "draw": draw, "images": int(sum(map(len, groups))),
                                "ranking": name, **figures(rows, groups, score)})
                print(json.dumps(printed[-1]), flush=True)
    print(json.dumps({"mean_over_draws": mean_over_draws(printed)}))
    if args.clean_level:
        print(json.dumps({"clean_level": clean_levels(Path(args.clean_level), args.side, args.clean,
                                                              args.alpha, args.confidence)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
