"""Fit the pairwise comparator (``compare``) and calibrate its level: collapseguard/weights/compare.safetensors.

The packaged weights are fitted on simulated chains of 47 pictures and on the same pictures
(their step 0 as 256 px views) through two real networks (``collapseguard[networks]``):

    collapseguard chains make --sources bundled,art:16,pixel:6,screen:6 --steps 10 \\
        --keep 0,1,2,3,5,10 --families noise_tint,contour_wrinkles,scattered_dots,texture_simplify,aspect_drift,codec,learned,mixed \\
        --seed 0 --out CHAINS
    mkdir SRC && python -c "import pandas as p,shutil; m=p.read_csv('CHAINS/manifest.csv'); [shutil.copy('CHAINS/'+r.path,'SRC/'+r.source_image.replace('/','_')+'.png') for r in m[m.step==0].drop_duplicates('source_image').itertuples()]"
    collapseguard chains make --sources views:SRC:256 --steps 10 --keep 0,1,2,3,5,10 \\
        --families animevideov3,waifu2x --seed 0 -w 1 --out NETS
    python recipes/compare_weights.py CHAINS/manifest.csv NETS/manifest.csv --work WORK \\
        --clean art:1000:256-512,pixel:150,screen:150 --clean-copies 2 \\
        --out collapseguard/weights/compare.safetensors

(with ``COLLAPSEGUARD_CNN_RUNTIME=onnx``). ``--cnn-mix L`` fits weights whose cnn input adds L
times the shipped detector's score (``compare.MixedCnn``; its figures: docs/history/
comparator_history.md). Several
manifests are fitted together, each chain within its own. Chains of 319 more training-side
pictures (``recipes/compare_chains.sh``) were measured and not shipped (docs/history/
comparator_history.md). ``--workers N`` describes the images in N processes (the same
descriptions; the fit does not depend on it). ``recipes/compare_eval.py`` ranks the evaluation
set's chains with the weights written.

1. Every chain image is described twice (``Comparator.describe``): as made (PNG), and as one
   harmless copy (``dedup.copies.random_copy``: a random storage of five, a resize, a crop), so
   pairs carry every storage and size on either side.
2. Chains are split by source picture (``manifest.source_bucket``): 60% fit, 40% held out.
   Pairs are every two descriptions of one chain at different steps, both orders; the label says
   which is the later step. Beside them, each image and its harmless copy make a pair labelled
   0.5 (nothing to tell apart), weighted ``--invariance-weight`` against the ordered pairs.
   ``dedup.fit.fit_logistic`` fits the weights of ``--inputs`` on the fit part (the other inputs
   get weight 0). The default set was chosen on the fit part's chains (three folds by source
   picture) for the worst family's step 0 vs step >= 3 accuracy (``--choose-inputs`` prints
   those figures for the sets it is given): with every input the fit learns the noise families'
   "more detail = worse" and ranks smoothed copies backwards.
3. Held-out figures: per family, how often step 0 is ranked below a step >= 3 copy, and step 1
   below step 5 (every description pair of the held-out chains).
4. The level: clean-only groups (the picture as made plus ``--clean-copies`` harmless copies,
   each with a 60% chance of a resize and 40% of a crop) of the ``--clean``
   pictures and of the held-out chains' step-0 pictures, one group per picture; ``dedup.fit.
   calibrate_level`` at ``--alpha`` and ``--confidence``. The level goes into the weights file's
   metadata beside the figures.

Descriptions are cached in WORK (``descriptions-*.npz`` per manifest, ``clean-*.npz`` for the
``--clean`` pictures, ``held_out_step0-*.npz`` for the chains' pictures), keyed by what they
depend on (each manifest's path and bytes, the cnn's version), so a rerun only refits.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.detectors.compare import INPUTS

#: the inputs fitted by default, chosen on the fit chains (three folds by source picture) for
#: the worst family's step 0 vs step >= 3 accuracy
DEFAULT_INPUTS = ("cnn", "sat", "hf", "flat", "cast")
#: the share of source pictures (by ``source_bucket``) in the fit part; the rest is held out
FIT_SHARE = 0.6


def pack(descs):
    return (np.array([d["cnn"] for d in descs]), np.array([d["ladder"] for d in descs]))


def unpack(cnn, lad):
    return [{"cnn": float(c), "ladder": l} for c, l in zip(cnn, lad)]


def order_figures(p, info, sel) -> dict:
    """Per family, the share of the ``sel`` pairs ordered right (``p`` > 0.5: the later step is
    the worse): step 0 against steps >= 3, and step 1 against step 5; [share, pairs]."""
    fam = np.array([i[1] for i in info])
    a = np.array([i[2] for i in info])
    b = np.array([i[3] for i in info])
    def share(m, digits):  # None where there is no such pair
        return round(float((p[m] > 0.5).mean()), digits) if m.any() else None

    out: dict = {"held_out_step0_vs_ge3": {}, "held_out_step1_vs_5": {}}
    for f in sorted(set(fam[sel])):
        m0, m15 = sel & (fam == f) & (a == 0) & (b >= 3), sel & (fam == f) & (a == 1) & (b == 5)
        out["held_out_step0_vs_ge3"][f] = [share(m0, 3), int(m0.sum())]
        out["held_out_step1_vs_5"][f] = [share(m15, 3), int(m15.sum())]
    m0, m15 = sel & (a == 0) & (b >= 3), sel & (a == 1) & (b == 5)
    out["held_out_step0_vs_ge3_all"] = share(m0, 4)
    out["held_out_step1_vs_5_all"] = share(m15, 4)
    return out


def file_digest(path) -> str:
    """SHA-256 of a file's bytes: a cache of its images' descriptions is stale once it changes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def worst(by_family: dict):
    """The lowest share of a ``{family: [share, pairs]}`` table, over families with pairs."""
    shares = [v[0] for v in by_family.values() if v[1]]
    return min(shares) if shares else None


