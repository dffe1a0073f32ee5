#!/usr/bin/env bash
# The evaluation set no training run touches (recipes/eval_set.py says how each stage works):
#
#   bash recipes/eval_set.sh OUT              # WORKERS=1 for one core; NETWORKS=1 adds the network
#                                             # families (collapseguard[networks] and the MAXIM
#                                             # tarballs, docs/TRAINING_DATA.md; resumes an existing OUT)
#   collapseguard evaluate --chains OUT/stored --detectors cnn --calibration default --out OUT/eval
#
# Clean images of every kind users hold (photos, foliage, night photos, painted portraits,
# illustrations, anime, pixel art, flat art, screenshots, diagrams and text, game textures, game
# renders), from 30 Debian packages that no shipped recipe trains or calibrates on (OUT/packages.tsv
# lists them with their licences; nothing is committed). Each source is one native-resolution
# window of at most 384 x 384 px (never resized), goes through two of the eight replicator
# families (20 steps; steps 0, 1, 5, 10, 20 kept), every 10th source (its centre 192 px) also through the opt-in
# super_resolution family (a pretrained network), and every chain is stored as PNG,
# JPEG q90 4:2:0, JPEG q75 4:2:0 and WebP q80: OUT/stored/manifest.csv, with the columns kind
# (the source's kind), storage and stored_from. Stages whose output exists are skipped.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: bash recipes/eval_set.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
net=()
if [ "${NETWORKS:-0}" = 1 ]; then net=(--networks); fi
python recipes/eval_set.py "$1" --workers "${WORKERS:-2}" "${net[@]}"
