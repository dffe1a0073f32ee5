#!/usr/bin/env bash
# Reproduce the Banana100 study's finding on our simulated chains: which detectors fail the
# Δ criterion (Δ5, Δ10, Δ20 against step 1 all > 0) on how many chains, AUROC clean vs step k,
# Spearman per chain, and images/s of each detector measured in the same run.
#
#   bash benchmarks/evaluate_study.sh WORK_DIR
#   SEED=8 DETECTORS=cnn,cnn:other.safetensors bash benchmarks/evaluate_study.sh WORK_DIR8
#     (a fresh draw of the same recipe, for judging candidate weights on chains nobody has scored)
#
# Chains: 4 procedural art images drawn with seed 7 (the shipped cnn was trained on art drawn with
# seed 0, so these sources are new to it) + the first 4 bundled photos (astronaut, chelsea,
# coffee, rocket: sources the cnn has seen, with different chain parameters here) x every
# replicator family, 20 steps, steps 0,1,2,3,5,10,20 kept, seed 7: 64 chains, 448 images.
# Writes WORK_DIR/evaluate (all chains) and WORK_DIR/evaluate_unseen (the art chains only,
# recomputed from the same scores). Nothing here is committed. About 12 minutes on 2 shared CPU
# cores (pyiqa:niqe is the slow one). Needs the [iqa] extra (pyiqa, scikit-video); no network.
set -euo pipefail
WORK="${1:?usage: bash benchmarks/evaluate_study.sh WORK_DIR}"
SEED=${SEED:-7}
DETECTORS=${DETECTORS:-cnn,nss,pyiqa:piqe,pyiqa:niqe}
export HF_HUB_OFFLINE=1

if [ ! -f "$WORK/chains/manifest.csv" ]; then
  collapseguard chains make --sources art:4:320-640,bundled --max-sources 8 \
    --steps 20 --keep 0,1,2,3,5,10,20 --seed "$SEED" --workers 2 --no-progress --out "$WORK/chains"
fi

collapseguard evaluate --chains "$WORK/chains" \
  --detectors "$DETECTORS" \
  --steps 5,10,20 --auroc-steps 2,3,5,10,20 --scale std --batch-size 8 --threads 1 -q \
  --out "$WORK/evaluate"

# the same scores, restricted to chains whose source the cnn never saw in training
python - "$WORK" "$SEED" <<'PY'
import sys, pandas as pd
w, seed = sys.argv[1:3]
s = pd.read_csv(f"{w}/evaluate/scores.csv", dtype={"chain_id": str, "error": str})
s[s["source_image"].str.startswith(f"art/{seed}-")].to_csv(f"{w}/scores_unseen.csv", index=False)
PY
collapseguard evaluate --from-scores "$WORK/scores_unseen.csv" --scale std --out "$WORK/evaluate_unseen"

cat "$WORK/evaluate/results.md"
