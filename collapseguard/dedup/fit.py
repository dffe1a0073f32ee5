"""Fitting the comparator and calibrating its level.

- ``fit_logistic``: the comparator's weights from pair inputs ``x(b) - x(a)`` and labels
  (1 = ``b`` is the later, more degraded step; 0.5 = two harmless copies of one step, which the
  comparator must not tell apart). Both orders of every pair are used, the inputs are divided by
  their spread ``s``, and the model has no intercept, so swapping a pair swaps the probability
  (``P(a, b) = 1 - P(b, a)``). Newton's method with a small L2 penalty; ``weight`` weighs pairs.
- ``calibrate_level``: the level ``p_worse`` must exceed for a copy to be marked a degraded copy,
  from groups made only of harmless copies of one clean picture (``copies.random_copy``). Each
  group contributes one number, the highest ``p_worse`` of its members against the copy kept;
  the group loses a member when that number exceeds the level. The level is the binomial order
  statistic of ``calibration.bounds``: with n independent clean groups, the probability that more
  than ``alpha`` of new clean groups lose a member is at most ``1 - confidence``.
- ``describe_all``: descriptions of many images (chain images for a fit), in ``describer_pool``
  worker processes when given one (``recipes/compare_weights.py --workers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # scipy.stats, which the bounds import, takes a second to load: only calibrate_level needs it
    from collapseguard.calibration.bounds import BoundResult


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 50,
                 weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(w, s)`` for P(y = 1) = sigmoid(w . x / s), fitted on both orders of each pair (``y`` may
    be fractional: soft labels)."""
    x = np.nan_to_num(np.asarray(x, np.float64))
    y = np.asarray(y, np.float64)
    wt = np.ones(len(y)) if weight is None else np.asarray(weight, np.float64)
    xs = np.concatenate([x, -x])
    ys = np.concatenate([y, 1.0 - y])
    ws = np.concatenate([wt, wt])
    ws = ws / ws.mean()
    s = xs.std(axis=0)
    s[s < 1e-9] = 1.0
    z = xs / s
    w = np.zeros(z.shape[1])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -60, 60)))
        grad = z.T @ (ws * (p - ys)) / len(ys) + l2 * w
        hess = (z * (ws * p * (1 - p))[:, None]).T @ z / len(ys) + l2 * np.eye(z.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w, s


def group_p_worse(utilities: np.ndarray, last: np.ndarray | None = None
                  ) -> tuple[int, np.ndarray, np.ndarray]:
    """``(kept, rank, p_worse)`` for one group from its members' utilities: the kept member has the
    lowest utility (ties: the first), ``rank`` orders members from least to most degraded, and
    ``p_worse[m]`` = P(member m is more degraded than the kept one) (NaN for the kept one).
    ``last`` (a mask, or tiers 0, 1, 2, ...): members ranked after all the others (each tier by
    utility), never kept while a member of a lower tier is there."""
    u = np.asarray(utilities, np.float64)
    after = np.zeros(len(u), np.int64) if last is None else np.asarray(last, np.int64)
    order = np.lexsort((np.arange(len(u)), u, after))
    rank = np.empty(len(u), np.int64)
    rank[order] = np.arange(len(u))
    kept = int(order[0])
    p = 1.0 / (1.0 + np.exp(-np.clip(u - u[kept], -60, 60)))
    p[kept] = np.nan
    return kept, rank, p


def calibrate_level(group_maxima, alpha: float = 0.01, confidence: float = 0.95) -> BoundResult:
    """The level from clean-only groups' highest ``p_worse`` (one number per group); a copy is a
    degraded copy when its ``p_worse`` is above the level."""
    from collapseguard.calibration.bounds import order_statistic_threshold

    return order_statistic_threshold(group_maxima, alpha, confidence)



def untrained_comparator(cnn_weights: str | None = None, mix: float | None = None):
    """A comparator with no weights (descriptions only, for fitting) reading the cnn
    ``cnn_weights`` (default: the comparator's own), or with ``mix`` that cnn's ``MixedCnn`` with
    the shipped detector's."""
    from collapseguard.detectors.base import create
    from collapseguard.detectors.compare import Comparator, MixedCnn, comparator_cnn

    cnn = create("cnn", weights=cnn_weights) if cnn_weights else comparator_cnn()
    if mix is not None:
        cnn = MixedCnn(cnn, create("cnn"), mix)
    return Comparator(untrained=True, cnn=cnn)


_WORKER_COMPARATOR = None


def _init_describer(cnn_weights: str | None) -> None:
    global _WORKER_COMPARATOR
    from collapseguard.engines.local import set_thread_budget

    set_thread_budget(1)  # before the cnn loads: the workers share the cores
    _WORKER_COMPARATOR = untrained_comparator(cnn_weights)


def _describe_in_worker(images) -> list[dict]:
    return _WORKER_COMPARATOR.describe(images)


def describer_pool(workers: int, cnn_weights: str | None = None):
    """A pool of ``workers`` spawned processes, each holding ``untrained_comparator(cnn_weights)``
    on one thread, for ``describe_all``; use it as a context manager (``with``)."""
    from concurrent.futures import ProcessPoolExecutor

    from collapseguard.engines.local import spawn_context

    return ProcessPoolExecutor(workers, mp_context=spawn_context(), initializer=_init_describer,
                               initargs=(cnn_weights,))


def describe_all(comparator, images, batch: int = 8, pool=None) -> list[dict]:
    """``comparator.describe`` of every image, in batches of ``batch``; with ``pool``
    (``describer_pool``, whose comparators must read the same cnn) the batches are described in
    its worker processes: the same descriptions up to the float rounding of the cnn's score on
    another thread count (about 1e-5)."""
    batches = [images[i: i + batch] for i in range(0, len(images), batch)]
    if pool is None:
        return [d for b in batches for d in comparator.describe(b)]
    return [d for part in pool.map(_describe_in_worker, batches) for d in part]
