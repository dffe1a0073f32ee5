"""``run_audit``: score a dataset, compare detectors, and write the audit outputs.

Scoring goes through the filter's own ``run_score`` (same reading, decoding, batching and
engines); with ``sample`` a seeded random subset is chosen from tar headers first and the rest is
never decoded. With one process, ``--compare`` detectors score the same decoded images in the same
pass (``panel.ComparePanel``); with worker processes each compared detector gets its own pass. Outputs in ``out_dir``:

- ``scores.parquet``  every audited sample: source, key, image, width, height, error, score,
  set_aside (``filter``'s reason to reject the sample whatever its score: ``unsafe_name``,
  ``refused_member``, ``repeated_key``, "" for none), flagged, equivalent_step,
  p_degraded_chain_mix (``PROBABILITY_COLUMN``), and ``score:<name>`` / ``flagged:<name>`` per
  compared detector;
- ``flagged.csv``     source, key, score, equivalent_step of the flagged samples, highest first
  (with Parquet inputs also ``row``, the row's index in its file, empty for other samples);
  a source or key that a spreadsheet would run as a formula (starting with ``=``, ``+``, ``-``,
  ``@``, tab or carriage return, or with ``'``) is written with a leading ``'`` (``io.csv_cells``); scores.parquet
  keeps the exact strings;
- ``summary.json``    the figures (strict JSON);
- ``report.html``     one self-contained page (see ``report_html``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.audit import stats
from collapseguard.audit.labels import SET_ASIDE_LABELS, source_labels
from collapseguard.audit.panel import ComparePanel, compare_column
from collapseguard.audit.sampling import choose_sample
from collapseguard.calibration.thresholds import (
    NoThresholdError,
    is_dropped,
    resolve_threshold,
)
from collapseguard.errors import CollapseguardError, missing_extra
from collapseguard.io.calibration_file import default_calibration
from collapseguard.io.csv_cells import csv_cell
from collapseguard.io.inputs import expand, other_files_note
from collapseguard.io.strict_json import json_ready
from collapseguard.io.terminal import percent, printable
from collapseguard.scoring import readback
from collapseguard.scoring.run import run_score

OUTPUT_FILES = ("report.html", "summary.json", "flagged.csv", "scores.parquet")
#: scores.parquet's column of the calibration's score -> P(degraded) map: the share of degraded
#: images (chain steps) among the calibration's own images that scored alike. It depends on that
#: mix of clean and degraded images, not on the audited data; it is not the decision (``flagged``)
#: and carries no guarantee, hence not a bare "probability"
PROBABILITY_COLUMN = "p_degraded_chain_mix"


class AuditError(CollapseguardError, RuntimeError):
    """The audit cannot run (no threshold, bad inputs, a detector that cannot be created, an --out
    that cannot be written). The message may name paths from the data: it is stored terminal-safe."""

    def __init__(self, message: str):
        super().__init__(printable(message))


def check_writable(out: Path) -> None:
    """Fail now, with one line, when the outputs cannot be written into ``out`` (read-only, full,
    not a folder): before any scoring, not after it."""
    probe = out / f".write-test-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)  # a full disk refuses data, not always an empty file
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise AuditError(f"cannot write to --out {out}: {exc.strerror or exc}") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


@dataclass
class AuditOptions:
    """Settings of one audit (see ``collapseguard audit --help``)."""

    detector: str = "cnn"
    threshold: float | None = None
    calibration: str | None = None
    compare: tuple[str, ...] = ()
    #: audit a seeded random subset of this many samples (None = all)
    sample: int | None = None
    seed: int = 0
    workers: int = 1
    detector_kwargs: tuple = ()
    #: detector name -> creation kwargs for compared detectors (e.g. trust_pickle for rali:)
    compare_kwargs: dict = field(default_factory=dict)
    #: images per gallery (most degraded, borderline, random kept); disagreements get half
    gallery_size: int = 12
    crop_size: int = 256
    confidence: float = stats.CONFIDENCE
    #: Parquet inputs: the column holding the images (None: found by type and name)
    image_column: str | None = None
    #: a ``dedup`` groups.parquet: the report shows up to ``gallery_size`` of its groups
    groups: str | None = None


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("collapseguard")
    except Exception:  # pragma: no cover - not installed
        return "unknown"


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _create(name: str, kwargs: tuple):
    from collapseguard.detectors import create
    try:
        return create(name, **dict(kwargs))
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise AuditError(f"cannot create detector {name!r}: {exc}") from None


def shard_positions(df: pd.DataFrame, select=None) -> np.ndarray:
    """For each row, which sample of its (source, key) in the shard it is (0 for the first): the
    ``readback.occurrence`` among the rows, or with ``select`` (``audit --sample``), among the samples the
    predicate takes, whose positions it alone decides: the j-th row of a key is the j-th ``n``
    with ``select(source, key, n)`` true, whatever copies of that key the sample skipped."""
    occ = readback.occurrence(df["source"], df["key"])
    if select is None:
        return occ
    out = occ.copy()
    for i, (source, key, j) in enumerate(zip(df["source"], df["key"], occ)):
        taken, n = -1, 0
        while n <= j + 100_000:  # the j-th selected copy lies within this many (bounded search)
            if select(source, key, n):
                taken += 1
                if taken == j:
                    out[i] = n
                    break
            n += 1
    return out


def align_scores(base: pd.DataFrame, other: pd.DataFrame) -> np.ndarray:
    """``other``'s scores in ``base``'s row order, matched by (source, key, occurrence); NaN where
    missing."""
    if len(base) == len(other) and (base["source"].to_numpy() == other["source"].to_numpy()).all() \
            and (base["key"].to_numpy() == other["key"].to_numpy()).all():
        return other["score"].to_numpy(np.float64)
    lookup = dict(zip(zip(other["source"], other["key"], readback.occurrence(other["source"], other["key"])),
                      other["score"]))
    return np.array([lookup.get(t, math.nan) for t in
                     zip(base["source"], base["key"], readback.occurrence(base["source"], base["key"]))],
                    dtype=np.float64)


def _score(inputs, name, det, kwargs: tuple, options: AuditOptions, select, quiet: bool,
           set_aside: bool = False, others=None):
    """Score through the filter's ``run_score`` (one detector, the same reading and engines).
    With ``set_aside`` the rows also hold ``set_aside``: why ``filter`` would set the sample aside
    whatever its score (``unsafe_name``, ``refused_member``, ``repeated_key``; "" for none).
    ``others`` counts the folders' files that are no image type (``run_score``)."""
    obj = det if options.workers <= 1 else None
    df, failures = run_score(inputs, name, workers=options.workers, quiet=quiet, detector_obj=obj,
                             detector_kwargs=kwargs, select=select,
                             image_column=options.image_column, set_aside=set_aside, others=others)
    df["score"] = pd.to_numeric(df["score"], errors="coerce").astype(np.float64)
    return df, failures


