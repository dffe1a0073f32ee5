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
import traceback
from collections.abc import Sequence


class RayEngine:
    def __init__(self, workers: int = 2, threads_per_worker: int = 1, gpus_per_worker: float = 0.0,
                 address: str | None = None):
        self.workers = max(1, int(workers))
        self.threads = max(1, int(threads_per_worker))
        self.gpus = float(gpus_per_worker)
        self.address = address or os.environ.get("RAY_ADDRESS")

    def _init(self):
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise RuntimeError("the Ray engine needs the extra: pip install 'collapseguard[ray]'") from exc
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(self.workers * self.threads, os.cpu_count() or 1),
                         include_dashboard=False, log_to_driver=False)
        return ray

    def run(self, fn, tasks: Sequence, detector: str, kwargs: tuple, on_progress, on_done) -> None:
        if not tasks:
            return
        ray = self._init()

        @ray.remote(num_cpus=self.threads, num_gpus=self.gpus)
        class ShardWorker:
            def __init__(self, threads: int):
                from collapseguard.filter.engines import get_detector, set_thread_budget
                set_thread_budget(threads)
                self.detector = get_detector(detector, kwargs)

            def run(self, i, task):
                try:
                    return i, fn(task, self.detector, None), None
                except Exception as exc:
                    return i, None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"

        n = min(self.workers, len(tasks))
        actors = [ShardWorker.remote(self.threads) for _ in range(n)]
        queue = list(enumerate(tasks))
        running = {}
        for actor in actors:
            if queue:
                i, t = queue.pop(0)
                running[actor.run.remote(i, t)] = actor
        try:
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                ref = done[0]
                actor = running.pop(ref)
                try:
                    i, res, err = ray.get(ref)
                except Exception as exc:  # the actor died (node lost, out of memory)
                    raise RuntimeError(f"Ray worker failed: {exc}") from exc
                on_done(i, res, err)
                if queue:
                    i, t = queue.pop(0)
                    running[actor.run.remote(i, t)] = actor
        finally:
            for actor in actors:
                ray.kill(actor)
