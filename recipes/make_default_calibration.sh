#!/usr/bin/env bash
# Build the calibrations shipped in collapseguard/calibration/defaults/<detector>.json (+ .png).
#
#   CG_CALIB_WORK=DIR bash recipes/make_default_calibration.sh        # cnn and nss
#   CG_CALIB_WORK=DIR bash recipes/make_default_calibration.sh nss    # only nss
#
# What it does (all offline except `apt-get download` of two Debian wallpaper packages,
# stellarium-data, and with CG_CALIB_KINDS=1 the four packages of step 3d):
#   1. clean photos: Debian's ukui-wallpapers and plasma-workspace-wallpapers (one picture per
#      wallpaper, at its largest size). NOT gnome/mate-backgrounds: those are the cnn detector's
#      training negatives, and calibrating on training images would make the threshold optimistic.
#      Images stay under $WORK and are never committed.
#   2. chains: every 3rd wallpaper (one 512 px native-resolution centre crop) plus procedural
#      "digital art" (seed $SEED, not the training seed), through every replicator family for 20
#      steps, keeping steps 0,1,3,5,10,20.
#   3. extra clean images (--clean): the other wallpapers as 2 native-resolution 768 px crops + one
#      JPEG (q85) each, procedural art as PNG, other procedural art as JPEG (q80), and the
#      calibration quarter of Debian's stellarium-data night-sky photos (recipes/nightsky.sh), and
#      $DRAWN drawn pixel-art and $DRAWN drawn screen pictures (training_data_tools.drawn_kinds, seed
#      41; training draws seed 31), each as PNG and as JPEG 4:2:0 at a quality drawn in 60-95.
#  3d. only with CG_CALIB_KINDS=1 (a measured variant, not the shipped calibration: see
#      docs/history/model_history.md): real kinds (recipes/calibration_kinds.py, into $WORK/kinds),
#      about 270 pictures from four Debian packages no training, evaluation or fresh-set recipe
#      reads (scratch, gnumeric-doc, crawl-tiles-data, freedink-data): photos and drawn scenes,
#      illustrations, screenshots, game textures and pixel art, each as PNG and as JPEG 4:2:0 at a
#      quality drawn in 60-95, passed to calibrate by kind (--clean KIND=...). The calibration is
#      then written to $WORK/<detector>.kinds.json, and the shipped file is left alone.
#  3w. only with CG_CALIB_WEB=1 (a candidate, not the shipped calibration): every clean image of
#      step 3 also with one web history (recipes/web_history_set.py folder: 1-4 JPEG saves at
#      q60-95 4:2:0, resizes, upload sharpening, screenshots) in $WORK/web, passed as the clean
#      kind "web"; written to $WORK/<detector>.web.json.
#   4. `collapseguard calibrate` with alpha = 1 %, confidence 95 %, 30 % of sources held out for the
#      drop curve; the per-image scores are kept in $WORK/scores_<detector>_<version>.csv.
#
# Environment: CG_CALIB_WORK (required: the work folder), CG_CALIB_SEED (20261130),
# CG_CALIB_WORKERS (2), CG_CALIB_ART_CHAINS (60), CG_CALIB_ART_CLEAN (400, half PNG, half JPEG),
# CG_CALIB_DRAWN (60; 0 leaves the drawn kinds out), CG_CALIB_KINDS (0; 1 adds step 3d),
# CG_CALIB_WEB (0; 1 adds step 3w), CG_CALIB_DATA_ONLY (0; 1 stops before step 4: the images a
# candidate's calibration reads, `collapseguard calibrate --chains $WORK/chains --clean $WORK/clean`).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${CG_CALIB_WORK:?set CG_CALIB_WORK to a work folder (images, chains and scores go there)}
SEED=${CG_CALIB_SEED:-20261130}
WORKERS=${CG_CALIB_WORKERS:-2}
ART_CHAINS=${CG_CALIB_ART_CHAINS:-60}
ART_CLEAN=${CG_CALIB_ART_CLEAN:-400}
DRAWN=${CG_CALIB_DRAWN:-60}
KINDS=${CG_CALIB_KINDS:-0}
WEB=${CG_CALIB_WEB:-0}
OUTDIR=collapseguard/calibration/defaults
DETECTORS=("$@")
[ ${#DETECTORS[@]} -eq 0 ] && DETECTORS=(cnn nss)
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$WORK/debs" "$OUTDIR"

# 1. wallpapers ---------------------------------------------------------------------------------
if [ ! -d "$WORK/debs/x/usr/share/wallpapers" ]; then
  (cd "$WORK/debs" && apt-get download ukui-wallpapers plasma-workspace-wallpapers \
     && for f in *.deb; do dpkg -x "$f" x; done)
fi

# 2 + 3. chains and extra clean images -----------------------------------------------------------
if [ ! -f "$WORK/chains/manifest.csv" ] || [ ! -f "$WORK/clean/.done" ]; then
  rm -f "$WORK"/scores_*.csv  # cached scores belong to the old images
  WORK="$WORK" SEED="$SEED" WORKERS="$WORKERS" ART_CHAINS="$ART_CHAINS" ART_CLEAN="$ART_CLEAN" \
  python recipes/calibration_set.py
fi

# 3b. night skies: the calibration quarter of the stellarium-data astrophotographs, as they ship
if [ ! -d "$WORK/clean/nightsky" ]; then
  bash recipes/nightsky.sh "$WORK/debs" "$WORK/clean/nightsky" calibration
  rm -f "$WORK"/scores_*.csv  # cached scores do not cover them
fi

# 3c. drawn kinds: pixel art and screens, as PNG and as JPEG 4:2:0 (quality 60-95)
if [ "$DRAWN" -gt 0 ] && [ ! -f "$WORK/clean/drawn/.done" ]; then
  rm -rf "$WORK/clean/drawn" && mkdir -p "$WORK/clean/drawn"
  python -m collapseguard.training_data_tools.drawn_kinds "$WORK/clean/drawn" "$DRAWN" --seed 41 --jpeg
  touch "$WORK/clean/drawn/.done"
  rm -f "$WORK"/scores_*.csv  # cached scores do not cover them
fi

# 3d. real kinds (CG_CALIB_KINDS=1): photos, illustrations, screenshots, game textures, pixel art
kinds=() kinds_text=() suffix=""
if [ "$KINDS" = 1 ]; then
  [ -f "$WORK/kinds/.done" ] || python recipes/calibration_kinds.py "$WORK/kinds"
  for d in "$WORK"/kinds/*/; do kinds+=(--clean "$(basename "$d")=$d"); done
  kinds_text=(--describe-clean "real kinds: $(ls "$WORK"/kinds/*/*__png.png | wc -l) pictures from Debian's scratch, gnumeric-doc, crawl-tiles-data and freedink-data (photos and drawn scenes, illustrations, screenshots, game textures, pixel art; recipes/calibration_kinds.py), each as PNG and as JPEG 4:2:0 q60-95")
  suffix=".kinds"
fi

# 3w. web histories of the clean images (CG_CALIB_WEB=1) ------------------------------------------
out_json() { if [ "$KINDS" = 1 ]; then echo "$WORK/$1.kinds.json"; elif [ "$WEB" = 1 ]; then echo "$WORK/$1.web.json"; else echo "$OUTDIR/$1.json"; fi; }
if [ "$WEB" = 1 ]; then
  [ -f "$WORK/web/.done" ] || { python recipes/web_history_set.py folder "$WORK/clean" "$WORK/web" && touch "$WORK/web/.done"; }
  kinds+=(--clean "web=$WORK/web")
  kinds_text+=(--describe-clean "web histories: every extra clean image again after one web history (recipes/web_history_set.py folder: 1-4 JPEG saves q60-95 4:2:0, resizes, upload sharpening, screenshots)")
  suffix="$suffix.web"
fi

[ "${CG_CALIB_DATA_ONLY:-0}" = 1 ] && exit 0

# 4. calibrate ----------------------------------------------------------------------------------
for det in "${DETECTORS[@]}"; do
  safe=$(echo "$det" | tr -c 'A-Za-z0-9_.\n-' '_')
  ver=$(python -c "from collapseguard.detectors import create; print(create('$det').version)")
  scores="$WORK/scores_${safe}_${ver}${suffix}.csv"  # reused only for the same detector version and set
  if [ -f "$scores" ]; then
    src=(--from-scores "$scores")
  else
    src=(--chains "$WORK/chains" --clean "$WORK/clean" "${kinds[@]}" --detector "$det" --scores-out "$scores")
  fi
  collapseguard calibrate "${src[@]}" --max-false-drop 0.01 --confidence 0.95 --holdout 0.3 \
    --describe-clean "chains: step 0 of 1/3 of the Debian ukui/plasma wallpapers (512 px native crop) and $ART_CHAINS procedural art images (seed $SEED); 8 replicator families, steps 1,3,5,10,20 degraded" \
    --describe-clean "extra clean: the other 2/3 of the wallpapers (2 native 768 px crops + 1 JPEG q85 each), $((ART_CLEAN / 2)) procedural art PNGs and $((ART_CLEAN - ART_CLEAN / 2)) procedural art JPEGs q80 (seed $((SEED + 1))); $(ls "$WORK/clean/nightsky" | wc -l) night-sky astrophotographs as shipped in Debian's stellarium-data (the calibration quarter, recipes/nightsky.sh); $DRAWN drawn pixel-art and $DRAWN drawn screen pictures (seed 41), each as PNG and as JPEG 4:2:0 q60-95" \
    "${kinds_text[@]}" --out "$(out_json "$safe")"
  # the file names the work folder as $CG_CALIB_WORK, never as this machine's absolute path
  # (tests/test_shipped_files.py checks the shipped ones)
  python - "$(out_json "$safe")" "$WORK" <<'PY'
import json, os, sys
path, work = sys.argv[1], os.path.abspath(sys.argv[2])
with open(path, encoding="utf-8") as f:
    text = f.read()
text = text.replace(json.dumps(work + "/")[1:-1], "$CG_CALIB_WORK/")
json.loads(text)
with open(path, "w", encoding="utf-8") as f:
    f.write(text)
PY
done
