"""The Ray engine gives the same outputs as the local engine (local Ray instance, 2 CPUs)."""

from __future__ import annotations

import json
import os
import re
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


def test_a_task_whose_actor_dies_leaves_nothing_staged(tmp_path):
    from cg_testutil import stage_or_die

    from collapseguard.engines.ray import RayEngine
    got = {}
    tasks = [(str(tmp_path), name) for name in ("a", "die", "b")]
    here = str(Path(__file__).parents[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here}})
    try:
        RayEngine(workers=2).run(stage_or_die, tasks, "nss", (), None,
                                 lambda i, res, err: got.setdefault(i, (res, err)))
    finally:
        ray.shutdown()
    assert got[1][0] is None and "Ray worker failed 2 times" in got[1][1]
    # the dead actor's staged file is removed once it is gone; the others committed theirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


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
    # the one error line (Ray or grpc may warn on other lines), and no traceback
    assert (f"collapseguard: error: cannot start or reach the Ray cluster at {address}: nothing "
            "answers there (Connection refused)") in err.splitlines()
    assert "Traceback" not in err


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
        p.send_signal(signal.SIGINT)  # while a shard is being written
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 1, err
    assert "no partial shard is left" in err
    assert len(list(out.glob(".done/*.json"))) < 2, err  # it stopped before the end
    assert [q.name for q in out.rglob("*.tmp")] == []
    # resumed (here by the local engine), the outputs are those of a run never interrupted
    assert subprocess.run([sys.executable, "-m", "collapseguard.cli", *args, "-w", "1"]).returncode == 0
    ref = tmp_path / "ref"
    assert subprocess.run([sys.executable, "-m", "collapseguard.cli", *args[:3], str(ref), *args[4:],
                           "-w", "1"]).returncode == 0
    for sub in ("kept", "rejected", "scores"):
        assert {q.name: q.read_bytes() for q in (out / sub).iterdir()} == \
            {q.name: q.read_bytes() for q in (ref / sub).iterdir()}


def _descendant_titled(pid: int, word: str) -> bool:
    """Is there a process below ``pid`` whose command line (a Ray worker's title) holds ``word``?"""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    todo = list(children.get(pid, ()))
    while todo:
        q = todo.pop()
        try:
            if word in Path(f"/proc/{q}/cmdline").read_bytes().decode(errors="replace"):
                return True
        except OSError:
            pass
        todo.extend(children.get(q, ()))
    return False


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.3])
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
        # while Ray starts its workers (the actor among them): a worker process exists
        _wait_for(lambda: _descendant_titled(p.pid, "ray::"), 240, "Ray worker process")
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
    finally:
        p.kill()
    text = log.read_text()
    assert p.returncode == 1, text  # not -11: Ray's teardown after an interrupt can crash
    done = re.search(r"interrupted: (\d+) of 40 shard\(s\) complete", text)
    assert done and int(done[1]) < 40 and "Aborted!" in text, text


# --- older Ray, driver watch, staged files, the interrupt hook ------------------------------

def test_a_task_on_a_ray_without_is_canceled_runs_and_stops_only_for_its_driver(monkeypatch):
    from types import SimpleNamespace

    from collapseguard.engines import local
    from collapseguard.engines.local import WorkerStopped
    from collapseguard.engines.ray import make_progress
    monkeypatch.setattr(local, "_OWNER_GONE", None)
    make_progress(SimpleNamespace())(16)  # a Ray before is_canceled: the task goes on
    make_progress(SimpleNamespace(is_canceled=lambda: False))(16)
    with pytest.raises(WorkerStopped):
        make_progress(SimpleNamespace(is_canceled=lambda: True))(16)
    monkeypatch.setattr(local, "_OWNER_GONE", lambda: True)
    with pytest.raises(WorkerStopped):
        make_progress(SimpleNamespace())(16)


def test_an_actor_watches_only_a_driver_process_it_can_see():
    from collapseguard.engines.ray import driver_watch, pid_namespace, process_start
    me = os.getpid()
    seen = ("node", me, process_start(me), pid_namespace())
    watch = driver_watch(seen, "node")
    assert watch is not None and watch() is False
    assert driver_watch(seen, "other node") is None
    assert driver_watch(None, "node") is None  # Ray Client, or no /proc: no watch
    # a pid that is another process here (another machine's or another PID namespace's driver)
    assert driver_watch(("node", me, "1", pid_namespace()), "node") is None
    assert driver_watch(("node", me, process_start(me), -1), "node") is None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = driver_watch(("node", child.pid, process_start(child.pid), pid_namespace()), "node")
        assert watch is not None and watch() is False
        child.kill()
        _wait_for(watch, 10, "driver end seen")  # a zombie counts as ended
    finally:
        child.kill()
        child.wait()
    assert watch() is True
    assert driver_watch(("node", child.pid, "1", pid_namespace()), "node") is None


