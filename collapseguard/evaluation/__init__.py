"""The Banana100 study's evaluation for any detector on any replication chains.

``metrics`` holds the arithmetic (Δ gap, pass/fail criterion, AUROC, Spearman), ``scoring`` scores a
chain manifest with several detectors while timing them, ``run`` ties it together and ``report``
writes results.md, chains.csv, scores.csv, the plot and summary.json.
"""

from collapseguard.evaluation.metrics import (
           auroc,
           chain_deltas,
           detector_scale,
           spearman_with_step,
)
from collapseguard.evaluation.report import write_outputs
from collapseguard.evaluation.run import (
           Evaluation,
           evaluate_scores,
           load_chain_manifest,
           run_evaluation,
)

__all__ = ["Evaluation", "auroc", "chain_deltas", "detector_scale", "evaluate_scores",
           "load_chain_manifest", "run_evaluation", "spearman_with_step", "write_outputs"]
