"""``collapseguard demo``: build a small dataset offline and filter it."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import click

from collapseguard.commands._common import (
    FiniteFloat,
    detector_option,
    load_detector,
    quiet_option,
    workers_option,
)


@click.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@detector_option()
@workers_option()
@click.option("--threshold", type=FiniteFloat(), default=None,
              help="Use this threshold instead of the detector's shipped calibration.")
@click.option("--steps", default=12, show_default=True, type=click.IntRange(min=1),
              help="Re-renderings applied to the degraded copies.")
@quiet_option("No progress bars.")
def demo(directory, detector, workers, threshold, steps, quiet):
    """Build a small WebDataset in DIRECTORY (default: a new temporary folder) from photos that ship
    with installed packages, half of them degraded by a simulated replication loop, then filter it
    with the default detector and its shipped calibration. Offline; about a minute on 2 cores."""
    from collapseguard.calibration.thresholds import NoThresholdError, resolve_threshold
    from collapseguard.commands.filter import format_summary
    from collapseguard.demo import build_demo_shards, demo_truth_table
    from collapseguard.filter.run import run_filter_cli

    det = load_detector(detector)
    try:  # before building anything: a detector with no shipped calibration needs --threshold
        resolve_threshold(det, threshold)
    except NoThresholdError:
        raise click.ClickException(
            f"{det.name} has no shipped calibration; pass --threshold T (the demo has no "
            "calibration of its own)") from None
    except ValueError as exc:  # a threshold that is not a finite number
        raise click.ClickException(str(exc)) from None
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="collapseguard-demo-"))
    t0 = time.perf_counter()
    click.echo(f"building demo shards in {root / 'shards'} ...", err=True)
    shards = build_demo_shards(root / "shards", steps=steps, quiet=quiet)
    click.echo(f"  {len(shards)} shards in {time.perf_counter() - t0:.1f}s", err=True)
    out = root / "filtered"
    summary = run_filter_cli([str(p) for p in shards], str(out), det, threshold=threshold,
                             workers=workers, resume=False, quiet=quiet)
    click.echo(format_summary(summary, str(out)))
    truth = demo_truth_table(out)
    click.echo("truth vs decision: " + json.dumps(truth, sort_keys=True))
    click.echo(f"try next: collapseguard audit {root / 'shards'} --out {root / 'audit'}")
