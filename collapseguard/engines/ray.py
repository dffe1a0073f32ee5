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
and waits up to ``STOP_SECONDS`` for them: on a Ray whose ``RuntimeContext`` has ``is_canceled`` (added late
2025, ray-project/ray#58914) a cancelled task stops at its next progress report (every 16 samples) and, as in a local
worker stopped by SIGINT, removes its staged files. Then the actors are killed, and once they are
gone the driver removes what the tasks it had sent them staged (``discard_staged``: this run's
``NAME.<run id>.tmp`` files in ``--out``), so on an older Ray, after the wait, or for a task sent
at the moment of the interrupt, no partial shard is left either. A task whose actor dies (a lost
node, the out-of-memory killer) has its staged files removed the same way before it is retried
on a new actor (``MAX_TRIES`` in all) or reported failed.

An actor on the driver's machine also watches the driver's process (``driver_watch``): once the
driver has ended (``kill -9`` included) its task stops at the next progress report and commits
nothing (``engines.local.parent_is_gone``). It watches only where it sees the driver's process
when it starts (same node, same PID namespace, the pid with the driver's start time) and never
through Ray Client (``ray://``), where the driver runs on another machine. An actor that does not
watch (on another node, say) is ended by Ray a few seconds after the driver died; until the next
run replaces ``<out>/.lock`` it commits only a complete shard, and what it staged is removed by
the next run on that ``--out``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

#: True while ``ray.init`` runs in this process (``exit_after_interrupt``: an interrupted init)
_RAY_INIT_RUNNING = False
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
    """In a command interrupted (Ctrl-C) while Ray is initialised in this process, or while its
    ``ray.init`` ran: say "Aborted!" as click does and end the process with ``code`` at once,
    without tearing Ray's core worker down. That teardown (``ray.shutdown()``, or the
    interpreter's exit) can crash with SIGSEGV when the interrupt came while actors were starting,
    so it is not attempted. On Linux the processes of a local instance started here end with this
    one (Ray's fate-sharing: the kernel kills them when their parent dies); where Ray has no
    fate-sharing (macOS, Windows) the local instance's processes are killed first (untested
    there). A cluster sees this driver leave. Returns, doing nothing, in a process where Ray is
    not initialised (never started, shut down, or its init failed): the interrupt then ends the
    command as click does. Registered with ``engines.local.on_interrupt`` by ``RayEngine``; the
    command line calls it from its group's ``invoke``, so a command run in process (click's
    ``CliRunner``) while Ray is initialised ends the process too."""
    ray = sys.modules.get("ray")
    if ray is None or not (_RAY_INIT_RUNNING or ray.is_initialized()):
        return
    try:
        print("\nAborted!", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        if not sys.platform.startswith("linux"):  # pragma: no cover - no fate-sharing there
            node = getattr(getattr(ray, "_private", None) and ray._private.worker, "_global_node",
                           None)
            if node is not None and getattr(node, "head", False):  # a local instance started here
                node.kill_all_processes(check_alive=False, allow_graceful=False)
    finally:
        os._exit(code)


def pid_namespace() -> int | None:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``); None where /proc has
    no such entry."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def driver_identity(ray) -> tuple | None:
    """What an actor needs to watch this driver's process (``driver_watch``): its node, pid,
    start time and PID namespace; None through Ray Client (the driver is on another machine,
    though Ray names the head node as its node) or where /proc cannot tell its start time."""
    from ray.util.client import ray as client
    if client.is_connected():
        return None
    started = process_start(os.getpid())
    if not started:
        return None
    return (ray.get_runtime_context().get_node_id(), os.getpid(), started, pid_namespace())


def driver_watch(driver: tuple | None, node_id: str):
    """In an actor on node ``node_id``: a function that says whether the driver
    (``driver_identity``) has ended, or None where this actor cannot see the driver's process
    (another node, another PID namespace, or that pid is not the driver now: it would look
    ended, or alive, whatever the driver does), so it must not stop tasks by it."""
    if not driver:
        return None
    node, pid, started, namespace = driver
    if node != node_id or namespace != pid_namespace() or process_start(pid) != started:
        return None
    return lambda: process_start(pid) not in (started, None)


def make_progress(context):
    """The progress function a task of an actor gets: it raises ``WorkerStopped`` (the task
    removes its staged files) once the task is cancelled (on a Ray with
    ``RuntimeContext.is_canceled``; an older one cannot tell, and the driver removes the files
    after killing the actor) or the watched driver has ended."""
    from collapseguard.engines.local import WorkerStopped, parent_is_gone
    is_canceled = getattr(context, "is_canceled", None)

    def progress(n: int) -> None:
        if (is_canceled is not None and is_canceled()) or parent_is_gone():
            raise WorkerStopped(signal.SIGINT)
    return progress


def discard_staged(fn, task) -> None:
    """Remove what a task of this run staged and can no longer commit, once the actor that ran it
    is gone: the task function says how, as its ``discard_abandoned`` attribute
    (``filter.pipeline.filter_task``'s removes this run's ``NAME.<run id>.tmp`` files in
    ``--out``); task functions without one (score, dedup) stage nothing in an output folder."""
    discard = getattr(fn, "discard_abandoned", None)
    if discard is not None:
        discard(task)


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
        global _RAY_INIT_RUNNING
        from collapseguard.engines.local import EngineError, add_interrupt_hook
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise EngineError("the Ray engine needs the extra: pip install 'collapseguard[ray]'") from exc
        add_interrupt_hook(exit_after_interrupt)
        if not ray.is_initialized():
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
            try:
                if self.address:
                    try:
                        check_reachable(self.address)
                    except OSError as exc:
                        raise EngineError(f"cannot start or reach {where}: nothing answers there "
                                          f"({exc.strerror or str(exc) or type(exc).__name__})") from None
                    settings = {"address": self.address}
                else:
                    settings = {"num_cpus": max(self.workers * self.threads, os.cpu_count() or 1),
                                "include_dashboard": False}
                _RAY_INIT_RUNNING = True
                try:
                    # Ray's own INFO lines (the local instance started) are not this tool's to print
                    ray.init(**settings, log_to_driver=False, logging_level=logging.WARNING)
                finally:
                    _RAY_INIT_RUNNING = False
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

        # the driver's process, for actors that can see it to watch (engines.local.parent_is_gone)
        driver = driver_identity(ray)

        @ray.remote(num_cpus=self.threads, num_gpus=self.gpus)
        class ShardWorker:
            def __init__(self, threads: int, runtime: str | None):
                from collapseguard.engines import local
                local.set_thread_budget(threads)
                if runtime:
                    os.environ[RUNTIME_ENV] = runtime
                else:
                    os.environ.pop(RUNTIME_ENV, None)
                local._OWNER_GONE = driver_watch(driver, ray.get_runtime_context().get_node_id())
                self.detector = local.get_detector(detector, kwargs)

            def run(self, i, task):
                from collapseguard.engines.local import WorkerStopped, task_error
                progress = make_progress(ray.get_runtime_context())
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
        sent: dict[int, object] = {}  # tasks sent to an actor (or being sent) and not reported

        def submit(actor) -> None:
            i, t = queue[0]
            sent[i] = t  # first: an interrupt from here on finds the task among those to clean
            queue.pop(0)
            tries[i] = tries.get(i, 0) + 1
            ref = actor.run.remote(i, t)
            running[ref] = (actor, i, t)

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
                    try:  # what it staged can no longer be committed (a retry stages afresh)
                        discard_staged(fn, t)
                    except Exception:  # noqa: BLE001 - the next run on that --out removes it
                        pass
                    if tries[i] < self.MAX_TRIES:
                        queue.insert(0, (i, t))  # another actor retries it
                    else:
                        sent.pop(i, None)
                        on_done(i, None, f"Ray worker failed {tries[i]} times on this task: "
                                         f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                    if queue:
                        actor = ShardWorker.remote(self.threads, runtime)
                        actors.append(actor)
                        submit(actor)
                    continue
                sent.pop(i, None)
                on_done(i, res, err)
                if queue:
                    submit(actor)
        except BaseException:  # interrupted: the running tasks clean up before their actors end
            try:
                self._stop(ray, running)
            except Exception:  # noqa: BLE001 - Ray itself failing: the actors are killed below
                pass
            self._kill(ray, actors)
            for t in sent.values():  # what the tasks staged and could not remove themselves
                try:
                    discard_staged(fn, t)
                except Exception:  # noqa: BLE001 - the next run removes it
                    pass
            raise
        finally:
            self._kill(ray, actors, wait=False)

    #: how long an interrupted run waits for its running tasks to remove their staged files
    STOP_SECONDS = 30.0

    def _stop(self, ray, running: dict) -> bool:
        """Cancel the ``running`` tasks and wait (up to ``STOP_SECONDS``) until they have ended:
        on a Ray with ``RuntimeContext.is_canceled`` each stops at its next progress report and
        removes its staged files. On an older Ray a running task cannot be stopped, so there is
        no wait. Returns whether every running task has ended."""
        from ray.runtime_context import RuntimeContext
        for ref in running:
            ray.cancel(ref)
        busy = {id(actor): actor for actor, _, _ in running.values()}
        if not busy:
            return True
        if not hasattr(RuntimeContext, "is_canceled"):
            return False
        _, left = ray.wait([a.idle.remote() for a in busy.values()], num_returns=len(busy),
                           timeout=self.STOP_SECONDS)
        return not left

    #: how long an interrupted run waits for its killed actors to be gone
    KILL_SECONDS = 10.0

    def _kill(self, ray, actors: list, wait: bool = True) -> None:
        """Kill ``actors``; with ``wait``, wait (up to ``KILL_SECONDS``) until Ray reports them
        gone, so that none writes after the driver removed what it staged."""
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - gone already
                pass
        if actors and wait:
            try:
                ray.wait([a.idle.remote() for a in actors], num_returns=len(actors),
                         timeout=self.KILL_SECONDS)
            except Exception:  # noqa: BLE001
                pass
        actors.clear()
