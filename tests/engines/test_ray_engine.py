"""The Ray engine gives the same outputs as the local engine (local Ray instance, 2 CPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cg_testutil import make_shard

from collapseguard.filter.pipeline import FilterOptions
from collapseguard.filter.run import run_filter

ray = pytest.importorskip("ray", reason="Ray engine needs the [ray] extra")


def test_ray_engine_matches_local_engine(tmp_path, photos):
    d = tmp_path / "data"
    d.mkdir()
    for s in range(3):
        make_shard(d / f"s-{s}.tar", photos[:2], start=10 * s)
    shards = str(d / "s-{0..2}.tar")
    outs = {}
    for engine in ("local", "ray"):
        opts = FilterOptions(out_dir=str(tmp_path / engine), detector="nss", threshold=3.0)
        summary = run_filter([shards], opts, workers=2, engine=engine, quiet=True)
        assert summary["shards_failed"] == [] and summary["samples"] == 12
        outs[engine] = {p.relative_to(tmp_path / engine).as_posix(): p.read_bytes()
                        for sub in ("kept", "rejected", "scores") for p in (tmp_path / engine / sub).iterdir()}
    ray.shutdown()
    assert outs["ray"] == outs["local"]
    assert len(outs["ray"]) == 9
    assert json.loads((tmp_path / "ray/summary.json").read_text())["rejected"] >= 1


def test_ray_engine_reads_and_writes_paths_relative_to_the_callers_folder(tmp_path, photos, monkeypatch):
    (tmp_path / "data").mkdir()
    make_shard(tmp_path / "data/s.tar", photos[:2])
    monkeypatch.chdir(tmp_path)
    opts = FilterOptions(out_dir="out", detector="nss", threshold=3.0)
    try:
        summary = run_filter(["data/s.tar"], opts, workers=1, engine="ray", quiet=True)
    finally:
        ray.shutdown()
    assert summary["shards_failed"] == [] and summary["samples"] == 4
    assert (tmp_path / "out/kept/s.tar").exists() and (tmp_path / "out/scores/s.parquet").exists()
    # a local Ray instance happens to start its actors in the caller's folder; a cluster's nodes
    # do not, so the actors must have been handed absolute paths
    done = json.loads((tmp_path / "out/.done/s.json").read_text())
    assert Path(done["shard"]) == tmp_path / "data/s.tar"


def test_a_dead_ray_actor_fails_only_its_own_task():
    from cg_testutil import echo_or_die

    from collapseguard.engines.ray import RayEngine
    got = {}
    tasks = ["a", "die", "b", "c"]
    here = str(Path(__file__).parents[1])  # Ray's workers import the test helper from here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here}})
    try:
        RayEngine(workers=2).run(echo_or_die, tasks, "nss", (), None,
                                 lambda i, res, err: got.setdefault(i, (res, err)))
    finally:
        ray.shutdown()
    assert sorted(got) == [0, 1, 2, 3]
    assert got[1][0] is None and "Ray worker failed 2 times" in got[1][1]
    assert [got[i] for i in (0, 2, 3)] == [("a", None), ("b", None), ("c", None)]


def test_an_unreachable_ray_cluster_is_a_one_line_error(tmp_path, photos, monkeypatch):
    from click.testing import CliRunner

    from collapseguard.cli import main
    ray.shutdown()
    make_shard(tmp_path / "s.tar", photos[:1])
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # no cluster is running here
    res = CliRunner().invoke(main, ["filter", str(tmp_path / "s.tar"), "--out", str(tmp_path / "o"),
                                    "-d", "nss", "--threshold", "1", "--engine", "ray", "-q"])
    assert res.exit_code == 1 and "cannot start or reach the Ray cluster at auto" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
