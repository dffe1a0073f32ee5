"""``LocalEngine(keep_pool=True)``: the worker processes of one run serve the next (another task
function, another detector), progress is reported in each run, a worker that dies costs only its
task, and ``close`` ends the processes."""

import os

from cg_testutil import pid_and_detector

from collapseguard.engines import LocalEngine


def _run(engine, tasks, detector, kwargs=()):
    done, progress = {}, []
    engine.run(pid_and_detector, tasks, detector, kwargs, progress.append,
               lambda i, r, e: done.__setitem__(i, (r, e)))
    return done, sum(progress)


def test_the_next_run_uses_the_same_worker_processes_and_close_ends_them():
    with LocalEngine(2, threads_per_worker=1, keep_pool=True) as engine:
        first, n1 = _run(engine, ["slow"] * 4, "nss")
        second, n2 = _run(engine, ["slow"] * 4, "compare", (("fingerprints", "only"),))
        pids = {r[0] for r, _ in first.values()}
        assert len(pids) == 2 and os.getpid() not in pids
        assert {r[0] for r, _ in second.values()} <= pids  # no process started for the second run
        assert {r[1] for r, _ in first.values()} == {"NSSDetector"}
        assert {r[1] for r, _ in second.values()} == {"FingerprintOnly"}
        assert n1 == n2 == 4
    for pid in pids:  # joined by close: gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"worker {pid} outlived close()")


def test_a_worker_that_dies_fails_its_task_only_and_the_next_run_gets_new_workers():
    with LocalEngine(2, threads_per_worker=1, keep_pool=True) as engine:
        first, _ = _run(engine, ["slow", "die", "slow", "slow"], "nss")
        assert first[1] == (None, first[1][1]) and "worker failed" in first[1][1]
        assert all(first[i][1] is None for i in (0, 2, 3))
        second, n = _run(engine, ["slow", "slow"], "nss")
        assert all(e is None for _, e in second.values()) and n == 2
