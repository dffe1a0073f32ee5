#!/usr/bin/env bash
# A second independent set, built in session 11 to judge a candidate recipe on images that no
# earlier comparison has scored: the same layout as the default calibration's set, so
# benchmarks/select_cnn.py reads it with --work.
#
#   bash benchmarks/fresh_set.sh [WORK]          (default WORK: /tmp/cg_fresh)
#   python benchmarks/select_cnn.py WEIGHTS... --work /tmp/cg_fresh --out /tmp/cg_fresh/scores
#
# Sources (all `apt-get download` + `dpkg -x`; nothing is committed), none used by training
# (benchmarks/train_cnn.sh), the default calibration (make_default_calibration.sh) or the model
# selections of sessions 1-10:
#   - photos: the 11 photographs among lxqt-themes' wallpapers (benchmarks/lxqt_photos.sh; before
#     this set they were only a clean folder checked for the shipped weights). Two 512 px native
#     windows of each are chain sources (named wp-*, so select_cnn counts them as photos); two
#     768 px crops + one JPEG q85 of each are extra clean images.
#   - digital art: Debian's desktop-base themes (the 16:9 GRUB backgrounds and the plymouth
#     backgrounds) and the largest sway-backgrounds wallpaper: one 512 px window each as a chain
#     source, two 768 px crops each as extra clean images.
#   - game textures: OpenArena's texture pack (openarena-081-textures; photo-derived stone, metal,
#     rust, wood; its JPEGs), pictures at least 256 px on the short side, in name order: every 6th as a chain
#     source, the rest (up to 240) as extra clean images, half of them JPEG q85.
# Chains: every replicator family, 20 steps, steps 0,1,3,5,10,20 kept, seed $SEED (20261201).
# About 10 minutes on the 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/cg_fresh}
SEED=${SEED:-20261201}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$WORK/debs"
if [ ! -d "$WORK/debs/x/usr/share/desktop-base" ] || [ ! -d "$WORK/debs/x/usr/share/backgrounds/sway" ] \
   || ! ls "$WORK"/debs/x/usr/share/games/openarena/*/pak4-textures.pk3 >/dev/null 2>&1; then
  (cd "$WORK/debs" && apt-get download desktop-base sway-backgrounds openarena-081-textures \
     && for f in *.deb; do dpkg -x "$f" x; done)
fi
bash benchmarks/lxqt_photos.sh "$WORK/debs/lxqt" "$WORK/lxqt"
tex="$WORK/openarena"
if [ ! -d "$tex" ]; then
  mkdir -p "$tex" && unzip -q -o "$WORK"/debs/x/usr/share/games/openarena/*/pak4-textures.pk3 \
    'textures/*.jpg' -d "$tex"
fi

WORK="$WORK" SEED="$SEED" python - <<'EOF'
import os
import shutil
from pathlib import Path

import torch

from collapseguard.calibration.clean_sets import load_files, write_variants
from collapseguard.detectors.crops import crop_grid
from collapseguard.images import is_image_name
from collapseguard.training_data_tools.chains import make_chains

torch.set_num_threads(1)
work, seed = Path(os.environ["WORK"]), int(os.environ["SEED"])
share = work / "debs" / "x" / "usr" / "share"


def window(img, i, n):
    """The i-th of n 512 px native-resolution windows on crop_grid's fixed grid."""
    return crop_grid(img, min(512, *img.shape[:2]), n)[i]


photos = list(load_files(sorted((work / "lxqt").iterdir())))
art_files = sorted(share.glob("desktop-base/*-theme/grub/grub-16x9.png"))
art_files += sorted(p for p in share.glob("plymouth/themes/*/*background*.png"))
sway = sorted(share.glob("backgrounds/sway/*.png"), key=lambda p: p.stat().st_size)[-1:]
art = [(f"{p.parents[1].name if 'grub' in p.parts else p.parent.name}-{p.stem}", img)
       for p, (_, img) in zip(art_files + sway, load_files(art_files + sway))]
tex_files = sorted(p for p in (work / "openarena").rglob("*") if p.is_file() and is_image_name(p.name))
textures = [(p.relative_to(work / "openarena").with_suffix("").as_posix().replace("/", "-"), img)
            for p, (_, img) in zip(tex_files, load_files(tex_files)) if min(img.shape[:2]) >= 256]
print(f"{len(photos)} photos, {len(art)} art pictures, {len(textures)} textures >= 256 px")

sources = [(f"wp-{n}-w{i}", window(img, i, 3)) for n, img in photos for i in (0, 2)]
sources += [(f"art-{n}", window(img, 0, 1)) for n, img in art]
tex_chain = textures[::6]
sources += [(f"tex-{n}", window(img, 0, 1)) for n, img in tex_chain]
tex_clean = [x for i, x in enumerate(textures) if i % 6][:240]

clean = work / "clean"
shutil.rmtree(clean, ignore_errors=True)
n = len(write_variants(photos, clean / "photos", crops=2, crop_size=768, jpeg_quality=85))
n += len(write_variants(art, clean / "art", crops=2, crop_size=768, jpeg_quality=None))
half = len(tex_clean) // 2
n += len(write_variants(tex_clean[:half], clean / "textures_png", crops=1, crop_size=4096, jpeg_quality=None))
n += len(write_variants(tex_clean[half:], clean / "textures_jpeg", crops=1, crop_size=4096,
                        jpeg_quality=85, png=False))
print(f"{n} extra clean images in {clean}")
shutil.rmtree(work / "chains", ignore_errors=True)
m = make_chains(sources, steps=20, keep=[0, 1, 3, 5, 10, 20], out_dir=work / "chains", seed=seed,
                workers=2, progress=False)
print(f"{m['chain_id'].nunique()} chains from {len(sources)} sources written to {work / 'chains'}")
EOF
