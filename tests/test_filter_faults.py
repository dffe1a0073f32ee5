"""Process faults during ``filter``: a killed parent leaves no worker behind and nothing half-done
that a resume would trust."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cg_testutil import make_shard

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (read from /proc)."""
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
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def outputs(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for sub in ("kept", "rejected", "scores")
            for p in sorted((out / sub).glob("*")) if not p.name.endswith("tmp")}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from skimage import data
    big = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()] * 3
    d = tmp_path_factory.mktemp("data")
    for s in range(2):
        make_shard(d / f"race-{s}.tar", big, start=s * 100)
    return d


def filter_cmd(d: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "collapseguard.cli", "filter", str(d / "race-{0..1}.tar"), "-d",
            "nss", "--threshold", "3.2", "--workers", "2", "--batch-size", "1", "-q",
            "--out", str(out)]


def test_workers_die_with_a_killed_parent_and_the_resume_is_identical(tmp_path, shards):
    ref = tmp_path / "ref"
    subprocess.run(filter_cmd(shards, ref), check=True)
    out = tmp_path / "out"
    proc = subprocess.Popen(filter_cmd(shards, out))
    deadline = time.time() + 180
    while time.time() < deadline and not list((out / "kept").glob("*.tmp")):
        time.sleep(0.05)
    workers = descendants(proc.pid)
    assert workers, "no worker processes seen"
    os.kill(proc.pid, signal.SIGKILL)  # the parent alone, as a user's kill -9 would
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if alive(w)], "workers outlived their parent"
    subprocess.run(filter_cmd(shards, out), check=True)
    assert outputs(out) == outputs(ref)
    assert not [p for p in out.rglob("*tmp")], "temporary files left behind"


def test_a_marker_whose_output_was_cut_short_is_not_trusted(tmp_path, shards):
    out = tmp_path / "out"
    subprocess.run(filter_cmd(shards, out), check=True)
    ref = outputs(out)
    kept = out / "kept" / "race-0.tar"
    kept.write_bytes(kept.read_bytes()[: kept.stat().st_size // 2])  # as a stale writer would leave it
    subprocess.run(filter_cmd(shards, out), check=True)
    assert outputs(out) == ref
    summary = json.loads((out / "summary.json").read_text())
    status = {Path(s["shard"]).name: s["status"] for s in summary["per_shard"]}
    assert status == {"race-0.tar": "done", "race-1.tar": "resumed"}


def test_a_worker_of_a_run_that_lost_the_lock_commits_nothing(tmp_path, shards):
    """The commit check: a task whose run id is no longer in ``<out>/.lock`` leaves no outputs."""
    from collapseguard.detectors import create
    from collapseguard.filter.pipeline import FilterOptions, RunLostError, process_shard
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text("another-run\n")
    opts = FilterOptions(out_dir=str(out), detector="nss", threshold=3.2, run_id="this-run")
    with pytest.raises(RunLostError):
        process_shard(str(shards / "race-0.tar"), opts, create("nss"))
    assert not [p for p in out.rglob("*") if p.is_file() and p.name != ".lock"]
