#!/usr/bin/env bash
# A second independent set, to judge weights on images that neither training nor the default
# calibration uses: the same layout as the default calibration's set, so
# benchmarks/select_cnn.py reads it with --work.
#
#   bash recipes/fresh_set.sh WORK
#   python benchmarks/select_cnn.py WEIGHTS... --work WORK --out WORK/scores
#
# Sources (all `apt-get download` + `dpkg -x`; nothing is committed), none used by training
# (recipes/train_cnn.sh), or the default calibration (make_default_calibration.sh):
#   - photos: the 11 photographs among lxqt-themes' wallpapers (recipes/lxqt_photos.sh; before
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
WORK=${1:?usage: bash recipes/fresh_set.sh WORK}
SEED=${SEED:-20261201}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$WORK/debs"
if [ ! -d "$WORK/debs/x/usr/share/desktop-base" ] || [ ! -d "$WORK/debs/x/usr/share/backgrounds/sway" ] \
   || ! ls "$WORK"/debs/x/usr/share/games/openarena/*/pak4-textures.pk3 >/dev/null 2>&1; then
  (cd "$WORK/debs" && apt-get download desktop-base sway-backgrounds openarena-081-textures \
     && for f in *.deb; do dpkg -x "$f" x; done)
fi
bash recipes/lxqt_photos.sh "$WORK/debs/lxqt" "$WORK/lxqt"
tex="$WORK/openarena"
if [ ! -d "$tex" ]; then
  mkdir -p "$tex" && unzip -q -o "$WORK"/debs/x/usr/share/games/openarena/*/pak4-textures.pk3 \
    'textures/*.jpg' -d "$tex"
fi

WORK="$WORK" SEED="$SEED" python recipes/fresh_set.py
