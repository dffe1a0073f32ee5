"""Filter throughput against decode-only throughput, measured side by side in one run.

Makes shards of N JPEG photos (1024x768, from photos bundled with installed packages), then runs,
alternating, (a) read + decode only and (b) ``filter`` end to end, both with the same number of
worker processes, each phase in a fresh subprocess so its peak memory can be read. Prints images/s
of both, their ratio, and the peak resident memory of the parent and of the largest worker.

    python benchmarks/throughput.py --images 200 --workers 2 --detector nss
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


def make_shards(root: Path, n: int, per_shard: int = 50, seed: int = 0) -> list[str]:
    import numpy as np
    from PIL import Image

    from collapseguard.training_data_tools.sources import bundled_photos

    rng = np.random.default_rng(seed)
    photos = [im for _, im in bundled_photos(min_side=256)]
    paths = []
    for s in range(0, n, per_shard):
        p = root / f"bench-{s // per_shard:04d}.tar"
        with tarfile.open(p, "w") as tf:
            for i in range(s, min(n, s + per_shard)):
                src = Image.fromarray(photos[i % len(photos)])
                scale = max(1024 / src.width, 768 / src.height) * rng.uniform(1.0, 1.3)
                big = src.resize((int(src.width * scale) + 1, int(src.height * scale) + 1), Image.BICUBIC)
                x = int(rng.integers(0, big.width - 1024 + 1))
                y = int(rng.integers(0, big.height - 768 + 1))
                buf = io.BytesIO()
                big.crop((x, y, x + 1024, y + 768)).save(buf, "JPEG", quality=90)
                for name, data in ((f"{i:06d}.jpg", buf.getvalue()), (f"{i:06d}.txt", b"caption")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        paths.append(str(p))
    return paths


def decode_task(shard, detector, progress=None) -> int:
    """Engine task for the baseline: read and decode every image, score nothing."""
    from collapseguard.images import decode_image
    from collapseguard.io.tar import ShardReader
    from collapseguard.scoring.records import image_members

    n = 0
    for sample in ShardReader(shard):
        for _, data in image_members([(m.name, m.data) for m in sample.members]):
            decode_image(data)
            n += 1
    return n


def phase(kind: str, shards: list[str], workers: int, detector: str, out: str) -> dict:
    t0 = time.perf_counter()
    if kind == "decode":
        from collapseguard.engines import make_engine
        counts = []
        make_engine("local", workers).run(decode_task, shards, detector, (), None,
                                          lambda i, r, e: counts.append(r if e is None else 0))
        n = sum(counts)
    else:
        from collapseguard.filter.pipeline import FilterOptions
        from collapseguard.filter.run import run_filter
        s = run_filter(shards, FilterOptions(out_dir=out, detector=detector, threshold=1e9),
                       workers=workers, resume=False, quiet=True)
        n = s["samples"]
    secs = time.perf_counter() - t0
    kib = 1024 if sys.platform != "darwin" else 1
    return {"kind": kind, "images": n, "seconds": secs, "images_per_s": n / secs,
            "parent_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib / 2**20,
            "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--detector", default="nss")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--phase", choices=["decode", "filter"], help=argparse.SUPPRESS)
    ap.add_argument("--shards", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase:  # child: one measured phase
        print(json.dumps(phase(a.phase, a.shards, a.workers, a.detector, a.out)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        shards = make_shards(Path(tmp), a.images)
        results: dict[str, list[dict]] = {"decode": [], "filter": []}
        for r in range(a.repeats):
            for kind in ("decode", "filter"):
                cmd = [sys.executable, __file__, "--phase", kind, "--workers", str(a.workers),
                       "--detector", a.detector, "--out", str(Path(tmp) / f"out{r}"), "--shards", *shards]
                res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                results[kind].append(res)
                print(f"  {kind:<7} {res['images']} images in {res['seconds']:.2f}s = "
                      f"{res['images_per_s']:.1f} img/s  (peak: parent {res['parent_peak_mb']:.0f} MB, "
                      f"largest worker {res['worker_peak_mb']:.0f} MB)", flush=True)
        dec = statistics.median(r["images_per_s"] for r in results["decode"])
        fil = statistics.median(r["images_per_s"] for r in results["filter"])
        peak = max(max(r["parent_peak_mb"], r["worker_peak_mb"]) for r in results["filter"])
        print(f"images {a.images} (1024x768 JPEG), workers {a.workers}, detector {a.detector}")
        print(f"decode-only: {dec:.1f} img/s   filter: {fil:.1f} img/s   ratio filter/decode: {fil / dec:.2f}")
        print(f"peak memory of one filter process: {peak:.0f} MB")


if __name__ == "__main__":
    main()