def _pick_galleries(df: pd.DataFrame, threshold: float, comparisons, options: AuditOptions) -> dict:
    """Row indices per gallery: most degraded, borderline, random kept (never a sample ``filter``
    sets aside whatever its score), and disagreements."""
    k = options.gallery_size
    s = df["score"].to_numpy(np.float64)
    fin = np.isfinite(s)
    idx = np.flatnonzero(fin)
    shown: set[int] = set()
    top = idx[np.argsort(-s[idx], kind="stable")][:k].tolist()
    shown.update(top)
    rest = np.array([i for i in idx if i not in shown], dtype=int)
    border = rest[np.argsort(np.abs(s[rest] - threshold), kind="stable")][:k].tolist() if len(rest) else []
    shown.update(border)
    aside = _set_aside(df)
    kept = np.array([i for i in idx if s[i] <= threshold and i not in shown and not aside[i]], dtype=int)
    rng = np.random.default_rng(options.seed)
    rand = sorted(rng.choice(kept, size=min(k, len(kept)), replace=False).tolist()) if len(kept) else []
    out = {"degraded": top, "borderline": sorted(border, key=lambda i: -s[i]), "kept": rand}
    half = max(2, k // 2)
    for c in comparisons:
        other = df[compare_column(c.name)].to_numpy(np.float64)
        mo = np.flatnonzero(c.main_only)
        oo = np.flatnonzero(c.other_only)
        out[f"main_only:{c.name}"] = mo[np.argsort(-s[mo], kind="stable")][:half].tolist()
        out[f"other_only:{c.name}"] = oo[np.argsort(-other[oo], kind="stable")][:half].tolist()
    return out


def _items(df: pd.DataFrame, picks: dict, options: AuditOptions, select=None) -> dict:
    """Gallery items (dicts for the report) with thumbnails and native crops; ``select`` is the
    ``--sample`` predicate the rows were scored under (it decides which copy of a repeated key
    each row is)."""
    wanted = {int(i) for rows in picks.values() for i in rows}
    nth = shard_positions(df, select)

    def prepare(img):  # thumbnail and crop made as each image is read: the image is not kept
        crop, (y, x) = readback.detail_crop(img, options.crop_size)
        return {"thumb": readback.thumb_uri(readback.thumbnail(img)), "crop": readback.png_uri(crop),
                "crop_at": (y, x), "crop_size": (crop.shape[1], crop.shape[0]),
                "alpha": bool(img.ndim == 3 and img.shape[2] == 4)}  # shown on a checkerboard

    fetched = readback.fetch_samples(
        ((df.at[i, "source"], df.at[i, "key"], str(df.at[i, "image"] or ""), nth[i]) for i in sorted(wanted)),
        prepare=prepare, image_column=options.image_column)
    cards: dict[int, dict] = {}
    compared = [c[len("score:"):] for c in df.columns if c.startswith("score:")]
    for i in sorted(wanted):
        row = df.loc[i]
        f = fetched.get((row["source"], row["key"], nth[i]), readback.Fetched(error="not read"))
        card = {"source": str(row["source"]), "key": str(row["key"]), "score": float(row["score"]),
                "flagged": bool(row["flagged"]), "step": float(row["equivalent_step"]),
                "width": int(row["width"] or 0), "height": int(row["height"] or 0),
                "caption": f.caption, "error": f.error, "set_aside": str(row.get("set_aside") or ""),
                "others": {n: (float(row[compare_column(n)]), bool(row[f"flagged:{n}"])) for n in compared}}
        if f.prepared is not None:
            card.update(f.prepared)
        cards[i] = card
    return {name: [cards[int(i)] for i in rows] for name, rows in picks.items()}


def _set_aside(df: pd.DataFrame) -> np.ndarray:
    """Per row: does ``filter`` set this sample aside whatever its score?"""
    if "set_aside" not in df:
        return np.zeros(len(df), bool)
    return (df["set_aside"].fillna("").astype(str) != "").to_numpy()


def set_aside_summary(df: pd.DataFrame, max_examples: int = 50) -> dict:
    """The samples ``filter`` would set aside whatever their score: how many, by reason, and the
    first ``max_examples`` (source, key, reason, score, flagged, error)."""
    mask = _set_aside(df)
    rows = df[mask]
    reasons = rows["set_aside"].astype(str) if len(rows) else pd.Series([], dtype=str)
    by = {r: int(n) for r, n in reasons.value_counts().items()}
    by = {r: by[r] for r in [*SET_ASIDE_LABELS, *sorted(set(by) - set(SET_ASIDE_LABELS))] if r in by}
    ex = rows.head(max_examples)
    return {"count": int(mask.sum()), "by_reason": by,
            "note": ("filter rejects these samples whatever their score (reasons "
                     f"{', '.join(SET_ASIDE_LABELS)}); they are counted above by their scores"),
            "examples": [{"source": str(a), "key": str(b), "reason": str(c), "score": stats._num(float(d)),
                          "flagged": bool(f), "error": str(g or "")}
                         for a, b, c, d, f, g in zip(ex["source"], ex["key"], ex["set_aside"], ex["score"],
                                                     ex["flagged"], ex["error"].fillna(""))]}


def _input_sources(inputs: Sequence[str], df: pd.DataFrame) -> set[str]:
    """The sources of this audit's inputs, sampled or not. A groups table is a file, not a command
    line: only these are read again to show its copies (no ``pipe:`` command, URL or folder named
    only by the table)."""
    data, files = expand(inputs, failed=[])
    return set(inputs) | set(df["source"]) | {d.name for d in data} | {f.source for f in files}


def run_audit(inputs: Sequence[str], out_dir: str | Path, options: AuditOptions, *,
              quiet: bool = False, detector_obj=None) -> dict:
    """Audit ``inputs`` into ``out_dir``; returns the summary (also written as summary.json)."""
    from collapseguard.audit import report_html

    t0 = time.perf_counter()
    out = Path(out_dir)
    inputs = [str(p) for p in inputs]
    det = detector_obj if detector_obj is not None else _create(options.detector, options.detector_kwargs)
    try:
        threshold, threshold_source, cal = resolve_threshold(
            det, options.threshold, options.calibration,
            how="pass --threshold T or --calibration FILE (made with `collapseguard calibrate`)")
    except NoThresholdError as exc:
        raise AuditError(str(exc)) from None
    if cal is None and options.threshold is not None:
        # the score maps belong to the detector's score scale, not to a threshold: with
        # --threshold alone, the packaged calibration for this exact detector version still maps
        # scores to replication steps (its guarantee, at its own threshold, is not claimed)
        cal = default_calibration(det.name, str(det.version))
        if cal is not None:
            threshold_source += (f"; score maps from the packaged default calibration for "
                                 f"{det.name}@{det.version} (its threshold {cal.threshold:.6g} is not used)")
    # compared detectors are created up front: a bad name fails before any scoring
    others = {}
    for name in options.compare:
        if name != det.name and name not in others:
            others[name] = _create(name, tuple(options.compare_kwargs.get(name, ())))
    check_writable(out)  # before any scoring: a read-only or full --out fails now, in one line
    group_rows = None
    if options.groups:
        from collapseguard.dedup.gallery import NotAGroupsTable, read_gallery_rows
        try:  # checked before any scoring: a file that is not a groups table is one line now
            group_rows = read_gallery_rows(options.groups)
        except NotAGroupsTable as exc:
            raise AuditError(f"--groups: {exc}") from None
    select, population = None, None
    if options.sample:
        _log(f"choosing a random sample of {options.sample} (seed {options.seed}) from the inputs' "
             "listing (tar headers for shards: nothing is decoded)",
             quiet)
        select, population = choose_sample(inputs, options.sample, options.seed,
                                           image_column=options.image_column)
    # one process: the compared detectors score the same decoded images (one read, one decode)
    panel = ComparePanel(det, others) if others and options.workers <= 1 else None
    _log(f"scoring with {det.name}" + (f" and {', '.join(others)} (--compare)" if panel else ""), quiet)
    other_files: Counter = Counter()  # folder files that are no image type: said, never silently left out
    df, failures = _score(inputs, det.name, panel or det, options.detector_kwargs, options, select, quiet,
                          set_aside=True, others=other_files)
    main_failures = set(failures)
    if panel is not None:
        failures += panel.errors
    if population is None:
        population = len(df)
    s = df["score"].to_numpy(np.float64)
    df["flagged"] = is_dropped(s, threshold)
    has_step = cal is not None and cal.step_map is not None
    has_prob = cal is not None and cal.probability_map is not None
    df["equivalent_step"] = cal.equivalent_step(s) if has_step else np.full(len(df), np.nan)
    df[PROBABILITY_COLUMN] = cal.probability(s) if has_prob else np.full(len(df), np.nan)

    comparisons = []
    for name, other_det in others.items():
        if panel is not None:
            col = compare_column(name)
            other = (pd.to_numeric(df[col], errors="coerce").to_numpy(np.float64) if col in df
                     else np.full(len(df), np.nan))
            # as in a separate pass (score_records): a non-finite score is "could not score"
            other = np.where(np.isfinite(other), other, np.nan)
        else:  # worker processes create detectors by name: one scoring pass per compared detector
            _log(f"scoring with {name} (--compare)", quiet)
            odf, ofail = _score(inputs, name, other_det, tuple(options.compare_kwargs.get(name, ())),
                                options, select, quiet)
            # an input that failed the main pass (a URL that cannot be listed) is named once
            failures += [f"[{name}] {f}" for f in ofail if f not in main_failures]
            other = align_scores(df, odf)
        c = stats.compare(s, threshold, other, name, str(other_det.version))
        df[compare_column(name)] = other
        df[f"flagged:{name}"] = is_dropped(other, c.threshold) if np.isfinite(c.threshold) else False
        comparisons.append(c)

    counts = stats.flag_counts(s, threshold, options.confidence)
    per_source = stats.per_source_table(df, threshold, options.confidence)
    sampled = select is not None
    summary = {
        "tool": "collapseguard audit", "collapseguard_version": _version(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "inputs": inputs,
        "detector": det.name, "detector_version": str(det.version),
        "threshold": threshold, "threshold_source": threshold_source,
        "decision_rule": "flagged when score > threshold; unscored images are not flagged",
        "calibration": None if cal is None else {
            "label": cal.label, "guarantee": cal.guarantee_text(), "scope": cal.scope,
            "threshold": cal.threshold,
            # with --threshold, only the score maps are used: the guarantee is for cal.threshold;
            # a file that states no bound has no guarantee to apply
            "guarantee_applies": options.threshold is None and cal.is_calibrated,
            "calibrated": cal.is_calibrated,
            "has_step_map": has_step, "has_probability_map": has_prob},
        "sample": {"sampled": sampled, "audited": len(df), "population": int(population),
                   "seed": options.seed if sampled else None,
                   "note": (f"figures are estimates from a seeded random sample of {len(df)} of "
                            f"{population} samples" if sampled else "every sample was audited")},
        **counts.as_dict(),
        "confidence": options.confidence, "interval_method": "clopper-pearson",
    }
    summary["flagged_fraction"] = summary.pop("fraction")
    if sampled and counts.scored:
        summary["estimated_flagged_in_dataset"] = stats.dataset_estimate(counts, int(population))
    fl = df["flagged"].to_numpy(bool)
    summary["equivalent_step"] = ({"available": True, "all": stats.quantiles(df["equivalent_step"]),
                                   "flagged": stats.quantiles(df["equivalent_step"][fl]),
                                   # the map is clamped here: this value means "at least this step"
                                   "max_step": float(max(cal.step_map["y"]))}
                                  if has_step else
                                  {"available": False, "reason": _no_step_reason(det, cal, options)})
    # the samples that could not be scored (not those scored with a note, e.g. an unsafe name)
    errs = df[~np.isfinite(s)].head(50)
    summary["error_examples"] = [{"source": a, "key": b, "error": c or "no finite score"}
                                 for a, b, c in zip(errs["source"], errs["key"],
                                                    errs["error"].fillna("").astype(str))]
    summary["set_aside"] = set_aside_summary(df)
    summary["per_source"] = [{k: stats._num(v) for k, v in r.items()}
                             for r in per_source.to_dict(orient="records")]
    summary["storage"] = stats.storage_table(df)
    summary["transparent"] = int(df["has_alpha"].fillna(False).astype(bool).sum()) if "has_alpha" in df else 0
    summary["storage_note"] = stats.storage_note(summary["storage"], det.name)
    summary["compare"] = [c.as_dict() for c in comparisons]
    summary["failures"] = failures
    summary["other_files"] = dict(sorted(other_files.items()))

    _log("building the report", quiet)
    picks = _pick_galleries(df, threshold, comparisons, options)
    cards = _items(df, picks, options, select)
    figures: dict[str, str] = {}
    try:
        from collapseguard.audit import plots
    except ImportError as exc:  # the core install: the report says which extra draws them
        if missing_extra(exc) is None:
            raise
    else:
        figures["scores"] = readback.data_uri(plots.score_histogram(s, threshold, det.name), "image/png")
        if has_step:
            figures["steps"] = readback.data_uri(plots.step_histogram(df["equivalent_step"], fl),
                                                "image/png")
        for c in comparisons:
            figures[f"compare:{c.name}"] = readback.data_uri(plots.compare_scatter(
                s, df[compare_column(c.name)], threshold, c.threshold, det.name, c.name), "image/png")
    groups_html = None
    if group_rows is not None:
        from collapseguard.audit.group_sources import match_sources
        from collapseguard.dedup.gallery import pick_groups, render_groups
        _log("reading the near-duplicate groups to show", quiet)
        sources = _input_sources(inputs, df)
        # the table's sources as this audit names them (another spelling, or the same file name
        # and bytes elsewhere), and none whose file changed since the table was made
        on_show = {m["source"] for ms in pick_groups(group_rows, options.gallery_size) for m in ms}
        group_rows, warnings = match_sources(group_rows, sources, on_show)
        for line in warnings:
            print(line, file=sys.stderr, flush=True)
        grouped = {r["source"] for r in group_rows if r["group"] and not r.get("unreadable")}
        if grouped and not grouped & sources:  # a table of other data: every tile "not read"
            print(f"warning: --groups {printable(str(options.groups))} has no group among the "
                  f"audited inputs (its groups are in {len(grouped)} other input(s), e.g. "
                  f"{printable(sorted(grouped)[0])}): the report cannot show their copies; was it "
                  "made by `collapseguard dedup` over these inputs?", file=sys.stderr, flush=True)
        groups_html, shown = render_groups(group_rows, options.gallery_size, options.image_column,
                                           heading="h3", sources=sources)
        summary["groups"] = {"table": str(options.groups), "shown": shown,
                             "inputs_with_groups": len(grouped & sources),
                             "inputs_with_groups_not_audited": len(grouped - sources),
                             "inputs_changed_since_the_table": len(warnings)}
    summary["outputs"] = {name: str(out / name) for name in OUTPUT_FILES}
    summary["elapsed_seconds"] = round(time.perf_counter() - t0, 3)

    out.mkdir(parents=True, exist_ok=True)
    _write(out / "scores.parquet", lambda p: df.to_parquet(p, index=False))
    # a Parquet row's index beside its key: keys a table repeats name their rows apart
    flagged = df.loc[fl, ["source", "key", *(["row"] if "row" in df.columns else []), "score",
                          "equivalent_step"]].sort_values("score", ascending=False, kind="stable")
    flagged = flagged.assign(source=flagged["source"].map(csv_cell), key=flagged["key"].map(csv_cell))
    _write(out / "flagged.csv", lambda p: flagged.to_csv(p, index=False))
    _write(out / "summary.json", lambda p: Path(p).write_text(
        json.dumps(json_ready(summary), indent=2, allow_nan=False), encoding="utf-8"))
    html = report_html.render(summary, per_source, cards, figures, comparisons,
                              groups_html=groups_html)
    _write(out / "report.html", lambda p: Path(p).write_text(html, encoding="utf-8"))
    return summary


def _no_step_reason(det, cal, options: AuditOptions) -> str:
    """Why the report has no estimated replication step, and how to get one."""
    made = f"made by `collapseguard calibrate` for {det.name}@{det.version}"
    if cal is not None:
        return (f"the calibration in use has no score -> step map (pass --calibration FILE {made} "
                "from replication chains)")
    if options.threshold is not None:
        return (f"{det.name}@{det.version} has no packaged calibration, and the step map belongs to "
                f"a calibration of the detector's scores, not to a threshold: add --calibration FILE "
                f"{made} (your --threshold stays the one used)")
    return f"no calibration with a step map is in use (pass --calibration FILE {made})"


def _write(path: Path, writer) -> None:
    """Write ``path`` through a temporary file; a failing filesystem is one AuditError line and
    leaves no temporary file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        writer(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise AuditError(f"cannot write {path}: {exc.strerror or exc}") from None


def format_summary(summary: dict, max_sources: int = 5) -> str:
    """The short table printed in the terminal."""
    lines = [f"detector   {summary['detector']}@{summary['detector_version']}",
             f"threshold  {summary['threshold_source']}"]
    smp = summary["sample"]
    if smp["sampled"]:
        lines.append(f"sample     {smp['audited']} of {smp['population']} samples (seed {smp['seed']}): "
                     "figures are ESTIMATES")
    lines.append(f"audited    {summary['samples']} samples, {summary['scored']} scored, "
                 f"{summary['errors']} could not be scored")
    lines.append(f"flagged    {summary['flagged']} = {percent(summary['flagged_fraction'])} "
                 f"({100 * summary['confidence']:.0f}% CI {percent(summary['ci_low'])} - {percent(summary['ci_high'])})")
    est = summary.get("estimated_flagged_in_dataset")
    if est:
        lines.append(f"estimate   about {est['count']} flagged in the whole dataset ({est['low']} - {est['high']})")
    step = summary["equivalent_step"]
    if step["available"] and step.get("flagged"):
        lines.append(f"step       median replication step of the calibration's chains that flagged "
                     f"images score like: "
                     f"{stats.format_step(step['flagged']['p50'], step.get('max_step'))}")
    rows = sorted(summary["per_source"], key=lambda r: -(r["fraction"] or 0))[:max_sources]
    if len(summary["per_source"]) > 1 and rows:
        label = source_labels([r["source"] for r in summary["per_source"]])
        width = min(48, max(len(label[r["source"]]) for r in rows))  # a longer label is not cut
        lines.append(f"{'source':<{width}}  {'scored':>7}  {'flagged':>7}  {'fraction':>8}")
        for r in rows:
            lines.append(f"{label[r['source']]:<{width}}  {r['scored']:>7}  {r['flagged']:>7}  "
                         f"{percent(r['fraction']):>8}")
        if len(summary["per_source"]) > max_sources:
            lines.append(f"... {len(summary['per_source']) - max_sources} more sources in summary.json")
    aside = summary.get("set_aside") or {}
    if aside.get("count"):
        lines.append(f"set aside  {aside['count']} sample(s) that filter rejects whatever their score ("
                     + ", ".join(f"{n} {SET_ASIDE_LABELS.get(r, r)}" for r, n in aside["by_reason"].items())
                     + "): listed in the report")
    if summary.get("storage"):
        lines.append("storage    " + ", ".join(f"{r['samples']} {r['storage']}" for r in summary["storage"]))
    if summary.get("storage_note"):
        lines.append(f"note       {summary['storage_note']}")
    for c in summary["compare"]:
        t = c["matched_threshold"]
        shares = (f"flags {c['other_flagged']} where {summary['detector']} flags {c['main_flagged']}: "
                  "its scores tie at the threshold" if c.get("other_flagged") != c.get("main_flagged")
                  else f"flags the share {summary['detector']} flags")
        lines.append(f"compare    {c['detector']} at {'n/a' if t is None else f'{t:.4g}'} "
                     f"({shares}): agreement {percent(c['agreement'])}, "
                     f"{c['main_flags_other_calls_fine']} flagged only by {summary['detector']}, "
                     f"{c['other_flags_main_calls_fine']} only by {c['detector']}")
    if summary.get("other_files"):
        lines.append(f"note       {other_files_note(Counter(summary['other_files']))}")
    for f in summary["failures"]:
        lines.append(f"FAILED     {f.splitlines()[0]}")
    lines.append(f"report     {summary['outputs']['report.html']}")
    return "\n".join(printable(x) for x in lines)
