"""``run_filter``: filter many shards into kept/, rejected/, scores/ and summary.json.

Completed shards (those with a completion marker made with the same settings) are skipped on
resume; ``overwrite=True`` redoes them. A shard that fails is reported by name and the others go on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from collapseguard.filter.engines import make_engine
from collapseguard.filter.inputs import expand_pattern, expand_shards
from collapseguard.filter.pipeline import (
    FilterOptions,
    filter_task,
    output_paths,
    read_marker,
    shard_name,
)


class FilterError(RuntimeError):
    """The run cannot start (bad inputs, clashing shard names, settings changed on resume)."""


def refuse_out_inside_inputs(inputs: Sequence[str], out_dir: str) -> None:
    """Refuse an ``--out`` inside an input folder: its kept/ and rejected/ shards would be read as
    inputs by the next run (and by ``score`` or ``audit`` of that folder)."""
    out = Path(out_dir).resolve()
    for raw in inputs:
        for p in expand_pattern(str(raw)):
            if os.path.isdir(p) and out.is_relative_to(Path(p).resolve()):
                raise FilterError(f"--out {out_dir} is inside the input folder {p}: its kept/ and "
                                  "rejected/ shards would be read as input next time; choose an "
                                  "--out outside the inputs")


def same_shard(a: str, b: str) -> bool:
    """Do two spellings of a shard path name the same file (``data/x.tar``, ``./data/x.tar``,
    an absolute path)?"""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def plan_shards(inputs: Sequence[str]) -> list[str]:
    """Expand inputs to shards and refuse two shards that would write to the same output name."""
    shards = expand_shards(inputs)
    by_name: dict[str, str] = {}
    for s in shards:
        other = by_name.setdefault(shard_name(s), s)
        if other != s:
            raise FilterError(f"two input shards share the name {shard_name(s)!r} ({other} and {s}); "
                              "their outputs would collide: filter them into different --out folders")
    return list(by_name.values())


def clear_shard_outputs(shard: str, out_dir: str) -> None:
    for p in output_paths(shard, out_dir).values():
        for q in (p, p.with_name(p.name + ".tmp")):
            if q.exists():
                q.unlink()


def run_filter(inputs: Sequence[str], options: FilterOptions, *, workers: int = 2,
               engine: str = "local", resume: bool = True, quiet: bool = False,
               threshold_source: str = "", detector=None) -> dict:
    """Filter ``inputs`` and write ``summary.json`` into ``options.out_dir``; returns the summary.

    ``detector`` (optional) is an already-created detector to reuse when running inline.
    """
    t0 = time.perf_counter()
    refuse_out_inside_inputs(inputs, options.out_dir)
    shards = plan_shards(inputs)
    out = Path(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {}
    todo: list[str] = []
    for s in shards:
        marker = read_marker(s, options.out_dir) if resume else None
        if marker is not None:
            if not same_shard(str(marker.get("shard", "")), s):
                raise FilterError(
                    f"{shard_name(s)} was completed in {out} from another shard "
                    f"({marker.get('shard')}); use --overwrite or another --out")
            if marker.get("options") != options.fingerprint():
                raise FilterError(
                    f"{shard_name(s)} was completed in {out} with other settings "
                    f"({marker.get('options')}); use --overwrite or another --out")
            records[s] = {**marker, "shard": s}
        else:
            clear_shard_outputs(s, options.out_dir)
            todo.append(s)
    errors: dict[str, str] = {}
    bar = tqdm(total=len(shards), initial=len(records), unit="shard", disable=quiet,
               file=sys.stderr, dynamic_ncols=True, desc="filter")
    samples_done = 0
    t_run = time.perf_counter()

    def on_progress(n: int) -> None:
        nonlocal samples_done
        samples_done += n
        rate = samples_done / max(1e-9, time.perf_counter() - t_run)
        bar.set_postfix_str(f"{samples_done} samples, {rate:.1f}/s", refresh=True)

    def on_done(i: int, rec: dict | None, err: str | None) -> None:
        shard = todo[i]
        if err is not None:
            errors[shard] = err
            bar.write(f"FAILED {shard}: {err.splitlines()[0]}", file=sys.stderr)
        else:
            records[shard] = rec
        bar.update(1)

    if todo:
        make_engine(engine, workers, detector).run(
            filter_task, [(s, options) for s in todo], options.detector, options.detector_kwargs,
            on_progress if not quiet else None, on_done)
    bar.close()
    run_seconds = time.perf_counter() - t_run
    summary = summarize(shards, records, errors, options, todo, run_seconds, threshold_source)
    summary["elapsed_seconds"] = round(time.perf_counter() - t0, 3)
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=False))
    os.replace(tmp, out / "summary.json")
    return summary


def summarize(shards, records, errors, options: FilterOptions, todo, run_seconds,
              threshold_source: str) -> dict:
    reasons: Counter = Counter()
    per_shard = []
    for s in shards:
        rec = records.get(s)
        if rec is None:
            per_shard.append({"shard": s, "status": "failed", "error": errors.get(s, "not run")})
            continue
        reasons.update(rec["reasons"])
        per_shard.append({"shard": s, "status": "resumed" if s not in todo else "done",
                          **{k: rec[k] for k in ("samples", "images", "kept", "rejected",
                                                 "reasons", "skipped_members", "seconds")}})
    ran = [records[s] for s in todo if s in records]
    images_run = sum(r["images"] for r in ran)
    version = next((r.get("detector_version") for r in records.values()), None)
    return {
        "detector": options.detector,
        "detector_version": version,
        "threshold": options.threshold,
        "threshold_source": threshold_source,
        "dry_run": options.dry_run,
        "write_rejected": options.write_rejected and not options.dry_run,
        "shards": len(shards),
        "shards_failed": sorted(errors),
        "samples": sum(reasons.values()),
        "kept": sum(r["kept"] for r in records.values()),
        "rejected": sum(r["rejected"] for r in records.values()),
        "reasons": dict(sorted(reasons.items())),
        "images_this_run": images_run,
        "images_per_second": round(images_run / run_seconds, 3) if run_seconds > 0 and images_run else None,
        "per_shard": per_shard,
    }


def run_filter_cli(inputs: Sequence[str], out: str, detector, *, kwargs: tuple = (),
                   threshold: float | None = None, calibration: str | None = None,
                   drop_fraction: float | None = None, workers: int = 2, engine: str = "local",
                   resume: bool = True, write_rejected: bool = True, reject_no_image: bool = False,
                   dry_run: bool = False, batch_size: int = 0, quiet: bool = False) -> dict:
    """Resolve the threshold (explicit, calibration file, packaged default, or a drop-fraction
    cut over this data) and run the filter. ``detector`` is a created detector."""
    from collapseguard.calibration.files import (
        resolve_threshold,
        threshold_for_drop_fraction,
    )

    base = dict(out_dir=str(out), detector=detector.name, detector_kwargs=tuple(kwargs),
                batch_size=batch_size, reject_no_image=reject_no_image,
                write_rejected=write_rejected, dry_run=dry_run)
    inline = detector if workers <= 1 else None
    if drop_fraction is None:
        t, source, _ = resolve_threshold(detector, threshold, calibration)
        return run_filter(inputs, FilterOptions(threshold=t, **base), workers=workers,
                          engine=engine, resume=resume, quiet=quiet, threshold_source=source,
                          detector=inline)
    # pass 1: score everything (resumable like any run), pass 2: decide from those scores
    prepass = str(Path(out) / ".prepass")
    first = FilterOptions(**{**base, "out_dir": prepass, "dry_run": True, "threshold": float("inf")})
    s1 = run_filter(inputs, first, workers=workers, engine=engine, resume=resume, quiet=quiet,
                    threshold_source="scoring pass for --drop-fraction", detector=inline)
    if s1["shards_failed"]:
        raise FilterError("scoring pass failed for: " + ", ".join(s1["shards_failed"]))
    import pyarrow.parquet as pq
    scores = [v for p in sorted(Path(prepass, "scores").glob("*.parquet"))
              for v in pq.read_table(p, columns=["score"]).column("score").to_pylist()
              if v is not None]
    t = threshold_for_drop_fraction(scores, drop_fraction)
    source = (f"uncalibrated: --drop-fraction {drop_fraction:g} of this data "
              f"(threshold {t:.6g} from {len(scores)} scores; no guarantee about clean images)")
    second = FilterOptions(threshold=t, scores_from=str(Path(prepass, "scores")), **base)
    return run_filter(inputs, second, workers=workers, engine=engine, resume=resume, quiet=quiet,
                      threshold_source=source, detector=inline)
