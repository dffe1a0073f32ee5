"""The local engines: tasks in this process, or in spawned worker processes on this machine.

An engine has one method, ``run(fn, tasks, detector, on_progress, on_done)``: it calls the
module-level function ``fn(task, detector, progress)`` for every task (for ``filter`` a task is a
shard and its options, see ``pipeline.filter_task``; for ``score`` a shard or a chunk of image
files) and reports each finished task to ``on_done`` as ``(index, result, error)``. Workers load the detector once per process and split the machine's
cores between them, so torch and BLAS threads do not oversubscribe the CPU. A distributed engine
(Ray) implements the same method (see ``engines/ray.py``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.managers import SyncManager

from collapseguard.errors import CollapseguardError

OnProgress = Callable[[int], None]
#: (task index, result or None, error text or None)
OnDone = Callable[[int, object, "str | None"], None]
#: fn(task, detector, progress) -> result; must be a module-level function (it is pickled)
TaskFn = Callable[[object, object, "OnProgress | None"], object]

_DETECTORS: dict = {}
_PROGRESS_QUEUE = None
#: the pid of the process that started this worker (None outside worker processes)
_PARENT_PID: int | None = None
#: True in a worker process while it runs a task
_IN_TASK = False
#: in a worker that is not its starting process's child (a Ray actor on the driver's machine):
#: says whether that process has ended
_OWNER_GONE: Callable[[], bool] | None = None


#: called, in order, when a command is interrupted (``on_interrupt``)
_INTERRUPT_HOOKS: list[Callable[[], None]] = []


def add_interrupt_hook(hook: Callable[[], None]) -> None:
    """Have ``hook`` called when a command of this process is interrupted (Ctrl-C): an engine
    that must end the process its own way then registers it when it first runs (the Ray engine:
    ``engines.ray.exit_after_interrupt``). Added once however often it is registered."""
    if hook not in _INTERRUPT_HOOKS:
        _INTERRUPT_HOOKS.append(hook)


def on_interrupt() -> None:
    """The command line calls this when a command was interrupted, before click reports it: each
    registered hook may end the process (and does not return then) or return to let the
    interrupt go on as usual."""
    for hook in list(_INTERRUPT_HOOKS):
        hook()


def parent_is_gone() -> bool:
    """True in a worker process whose starting process has exited (it must not commit)."""
    if _PARENT_PID is not None:
        return os.getppid() != _PARENT_PID
    return _OWNER_GONE is not None and _OWNER_GONE()


def spawn_context():
    """The multiprocessing context for worker pools: spawn, never fork (a parent that already ran
    torch/OpenMP can deadlock forked children).

    Spawned workers re-import the parent's main module from its file. A script read from stdin
    (``python - <<EOF``) has no file, and every worker would die with an opaque
    ``BrokenProcessPool``; this raises a ``RuntimeError`` that says so instead.
    """
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and main_file.startswith("<") and main_file.endswith(">"):
        raise RuntimeError(
            f"worker processes cannot start: the main script is {main_file}, which spawned workers "
            "cannot re-import. Save the script to a file (with an `if __name__ == \"__main__\":` "
            "guard) or use one worker.")
    return mp.get_context("spawn")


def get_detector(name: str, kwargs: tuple = ()):
    """The process-wide detector for ``name`` (created on first use, then reused), one for each
    cnn runtime the process asks for (``$COLLAPSEGUARD_CNN_RUNTIME``, which ``--runtime`` sets for
    a run): a detector made under one runtime is never served to a run under another."""
    from collapseguard.detectors.cnn_family import RUNTIME_ENV

    key = (name, kwargs, os.environ.get(RUNTIME_ENV, ""))
    if key not in _DETECTORS:
        from collapseguard.detectors import create
        _DETECTORS[key] = create(name, **dict(kwargs))
    return _DETECTORS[key]


def set_thread_budget(n_threads: int) -> None:
    """Limit torch/BLAS/OpenMP threads of this process to ``n_threads``.

    The environment variables cover libraries imported later (torch reads OMP_NUM_THREADS when
    it loads); torch is only told directly if it is already loaded, so detectors that do not
    need torch never pay for importing it.
    """
    n = str(max(1, int(n_threads)))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = n
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(n))


def die_with_parent(parent_pid: int) -> None:
    """Make this worker process end when its parent does.

    On Linux the kernel sends SIGKILL to this process the moment its parent exits
    (``PR_SET_PDEATHSIG``), however the parent died (``kill -9`` included), so a worker can never
    go on writing outputs for a run that no longer holds its ``--out``. A parent that died before
    the request was made is caught by comparing ``getppid()``. Elsewhere, the commit check of
    ``filter.pipeline`` (parent alive, run still owns the lock) is the guard.
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no prctl in this libc
            pass
    if os.getppid() != parent_pid:
        os._exit(1)


