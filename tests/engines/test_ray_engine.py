"""The Ray engine gives the same outputs as the local engine (local Ray instance, 2 CPUs)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from cg_testutil import add_member, make_shard

from collapseguard.filter.pipeline import FilterOptions
from collapseguard.filter.run import run_filter

ray = pytest.importorskip("ray", reason="Ray engine needs the [ray] extra")


def test_ray_engine_matches_local_engine(tmp_path, photos):
    d = tmp_path / "data"
    d.mkdir()
    for s in range(3):
        make_shard(d / f"s-{s}.tar", photos[:2], start=10 * s)
    shards = str(d / "s-{0..2}.tar")
    outs = {}
    for engine in ("local", "ray"):
        opts = FilterOptions(out_dir=str(tmp_path / engine), detector="nss", threshold=3.0)
        summary = run_filter([shards], opts, workers=2, engine=engine, quiet=True)
        assert summary["shards_failed"] == [] and summary["samples"] == 12
        outs[engine] = {p.relative_to(tmp_path / engine).as_posix(): p.read_bytes()
                        for sub in ("kept", "rejected", "scores") for p in (tmp_path / engine / sub).iterdir()}
    ray.shutdown()
    assert outs["ray"] == outs["local"]
    assert len(outs["ray"]) == 9
    assert json.loads((tmp_path / "ray/summary.json").read_text())["rejected"] >= 1


def test_ray_engine_reads_and_writes_paths_relative_to_the_callers_folder(tmp_path, photos, monkeypatch):
    (tmp_path / "data").mkdir()
    make_shard(tmp_path / "data/s.tar", photos[:2])
    monkeypatch.chdir(tmp_path)
    opts = FilterOptions(out_dir="out", detector="nss", threshold=3.0)
    try:
        summary = run_filter(["data/s.tar"], opts, workers=1, engine="ray", quiet=True)
    finally:
        ray.shutdown()
    assert summary["shards_failed"] == [] and summary["samples"] == 4
    assert (tmp_path / "out/kept/s.tar").exists() and (tmp_path / "out/scores/s.parquet").exists()
    # a local Ray instance happens to start its actors in the caller's folder; a cluster's nodes
    # do not, so the actors must have been handed absolute paths
    done = json.loads((tmp_path / "out/.done/s.json").read_text())
    assert Path(done["shard"]) == tmp_path / "data/s.tar"


def test_a_dead_ray_actor_fails_only_its_own_task():
    from cg_testutil import echo_or_die

    from collapseguard.engines.ray import RayEngine
    got = {}
    tasks = ["a", "die", "b", "c"]
    here = str(Path(__file__).parents[1])  # Ray's workers import the test helper from here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here}})
    try:
        RayEngine(workers=2).run(echo_or_die, tasks, "nss", (), None,
                                 lambda i, res, err: got.setdefault(i, (res, err)))
    finally:
        ray.shutdown()
    assert sorted(got) == [0, 1, 2, 3]
    assert got[1][0] is None and "Ray worker failed 2 times" in got[1][1]
    assert [got[i] for i in (0, 2, 3)] == [("a", None), ("b", None), ("c", None)]


def test_an_unreachable_ray_cluster_is_a_one_line_error(tmp_path, photos, monkeypatch):
    from click.testing import CliRunner

    from collapseguard.cli import main
    ray.shutdown()
    make_shard(tmp_path / "s.tar", photos[:1])
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # no cluster is running here
    res = CliRunner().invoke(main, ["filter", str(tmp_path / "s.tar"), "--out", str(tmp_path / "o"),
                                    "-d", "nss", "--threshold", "1", "--engine", "ray", "-q"])
    assert res.exit_code == 1 and "cannot start or reach the Ray cluster at auto" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    """``collapseguard <args>`` in a process of its own (a signal reaches only it)."""
    return subprocess.Popen([sys.executable, "-m", "collapseguard.cli", *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nothing listens there


@pytest.mark.parametrize("form", ["{}", "ray://{}"])
def test_a_ray_address_where_nothing_listens_fails_within_seconds(tmp_path, photos, form):
    make_shard(tmp_path / "s.tar", photos[:1])
    address = form.format(f"127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    p = _cli("filter", str(tmp_path / "s.tar"), "--out", str(tmp_path / "o"), "-d", "nss",
             "--threshold", "1", "--engine", "ray", "-q", env={"RAY_ADDRESS": address})
    try:
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert time.monotonic() - t0 < 30  # the interpreter and imports included; Ray's retries alone last for ever
    assert p.returncode == 1
    assert err.strip().splitlines() == [
        f"collapseguard: error: cannot start or reach the Ray cluster at {address}: nothing answers "
        "there (Connection refused)"]


def _big_shard(path: Path, photos) -> None:
    """One shard long enough (600 samples) that an interrupt lands while it is written."""
    members = make_shard(path, photos[:2])
    with tarfile.open(path, "w") as tf:
        for r in range(150):
            for name, data in members:
                add_member(tf, f"r{r:03d}_{name}", data)


def _wait_for(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"no {what} within {timeout} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_an_interrupted_ray_filter_leaves_no_staged_file_and_resumes_to_the_same_bytes(tmp_path, photos):
    d = tmp_path / "data"
    d.mkdir()
    _big_shard(d / "big-0.tar", photos)
    _big_shard(d / "big-1.tar", photos)
    out = tmp_path / "ray"
    args = ("filter", str(d), "--out", str(out), "-d", "nss", "--threshold", "3", "-q")
    p = _cli(*args, "--engine", "ray", "-w", "1")
    try:
        _wait_for(lambda: list(out.glob("kept/*.tmp")), 240, "staged shard")
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 1, err
    assert "no partial shard is left" in err
    assert [q.name for q in out.rglob("*.tmp")] == []
    # resumed (here by the local engine), the outputs are those of a run never interrupted
    assert subprocess.run([sys.executable, "-m", "collapseguard.cli", *args, "-w", "1"]).returncode == 0
    ref = tmp_path / "ref"
    assert subprocess.run([sys.executable, "-m", "collapseguard.cli", *args[:3], str(ref), *args[4:],
                           "-w", "1"]).returncode == 0
    for sub in ("kept", "rejected", "scores"):
        assert {q.name: q.read_bytes() for q in (out / sub).iterdir()} == \
            {q.name: q.read_bytes() for q in (ref / sub).iterdir()}


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.2, 0.3])
def test_ctrl_c_while_ray_starts_exits_1_after_saying_so(tmp_path, photos, delay):
    d = tmp_path / "data"
    d.mkdir()
    for s in range(40):
        make_shard(d / f"s-{s:02d}.tar", photos[:1])
    log = tmp_path / "log"
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "collapseguard.cli", "filter", str(d), "--out",
                              str(tmp_path / "o"), "-d", "nss", "--threshold", "3", "-q", "--engine",
                              "ray", "-w", "1"], stdout=f, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: "Started a local Ray" in log.read_text(), 240, "Ray start")
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
    finally:
        p.kill()
    text = log.read_text()
    assert p.returncode == 1, text  # not -11: Ray's teardown after an interrupt can crash
    assert "interrupted: 0 of 40 shard(s) complete" in text and "Aborted!" in text
