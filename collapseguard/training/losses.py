"""The chain-aware objective: pairwise ranking within a chain plus clean-vs-degraded classification.

Both losses take soft targets, so the same code trains on chain labels (hard 0/1 targets, a chain's
later step always more degraded) and on a teacher detector's labels (soft targets from its scores,
pair probabilities from its score differences) for distillation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def classification_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted binary cross-entropy on image logits; ``targets`` may be soft (in [0, 1]).

    Rows with weight 0 are ignored; returns 0 when every weight is 0.
    """
    w = weights.float()
    total = w.sum()
    if total <= 0:
        return logits.sum() * 0.0
    bce = F.binary_cross_entropy_with_logits(logits, targets.float(), reduction="none")
    return (bce * w).sum() / total


def pair_indices(groups: torch.Tensor, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All (i, j) with the same group and ``order[j] > order[i]`` (j should score higher)."""
    same = groups[:, None] == groups[None, :]
    later = order[None, :] > order[:, None]
    i, j = torch.nonzero(same & later, as_tuple=True)
    return i, j


def ranking_loss(logits: torch.Tensor, groups: torch.Tensor, order: torch.Tensor,
                 soft_scale: float | None = None) -> torch.Tensor:
    """RankNet loss over pairs in the same group: -log sigmoid(s_j - s_i) for later j.

    By default every pair is certain (a chain's later step is worse). With ``soft_scale`` the
    ``order`` values are a teacher's scores and the target probability that j is worse than i is
    ``sigmoid((order_j - order_i) / soft_scale)``, so near-ties count little. Returns 0 when there
    are no pairs.
    """
    i, j = pair_indices(groups, order)
    if len(i) == 0:
        return logits.sum() * 0.0
    diff = logits[j] - logits[i]
    if soft_scale is None:
        p = torch.ones_like(diff)
    else:
        p = torch.sigmoid((order[j] - order[i]).float() / soft_scale)
    return F.binary_cross_entropy_with_logits(diff, p)
