"""A learned full-reference comparator, measured beside the packaged one on the same pairs.

    python recipes/compare_pairnet.py CHAINS/manifest.csv [MORE/manifest.csv ...] \\
        --eval EVAL/stored/manifest.csv --work WORK [--steps 4000] [--side 256] [--seed 0]

The packaged comparator (``compare``) is a utility per image: a weighted sum of no-reference
features, so the difference of two copies' utilities says which is worse. It never looks at the
two copies together. This recipe trains the other design the dedup issue allows: a small
convolutional net that sees both copies aligned, pixel for pixel, and so can tell detail that
was *removed* from one copy (smoothing, flattened texture) from detail that was *added* (grain,
dots), which a per-image score reads the same way.

- **Images**: every chain image of the training manifests, reduced (area filter, never enlarged)
  to a longer side of at most ``--side``, as made and as one harmless copy
  (``dedup.copies.random_copy``: a random storage of five, a resize, a crop). Chains are split
  by source picture (``manifest.source_bucket``, as ``compare_weights.py`` does): 60% train,
  40% held out.
- **Pairs**: two images of one chain at different steps (label: the later one is worse), or an
  image and its own harmless copy (label 0.5). The second image is resized to the first's size;
  both are cut at the same ``--crops`` positions of ``--crop`` px.
- **Net**: ``h`` reads the 9 channels ``a, b, b - a`` of a crop pair through four 3x3 convolutions
  and mean + standard-deviation pooling; the pair's logit is the crops' mean of
  ``h(a, b) - h(b, a)``, so swapping the pair negates it (P(b worse) + P(a worse) = 1).
- **Figures**: per family, the share of (step 0, step >= 3) and (step 1, step 5) pairs ordered
  right: on the held-out chains by the net (made / copy on either side), and on the evaluation
  set (``--eval``, every storage on either side, each picture's chains) by the net and by the
  packaged comparator's utilities on the same pairs (``compare_eval.describe_manifest``
  descriptions, cached in ``--eval-work``).

The net's weights go to ``WORK/pairnet-KEY.pt`` (KEY: the chains read and the training options); a
rerun with the same arguments loads them instead of training. The figures are a measurement, not
a shipped model (docs/DEDUP.md has them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

FIT_SHARE = 0.6


def reduced(img: np.ndarray, side: int) -> np.ndarray:
    h, w = img.shape[:2]
    if max(h, w) <= side:
        return img
    s = side / max(h, w)
    return np.asarray(Image.fromarray(img).resize((max(1, round(w * s)), max(1, round(h * s))), Image.BOX))


def aligned(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``b`` resized to ``a``'s size (area filter when it shrinks, bicubic when it grows)."""
    if a.shape == b.shape:
        return b
    h, w = a.shape[:2]
    f = Image.BOX if b.shape[0] * b.shape[1] > h * w else Image.BICUBIC
    return np.asarray(Image.fromarray(b).resize((w, h), f))


def crop_pairs(a: np.ndarray, b: np.ndarray, size: int, n: int, rng: np.random.Generator | None) -> np.ndarray:
    """(n, 6, size, size) float crops of ``a`` and aligned ``b`` at the same positions: random
    with ``rng``, else a fixed grid."""
    b = aligned(a, b)
    h, w = a.shape[:2]
    if h < size or w < size:
        pad = ((0, max(0, size - h)), (0, max(0, size - w)), (0, 0))
        a, b = np.pad(a, pad, mode="reflect"), np.pad(b, pad, mode="reflect")
        h, w = a.shape[:2]
    if rng is not None:
        ys = rng.integers(0, h - size + 1, n)
        xs = rng.integers(0, w - size + 1, n)
    else:
        k = int(np.ceil(np.sqrt(n)))
        grid = [(y, x) for y in np.linspace(0, h - size, k).astype(int)
                for x in np.linspace(0, w - size, k).astype(int)]
        ys, xs = zip(*grid[:n])
    out = np.stack([np.concatenate([a[y:y + size, x:x + size], b[y:y + size, x:x + size]], axis=2)
                    for y, x in zip(ys, xs)])
    return out.transpose(0, 3, 1, 2)