class WorkerStopped(BaseException):
    """Raised in a worker process by SIGINT or SIGTERM (in a Ray actor: when its task is cancelled
    or its driver has ended), so the task it runs cleans up first."""


def _stop_worker(signum, frame) -> None:
    # Ctrl-C reaches every process of the group; when one worker dies of it, the pool terminates
    # the others with SIGTERM. Either signal unwinds the running task (``process_shard`` deletes
    # its staged files on any exception) and ends the process; later signals are ignored so they
    # cannot cut that cleanup short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not _IN_TASK:  # idle between tasks: nothing to clean up, and no traceback to print
        os._exit(128 + signum)
    raise WorkerStopped(signum)


def _worker_init(threads: int, progress_queue, detector: str, kwargs: tuple,
                 parent_pid: int) -> None:
    global _PROGRESS_QUEUE, _PARENT_PID
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, _stop_worker)
    signal.signal(signal.SIGTERM, _stop_worker)
    _PARENT_PID = parent_pid
    set_thread_budget(threads)
    _PROGRESS_QUEUE = progress_queue
    get_detector(detector, kwargs)


def _worker_run(fn: TaskFn, task, detector: str, kwargs: tuple):
    global _IN_TASK
    q = _PROGRESS_QUEUE
    _IN_TASK = True
    try:
        res = fn(task, get_detector(detector, kwargs), (lambda n: q.put(n)) if q is not None else None)
        return res, None
    except WorkerStopped as stop:  # the task has cleaned up; this worker ends, as signalled
        os._exit(128 + stop.args[0])
    except (Exception, SystemExit) as exc:  # reported per task (a sys.exit in a detector too);
        return None, task_error(exc)             # the run goes on with the others
    finally:
        _IN_TASK = False


def task_error(exc: BaseException) -> str:
    """How a failed task is recorded: ``Type: message``, on one line, for a collapseguard error
    (a damaged shard) or an ``OSError`` (a full disk, a file or URL that is gone): the message is
    the whole story. An unexpected error (a bug) gets a short traceback after that line."""
    head = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (CollapseguardError, OSError)):
        return " ".join(head.splitlines())  # one line whatever the message holds
    return f"{head}\n{traceback.format_exc(limit=4)}"


class InlineEngine:
    """Runs tasks one after another in this process (workers=1, debugging, notebooks)."""

    def __init__(self, detector=None):
        self.detector = detector

    def run(self, fn: TaskFn, tasks: Sequence, detector: str, kwargs: tuple,
            on_progress: OnProgress | None, on_done: OnDone) -> None:
        det = self.detector if self.detector is not None else get_detector(detector, kwargs)
        for i, task in enumerate(tasks):
            try:
                result = fn(task, det, on_progress)
            except (Exception, SystemExit) as exc:  # one task's failure, never the run's
                on_done(i, None, task_error(exc))
            else:
                on_done(i, result, None)


class EngineError(CollapseguardError, RuntimeError):
    """An engine cannot run at all (a missing extra, an unreachable cluster)."""


