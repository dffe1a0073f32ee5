"""Make the chains the shipped `cnn` weights are trained on (step 1 of recipes/train_cnn.sh).

    python recipes/make_train_chains.py SOURCES OUT_DIR [--photos PATH ...] [--both-views]
                                           [--windows N [--windows-only]]
                                           [--clean-art N --clean-art-dir DIR]
                                           [--extra-photos PATH ... --extra-n N]

SOURCES is a source spec (e.g. ``bundled,art:40:320-640``). ``--photos`` adds large photos as
chain sources through ``sources.photo_views`` (a native 512 px window or a web-size downscale per
photo), but only those on the *training* side of ``training.negatives.split_clean`` -- the same
hash by file name that ``collapseguard train --clean`` uses -- so the photos it holds out as unseen
clean images are never chain sources either; ``--both-views`` takes both views of every photo
(their chains stay on one side of the train/held-out split). ``--windows N`` adds N more native
windows of every training-side photo (``sources.photo_windows``; ``--windows-only`` makes a
chains folder of those alone, passed to ``collapseguard train`` as a second ``--chains``). ``--extra-photos`` adds ``--extra-n``
files (seeded choice among the training side, one view each) of another photo kind -- night skies
in train_cnn.sh -- so that kind is seen degraded as well as clean. ``--clean-art N`` also writes N
procedural art PNGs (seed 11, never chain sources; the study script draws its unseen art with seed 7) into ``--clean-art-dir`` for ``--clean``, where
training adds JPEG/grain/resize variants: clean digital art as a pipeline delivers it. Every
replicator family, 20 steps, keeping 0,1,2,3,5,10,20; seed 0; 2 worker processes (``--workers``).
``--families a,b`` makes those families instead (e.g. the opt-in network families ``animevideov3,waifu2x``)
and ``--limit N`` keeps N of the sources (a seeded choice), to bound the cost of slow families.
"""

from __future__ import annotations

import argparse
import time

import torch

from collapseguard.training.negatives import list_images, split_clean
from collapseguard.training_data_tools import chains, sources

if __name__ == "__main__":
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--photos", nargs="*", default=[], help="photo folders or files (train side only)")
    ap.add_argument("--side", type=int, default=512)
    ap.add_argument("--both-views", action="store_true")
    ap.add_argument("--windows", type=int, default=0,
                    help="N more native windows of each training-side --photos file (sources.photo_windows)")
    ap.add_argument("--windows-only", action="store_true",
                    help="with --windows: chains of the windows alone (a second chains folder)")
    ap.add_argument("--extra-photos", nargs="*", default=[], help="another photo kind (train side only)")
    ap.add_argument("--extra-n", type=int, default=0, help="chain sources taken from --extra-photos")
    ap.add_argument("--clean-art", type=int, default=0)
    ap.add_argument("--clean-art-dir", default=None)
    ap.add_argument("--workers", type=int, default=2, help="chain-making worker processes (default 2)")
    ap.add_argument("--families", default="", help="comma-separated families (default: every default family)")
    ap.add_argument("--limit", type=int, default=0, help="keep this many sources (seeded choice; 0: all)")
    ap.add_argument("--clean-art-dither", default="0.6",
                    help="dither sigma of the clean art, or 'vary' (sources.DITHER_LEVELS per image)")
    args = ap.parse_args()
    if args.windows_only and not (args.windows > 0 and args.photos):
        ap.error("--windows-only needs --windows N (N > 0) and --photos")
    t = time.time()
    srcs = list(sources.resolve_sources(args.spec, seed=0)) if args.spec else []
    if args.photos:
        train_files, held = split_clean(list_images(args.photos))
        if not args.windows_only:
            views = list(sources.photo_views(train_files, args.side, seed=0, both=args.both_views))
            print(f"photo sources: {len(views)} views of {len(train_files)} training photos "
                  f"({len(held)} held out, never used)")
            srcs += views
        if args.windows:
            wins = list(sources.photo_windows(train_files, args.side, count=args.windows, seed=2))
            print(f"photo window sources: {len(wins)} more native windows")
            srcs += wins
    if args.extra_photos and args.extra_n > 0:
        import numpy as np

        train_files, _ = split_clean(list_images(args.extra_photos))
        pick = np.random.default_rng(0).permutation(len(train_files))[: args.extra_n]
        extra = list(sources.photo_views([train_files[i] for i in sorted(pick)], args.side, seed=1))
        print(f"extra photo sources: {len(extra)} of {len(train_files)} training-side files")
        srcs += extra
    if args.clean_art:
        from pathlib import Path

        from PIL import Image

        folder = Path(args.clean_art_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, img in sources.procedural_art(args.clean_art, seed=11, min_side=320, max_side=1024,
                                                dither=args.clean_art_dither):
            Image.fromarray(img).save(folder / f"{name.replace('/', '-')}.png")
        print(f"clean art: {args.clean_art} PNGs in {folder}")
    if args.limit and len(srcs) > args.limit:
        import numpy as np

        keep = sorted(np.random.default_rng(5).permutation(len(srcs))[: args.limit])
        srcs = [srcs[i] for i in keep]
        print(f"kept {len(srcs)} sources (--limit)")
    families = [f for f in args.families.split(",") if f] or None
    df = chains.make_chains(srcs, families, steps=20, keep=(0, 1, 2, 3, 5, 10, 20), out_dir=args.out,
                            seed=0, workers=args.workers, progress=False)
    print(f"chains: {df['chain_id'].nunique()} chains, {len(df)} images, families "
          f"{sorted(df['family'].unique())} in {time.time() - t:.0f}s")
