#!/usr/bin/env bash
# Reproduce the shipped cnn weights (collapseguard/weights/cnn.safetensors) in one command:
#   bash benchmarks/train_cnn.sh
# 1. makes the training chains (bundled photos + procedural art, every replicator family,
#    20 steps, keeping 0,1,2,3,5,10,20) with make_chains, seed 0, 2 workers;
# 2. trains with `collapseguard train` (seed 0, 2 threads), writing the weights, <out>.json and
#    the model card <out>.md with held-out metrics.
# Clean photos (optional, strongly recommended): the Debian wallpaper packages, never committed:
#   cd /tmp && apt-get download gnome-backgrounds mate-backgrounds && for f in *.deb; do dpkg -x $f wp; done
# and CLEAN=/tmp/wp/usr/share/backgrounds (the default, or /tmp/wp/x/usr/share/backgrounds when
# only that exists; skipped when neither folder exists).
set -euo pipefail
WORK=${WORK:-/tmp/cg_train}
if [ -z "${CLEAN:-}" ]; then
  CLEAN=/tmp/wp/usr/share/backgrounds
  [ -d "$CLEAN" ] || CLEAN=/tmp/wp/x/usr/share/backgrounds
fi
OUT=${OUT:-collapseguard/weights/cnn.safetensors}
SOURCES=${SOURCES:-bundled,art:64:320-640}
ITERS=${ITERS:-3000}
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1
start=$(date +%s)
rm -rf "$WORK/chains"
python benchmarks/make_train_chains.py "$SOURCES" "$WORK/chains"
clean_args=()
if [ -d "$CLEAN" ]; then clean_args=(--clean "$CLEAN"); else echo "no clean folder $CLEAN: training without extra photos"; fi
collapseguard train --chains "$WORK/chains" "${clean_args[@]}" --out "$OUT" --steps "$ITERS" --seed 0 --threads 2
echo "total wall time: $(( $(date +%s) - start )) s"
