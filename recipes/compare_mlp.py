"""A non-linear comparator on the same descriptions, against the linear one (measured, not shipped).

    python recipes/compare_mlp.py CHAINS/manifest.csv --work WORK --eval EVAL/stored/manifest.csv \\
        --eval-work EW [--hidden 32] [--inputs all] [--context/--no-context] [--steps 3000] [--wd 1e-3]

The packaged comparator is linear in the difference of two descriptions, so one weight per
feature cannot read more fine detail as damage for noise and less as damage for smoothing
(docs/history/comparator_history.md). This recipe fits the smallest model that can: each copy's
utility is ``u(x, c) = v . (x - c) + MLP((x - c), c)`` with ``c`` the mean description of the
copies compared (the pair's mean in training, the group's in ``group-ctx`` ranking), so
``P(b worse than a) = sigmoid(u(x_b, c) - u(x_a, c))`` keeps ``P(a, b) = 1 - P(b, a)``; with
``--hidden 0`` it is the linear model (a check: it gives the packaged figures within about 0.01).

Fit data are ``recipes/compare_weights.py``'s (its cached descriptions in WORK: each chain image
as made and as one harmless copy; pictures split 60/40 by ``source_bucket``; every pair of one
chain at different steps, both orders, and each image with its copy labelled 0.5). Printed: the
held-out pictures' worst family (step 0 above step >= 3, step 1 above step 5), then on the
evaluation set's chains (``recipes/compare_eval.py``'s cached descriptions in EW, each picture
one group) the same figures per family, ranked two ways: ``borda`` (each copy's mean P(worse)
against every other copy of its picture, each pair with its own context) and ``group-ctx``
(utilities with the group's mean as context, the form ``dedup`` ranks with).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # compare_eval, compare_weights beside it

FEATS = ("hf", "grad", "noise", "impulse", "texture", "flat", "sat", "cast", "block", "cnn")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest", help="the fit chains' manifest (compare_weights.py's)")
    ap.add_argument("--work", required=True, help="compare_weights.py's WORK (descriptions cache)")
    ap.add_argument("--eval", required=True, help="an evaluation set's manifest")
    ap.add_argument("--eval-work", required=True, help="compare_eval.py's WORK for it")
    ap.add_argument("--hidden", type=int, default=32, help="MLP width (0: the linear model)")
    ap.add_argument("--inputs", default="all", help=f"names of {', '.join(FEATS)}, or all")
    ap.add_argument("--context", action=argparse.BooleanOptionalAction, default=True,
                    help="the MLP also sees the context c, not only x - c")
    ap.add_argument("--steps", type=int, default=3000, help="full-batch AdamW steps")
    ap.add_argument("--wd", type=float, default=1e-3, help="AdamW weight decay")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    use = list(range(len(FEATS))) if args.inputs == "all" else [FEATS.index(n) for n in args.inputs.split(",")]

    import torch
    from compare_eval import describe_manifest, ranked_right
    from compare_weights import FIT_SHARE, chain_descriptions

    from collapseguard.dedup.fit import untrained_comparator
    from collapseguard.detectors.pair_features import common_scale
    from collapseguard.training_data_tools.manifest import source_bucket

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small matrices: more threads only wait on each other
    part, descs, rows = chain_descriptions(args.manifest, Path(args.work), 0, untrained_comparator())
    cnn = np.array([d["cnn"] for d in descs])
    lad = np.array([d["ladder"] for d in descs])

    def x_at(lads, cnns, i, scale):
        return np.nan_to_num(np.append(lads[i, scale], cnns[i]))[use]

    step = part["step"].to_numpy()[rows]
    chain = part["chain_id"].astype(str).to_numpy()[rows]
    fam = part["family"].to_numpy()[rows]
    held = np.array([source_bucket(s) >= FIT_SHARE for s in part["source_image"]])[rows]
    xa, xb, y, hold, info = [], [], [], [], []
    for cid in np.unique(chain):
        idx = np.flatnonzero(chain == cid)
        for a in idx:
            for b in idx:
                if step[a] < step[b]:
                    sc = common_scale(lad[a], lad[b])
                    xa.append(x_at(lad, cnn, a, sc))
                    xb.append(x_at(lad, cnn, b, sc))
                    y.append(1.0)
                    hold.append(held[a])
                    info.append((fam[a], step[a], step[b]))
    for a in range(0, len(rows) - 1, 2):  # an image and its harmless copy: nothing to tell apart
        if rows[a] == rows[a + 1]:
            sc = common_scale(lad[a], lad[a + 1])
            xa.append(x_at(lad, cnn, a, sc))
            xb.append(x_at(lad, cnn, a + 1, sc))
            y.append(0.5)
            hold.append(held[a])
            info.append((fam[a], step[a], step[a]))
    xa, xb, y, hold = map(np.array, (xa, xb, y, hold))
    fit = ~hold
    both = np.concatenate([xa[fit], xb[fit]])
    mu, sd = (torch.tensor(v, dtype=torch.float32) for v in (both.mean(0), both.std(0) + 1e-6))
    dsd = torch.tensor((xb[fit] - xa[fit]).std(0) + 1e-6, dtype=torch.float32)
    d = len(use)
    lin = torch.nn.Linear(d, 1, bias=False)
    h = max(1, args.hidden)
    mlp = torch.nn.Sequential(torch.nn.Linear(2 * d if args.context else d, h), torch.nn.GELU(),
                              torch.nn.Linear(h, h), torch.nn.GELU(), torch.nn.Linear(h, 1))

    def utility(x, c):
        dev = (x - c) / dsd
        out = lin(dev)[:, 0]
        if args.hidden:
            out = out + mlp(torch.cat([dev, (c - mu) / sd], 1) if args.context else dev)[:, 0]
        return out

    def logit(a, b):
        c = (a + b) / 2
        return utility(b, c) - utility(a, c)

    ta, tb = (torch.tensor(v[fit], dtype=torch.float32) for v in (xa, xb))
    ty = torch.tensor(y[fit], dtype=torch.float32)
    n_ord, n_inv = float((y[fit] == 1).sum()), float(max(1, (y[fit] == 0.5).sum()))
    tw = torch.where(ty == 0.5, n_ord / n_inv, 1.0)  # the copy pairs weigh as much as the ordered
    opt = torch.optim.AdamW([*lin.parameters(), *mlp.parameters()], lr=3e-3, weight_decay=args.wd)
    for _ in range(args.steps):
        lg = torch.cat([logit(ta, tb), logit(tb, ta)])
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(
            lg, torch.cat([ty, 1 - ty]), reduction="none") * torch.cat([tw, tw])).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    out: dict = {"hidden": args.hidden, "inputs": [FEATS[i] for i in use], "context": args.context,
                 "steps": args.steps, "wd": args.wd, "final_loss": round(float(loss.detach()), 4)}
    with torch.no_grad():
        p = torch.sigmoid(logit(torch.tensor(xa, dtype=torch.float32),
                                torch.tensor(xb, dtype=torch.float32))).numpy()
    r0, r15 = defaultdict(list), defaultdict(list)
    for k in np.flatnonzero(hold & (y == 1)):
        f, a, b = info[k]
        if a == 0 and b >= 3:
            r0[f].append(p[k] > 0.5)
        elif (a, b) == (1, 5):
            r15[f].append(p[k] > 0.5)
    out["held_out"] = {"step0_vs_ge3": table(r0), "step1_vs_5": table(r15)}

    erows, ecnn, elad = describe_manifest(args.eval, Path(args.eval_work), 10, 1)
    borda, gctx = np.full(len(erows), np.nan), np.full(len(erows), np.nan)
    for _, g in erows.groupby("source_image"):
        idx = g.index.to_numpy()
        reached = np.flatnonzero(~np.isnan(elad[idx][:, :, 0]).any(axis=0))
        sc = int(reached[-1]) if reached.size else 0
        x = torch.tensor(np.array([x_at(elad, ecnn, i, sc) for i in idx]), dtype=torch.float32)
        ia, ib = (v.ravel() for v in np.meshgrid(np.arange(len(idx)), np.arange(len(idx)), indexing="ij"))
        with torch.no_grad():
            pw = torch.sigmoid(logit(x[ia], x[ib])).numpy().reshape(len(idx), len(idx))
            borda[idx] = pw.mean(axis=0)  # pw[i, j] = P(j worse than i)
            gctx[idx] = utility(x, x.mean(0, keepdim=True).expand_as(x)).numpy()
    for name, score in (("borda", borda), ("group_ctx", gctx)):
        r0, r15 = ranked_right(erows, score)
        out[f"eval_{name}"] = {"step0_vs_ge3": table(r0), "step1_vs_5": table(r15)}
    print(json.dumps(out))
    return 0


def table(right: dict) -> dict:
    """``{"worst": ..., "mean": ..., "by_family": {family: share}}`` of per-family booleans
    (``compare_eval.shares``)."""
    from compare_eval import shares

    by, worst, mean = shares(right)
    return {"worst": worst, "mean": mean, "by_family": {f: v[0] for f, v in by.items()}}


if __name__ == "__main__":
    raise SystemExit(main())
