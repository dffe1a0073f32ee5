"""The Ray engine: the same per-shard function, run by actors across a Ray cluster.

Each actor loads the detector once and processes whole shards, exactly like a local worker
process, so outputs are byte-identical to a local run. Requirements:

- ``pip install 'collapseguard[ray]'`` on every node;
- input shards and ``--out`` on a filesystem every node can read and write (NFS, a mounted
  bucket): workers write their outputs directly and rename them into place;
- ``RAY_ADDRESS`` (or ``ray start --address ...``) pointing at the cluster; without it a local
  Ray instance is started with this machine's cores.

Actors ask for ``threads_per_worker`` CPUs each (and one GPU each when ``gpus_per_worker`` is set),
so Ray's scheduler spreads them over the cluster without oversubscribing a node.

An interrupted run (Ctrl-C, or any error in the driver) cancels the tasks its actors are running
and waits up to ``STOP_SECONDS`` for them: a cancelled task stops at its next progress report
(every 16 samples) and, as in a local worker stopped by SIGINT, removes its staged files before
its actor is killed. An actor on the driver's machine also watches the driver's process: once the
driver has ended (``kill -9`` included) its task stops at the next progress report and commits
nothing (``engines.local.parent_is_gone``). An actor on another node cannot see the driver; Ray
ends it a few seconds after the driver died, and what it staged is removed by the next run on
that ``--out`` (it never commits: the commit check also requires the run's id in ``<out>/.lock``,
which the next run replaces).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Sequence

#: set once this process starts or joins Ray (``exit_after_interrupt``)
_RAY_STARTED = False
#: how long ``ray.init`` is given to find something listening at a ``host:port`` address
CONNECT_SECONDS = 5.0


def check_reachable(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """Raise ``OSError`` unless something accepts a TCP connection at the ``host:port`` of
    ``address`` (``host:port`` or ``ray://host:port``; other forms, such as ``auto``, are left to
    ``ray.init``). ``ray.init`` itself retries an address where nothing listens without end."""
    rest = address.strip()
    if "://" in rest:
        scheme, _, rest = rest.partition("://")
        if scheme != "ray":
            return
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
        pass


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/<pid>/stat``), with the pid a process's
    identity; "" when it has ended (or is a zombie), None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return ""
    except OSError:
        return None
    return "" if fields[0] in ("Z", "X") else fields[19]


def exit_after_interrupt(code: int = 1) -> None:
    """In a command interrupted (Ctrl-C) after Ray was started in this process: say "Aborted!" as
    click does and end the process with ``code`` at once, without tearing Ray's core worker down.
    That teardown (``ray.shutdown()``, or the interpreter's exit) can crash with SIGSEGV when the
    interrupt came while actors were starting. The Ray processes a local instance started end
    with this one, as they do however it ends; a cluster sees this driver leave. Returns when
    Ray was not started here."""
    ray = sys.modules.get("ray")
    if ray is None or not (_RAY_STARTED or ray.is_initialized()):  # an interrupted ray.init too
        return
    try:
        print("\nAborted!", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class RayEngine:
    #: a task whose actor dies is retried on a new actor, and reported failed after this many tries
    MAX_TRIES = 2

    def __init__(self, workers: int = 2, threads_per_worker: int = 1, gpus_per_worker: float = 0.0,
                 address: str | None = None):
        self.workers = max(1, int(workers))
        self.threads = max(1, int(threads_per_worker))
        self.gpus = float(gpus_per_worker)
        self.address = address or os.environ.get("RAY_ADDRESS")

    def _init(self):
        global _RAY_STARTED
        from collapseguard.engines.local import EngineError
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise EngineError("the Ray engine needs the extra: pip install 'collapseguard[ray]'") from exc
        if not ray.is_initialized():
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
            try:
                if self.address:
                    try:
                        check_reachable(self.address)
                    except OSError as exc:
                        raise EngineError(f"cannot start or reach {where}: nothing answers there "
                                          f"({exc.strerror or exc or type(exc).__name__})") from None
                    _RAY_STARTED = True
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    _RAY_STARTED = True
                    ray.init(num_cpus=max(self.workers * self.threads, os.cpu_count() or 1),
                             include_dashboard=False, log_to_driver=False)
            except (ConnectionError, TimeoutError, ValueError) as exc:
                raise EngineError(f"cannot start or reach {where}: {exc}") from None
        return ray

    def run(self, fn, tasks: Sequence, detector: str, kwargs: tuple, on_progress, on_done) -> None:
        if not tasks:
            return
        ray = self._init()

        from collapseguard.detectors.cnn_family import RUNTIME_ENV

        # the driver's cnn runtime (filter and dedup set it for their run): an actor on another
        # node, or in a Ray instance started before it was set, does not inherit it
        runtime = os.environ.get(RUNTIME_ENV)

        # the driver's process, for actors on its machine to watch (engines.local.parent_is_gone)
        driver = (ray.get_runtime_context().get_node_id(), os.getpid(), process_start(os.getpid()))

        @ray.remote(num_cpus=self.threads, num_gpus=self.gpus)
        class ShardWorker:
            def __init__(self, threads: int, runtime: str | None):
                from collapseguard.engines import local
                local.set_thread_budget(threads)
                if runtime:
                    os.environ[RUNTIME_ENV] = runtime
                else:
                    os.environ.pop(RUNTIME_ENV, None)
                node, pid, started = driver
                if started and ray.get_runtime_context().get_node_id() == node:
                    local._OWNER_GONE = lambda: process_start(pid) not in (started, None)
                self.detector = local.get_detector(detector, kwargs)

            def run(self, i, task):
                from collapseguard.engines.local import (
                    WorkerStopped,
                    parent_is_gone,
                    task_error,
                )
                context = ray.get_runtime_context()

                def progress(n: int) -> None:  # where a task can stop: it removes its staged files
                    if context.is_canceled() or parent_is_gone():
                        raise WorkerStopped(signal.SIGINT)

                try:
                    return i, fn(task, self.detector, progress), None
                except WorkerStopped:
                    return i, None, "stopped: the run was interrupted"
                except Exception as exc:
                    return i, None, task_error(exc)

            def idle(self) -> None:
                """Returns once the task this actor is running has ended."""

        queue = list(enumerate(tasks))
        tries: dict[int, int] = {}
        running = {}
        actors: list = []

        def submit(actor) -> None:
            i, t = queue.pop(0)
            tries[i] = tries.get(i, 0) + 1
            running[actor.run.remote(i, t)] = (actor, i, t)

        try:
            for _ in range(min(self.workers, len(tasks))):
                actors.append(ShardWorker.remote(self.threads, runtime))
                submit(actors[-1])
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                ref = done[0]
                actor, i, t = running.pop(ref)
                try:
                    _, res, err = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the actor died (node lost, out of memory)
                    ray.kill(actor)
                    actors.remove(actor)
                    if tries[i] < self.MAX_TRIES:
                        queue.insert(0, (i, t))  # another actor retries it
                    else:
                        on_done(i, None, f"Ray worker failed {tries[i]} times on this task: "
                                         f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                    if queue:
                        actor = ShardWorker.remote(self.threads, runtime)
                        actors.append(actor)
                        submit(actor)
                    continue
                on_done(i, res, err)
                if queue:
                    submit(actor)
        except BaseException:  # interrupted: the running tasks clean up before their actors end
            try:
                self._stop(ray, running)
            except Exception:  # noqa: BLE001 - Ray itself failing: the actors are killed below
                pass
            raise
        finally:
            for actor in actors:
                ray.kill(actor)

    #: how long an interrupted run waits for its running tasks to remove their staged files
    STOP_SECONDS = 30.0

    def _stop(self, ray, running: dict) -> None:
        """Cancel the ``running`` tasks and wait (up to ``STOP_SECONDS``) until they have ended:
        each stops at its next progress report and removes its staged files."""
        for ref in running:
            ray.cancel(ref)
        busy = {id(actor): actor for actor, _, _ in running.values()}
        if busy:
            ray.wait([a.idle.remote() for a in busy.values()], num_returns=len(busy),
                     timeout=self.STOP_SECONDS)