class PairNet(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        c = width
        self.body = nn.Sequential(
            nn.Conv2d(9, c, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c, c, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(4 * c, 1)

    def h(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        f = self.body(torch.cat([a, b, b - a], dim=1))
        f = torch.cat([f.mean((2, 3)), f.std((2, 3))], dim=1)
        return self.head(f).squeeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (pairs, crops, 6, s, s) uint8-valued floats; the pairs' logits."""
        p, n = x.shape[:2]
        x = x.reshape(p * n, 6, *x.shape[3:]) / 255.0 - 0.5
        a, b = x[:, :3], x[:, 3:]
        d = self.h(a, b) - self.h(b, a)
        return d.reshape(p, n).mean(1)


def load_chains(manifests: list[str], side: int, seed: int,
                families: list[str] | None = None) -> tuple[pd.DataFrame, list, list]:
    """The manifests' chain images (only ``families`` when given, in the manifests' order), each
    reduced, as made and as one harmless copy."""
    from collapseguard.dedup.copies import random_copy
    from collapseguard.images import load_image
    from collapseguard.training_data_tools.manifest import read_manifest, source_bucket

    rows = pd.concat([read_manifest(m) for m in manifests], ignore_index=True)
    if families:
        missing = sorted(set(families) - set(rows["family"]))
        if missing:
            raise SystemExit(f"--families: no chains of {', '.join(missing)} in the manifests")
        rows = rows[rows["family"].isin(families)].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    made, copy = [], []
    t0 = time.time()
    for i, p in enumerate(rows["path"]):
        img = reduced(load_image(p), side)
        made.append(img)
        copy.append(reduced(random_copy(img, rng)[2], side))
        if (i + 1) % 2000 == 0:
            print(f"  read {i + 1}/{len(rows)} in {time.time() - t0:.0f} s", file=sys.stderr)
    rows["held_out"] = [source_bucket(s) >= FIT_SHARE for s in rows["source_image"]]
    return rows, made, copy


def train(net: PairNet, rows: pd.DataFrame, made: list, copy: list, steps: int, crop: int, crops: int,
          batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed + 1)
    fit = rows[~rows["held_out"]]
    chains = [g.index.to_numpy() for _, g in fit.groupby("chain_id") if g["step"].nunique() > 1]
    if not chains:
        raise SystemExit("no chain of the fit part has two steps: nothing to train on")
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    t0, run = time.time(), []
    for it in range(steps):
        xs, ys = [], []
        for _ in range(batch):
            idx = chains[int(rng.integers(len(chains)))]
            if rng.random() < 0.2:  # an image and its own harmless copy: nothing to tell apart
                i = int(idx[rng.integers(len(idx))])
                a, b, y = made[i], copy[i], 0.5
                if rng.random() < 0.5:
                    a, b = b, a
            else:
                i, j = rng.choice(idx, 2, replace=False)
                a = (made if rng.random() < 0.5 else copy)[int(i)]
                b = (made if rng.random() < 0.5 else copy)[int(j)]
                y = float(rows.at[int(j), "step"] > rows.at[int(i), "step"])
            xs.append(crop_pairs(a, b, crop, crops, rng))
            ys.append(y)
        x = torch.from_numpy(np.stack(xs)).float()
        loss = nn.functional.binary_cross_entropy_with_logits(net(x), torch.tensor(ys))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        run.append(float(loss.detach()))
        if (it + 1) % 200 == 0:
            print(f"  step {it + 1}/{steps} loss {np.mean(run[-200:]):.4f} ({time.time() - t0:.0f} s)",
                  file=sys.stderr)


@torch.inference_mode()
def pair_logits(net: PairNet, pairs: list[tuple[np.ndarray, np.ndarray]], crop: int, crops: int) -> np.ndarray:
    out = []
    for k in range(0, len(pairs), 64):
        x = np.stack([crop_pairs(a, b, crop, crops, None) for a, b in pairs[k:k + 64]])
        out.append(net(torch.from_numpy(x).float()).numpy())
    return np.concatenate(out) if out else np.zeros(0)


def figures(right: dict) -> dict:
    from compare_eval import shares

    fams, worst, mean = shares(right)
    return {"by_family": fams, "worst": worst, "mean": mean}


def held_out_figures(net, rows, made, copy, crop, crops) -> dict:
    """Held-out chains: every (made / copy) x (made / copy) pair of step 0 vs >= 3 and 1 vs 5."""
    ho = rows[rows["held_out"]]
    right = {"step0_vs_ge3": defaultdict(list), "step1_vs_5": defaultdict(list)}
    for (_, fam), g in ho.groupby(["chain_id", "family"]):
        for name, lo, hi in (("step0_vs_ge3", g[g.step == 0], g[g.step >= 3]),
                             ("step1_vs_5", g[g.step == 1], g[g.step == 5])):
            pairs = [(va[i], vb[j]) for i in lo.index for j in hi.index
                     for va in (made, copy) for vb in (made, copy)]
            if pairs:
                right[name][fam] += list(pair_logits(net, pairs, crop, crops) > 0)
    return {k: figures(v) for k, v in right.items()}


def eval_figures(net, manifest: str, work: Path, side: int, crop: int, crops: int) -> dict:
    """The evaluation set's chains, every storage on either side: the net and the packaged
    comparator's utilities on the same pairs."""
    from compare_eval import describe_manifest, utilities

    from collapseguard.detectors.compare import load_weights
    from collapseguard.images import load_image

    rows, cnn, lad = describe_manifest(manifest, work, 10, 1)
    t = load_weights(None)
    u = utilities(rows, cnn, lad, t["w"], t["s"])
    right = {(who, name): defaultdict(list) for who in ("pairnet", "packaged")
             for name in ("step0_vs_ge3", "step1_vs_5")}
    for _, g in rows.groupby("source_image"):
        img = {i: reduced(load_image(rows.at[i, "path"]), side) for i in g.index}
        for fam, f in g.groupby("family"):
            for name, lo, hi in (("step0_vs_ge3", f[f.step == 0], f[f.step >= 3]),
                                 ("step1_vs_5", f[f.step == 1], f[f.step == 5])):
                ij = [(i, j) for i in lo.index for j in hi.index]
                if not ij:
                    continue
                z = pair_logits(net, [(img[i], img[j]) for i, j in ij], crop, crops)
                right[("pairnet", name)][fam] += list(z > 0)
                right[("packaged", name)][fam] += [u[i] < u[j] for i, j in ij]
    return {f"{who}.{name}": figures(v) for (who, name), v in right.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifests", nargs="+", help="training chain manifests (collapseguard chains make)")
    ap.add_argument("--eval", help="an evaluation set's stored manifest (recipes/eval_set.sh)")
    ap.add_argument("--work", required=True, help="the net's weights go here")
    ap.add_argument("--eval-work", help="compare_eval.py's description cache (default: WORK)")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--side", type=int, default=256, help="longest side images are reduced to")
    ap.add_argument("--crop", type=int, default=48)
    ap.add_argument("--crops", type=int, default=8)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="", help="train on these families only, and give held-out figures of them "
                         "(comma-separated; --eval figures keep every family)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    rows, made, copy = load_chains(args.manifests, args.side, args.seed, families)
    # the chains read (not the manifests' names) and the training options
    data = rows[["chain_id", "family", "step", "path"]].to_csv(index=False)
    what = (data, args.steps, args.batch, args.side, args.crop, args.crops, args.width, args.seed)
    weights = work / f"pairnet-{hashlib.sha256(repr(what).encode()).hexdigest()[:12]}.pt"
    net = PairNet(args.width)
    if weights.exists():
        net.load_state_dict(torch.load(weights, weights_only=True))
    else:
        t0 = time.time()
        train(net, rows, made, copy, args.steps, args.crop, args.crops, args.batch, args.seed)
        torch.save(net.state_dict(), weights)
        print(f"trained in {time.time() - t0:.0f} s: {weights}", file=sys.stderr)
    net.eval()
    out = {"weights": str(weights), "held_out": held_out_figures(net, rows, made, copy, args.crop, args.crops)}
    if args.eval:
        out["eval"] = eval_figures(net, args.eval, Path(args.eval_work or work), args.side, args.crop, args.crops)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
