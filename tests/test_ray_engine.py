"""The Ray engine gives the same outputs as the local engine (local Ray instance, 2 CPUs)."""

from __future__ import annotations

import json

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
