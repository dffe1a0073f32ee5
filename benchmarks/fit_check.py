"""Does a cnn fit its own training chains? Training-side and held-out chains, scored side by side.

    python benchmarks/fit_check.py [WEIGHTS] --chains DIR [--n 250] [--seed 0]

Splits the chains exactly as ``collapseguard train`` does (by source image, salt "cnn"), draws a
seeded sample of ``--n`` chains from each side, scores their steps 0, 5, 10 and 20 with the weights
(default: the packaged ones) and prints AUROC of step 0 against each step, for all sampled chains
and separately for procedural-art and photo chains. A model that ranks held-out chains poorly
*and* its training chains poorly is short of capacity or signal; one that ranks training chains
well and held-out chains poorly is short of data.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from collapseguard.detectors.cnn import CNNDetector
from collapseguard.evaluation.metrics import auroc
from collapseguard.training.metrics import score_paths
from collapseguard.training.run import load_chains, split_chains

STEPS = (5, 10, 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="?", default=None)
    ap.add_argument("--chains", required=True, help="chains folder (e.g. $WORK/chains of recipes/train_cnn.sh)")
    ap.add_argument("--n", type=int, default=250, help="chains sampled per side")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    df = load_chains([args.chains])  # read_manifest gives absolute paths
    det = CNNDetector(weights=args.weights, device="cpu")
    rng = np.random.default_rng(args.seed)
    print(f"weights {det.version}; {args.n} chains per side; AUROC step 0 vs step " + " / ".join(map(str, STEPS)))
    for side, part in zip(("training", "held-out"), split_chains(df)):
        ids = part["chain_id"].unique()
        ids = rng.choice(ids, min(args.n, len(ids)), replace=False)
        s = part[part["chain_id"].isin(ids) & part["step"].isin((0, *STEPS))].copy()
        s["score"] = score_paths(det, s["path"].tolist())
        art = s["source_image"].str.startswith("art")
        for kind, g in (("all", s), ("art", s[art]), ("photo", s[~art])):
            neg = g.loc[g["step"] == 0, "score"].to_numpy()
            aucs = [auroc(neg, g.loc[g["step"] == k, "score"].to_numpy()) for k in STEPS]
            print(f"{side:9s} {kind:6s} " + " / ".join(f"{a:.3f}" for a in aucs))


if __name__ == "__main__":
    main()