def fit_pairs(x, xi, used, invariance_weight):
    """``(w, s)`` of ``fit_logistic`` on the inputs ``used`` of ordered pairs ``x`` (label 1: the
    later step is the worse) and invariance pairs ``xi`` (label 0.5), the latter weighted
    ``invariance_weight`` times as much as the ordered pairs in all."""
    from collapseguard.dedup.fit import fit_logistic

    n, ni = len(x), len(xi)
    return fit_logistic(np.concatenate([x[:, used], xi[:, used]]),
                        np.concatenate([np.ones(n), np.full(ni, 0.5)]),
                        weight=np.concatenate([np.ones(n), np.full(ni, invariance_weight * n / max(1, ni))]))


def cross_validate(input_sets, x, info, xi, xi_bucket, invariance_weight, folds=3):
    """For each set of input names, the order figures of ``folds``-fold cross-validation over the
    fit part's chains (folds by source picture: ``source_bucket`` in [0, ``FIT_SHARE``) cut in
    ``folds`` equal ranges), each fold ranked by ``fit_pairs`` on the others' pairs, as the final
    fit is made. A fold without pairs, or without pairs beside it to fit on, is an error."""
    bucket = np.array([i[5] for i in info])
    hold = np.array([i[0] for i in info])
    fold = np.minimum((bucket / FIT_SHARE * folds).astype(int), folds - 1)
    ifold = np.minimum((np.asarray(xi_bucket) / FIT_SHARE * folds).astype(int), folds - 1)
    for k in range(folds):
        if not (~hold & (fold == k)).any() or not (~hold & (fold != k)).any():
            raise ValueError(f"--choose-inputs: fold {k} of {folds} has no chain pairs, or is the only "
                             "fold with any: too few fit pictures to cross-validate")
    out = {}
    for names in input_sets:
        used = [INPUTS.index(n) for n in names]
        p = np.full(len(x), np.nan)
        for k in range(folds):
            tr, te = ~hold & (fold != k), ~hold & (fold == k)
            w, s = fit_pairs(x[tr], xi[ifold != k], used, invariance_weight)
            p[te] = 1.0 / (1.0 + np.exp(-(x[te][:, used] / s) @ w))
        figs = order_figures(p, info, ~hold)
        out[",".join(names)] = {
            "worst_step0_vs_ge3": worst(figs["held_out_step0_vs_ge3"]),
            "worst_step1_vs_5": worst(figs["held_out_step1_vs_5"]),
            "by_family_step0_vs_ge3": figs["held_out_step0_vs_ge3"],
            "by_family_step1_vs_5": figs["held_out_step1_vs_5"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifests", nargs="+", metavar="MANIFEST")
    ap.add_argument("--work", required=True)
    ap.add_argument("--clean", default="art:1000:256-512,pixel:150,screen:150")
    ap.add_argument("--clean-seed", type=int, default=7)
    ap.add_argument("--clean-copies", type=int, default=2,
                    help="harmless copies beside each clean picture in its calibration group")
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--invariance-weight", type=float, default=1.0,
                    help="weight of the same-step pairs (label 0.5) against the ordered pairs")
    ap.add_argument("--inputs", default=",".join(DEFAULT_INPUTS),
                    help="the model's inputs (of compare.INPUTS); the others get weight 0")
    ap.add_argument("--cnn", default=None, metavar="FILE",
                    help="cnn weights whose score is the cnn input (default: the packaged "
                         "compare_cnn the comparator reads; a fit on other weights ships only "
                         "with them: docs/DEDUP.md, \"The comparator's cnn\")")
    ap.add_argument("--cnn-mix", type=float, default=None, metavar="LAMBDA",
                    help="the cnn input is the cnn's score plus LAMBDA times the shipped detector's "
                         "(compare.MixedCnn; the weights file names LAMBDA as cnn_mix)")
    ap.add_argument("--choose-inputs", default=None, metavar="SETS",
                    help="sets of inputs separated by ';' (e.g. 'cnn,sat,hf,flat,cast;all'): print "
                         "each set's three-fold cross-validated figures on the fit part's chains "
                         "(the worst family decides; the default set was chosen so)")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes that describe the images (the same descriptions up to the float "
                         "rounding of the cnn's score, about 1e-5)")
    args = ap.parse_args(argv)
    inputs = [name.strip() for name in args.inputs.split(",") if name.strip()]
    if not inputs or any(name not in INPUTS for name in inputs):
        ap.error(f"--inputs: names of {', '.join(INPUTS)}")
    input_sets = []
    for part in (args.choose_inputs or "").split(";"):
        names = list(INPUTS) if part.strip() == "all" else [n.strip() for n in part.split(",") if n.strip()]
        if part.strip() and (not names or any(n not in INPUTS for n in names)):
            ap.error(f"--choose-inputs: sets of names of {', '.join(INPUTS)} (or 'all'), separated by ';'")
        if names:
            input_sets.append(names)

    from collapseguard.dedup.fit import describer_pool

    with describer_pool(args.workers, args.cnn) if args.workers > 1 else contextlib.nullcontext() as pool:
        return run(args, inputs, input_sets, pool)


def chain_images(part, seed: int):
    """``(images, row of each)``: each chain image of a manifest's rows as made, then its one
    harmless copy (``random_copy``, stream ``seed``): the same images on every call."""
    from collapseguard.dedup.copies import random_copy
    from collapseguard.images import load_image

    rng = np.random.default_rng(seed)
    imgs, rows = [], []
    for r, path in enumerate(part["path"]):
        img = load_image(path)
        imgs += [img, random_copy(img, rng)[2]]
        rows += [r, r]
    return imgs, rows


def other_cnn_scores(cnn, name: str, key, images, work: Path) -> np.ndarray:
    """The scores of ``cnn`` (the shipped detector's) on ``images()`` (a callable: called only
    when they are not cached in ``work``), cached as ``other-cnn-{name}-*.npz`` keyed by ``key``
    and that cnn's version: the second score of ``--cnn-mix``."""
    from collapseguard.io.atomic import replaced_when_done

    cache = work / f"other-cnn-{name}-{hashlib.sha256(repr((key, cnn.version)).encode()).hexdigest()[:12]}.npz"
    if cache.exists():
        return np.load(cache, allow_pickle=False)["score"]
    imgs = images()
    score = np.concatenate([np.asarray(cnn.score(imgs[i: i + 8]), np.float64) for i in range(0, len(imgs), 8)])
    with replaced_when_done(cache, suffix=".npz") as tmp:
        np.savez(tmp, score=score)
    return score


def mixed(descs, other: np.ndarray, mix: float):
    """``descs`` with ``mix`` times the other cnn's score added to their cnn input (``MixedCnn``)."""
    return [{**d, "cnn": d["cnn"] + mix * float(o)} for d, o in zip(descs, other)]


def chain_descriptions(manifest, work: Path, seed: int, comp, pool=None):
    """``(rows, descriptions, row of each description)`` of a manifest's chain images: each image
    as made and as one harmless copy (``random_copy``, stream ``seed``), cached in ``work``
    (``descriptions-*.npz``, keyed by the manifest's path and bytes, the seed and what the
    descriptions depend on)."""
    from collapseguard.dedup.fit import describe_all
    from collapseguard.io.atomic import replaced_when_done
    from collapseguard.training_data_tools.manifest import read_manifest

    t0 = time.time()
    part = read_manifest(manifest).reset_index(drop=True)
    key = hashlib.sha256(repr((str(Path(manifest).resolve()), file_digest(manifest), seed,
                               comp.description_version)).encode()).hexdigest()[:12]
    cache = work / f"descriptions-{key}.npz"
    z = np.load(cache, allow_pickle=False) if cache.exists() else None
    if z is not None and len(z["chain_rows"]) == 2 * len(part):
        return part, unpack(z["chain_cnn"], z["chain_lad"]), z["chain_rows"]
    imgs, rows = chain_images(part, seed)
    descs = describe_all(comp, imgs, pool=pool)
    rows = np.array(rows)
    del imgs
    cc, cl = pack(descs)
    work.mkdir(parents=True, exist_ok=True)
    with replaced_when_done(cache, suffix=".npz") as tmp:
        np.savez(tmp, chain_cnn=cc, chain_lad=cl, chain_rows=rows)
    print(f"{manifest}: described {len(descs)} chain images in {time.time() - t0:.0f} s", file=sys.stderr)
    return part, descs, rows


def run(args, inputs, input_sets, pool) -> int:
    """Describe, fit and calibrate as the module text says (``pool``: a ``describer_pool`` or
    None)."""
    from safetensors.numpy import save_file

    from collapseguard.dedup.copies import random_copy
    from collapseguard.dedup.fit import (
        calibrate_level,
        describe_all,
        group_p_worse,
        untrained_comparator,
    )
    from collapseguard.detectors.base import create
    from collapseguard.detectors.compare import MixedCnn, pair_inputs
    from collapseguard.images import load_image
    from collapseguard.io.atomic import replaced_when_done
    from collapseguard.training_data_tools.manifest import source_bucket
    from collapseguard.training_data_tools.sources import resolve_sources

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    comp = untrained_comparator(args.cnn)
    # the shipped detector's cnn, loaded once, and the version of the mix the weights will name
    shipped = create("cnn") if args.cnn_mix is not None else None
    mixed_version = MixedCnn(comp.cnn, shipped, args.cnn_mix).version if shipped is not None else None
    t0 = time.time()
    frames, chain_descs, chain_rows = [], [], []
    for m, manifest in enumerate(args.manifests):
        part, descs, rows = chain_descriptions(manifest, work, args.seed, comp, pool)
        if args.cnn_mix is not None:
            other = other_cnn_scores(shipped, "chains", (str(Path(manifest).resolve()), file_digest(manifest), args.seed),
                                     lambda part=part: chain_images(part, args.seed)[0], work)
            descs = mixed(descs, other, args.cnn_mix)
        part["chain_id"] = f"{m}:" + part["chain_id"].astype(str)  # chains stay within a manifest
        chain_descs += descs
        chain_rows.append(np.asarray(rows) + sum(len(f) for f in frames))
        frames.append(part)
    df = pd.concat(frames, ignore_index=True)
    df["bucket"] = [source_bucket(s) for s in df["source_image"]]
    df["held_out"] = df["bucket"] >= FIT_SHARE
    chain_rows = np.concatenate(chain_rows)
    # clean-only groups: the --clean pictures, and the held-out chains' step-0 pictures (each
    # set cached on its own: a new manifest does not re-describe the --clean pictures)
    held0 = df[df["held_out"] & (df["step"] == 0)].drop_duplicates("source_image")
    clean_sets = {
        "clean": ((args.clean, args.clean_seed, args.clean_copies, args.seed, comp.description_version),
                  lambda: [arr for _, arr in resolve_sources(args.clean, seed=args.clean_seed)], 1),
        "held_out_step0": (([(str(Path(m).resolve()), file_digest(m)) for m in args.manifests],
                            args.clean_copies, args.seed, comp.description_version),
                           lambda: [load_image(p) for p in held0["path"]], 2),
    }
    def clean_images(pictures, stream):
        crng = np.random.default_rng([args.seed, stream])
        cimgs, group = [], []
        for g, pic in enumerate(pictures()):
            cimgs.append(pic)
            group.append(g)
            for _ in range(args.clean_copies):
                cimgs.append(random_copy(pic, crng, p_resize=0.6, p_crop=0.4)[2])
                group.append(g)
        return cimgs, group

    clean_descs, clean_group, clean_set = [], [], []
    for name, (key, pictures, stream) in clean_sets.items():
        cache = work / f"{name}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}.npz"
        if cache.exists():
            z = np.load(cache, allow_pickle=False)
            descs, group = unpack(z["clean_cnn"], z["clean_lad"]), z["clean_group"]
        else:
            cimgs, group = clean_images(pictures, stream)
            descs = describe_all(comp, cimgs, pool=pool)
            group = np.array(group)
            kc, kl = pack(descs)
            with replaced_when_done(cache, suffix=".npz") as tmp:
                np.savez(tmp, clean_cnn=kc, clean_lad=kl, clean_group=group)
            print(f"{name}: described {len(descs)} clean copies in {time.time() - t0:.0f} s",
                  file=sys.stderr)
        if args.cnn_mix is not None:
            other = other_cnn_scores(shipped, name, key, lambda p=pictures, st=stream: clean_images(p, st)[0], work)
            descs = mixed(descs, other, args.cnn_mix)
        clean_group.append(np.asarray(group) + sum(len(set(g)) for g in clean_group))
        clean_set += [name] * len(group)
        clean_descs += descs
    clean_group, clean_set = np.concatenate(clean_group), np.array(clean_set)

    # pairs within chains
    step = df["step"].to_numpy()[chain_rows]
    chain = df["chain_id"].to_numpy()[chain_rows]
    fam = df["family"].to_numpy()[chain_rows]
    held = df["held_out"].to_numpy()[chain_rows]
    bucket = df["bucket"].to_numpy()[chain_rows]
    origin = np.repeat(np.arange(len(frames)), [len(f) for f in frames])[chain_rows]  # manifest
    xs, info = [], []
    for cid in np.unique(chain):
        idx = np.flatnonzero(chain == cid)
        for a in idx:
            for b in idx:
                if step[a] < step[b]:
                    xs.append(pair_inputs(chain_descs[a], chain_descs[b]))
                    info.append((held[a], fam[a], step[a], step[b], origin[a], bucket[a]))
    x = np.array(xs)
    hold = np.array([i[0] for i in info])
    # invariance pairs: an image as made and its harmless copy (same step) are told apart by
    # nothing that matters, label 0.5; weighted to count as much as the ordered pairs
    same = [(a, a + 1) for a in range(0, len(chain_rows) - 1, 2) if chain_rows[a] == chain_rows[a + 1]
            and not held[a]]
    xi = np.array([pair_inputs(chain_descs[a], chain_descs[b]) for a, b in same]).reshape(-1, x.shape[1])
    used = [INPUTS.index(name) for name in inputs]
    w, s = np.zeros(len(INPUTS)), np.ones(len(INPUTS))
    w[used], s[used] = fit_pairs(x[~hold], xi, used, args.invariance_weight)
    w, s = (v.astype(np.float32).astype(np.float64) for v in (w, s))  # as shipped
    comp.w, comp.s = w, s
    p = 1.0 / (1.0 + np.exp(-(x / s) @ w))  # P(later step worse than earlier)
    figures: dict = {"pairs_fit": int((~hold).sum()), "pairs_held_out": int(hold.sum()),
                     **order_figures(p, info, hold)}
    if input_sets:
        figures["cross_validated_inputs"] = cross_validate(
            input_sets, x, info, xi, [bucket[a] for a, _ in same], args.invariance_weight)
    if len(frames) > 1:  # each manifest's held-out chains on their own
        origins = np.array([i[4] for i in info])
        figures["by_manifest"] = {args.manifests[m]: order_figures(p, info, hold & (origins == m))
                                  for m in range(len(frames))}

    # the level from clean-only groups
    maxima, maxima_set = [], []
    for g in np.unique(clean_group):
        idx = np.flatnonzero(clean_group == g)
        _, _, pw = group_p_worse(comp.group_utilities([clean_descs[i] for i in idx]))
        maxima.append(float(np.nanmax(pw)))
        maxima_set.append(clean_set[idx[0]])
    bound = calibrate_level(maxima, args.alpha, args.confidence)
    maxima, maxima_set = np.array(maxima), np.array(maxima_set)
    figures["level"] = {"level": bound.threshold, "clean_groups": bound.n, "k": bound.k,
                        "alpha": bound.alpha, "confidence": bound.confidence,
                        "guaranteed_groups_losing_a_member": round(bound.guaranteed_false_drop, 4),
                        "empirical_groups_losing_a_member": round(bound.empirical_false_drop, 4),
                        "groups_losing_a_member_by_set": {
                            name: [int((maxima[maxima_set == name] > bound.threshold).sum()),
                                   int((maxima_set == name).sum())] for name in clean_sets}}
    m5 = hold & np.array([i[2] == 0 and i[3] >= 5 for i in info])
    figures["held_out_step0_vs_ge5_above_level"] = round(float((p[m5] > bound.threshold).mean()), 4)
    figures["invariance_pairs_fit"] = len(xi)
    figures["weights"] = {INPUTS[j]: round(float(w[j]), 4) for j in used}
    meta = {"inputs": ",".join(inputs), "level": repr(bound.threshold), "alpha": repr(bound.alpha),
            "confidence": repr(bound.confidence), "clean_groups": str(bound.n),
            "guarantee": (f"at most {bound.alpha:g} of clean-only groups lose a member, with "
                          f"confidence {bound.confidence:g} ({bound.n} clean groups of a picture "
                          f"and {args.clean_copies} harmless copies; binomial order statistic)"),
            "recipe": "recipes/compare_weights.py", "cnn": mixed_version or comp.cnn.version}
    if args.cnn_mix is not None:
        meta["cnn_mix"] = repr(float(args.cnn_mix))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": w.astype(np.float32), "s": s.astype(np.float32)}, args.out, metadata=meta)
    (work / "figures.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
