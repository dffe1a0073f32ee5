#!/usr/bin/env bash
# Everything a candidate cnn is judged on, rebuilt from an empty folder (nothing is committed):
#
#   bash recipes/judging_data.sh DIR        # WORKERS=1 for one core
#
# - DIR/eval: the evaluation set with its network families (NETWORKS=1 recipes/eval_set.sh; the
#   MAXIM families' npm tarballs are fetched first where missing);
# - DIR/wh: the web-history clean set of its sources (recipes/web_history_set.py build);
# - DIR/calib: the calibration's chains and clean images (recipes/make_default_calibration.sh up
#   to its step 4, CG_CALIB_DATA_ONLY=1; the shipped calibration files are not rewritten).
#
# Each part is skipped or resumed where its output exists. Then, for weights W:
#   collapseguard calibrate --chains DIR/calib/chains --clean DIR/calib/clean --detector cnn:W \
#     --max-false-drop 0.01 --confidence 0.95 --holdout 0.3 --out CAL.json
#   python recipes/judge_cnn.py --eval DIR/eval/stored/manifest.csv \
#     --web-history DIR/wh/manifest.csv --cache DIR/judge --candidate W --calibration CAL.json
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: bash recipes/judging_data.sh DIR" >&2; exit 2; }
DIR=$(realpath -m "$1")  # before cd: a relative DIR is the caller's
cd "$(dirname "$0")/.."
mkdir -p "$DIR"
# the MAXIM families' npm tarballs (replicators/maxim.py), fetched once from the npm registry
MAXIM_DIR=${COLLAPSEGUARD_MAXIM_DIR:-$HOME/.cache/collapseguard}
mkdir -p "$MAXIM_DIR"
for t in denoising deblurring retouching enhancement; do
  [ -f "$MAXIM_DIR/upscalerjs-maxim-$t-0.1.0.tgz" ] || (cd "$MAXIM_DIR" && npm pack --silent "@upscalerjs/maxim-$t@0.1.0" >/dev/null)
done
NETWORKS=1 WORKERS=${WORKERS:-2} bash recipes/eval_set.sh "$DIR/eval"
python recipes/web_history_set.py build "$DIR/eval" "$DIR/wh"
CG_CALIB_WORK="$DIR/calib" CG_CALIB_WORKERS=${WORKERS:-2} CG_CALIB_DATA_ONLY=1 \
  bash recipes/make_default_calibration.sh cnn
echo "judging data ready in $DIR"