def test_the_driver_removes_only_this_runs_staged_files_of_a_task(tmp_path):
    from collapseguard.engines.ray import discard_staged
    from collapseguard.filter.pipeline import filter_task
    out = tmp_path / "out"
    mine = ["kept/s.tar.RUN.tmp", "rejected/s.tar.RUN.tmp", "scores/s.parquet.RUN.tmp",
            ".done/s.json.RUN.tmp"]
    others = ["kept/s.tar.OTHER.tmp", "kept/s.tar", "kept/t.tar.RUN.tmp", "scores/s.parquet"]
    for name in mine + others:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    opts = FilterOptions(out_dir=str(out), detector="nss", threshold=3.0, run_id="RUN")
    discard_staged(filter_task, (str(tmp_path / "data/s.tar"), opts))
    assert sorted(str(q.relative_to(out)) for q in out.rglob("*") if q.is_file()) == sorted(others)
    discard_staged(lambda *a: None, (str(tmp_path / "data/t.tar"), opts))  # not a filter task
    assert (out / "kept/t.tar.RUN.tmp").exists()


_BOOM = """
import click
@click.command()
def boom():
    raise KeyboardInterrupt
"""

_AFTER_A_FAILED_RAY_RUN = """
import os, sys
from click.testing import CliRunner
from collapseguard import cli
cli.COMMANDS["boom"] = "cg_boom:boom"
for address in sys.argv[2:]:  # each fails to start or reach Ray
    os.environ["RAY_ADDRESS"] = address
    res = CliRunner().invoke(cli.main, ["filter", sys.argv[1], "--out", sys.argv[1] + ".out",
                                        "-d", "nss", "--threshold", "1", "--engine", "ray", "-q"])
    print("ray run:", res.exit_code, res.output.strip().splitlines()[-1:], flush=True)
res = CliRunner().invoke(cli.main, ["boom"])
print("interrupted:", res.exit_code, type(res.exception).__name__, repr(res.output), flush=True)
print("still running")
"""


def test_after_a_failed_ray_run_an_interrupted_command_ends_as_click_says(tmp_path, photos):
    """Ray never got initialised in this process, so a later Ctrl-C (here in another command) is
    click's Abort, not the Ray engine's os._exit: the process goes on."""
    make_shard(tmp_path / "s.tar", photos[:1])
    (tmp_path / "cg_boom.py").write_text(_BOOM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    res = subprocess.run([sys.executable, "-c", _AFTER_A_FAILED_RAY_RUN, str(tmp_path / "s.tar"),
                          "auto", f"127.0.0.1:{_closed_port()}"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert [x.split("[")[0] for x in lines if x.startswith("ray run:")] == ["ray run: 1 "] * 2, lines
    assert "cannot start or reach the Ray cluster at auto" in lines[0]
    assert lines[-2].startswith("interrupted: 1 SystemExit") and "Aborted!" in lines[-2], lines
    assert lines[-1] == "still running"


_OLD_RAY = """
import sys

import ray


def before_is_canceled():  # a Ray from before RuntimeContext.is_canceled (ray>=2.9 is allowed)
    from ray.runtime_context import RuntimeContext
    if hasattr(RuntimeContext, "is_canceled"):
        del RuntimeContext.is_canceled


before_is_canceled()
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
         runtime_env={"worker_process_setup_hook": before_is_canceled})
from collapseguard.cli import main  # noqa: E402

main()
"""


@pytest.mark.slow
def test_on_a_ray_without_is_canceled_a_run_works_and_an_interrupted_one_leaves_no_staged_file(
        tmp_path, photos):
    d = tmp_path / "data"
    d.mkdir()
    _big_shard(d / "big-0.tar", photos)
    _big_shard(d / "big-1.tar", photos)
    script = tmp_path / "old_ray.py"
    script.write_text(_OLD_RAY)
    out = tmp_path / "ray"
    args = [sys.executable, str(script), "filter", str(d), "--out", str(out), "-d", "nss",
            "--threshold", "3", "-q", "--engine", "ray", "-w", "1"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: list(out.glob("kept/*.tmp")), 240, "staged shard")
        p.send_signal(signal.SIGINT)  # the task cannot be cancelled: the driver cleans up
        t0 = time.monotonic()
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 1, err
    assert time.monotonic() - t0 < 25, err  # no wait for a cancel that cannot come
    assert "no partial shard is left" in err
    assert len(list(out.glob(".done/*.json"))) < 2, err
    assert [q.name for q in out.rglob("*.tmp")] == []
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)  # resumed: it works
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shards_failed"] == [] and summary["samples"] == 1200, res.stderr
