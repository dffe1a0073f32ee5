"""Leave-one-family-out AUROC of the `cnn` training recipe.

    python benchmarks/lofo.py --chains DIR [--clean DIR] [--out DIR] [--steps 500] [--threads 1]
        [--init efficientnet-lite0:2 --n-crops 24 --delivery-kind web --delivery-jpeg 1 --context]
        [--web-history 0.5 --exclude-family codec]
        [--eval EVAL/stored --eval-storage "jpeg q90 4:2:0"]

For every family: train without it (short run of the recipe the options describe), score that
family's chains, print AUROC(step 0 vs 5) and (0 vs 10) on held-out sources, on all sources and,
with --eval, on the evaluation set's chains of that family in one storage (recipes/eval_set.sh).
Make the chains as in recipes/train_cnn.sh.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", action="append", required=True)
    ap.add_argument("--clean", action="append", default=[])
    ap.add_argument("--out", default="lofo_out")
    ap.add_argument("--steps", type=int, default=500, help="training iterations per family")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--crop-size", type=int, default=48, help="crop size in pixels (shipped recipe: 48)")
    ap.add_argument("--width", type=int, default=16, help="width of the from-scratch network (unused with --init)")
    ap.add_argument("--n-crops", type=int, default=48, help="crops per image when scoring (shipped: 24)")
    ap.add_argument("--cache", default=None, help="crop-bank cache folder (shared with collapseguard train --cache)")
    ap.add_argument("--families", default=None, help="comma-separated subset")
    ap.add_argument("--bank-crops", type=int, default=48,
                    help="crops cut once per training image (shipped: 48)")
    ap.add_argument("--clean-variants", type=int, default=4,
                    help="images made from each --clean file; 1 = as it is, no grain/JPEG variants (shipped: 4)")
    ap.add_argument("--generic-ladders", type=int, default=0,
                    help="damage ladders per clean training file (training.generic_damage; shipped: 0)")
    ap.add_argument("--context", action="store_true",
                    help="with the image-level context term (collapseguard train --context, part of the shipped recipe)")
    ap.add_argument("--shared-clean", choices=("drop", "keep"), default="drop",
                    help="a --clean file whose picture is a held-out chain source: drop (default, as "
                         "collapseguard train and recipes/train_cnn.sh) or keep (train on them)")
    ap.add_argument("--init", default=None, metavar="efficientnet-liteV[:N]",
                    help="start from ImageNet weights as collapseguard train --init (shipped: efficientnet-lite0:2)")
    ap.add_argument("--delivery-kind", choices=("jpeg", "web"), default="jpeg",
                    help="as collapseguard train --delivery-kind (shipped: web)")
    ap.add_argument("--delivery-jpeg", type=float, default=0.5,
                    help="as collapseguard train --delivery-jpeg (shipped: 1)")
    ap.add_argument("--web-history", type=float, default=0.0,
                    help="as collapseguard train --web-history (shipped: 0.5)")
    ap.add_argument("--exclude-family", action="append", default=[],
                    help="as collapseguard train --exclude-family: no run trains on it (shipped: codec); "
                         "it is still left out and scored in its turn")
    ap.add_argument("--eval", default=None, help="also score each left-out family on this chain "
                    "manifest (folder or file), e.g. the evaluation set's EVAL/stored")
    ap.add_argument("--eval-storage", default="jpeg q90 4:2:0",
                    help="with --eval: the storage column's value to keep (\"\" keeps every row)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from collapseguard.detectors.cnn_model import NetConfig
    from collapseguard.training.lofo import lofo
    from collapseguard.training.loop import TrainConfig
    from collapseguard.training_data_tools.manifest import read_manifest

    if args.init:  # the registry package is there: say so now, not after the crop banks
        from collapseguard.training.pretrained import weights_path

        try:
            weights_path(args.init)
        except ValueError as exc:
            ap.error(str(exc))
    cfg = TrainConfig(iterations=args.steps, seed=args.seed, threads=args.threads, log_every=100,
                      generic_ladders=args.generic_ladders, init="imagenet" if args.init else "",
                      delivery_kind=args.delivery_kind, delivery_jpeg=args.delivery_jpeg,
                      web_history=args.web_history,
                      net=NetConfig(crop_size=args.crop_size, width=args.width, n_crops=args.n_crops,
                                    context=args.context, stem=args.init or ""))
    eval_chains = None
    if args.eval:
        eval_chains = read_manifest(args.eval)
        if args.eval_storage:
            if "storage" not in eval_chains.columns:
                ap.error(f"--eval-storage: {args.eval} has no storage column (give --eval-storage \"\")")
            eval_chains = eval_chains[eval_chains["storage"] == args.eval_storage]
            if eval_chains.empty:
                ap.error(f"--eval-storage {args.eval_storage!r}: no such rows in {args.eval}")
    res = lofo(args.chains, args.out, cfg, clean_dirs=args.clean,
               families=args.families.split(",") if args.families else None, cache_dir=args.cache,
               clean_variants_n=args.clean_variants, crops_per_bank_image=args.bank_crops,
               shared_clean=args.shared_clean, eval_chains=eval_chains, exclude=args.exclude_family)
    cols = ["family", "n_chains_heldout", "heldout_auroc_0v5", "heldout_auroc_0v10",
            "n_chains_all", "all_auroc_0v5", "all_auroc_0v10"]
    if eval_chains is not None:
        cols += ["n_chains_eval", "eval_auroc_0v5", "eval_auroc_0v10"]
    print(res[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    worst = res[["all_auroc_0v5", "all_auroc_0v10"]].min()
    print(f"min over families (all sources): 0v5 {worst.iloc[0]:.3f}  0v10 {worst.iloc[1]:.3f}")
    if eval_chains is not None:
        ev = res[["eval_auroc_0v5", "eval_auroc_0v10"]].min()
        print(f"min over families (evaluation set, {args.eval_storage or 'every storage'}): "
              f"0v5 {ev.iloc[0]:.3f}  0v10 {ev.iloc[1]:.3f}")


if __name__ == "__main__":
    main()
