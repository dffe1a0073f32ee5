"""benchmarks/dedup_scale.py --throughput: the default shards are distinct pictures, so the share
of images ``dedup`` groups is the share of copies the benchmark adds (the figure its ratio is
stated at)."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pyarrow.parquet as pq
from PIL import Image


def _grouped(run_dedup, shards, out) -> float:
    run_dedup([str(s) for s in shards], out, quiet=True, workers=1)
    groups = pq.read_table(out / "groups.parquet").column("group").to_pylist()
    return sum(g != "" for g in groups) / len(groups)


def test_distinct_base_groups_only_the_added_copies(benchmark_script, tmp_path):
    from collapseguard.dedup.run import run_dedup

    mod = benchmark_script("dedup_scale.py")
    shards = mod.distinct_shards(tmp_path / "distinct", 24)
    sizes, digests = set(), set()
    for s in shards:
        with tarfile.open(s) as tf:
            for m in tf:
                if m.name.endswith(".jpg"):
                    data = tf.extractfile(m).read()
                    sizes.add(Image.open(io.BytesIO(data)).size)
                    digests.add(hash(data))
    assert sizes == {(1024, 768)} and len(digests) == 24
    assert _grouped(run_dedup, shards, tmp_path / "alone") == 0.0
    with_copies = mod.with_copies([str(s) for s in shards], tmp_path / "copies", 0.25)
    share = _grouped(run_dedup, with_copies, tmp_path / "copied")
    assert np.isclose(share, 6 / 27)  # 3 copies, each grouped with its original

