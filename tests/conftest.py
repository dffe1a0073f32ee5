"""Shared test setup: offline, few threads, and tiny shard fixtures made from real images."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def photos() -> list[np.ndarray]:
    """A few real photographs that ship inside installed packages (crops, to stay fast)."""
    from skimage import data
    return [data.astronaut()[:256, :320], data.coffee()[:240, :320], data.chelsea()[:240, :300],
            data.rocket()[:256, :256]]


def _script_loader(folder: str):
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / folder

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"{folder}_{Path(name).stem}", root / name)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return load


@pytest.fixture(scope="session")
def benchmark_script():
    """Load a script of benchmarks/ as a module by file name (they are scripts, not a package)."""
    return _script_loader("benchmarks")


@pytest.fixture(scope="session")
def recipe_script():
    """Load a script of recipes/ as a module by file name."""
    return _script_loader("recipes")
