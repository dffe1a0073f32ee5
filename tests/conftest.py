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
