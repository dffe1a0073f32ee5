"""The comparator pass sets torch's threads only in a process that runs the cnn on torch: a
process on onnxruntime, or an install without torch, must not import torch for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import sys
from collapseguard.dedup.describe import torch_threads
with torch_threads(1):
    pass
print("torch" in sys.modules)
"""


def test_torch_threads_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_torch_threads_sets_and_restores_torchs_threads_where_torch_runs():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    from collapseguard.dedup.describe import torch_threads

    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
