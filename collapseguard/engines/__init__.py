"""Engines run one task function over many tasks (shards, chunks of files): in this process, in
worker processes on this machine (``local``), or on Ray actors across a cluster (``ray``).

Every engine has one method, ``run(fn, tasks, detector, kwargs, on_progress, on_done)``; workers
load the detector once per process and die with the process that started them.
"""

from __future__ import annotations

from collapseguard.engines.local import (
    EngineError,
    InlineEngine,
    LocalEngine,
    get_detector,
    set_thread_budget,
    spawn_context,
)


def make_engine(name: str = "local", workers: int = 2, detector=None):
    """``"local"`` (processes; in this process when workers == 1) or ``"ray"``.

    ``detector`` (optional) is an already-created detector the inline engine reuses.
    """
    if name == "local":
        return InlineEngine(detector) if workers <= 1 else LocalEngine(workers)
    if name == "ray":
        from collapseguard.engines.ray import RayEngine
        return RayEngine(workers)
    raise ValueError(f"unknown engine {name!r}; use 'local' or 'ray'")


__all__ = ["EngineError", "InlineEngine", "LocalEngine", "get_detector", "make_engine",
           "set_thread_budget", "spawn_context"]
