#!/usr/bin/env bash
# The 11 photos among Debian's lxqt-themes wallpapers, as a clean folder no training or
# calibration uses (MODEL_CARD.md, "Clean kinds"):
#
#   bash recipes/lxqt_photos.sh DEB_DIR OUT_DIR
#   python benchmarks/clean_check.py --folder OUT_DIR
#
# Downloads lxqt-themes into DEB_DIR (once), unpacks it with dpkg -x and links the photographs of
# usr/share/lxqt/wallpapers into OUT_DIR (flowers, butterflies, fog, rain, a beam of light). The
# package's other wallpapers are logos, origami and flat geometric art, and are left out by name.
set -euo pipefail
deb=$1 out=$2
src="$deb/x/usr/share/lxqt/wallpapers"
if [ ! -d "$src" ]; then
  mkdir -p "$deb" && (cd "$deb" && apt-get download lxqt-themes && dpkg -x lxqt-themes_*.deb x)
fi
rm -rf "$out" && mkdir -p "$out"
for f in Butterfly-Kenneth-Wimer.jpg Valendas.png after-the-rain.jpg appleflower.png beam.png \
         butterfly.png cloud.png drop.png flowers.png fog.jpg this-is-not-windows.jpg; do
  [ -f "$src/$f" ] || { echo "missing from lxqt-themes: $f" >&2; exit 1; }
  ln -s "$src/$f" "$out/$f"
done
echo "lxqt photos: $(ls "$out" | wc -l) files in $out"
