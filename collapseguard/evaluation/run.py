"""The study's evaluation end to end: load chains, score them, compute the tables, write the report."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.detectors import Detector, create
from collapseguard.evaluation import breakdown, metrics
from collapseguard.evaluation.scoring import Timing, score_manifest
from collapseguard.training_data_tools.chain_check import unrelated_step_notes
from collapseguard.training_data_tools.loaders import load_chains


@dataclass
class Evaluation:
    """Every table of one evaluation run (what ``report.write_outputs`` writes)."""

    source: str
    scores: pd.DataFrame
    per_chain: pd.DataFrame
    failures: pd.DataFrame
    failures_by_family: pd.DataFrame
    auroc: pd.DataFrame
    spearman: pd.DataFrame
    scales: dict[str, metrics.Scale]
    timings: list[Timing]
    decode_seconds: float = 0.0
    delta_steps: tuple[int, ...] = metrics.DELTA_STEPS
    base_step: int = metrics.BASE_STEP
    auroc_steps: tuple[int, ...] = metrics.AUROC_STEPS
    clean_steps: tuple[int, ...] = metrics.CLEAN_STEPS
    batch_size: int = 16
    threads: int | None = None
    device: str = "default"
    #: detector name -> what ran its network (``runtime_of``; "" where nothing to say)
    runtimes: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: the notes that put the whole result in doubt (also in ``notes``); the command prints them
    warnings: list[str] = field(default_factory=list)
    #: the tables by storage and by clean kind (``breakdown``); empty frames when not computed
    auroc_by_storage: pd.DataFrame = field(default_factory=pd.DataFrame)
    auroc_by_kind: pd.DataFrame = field(default_factory=pd.DataFrame)
    failures_by_storage: pd.DataFrame = field(default_factory=pd.DataFrame)
    failures_by_kind: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: detector -> (threshold, where it came from) for the drop tables; the drop tables
    thresholds: dict[str, tuple[float, str]] = field(default_factory=dict)
    drops: pd.DataFrame = field(default_factory=pd.DataFrame)
    clean_drops: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def has_kinds(self) -> bool:
        """Whether the chains' manifest gave their sources' kinds (a ``kind`` column)."""
        return "source_kind" in self.scores.columns and bool((self.scores["source_kind"].fillna("") != "").any())

    @property
    def n_chains(self) -> int:
        return int(self.scores["chain_id"].nunique())

    @property
    def n_images(self) -> int:
        return int(len(self.scores) // max(1, self.scores["detector"].nunique()))

    @property
    def families(self) -> list[str]:
        return sorted(self.scores["family"].unique())

    @property
    def steps_present(self) -> list[int]:
        return sorted(int(s) for s in self.scores["step"].unique())


def load_chain_manifest(path: str | Path, notes: list[str] | None = None) -> pd.DataFrame:
    """Chains in any layout ``collapseguard chains ls`` reads (a manifest, a chains folder, a
    Banana100 download) as a validated manifest DataFrame with absolute paths (``notes``: as
    ``load_chains``'s)."""
    return load_chains(path, notes=notes)


def select_chains(manifest: pd.DataFrame, families: Sequence[str] | None = None,
                  max_chains_per_family: int | None = None) -> pd.DataFrame:
    """Keep only some families and/or the first N chains (sorted by id) of each family."""
    df = manifest
    if families:
        unknown = sorted(set(families) - set(df["family"].unique()))
        if unknown:
            raise ValueError(f"family(ies) {unknown} not in the chains; have {sorted(df['family'].unique())}")
        df = df[df["family"].isin(families)]
    if max_chains_per_family is not None:
        if max_chains_per_family < 1:
            raise ValueError("max_chains_per_family must be >= 1")
        keep = []
        for _, g in df.groupby("family", sort=True):
            keep += sorted(g["chain_id"].unique())[:max_chains_per_family]
        df = df[df["chain_id"].isin(keep)]
    return df.reset_index(drop=True)


#: below this many images on either side, an AUROC cell gets a note saying how far one image moves it
FEW_IMAGES = 20


def small_sample_notes(auroc: pd.DataFrame, ks: Sequence[int]) -> list[str]:
    """Notes for AUROC rows (detector x family) that rest on fewer than ``FEW_IMAGES`` clean or
    step-k images: one image more or less moves such a cell by up to 1/n, so a family of a handful
    of chains says little. One note per family and smallest side, naming detectors only when not
    every detector has that count (NaN scores drop images)."""
    found: dict[tuple[str, str, int], list[str]] = {}
    for _, r in auroc.iterrows():
        sides = [("clean", int(r["n_clean"]))] + [
            (f"step {k}", int(r[f"n_k{k}"])) for k in ks if int(r[f"n_k{k}"]) > 0]
        name, n = min(sides, key=lambda t: t[1])
        if 0 < n < FEW_IMAGES:
            found.setdefault((str(r["family"]), name, n), []).append(str(r["detector"]))
    n_det = auroc["detector"].nunique()
    notes = []
    for (family, name, n), dets in found.items():
        who = "" if len(dets) == n_det else f" for {', '.join(dets)}"
        notes.append(f"AUROC of family {family}{who} rests on {n} {name} image(s): "
                     f"one image moves it by up to {1 / n:.2f}")
    return notes


def evaluate_scores(
    scores: pd.DataFrame,
    timings: Sequence[Timing] = (),
    *,
    source: str = "",
    scale_method: str = "std",
    delta_steps: Sequence[int] = metrics.DELTA_STEPS,
    base_step: int = metrics.BASE_STEP,
    auroc_steps: Sequence[int] = metrics.AUROC_STEPS,
    clean_steps: Sequence[int] = metrics.CLEAN_STEPS,
    decode_seconds: float = 0.0,
    thresholds: dict[str, tuple[float, str]] | None = None,
    **info,
) -> Evaluation:
    """Compute every table from a long scores frame (chain_id, family, step, detector, score;
    optionally storage and source_kind, see ``scoring.GROUP_COLUMNS``). ``thresholds`` (detector
    -> (threshold, description)) adds the drop tables for those detectors."""
    scores = scores.copy()
    scores["step"] = scores["step"].astype(int)
    scores["score"] = pd.to_numeric(scores["score"], errors="coerce").astype(np.float64)
    if "error" not in scores.columns:
        scores["error"] = ""
    scores["error"] = scores["error"].fillna("").astype(str)
    scales = metrics.scales_for(scores, scale_method)
    per_chain = metrics.per_chain_table(scores, scales, delta_steps, base_step)
    notes = []
    present = set(scores["step"].unique())
    absent = [k for k in auroc_steps if k not in present]
    if absent:
        notes.append(f"no images at step(s) {absent}: their AUROC columns are empty")
    for det, s in scales.items():
        if s.degenerate:
            notes.append(f"detector {det}: every finite score equal (or none); scale set to 1.0")
    for det, g in per_chain.groupby("detector", sort=False):
        undefined = int((~np.isfinite(g["spearman"].to_numpy(np.float64))).sum())
        if undefined:  # the Spearman table counts the chains it averages: say why some are missing
            notes.append(f"detector {det}: Spearman ρ is undefined for {undefined} of {len(g)} chain(s) "
                         "(a score that does not change with step, or fewer than two finite scores); "
                         "the Spearman table leaves them out")
    auroc = metrics.auroc_table(scores, auroc_steps, clean_steps)
    notes += small_sample_notes(auroc, auroc_steps)
    thresholds = dict(thresholds or {})
    thr = {d: t for d, (t, _) in thresholds.items()}
    return Evaluation(
        auroc_by_storage=breakdown.auroc_by(scores, "storage", auroc_steps, clean_steps),
        auroc_by_kind=breakdown.auroc_by(scores, "source_kind", auroc_steps, clean_steps, by_family=False),
        failures_by_storage=breakdown.failures_by(per_chain, scores, "storage"),
        failures_by_kind=breakdown.failures_by(per_chain, scores, "source_kind"),
        thresholds=thresholds, drops=breakdown.drop_rates(scores, thr),
        clean_drops=breakdown.clean_drop_rates(scores, thr),
        source=source, scores=scores, per_chain=per_chain,
        failures=metrics.failure_counts(per_chain),
        failures_by_family=metrics.failure_counts(per_chain, by_family=True),
        auroc=auroc,
        spearman=metrics.spearman_summary(per_chain),
        scales=scales, timings=list(timings), decode_seconds=decode_seconds,
        delta_steps=tuple(delta_steps), base_step=base_step, auroc_steps=tuple(auroc_steps),
        clean_steps=tuple(clean_steps), notes=notes, **info,
    )


def runtime_of(det: Detector) -> str:
    """What runs a detector's network, as the speed figures should say: ``onnxruntime`` or
    ``torch`` for the cnn family, "" for the others."""
    return {"onnx": "onnxruntime", "torch": "torch"}.get(getattr(det, "runtime", ""), "")


def run_evaluation(
    chains: str | Path | pd.DataFrame,
    detectors: Sequence[str | Detector],
    *,
    batch_size: int = 16,
    device: str | None = None,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    families: Sequence[str] | None = None,
    max_chains_per_family: int | None = None,
    threshold_of: Callable[[Detector], tuple[float, str] | None] | None = None,
    **kwargs,
) -> Evaluation:
    """Load chains, create the detectors by name, score every image and compute the tables.

    ``threshold_of(detector)`` -> (threshold, description) or None gives the thresholds of the
    drop tables (``evaluate --calibration``)."""
    if threads is not None:
        # onnxruntime sessions (the cnn on the onnx runtime) take their threads from here
        os.environ["OMP_NUM_THREADS"] = str(int(threads))
        try:
            import torch
        except ImportError:  # the core install
            pass
        else:
            torch.set_num_threads(int(threads))
    unplaced: list[str] = []
    manifest = chains if isinstance(chains, pd.DataFrame) else load_chain_manifest(chains, unplaced)
    manifest = select_chains(manifest, families, max_chains_per_family)
    dets = []
    for d in detectors:
        det = create(d) if isinstance(d, str) else d
        if device:
            det = det.to(device) or det
        dets.append(det)
    thresholds = {}
    for det in dets if threshold_of is not None else ():
        found = threshold_of(det)
        if found is not None:
            thresholds[det.name] = found
    scores, timings, decode_s = score_manifest(manifest, dets, batch_size=batch_size, progress=progress)
    ev = evaluate_scores(scores, timings, source=str(chains) if not isinstance(chains, pd.DataFrame)
                         else "<DataFrame>", decode_seconds=decode_s, batch_size=batch_size,
                         threads=threads, device=device or "default", thresholds=thresholds, **kwargs)
    ev.runtimes = {det.name: runtime_of(det) for det in dets}
    ev.warnings = unplaced + unrelated_step_notes(manifest)
    ev.notes += ev.warnings
    return ev
