"""The core install: `pip install collapseguard` with no extras, in a fresh virtual environment,
leaves torch out and still runs `demo`, `score`, `filter` and `audit` with the shipped cnn on
onnxruntime, giving the full install's scores within SCORE_TOLERANCE.

The environment is built from a copy of the package's sources (setup.cfg, pyproject.toml,
README.md, collapseguard/) with pip's ordinary index (PyPI, or the local index pip is configured
with), so nothing of the running environment leaks in: no PYTHONPATH, a fresh detector cache
(the ONNX graph must come from the package, not from an earlier export)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the largest the core install's environment may be (pip and setuptools included)
MAX_ENV_MB = 800
#: the torch-free scores equal the full install's (torch runtime) within this
from collapseguard.detectors.cnn_onnx import SCORE_TOLERANCE  # noqa: E402


def _size_mb(folder: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.lstat(p).st_blocks * 512  # on disk, as du counts
    return total / 2**20


@pytest.fixture(scope="module")
def light(tmp_path_factory):
    base = tmp_path_factory.mktemp("light")
    src = base / "src"
    shutil.copytree(ROOT / "collapseguard", src / "collapseguard",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "COLLAPSEGUARD_CNN_RUNTIME")}
    env.update(COLLAPSEGUARD_CACHE=str(base / "cache"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               OMP_NUM_THREADS="1")
    venv = base / "venv"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    res = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src)], capture_output=True,
                         text=True, env=env, cwd=base)
    seconds = time.perf_counter() - t0
    assert res.returncode == 0, f"pip install of the core failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    size = _size_mb(venv)
    print(f"\ncore install: {seconds:.1f} s, {size:.0f} MB")  # shown with pytest -s

    def run(*args, expect=0):
        r = subprocess.run([str(venv / "bin" / "collapseguard"), *map(str, args)], capture_output=True,
                           text=True, env=env, cwd=base)
        assert r.returncode == expect, f"collapseguard {' '.join(map(str, args))}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    return SimpleNamespace(base=base, python=py, run=run, env=env, seconds=seconds, size_mb=size)


def test_the_core_install_leaves_torch_out(light):
    r = subprocess.run([str(light.python), "-c", "import torch"], capture_output=True, text=True,
                       env=light.env, cwd=light.base)
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr
    r = subprocess.run([str(light.python), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                       text=True, env=light.env, check=True, cwd=light.base)
    installed = {line.split("==")[0].lower() for line in r.stdout.split()}
    assert {"numpy", "pillow", "onnxruntime", "webdataset", "pyarrow", "click"} <= installed
    assert not installed & {"torch", "onnx", "matplotlib", "transformers", "pyiqa"}
    assert light.size_mb < MAX_ENV_MB, f"the core install takes {light.size_mb:.0f} MB"
    # a command that needs an extra names it in one line
    r = light.run("train", "--chains", light.base, "--out", light.base / "w.safetensors", expect=1)
    assert r.stderr.strip() == ("collapseguard: error: `collapseguard train` needs torch, which the "
                                "core install leaves out: pip install 'collapseguard[train]'")
    # a pyiqa metric needs torch too, but [train] would not bring pyiqa: [iqa] is named
    r = light.run("score", light.base, "-o", light.base / "s.csv", "-d", "pyiqa:piqe", expect=1)
    assert "pip install 'collapseguard[iqa]'" in r.stderr and "[train]" not in r.stderr, r.stderr


@pytest.fixture(scope="module")
def demo_shards(light):
    """The shards `collapseguard demo` builds (and filters) in the core install."""
    demo = light.base / "demo"
    r = light.run("demo", demo, "--quiet", "--workers", "1")
    assert "truth vs decision" in r.stdout and '"clean": {"kept": 17}' in r.stdout
    shards = sorted((demo / "shards").glob("*.tar"))
    assert len(shards) == 3
    return shards


def test_demo_score_filter_and_audit_run_without_torch_and_score_as_the_full_install(
        light, demo_shards, monkeypatch):
    pytest.importorskip("torch")  # the full install's reference scores
    from click.testing import CliRunner

    from collapseguard.cli import main

    shards = demo_shards

    light.run("score", *shards, "--out", light.base / "light.parquet", "--quiet")
    got = pd.read_parquet(light.base / "light.parquet")
    monkeypatch.setenv("COLLAPSEGUARD_CNN_RUNTIME", "torch")  # the network as trained
    res = CliRunner().invoke(main, ["score", *map(str, shards), "--out", str(light.base / "full.parquet"),
                                    "--quiet"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    want = pd.read_parquet(light.base / "full.parquet")
    assert len(got) == len(want) > 30
    assert list(got["key"]) == list(want["key"])
    assert (got["detector_version"] == want["detector_version"]).all()
    np.testing.assert_allclose(got["score"], want["score"], rtol=0, atol=SCORE_TOLERANCE)
    assert (got["threshold"] == want["threshold"]).all()
    near = (want["score"] - want["threshold"]).abs() <= SCORE_TOLERANCE
    assert (got["flagged"] == want["flagged"])[~near].all()
    by_key = dict(zip(want["key"], want["score"]))

    light.run("filter", *shards, "--out", light.base / "filtered", "--quiet", "--workers", "2")
    f = pd.concat([pd.read_parquet(p) for p in sorted((light.base / "filtered" / "scores").glob("*.parquet"))])
    assert sorted(f["key"]) == sorted(want["key"])
    np.testing.assert_allclose(f["score"], [by_key[k] for k in f["key"]], rtol=0, atol=SCORE_TOLERANCE)
    assert set(f.loc[f["reason"] == "degraded", "key"]) == set(got.loc[got["flagged"].astype(bool), "key"])

    light.run("audit", *shards, "--out", light.base / "audit", "--quiet")
    a = pd.read_parquet(light.base / "audit" / "scores.parquet")
    np.testing.assert_allclose(a["score"], [by_key[k] for k in a["key"]], rtol=0, atol=SCORE_TOLERANCE)
    html = (light.base / "audit" / "report.html").read_text()
    assert "Most degraded" in html and "pip install &#x27;collapseguard[plots]&#x27;" in html


def test_dedup_runs_without_torch_and_groups_as_the_full_install(light, demo_shards):
    """dedup's comparator loads its weights with safetensors.numpy and scores the cnn on
    onnxruntime: the core install groups the demo's clean photos and their re-renderings as the
    full install does."""
    from click.testing import CliRunner

    from collapseguard.cli import main

    # one process: the comparator pass runs in this process, which has no torch to set threads of
    light.run("dedup", *demo_shards, "--out", light.base / "dedup", "--quiet", "-w", "1")
    got = pd.read_parquet(light.base / "dedup" / "groups.parquet")
    res = CliRunner().invoke(main, ["dedup", *map(str, demo_shards), "--out",  # the cnn on torch
                                    str(light.base / "dedup_full"), "--quiet", "--runtime", "torch"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    want = pd.read_parquet(light.base / "dedup_full" / "groups.parquet")
    assert (got["group"] != "").sum() > 0  # the demo holds copies of one photo
    for col in ("source", "key", "group", "rank", "decision"):
        assert list(got[col]) == list(want[col]), col


def test_calibrate_and_evaluate_run_without_torch(light, demo_shards, monkeypatch):
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from collapseguard.cli import main

    chains = light.base / "chains"
    light.run("chains", "make", "--sources", "bundled", "--max-sources", "3", "--families",
              "noise_tint,scattered_dots", "--steps", "5", "--keep", "0,1,5", "--out", chains)
    args = ["--chains", chains, "--clean", demo_shards[0].parent, "--max-false-drop", "0.3",
            "--confidence", "0.8", "--holdout", "0"]
    r = light.run("calibrate", *args, "--out", light.base / "light_cal.json")
    assert "pip install 'collapseguard[plots]'" in r.stderr  # no figure, and why
    monkeypatch.setenv("COLLAPSEGUARD_CNN_RUNTIME", "torch")
    res = CliRunner().invoke(main, ["calibrate", *map(str, args), "--no-plot", "--out",
                                    str(light.base / "full_cal.json")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    from collapseguard.io.calibration_file import load_calibration

    a, b = load_calibration(light.base / "light_cal.json"), load_calibration(light.base / "full_cal.json")
    assert (a.detector, a.detector_version, a.n_clean) == (b.detector, b.detector_version, b.n_clean)
    assert abs(a.threshold - b.threshold) <= SCORE_TOLERANCE

    light.run("evaluate", "--chains", chains, "-d", "cnn,nss", "--steps", "5", "--out", light.base / "ev")
    light.run("evaluate", "--from-scores", light.base / "ev" / "scores.csv", "--steps", "5",
              "--out", light.base / "ev2")
    assert "cnn" in (light.base / "ev2" / "results.md").read_text()


def test_chains_make_its_default_families_without_torch_and_says_which_it_leaves_out(light):
    """The learned family needs torch: the core install makes every other default family, says
    so in one note, marks it in `chains families`, and refuses it by name with the extra to
    install, rather than failing after writing half the chains."""
    out = light.base / "chains_default"
    r = light.run("chains", "make", "--sources", "bundled", "--max-sources", "1", "--steps", "1",
                  "--keep", "0,1", "--out", out, "-w", "1", "-q")
    assert "family learned left out: it needs torch: pip install 'collapseguard[train]'" in r.stderr
    made = set(pd.read_csv(out / "manifest.csv")["family"])
    assert "learned" not in made and {"noise_tint", "mixed", "codec"} <= made
    listed = light.run("chains", "families").stdout
    assert "learned            (not available here: it needs torch" in listed
    r = light.run("chains", "make", "--sources", "bundled", "--max-sources", "1", "--families", "learned",
                  "--out", light.base / "chains_learned", expect=1)
    assert "family learned needs torch: pip install 'collapseguard[train]'" in r.stderr
    assert not (light.base / "chains_learned").exists()
