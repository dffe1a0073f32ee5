#!/usr/bin/env bash
# Replication chains of training-side pictures of several kinds, for fitting the comparator
# (recipes/compare_weights.py takes their manifests beside its own chains):
#
#   bash recipes/compare_chains.sh WORK       # WORK/chains0 .. WORK/chains7, each with manifest.csv
#   python recipes/compare_weights.py CHAINS/manifest.csv WORK/chains*/manifest.csv --work FIT --out W
#
# Pictures (never committed) come from the Debian packages recipes/train_cnn.sh trains on, none of
# which the evaluation set reads: wallpapers (gnome-backgrounds, mate-backgrounds,
# lomiri-wallpapers*), one view each (``photo_views``: a native 320 px window or a web-size
# downscale, alternating), the marble-data and gcompris-qt-data handbooks' screenshots and the
# colobot / extremetuxracer game textures (the 70% recipes/link_images.py puts in its training
# folders; one file per picture: the language versions of a screenshot and a texture's copies are
# one picture, of which the first by name is taken), and 60 procedural art, 40 pixel-art and 40
# screen pictures (seed 5). Each picture is one native window of at most 384 x 384 px (WORK/src),
# as the evaluation set's are. The pictures are split into four quarters by name; each quarter
# goes through two families in chains0-3 and two others in chains4-7, so every picture is seen by
# four of the eight families (10 steps; 0, 1, 2, 3, 5, 10 kept). Under 10 minutes on 2 cores
# after the download.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: bash recipes/compare_chains.sh WORK" >&2; exit 2; }
[ -n "$1" ] || { echo "compare_chains.sh: WORK must not be empty" >&2; exit 2; }
mkdir -p "$1"
WORK=$(realpath "$1")
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
mkdir -p "$WORK/debs"
if [ ! -d "$WORK/debs/x/usr/share/games/etr" ]; then
  (cd "$WORK/debs" && apt-get download gnome-backgrounds mate-backgrounds lomiri-wallpapers \
     lomiri-wallpapers-16.04 lomiri-wallpapers-20.04 marble-data gcompris-qt-data \
     colobot-common-textures extremetuxracer-data && for f in *.deb; do dpkg -x "$f" x; done)
fi
share="$WORK/debs/x/usr/share"
rm -rf "$WORK/photos" && mkdir -p "$WORK/photos"
for f in "$share"/backgrounds/gnome/*.webp "$share"/backgrounds/mate/*/* "$share"/backgrounds/*.jpg \
         "$share"/backgrounds/*.png; do
  [ -f "$f" ] || continue
  case "$(basename "$f")" in
    Elephants.jpg|Elephants_3840x2160.jpg|lomiri-default-background.png) continue ;;  # copies
  esac
  ln -sf "$(realpath "$f")" "$WORK/photos/$(basename "$f" | tr ' ' '_')"
done
rm -rf "$WORK/shots_train" "$WORK/shots_test" "$WORK/gametex_train" "$WORK/gametex_test"
python recipes/link_images.py "$share/doc/HTML" --out "$WORK/shots_train" --test-out "$WORK/shots_test"
python recipes/link_images.py "$share/games/colobot" "$share/games/etr" --min-side 256 \
  --out "$WORK/gametex_train" --test-out "$WORK/gametex_test"

rm -rf "$WORK/src" && mkdir -p "$WORK/src"
python - "$WORK" <<'EOF'
import os
import sys

import numpy as np
from PIL import Image

from collapseguard.training_data_tools.sources import resolve_sources

work = sys.argv[1]
rng = np.random.default_rng(123)
specs = [f"views:{work}/photos:320", f"folder:{work}/shots_train", f"folder:{work}/gametex_train",
         "art:60:256-640", "pixel:40", "screen:40"]
seen, n = set(), 0
for spec in specs:
    for name, arr in resolve_sources(spec, seed=5):
        picture = name.rsplit("__", 1)[-1] if spec.startswith("folder:") else name
        h, w = arr.shape[:2]
        if picture in seen or min(h, w) < 96:  # one file per picture (link_images.py's groups)
            continue
        seen.add(picture)
        ch, cw = min(h, 384), min(w, 384)
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        safe = name.replace("/", "_").replace("@", "_").replace(" ", "_")
        out = f"{work}/src/{safe}.png"
        if os.path.exists(out):
            raise SystemExit(f"two pictures named {safe}")
        Image.fromarray(arr[y:y + ch, x:x + cw]).save(out)
        n += 1
print(f"{n} pictures in {work}/src")
EOF

fams=("noise_tint,texture_simplify" "contour_wrinkles,scattered_dots" "aspect_drift,codec" "learned,mixed"
      "contour_wrinkles,aspect_drift" "noise_tint,learned" "texture_simplify,mixed" "scattered_dots,codec")
for k in 0 1 2 3; do
  rm -rf "$WORK/sub$k" && mkdir -p "$WORK/sub$k"
  (cd "$WORK/src" && ls | LC_ALL=C sort | awk -v k="$k" 'NR % 4 == k') | while read -r f; do
    ln -s "$(realpath "$WORK/src/$f")" "$WORK/sub$k/$f"
  done
done
for j in 0 1 2 3 4 5 6 7; do
  k=$((j % 4))
  rm -rf "$WORK/chains$j"
  collapseguard chains make --sources "folder:$WORK/sub$k" --steps 10 --keep 0,1,2,3,5,10 \
    --families "${fams[$j]}" --seed $((10 + j)) -w 2 -q --out "$WORK/chains$j"
done
