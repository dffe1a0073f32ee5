#!/usr/bin/env bash
# Night-sky photos for training negatives, calibration and an untouched test, from one partition.
#
#   bash recipes/nightsky.sh DEB_DIR OUT_DIR train|calibration|test
#
# Downloads Debian's stellarium-data into DEB_DIR (once; 246 MB, 555 astrophotographs of nebulae
# and galaxies in usr/share/stellarium/nebulae/default) and links one part of them into OUT_DIR:
# sorted by name, file i goes to `train` when i % 4 == 0, to `calibration` when i % 4 == 2 and to
# `test` otherwise. Training (recipes/train_cnn.sh), the shipped calibration
# (recipes/make_default_calibration.sh) and the night-sky check (benchmarks/clean_check.py)
# each see only their own part, so no night-sky photo is both learned from and measured on.
# Night skies matter because their sensor noise looks like the noise replication adds: a cnn
# trained without them drops many of them (CHANGELOG.md, 2026-11-30).
set -euo pipefail
deb=$1 out=$2 part=$3
case "$part" in train) want=0 ;; calibration) want=2 ;; test) want=odd ;; *)
  echo "part must be train, calibration or test" >&2; exit 2 ;; esac
src="$deb/x/usr/share/stellarium/nebulae/default"
if [ ! -d "$src" ]; then
  mkdir -p "$deb" && (cd "$deb" && apt-get download stellarium-data && dpkg -x stellarium-data_*.deb x)
fi
rm -rf "$out" && mkdir -p "$out"
i=0
while IFS= read -r f; do
  r=$((i % 4)); i=$((i + 1))
  if [ "$want" = odd ]; then [ $((r % 2)) -eq 1 ] || continue; else [ "$r" -eq "$want" ] || continue; fi
  ln -s "$src/$f" "$out/$f"
done < <(cd "$src" && ls | grep -E '\.(png|jpg|jpeg)$' | LC_ALL=C sort)
echo "night sky ($part): $(ls "$out" | wc -l) files in $out"
