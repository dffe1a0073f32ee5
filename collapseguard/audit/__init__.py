"""Dataset audit: how much of a dataset looks model-degraded, where, and examples to judge by eye.

``run_audit`` scores the inputs through the filter's own reading and scoring (``run_score``),
optionally on a seeded random sample, compares other detectors, and writes ``report.html``,
``summary.json``, ``flagged.csv`` and ``scores.parquet``.
"""