class LocalEngine:
    """Runs tasks in ``workers`` spawned processes on this machine, one detector per process.

    At most ``workers`` tasks are in flight, so when a worker process dies (killed, out of
    memory) only those tasks are suspects. The pool is restarted and the suspects are retried
    one at a time: the task that kills a worker while running alone is reported as failed, and
    every other task still runs.

    With ``keep_pool`` the worker processes outlive a ``run``: the next run (another task
    function, another detector, created in each worker when its first task asks for it) starts
    no processes and imports nothing again. ``close()`` (or leaving the engine's ``with`` block)
    ends them.
    """

    def __init__(self, workers: int = 2, threads_per_worker: int | None = None, keep_pool: bool = False):
        self.workers = max(1, int(workers))
        cores = os.cpu_count() or 1
        self.threads = threads_per_worker or max(1, cores // self.workers)
        self.keep_pool = bool(keep_pool)
        self._kept = None  # (pool, its width, its progress queue) between runs
        self._manager = None  # the progress queue's manager, kept with the pool
        self._manager_queue = None

    def close(self) -> None:
        """End the kept worker processes (and the progress queue's manager)."""
        self._drop_kept()
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _drop_kept(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            kept[0].shutdown(wait=True, cancel_futures=True)

    def run(self, fn: TaskFn, tasks: Sequence, detector: str, kwargs: tuple,
            on_progress: OnProgress | None, on_done: OnDone) -> None:
        if not tasks:
            return
        ctx = spawn_context()
        manager = None
        if on_progress:
            manager = self._manager if self.keep_pool else None
            if manager is None:
                manager = SyncManager(ctx=ctx)
                manager.start(die_with_parent, (os.getpid(),))
                if self.keep_pool:
                    self._manager = manager
                    self._manager_queue = manager.Queue()
        progress_q = (self._manager_queue if self.keep_pool else manager.Queue()) if manager else None
        stop = threading.Event()

        def pump():
            while True:
                try:
                    on_progress(progress_q.get(timeout=0.2))
                except queue.Empty:
                    if stop.is_set():
                        return
                except (EOFError, OSError):
                    return

        pumper = threading.Thread(target=pump, daemon=True) if progress_q is not None else None
        if pumper:
            pumper.start()
        todo = list(range(len(tasks)))  # task indices not yet finished, in order
        suspects: list[int] = []  # in flight when a worker died: retried one at a time
        try:
            while todo or suspects:
                alone = bool(suspects)
                queue_ = suspects if alone else todo
                width = 1 if alone else min(self.workers, len(todo))
                broken = self._run_pool(ctx, width, fn, tasks, queue_, detector, kwargs,
                                        progress_q, on_done, alone)
                if alone and broken:
                    # the task ran alone and its worker died: it is the one that kills workers
                    on_done(broken[0], None, "worker failed: its worker process died while "
                            "running it alone (killed, out of memory, or the detector could not "
                            "load)")
                    continue
                suspects.extend(broken)
        finally:
            stop.set()
            if pumper:
                pumper.join(timeout=5)
            if manager and not self.keep_pool:
                manager.shutdown()

    def _run_pool(self, ctx, width: int, fn, tasks, order: list[int], detector, kwargs,
                  progress_q, on_done, alone: bool = False) -> list[int]:
        """Run tasks from ``order`` (consumed from the front) with ``width`` in flight; returns
        the indices that were in flight when a worker died (empty when the pool stayed up).
        ``alone``: a suspect, run in a pool of its own (never the kept one)."""
        kept = self.keep_pool and not alone
        if kept and self._kept is not None and self._kept[2] is not progress_q:
            self._drop_kept()
        if kept and self._kept is None:  # all the workers (spawned as tasks need them): kept for later runs
            self._kept = (ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                              initializer=_worker_init,
                                              initargs=(self.threads, progress_q, detector, kwargs,
                                                        os.getpid())),
                          self.workers, progress_q)
        if kept:
            pool = self._kept[0]
        else:
            pool = ProcessPoolExecutor(max_workers=width, mp_context=ctx, initializer=_worker_init,
                                       initargs=(self.threads, progress_q, detector, kwargs,
                                                 os.getpid()))
        running: dict = {}
        broken: list[int] = []
        try:
            while order or running:
                while order and len(running) < width:
                    i = order.pop(0)
                    running[pool.submit(_worker_run, fn, tasks[i], detector, kwargs)] = i
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                    done, _ = wait(running)  # a broken pool settles every future it holds
                for fut in done:
                    i = running.pop(fut)
                    try:
                        res, err = fut.result()
                    except BrokenProcessPool:
                        broken.append(i)
                        continue
                    except Exception as exc:  # the result could not be sent back
                        res, err = None, f"worker failed: {type(exc).__name__}: {exc}"
                    on_done(i, res, err)
                if broken:
                    return sorted(broken)
            return []
        finally:
            if kept and broken:  # a worker died: the next run starts another pool
                self._kept = None
            if not kept or broken:
                pool.shutdown(wait=True, cancel_futures=True)
