"""kill -9 of a filter run's main process at random points, then resume: are the outputs
byte-identical to an uninterrupted run's every time?

Builds two shards of real photographs (and their degraded copies), filters them once without
interruption (the reference), then until ``--runs`` kills have landed while a run was going:
starts the same filter into a fresh --out, sends SIGKILL to the main process alone after a random
delay between 0 and 90% of the reference run's duration (so kills land in start-up, scoring,
writing and committing; a run that ended before its kill is checked too but not counted), waits
for its workers to go, resumes to completion and compares kept/, rejected/ and scores/ with the
reference byte for byte (and checks that no temporary file is left). Prints the count.

    python benchmarks/kill_resume.py --runs 20
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def make_inputs(folder: Path) -> Path:
    from cg_testutil import make_shard
    from skimage import data
    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()] * 2
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(2):
        make_shard(folder / f"race-{s}.tar", photos, start=s * 100)
    return folder


def filter_cmd(data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "collapseguard.cli", "filter", str(data / "race-{0..1}.tar"),
            "-d", "nss", "--threshold", "3.2", "--workers", "2", "--batch-size", "1", "-q",
            "--out", str(out)]


def outputs(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for sub in ("kept", "rejected", "scores")
            for p in sorted((out / sub).glob("*")) if not p.name.endswith("tmp")}


def children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run(runs: int = 20, work: Path | None = None, seed: int = 0, quiet: bool = True) -> dict:
    """Returns ``{"runs", "identical", "ended_before_kill", "orphans", "tmp_left", ...}``:
    ``identical`` counts the resumes after a kill mid-run that matched the reference."""
    rng = random.Random(seed)
    work = Path(work or tempfile.mkdtemp(prefix="kill_resume_"))
    data = make_inputs(work / "data")
    t = time.perf_counter()
    subprocess.run(filter_cmd(data, work / "ref"), check=True)
    ref_seconds = time.perf_counter() - t
    ref = outputs(work / "ref")
    result = {"runs": runs, "identical": 0, "ended_before_kill": 0, "ended_identical": 0,
              "orphans": 0, "tmp_left": 0, "reference_seconds": round(ref_seconds, 1)}
    killed = i = 0
    while killed < runs:
        i += 1
        out = work / f"run{i:02d}"
        delay = rng.uniform(0, 0.9 * ref_seconds)
        proc = subprocess.Popen(filter_cmd(data, out), stderr=subprocess.DEVNULL)
        time.sleep(delay)
        workers = children(proc.pid)
        still_running = proc.poll() is None
        if still_running:
            os.kill(proc.pid, signal.SIGKILL)  # the main process alone
            killed += 1
        proc.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(alive(w) for w in workers):
            time.sleep(0.1)
        result["orphans"] += sum(alive(w) for w in workers)
        subprocess.run(filter_cmd(data, out), check=True)
        same = outputs(out) == ref
        left = [p for p in out.rglob("*") if p.name.endswith("tmp")]
        result["tmp_left"] += bool(left)
        if still_running:
            result["identical"] += same and not left
        else:
            result["ended_before_kill"] += 1
            result["ended_identical"] += same and not left
        if not quiet:
            print(f"run {i}: kill after {delay:.1f} s "
                  f"({'mid-run' if still_running else 'after it ended'}): "
                  f"{'identical' if same else 'DIFFERENT'}{', tmp files left' if left else ''}",
                  flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="folder for inputs and outputs (default: a temporary one)")
    args = ap.parse_args()
    r = run(args.runs, args.work, args.seed, quiet=False)
    print(f"kill -9 of the main process at random points, then resume: {r['identical']} of "
          f"{r['runs']} resumes byte-identical to an uninterrupted run ({r['ended_before_kill']} "
          f"more runs ended before their kill, {r['ended_identical']} of them identical; "
          f"{r['orphans']} workers outlived their parent; {r['tmp_left']} runs left temporary "
          f"files; reference run {r['reference_seconds']} s)")


if __name__ == "__main__":
    main()
