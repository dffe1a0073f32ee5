"""benchmarks/throughput.py makes the shards it says it makes, and its floor decodes them all."""

from __future__ import annotations

import tarfile


def test_shards_are_1024x768_jpeg_q92_420_and_reused(tmp_path, benchmark_script):
    from collapseguard.images import decode_image, storage_label

    bench = benchmark_script("throughput.py")
    shards = bench.make_shards(tmp_path, 60)
    assert [p.name for p in shards] == ["bench-0000.tar", "bench-0001.tar"]
    with tarfile.open(shards[1]) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf]
    jpgs = [d for n, d in members if n.endswith(".jpg")]
    assert len(jpgs) == 10 and len(members) == 20
    assert {storage_label(d) for d in jpgs} == {"jpeg q92 4:2:0"}
    assert {decode_image(d).shape for d in jpgs} == {(768, 1024, 3)}
    assert sum(bench.floor_task(str(p)) for p in shards) == 60
    before = [p.stat().st_mtime_ns for p in shards]
    assert bench.make_shards(tmp_path, 60) == shards  # the same request reuses the folder
    assert [p.stat().st_mtime_ns for p in shards] == before


def test_the_filter_phase_runs_the_weights_and_threshold_given(tmp_path, benchmark_script):
    from importlib import resources

    bench = benchmark_script("throughput.py")
    shards = [str(p) for p in bench.make_shards(tmp_path / "data", 50)]
    weights = str(resources.files("collapseguard") / "weights" / "cnn.safetensors")
    high = bench.filter_phase(shards, 1, "onnx", str(tmp_path / "a"), weights, 100.0)
    low = bench.filter_phase(shards, 1, "onnx", str(tmp_path / "b"), weights, -100.0)
    assert (high["images"], high["kept"], high["rejected"]) == (50, 50, 0)
    assert (low["kept"], low["rejected"]) == (0, 50)
