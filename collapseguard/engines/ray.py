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
"""

from __future__ import annotations

import os
from collections.abc import Sequence


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
        from collapseguard.engines.local import EngineError
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise EngineError("the Ray engine needs the extra: pip install 'collapseguard[ray]'") from exc
        if not ray.is_initialized():
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    ray.init(num_cpus=max(self.workers * self.threads, os.cpu_count() or 1),
                             include_dashboard=False, log_to_driver=False)
            except (ConnectionError, TimeoutError, ValueError) as exc:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
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

        @ray.remote(num_cpus=self.threads, num_gpus=self.gpus)
        class ShardWorker:
            def __init__(self, threads: int, runtime: str | None):
                from collapseguard.engines.local import get_detector, set_thread_budget
                set_thread_budget(threads)
                if runtime:
                    os.environ[RUNTIME_ENV] = runtime
                else:
                    os.environ.pop(RUNTIME_ENV, None)
                self.detector = get_detector(detector, kwargs)

            def run(self, i, task):
                from collapseguard.engines.local import task_error
                try:
                    return i, fn(task, self.detector, None), None
                except Exception as exc:
                    return i, None, task_error(exc)

        n = min(self.workers, len(tasks))
        actors = [ShardWorker.remote(self.threads, runtime) for _ in range(n)]
        queue = list(enumerate(tasks))
        tries: dict[int, int] = {}
        running = {}

        def submit(actor) -> None:
            i, t = queue.pop(0)
            tries[i] = tries.get(i, 0) + 1
            running[actor.run.remote(i, t)] = (actor, i, t)

        for actor in actors:
            if queue:
                submit(actor)
        try:
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
        finally:
            for actor in actors:
                ray.kill(actor)
