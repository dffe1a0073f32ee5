"""Filter throughput against the floor, plain decoding of the same shards, side by side in one run.

    python benchmarks/throughput.py --data FOLDER [--images 1000] [--workers 2] [--rounds 2]

Writes (once; reused when FOLDER already holds them) ``--images`` JPEGs of 1024x768, quality 92,
4:2:0, made from the photos bundled with scikit-image and scikit-learn (random scale, window and
flip), in shards of 50 samples (.jpg + .txt). Then, in alternating rounds, each run in a fresh
subprocess so its peak memory can be read:

- ``floor``: a multiprocessing Pool of ``--workers`` processes, one shard per task, each image
  opened with PIL and decoded (``Image.open(...).convert("RGB")``): the fastest plain way to read
  the same bytes;
- ``filter RUNTIME``: ``collapseguard filter --workers N --runtime RUNTIME`` with the shipped
  default detector and threshold, into a fresh folder, for each of ``--runtimes`` (default auto;
  ``--runtimes auto,torch`` adds the torch runtime, several times slower). With ``--weights W``
  the detector is ``cnn:W`` at ``--threshold`` (default: the shipped cnn's calibrated threshold),
  for judging a candidate's speed before it has a calibration of its own.

Prints images/s of each (median over rounds), the ratio to the floor, the start-up (the same
command on one shard of two images) separately, the ratio with the start-up taken out, the peak
resident memory (VmHWM, ``getrusage``) of the largest worker process, and a per-stage profile of
the filter's work per image, timed in this process on one thread (tar read, decode, crop, score,
write; IPC is what the run's wall time holds beyond the workers' own shard time).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PER_SHARD = 50
SIZE = (1024, 768)


def make_shards(root: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` 1024x768 JPEG q92 4:2:0 photos in shards of PER_SHARD under ``root`` (reused when
    ``root/manifest.json`` says they are there)."""
    manifest = root / "manifest.json"
    want = {"images": n, "size": list(SIZE), "quality": 92, "subsampling": "4:2:0", "seed": seed,
            "per_shard": PER_SHARD}
    paths = [root / f"bench-{i:04d}.tar" for i in range((n + PER_SHARD - 1) // PER_SHARD)]
    if manifest.exists() and json.loads(manifest.read_text()) == want and all(p.exists() for p in paths):
        return paths
    import numpy as np
    from PIL import Image

    from collapseguard.training_data_tools.sources import bundled_photos

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(im) for _, im in bundled_photos(min_side=256)]
    w, h = SIZE
    for s, p in enumerate(paths):
        with tarfile.open(p, "w") as tf:
            for i in range(s * PER_SHARD, min(n, (s + 1) * PER_SHARD)):
                src = photos[i % len(photos)]
                scale = max(w / src.width, h / src.height) * rng.uniform(1.0, 1.4)
                big = src.resize((int(src.width * scale) + 1, int(src.height * scale) + 1), Image.BICUBIC)
                x = int(rng.integers(0, big.width - w + 1))
                y = int(rng.integers(0, big.height - h + 1))
                im = big.crop((x, y, x + w, y + h))
                if rng.random() < 0.5:
                    im = im.transpose(Image.FLIP_LEFT_RIGHT)
                buf = io.BytesIO()
                im.save(buf, "JPEG", quality=92, subsampling=2)
                for name, data in ((f"{i:06d}.jpg", buf.getvalue()), (f"{i:06d}.txt", b"a caption")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    manifest.write_text(json.dumps(want))
    return paths


def _peak_mb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def load_line() -> str:
    """The machine's load average, printed beside a measurement: other work on the cores moves
    absolute figures (and, less, ratios measured side by side)."""
    one, five, fifteen = os.getloadavg()
    return f"load average (1, 5, 15 min): {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def floor_task(shard: str) -> int:
    """Decode every image of a shard with PIL (a floor worker's task)."""
    from PIL import Image

    n = 0
    with tarfile.open(shard) as tf:
        for m in tf:
            if m.name.endswith(".jpg"):
                Image.open(io.BytesIO(tf.extractfile(m).read())).convert("RGB")
                n += 1
    return n


def floor_phase(shards: list[str], workers: int) -> dict:
    import multiprocessing as mp

    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        n = sum(pool.imap_unordered(floor_task, shards))
    secs = time.perf_counter() - t0
    return {"images": n, "seconds": secs, "worker_peak_mb": _peak_mb(resource.RUSAGE_CHILDREN),
            "parent_peak_mb": _peak_mb(resource.RUSAGE_SELF)}


def filter_phase(shards: list[str], workers: int, runtime: str, out: str,
                 weights: str | None = None, threshold: float | None = None) -> dict:
    from click.testing import CliRunner

    from collapseguard.cli import main

    detector = ["--detector", f"cnn:{weights}", "--threshold", repr(threshold)] if weights else []
    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["filter", *shards, "--out", out, "--workers", str(workers),
                                    "--runtime", runtime, "--overwrite", "--quiet", *detector],
                             catch_exceptions=False)
    secs = time.perf_counter() - t0
    if res.exit_code != 0:
        raise SystemExit(f"filter failed ({res.exit_code}): {res.output}")
    summary = json.loads((Path(out) / "summary.json").read_text())
    busy = sum(r.get("seconds", 0.0) for r in summary.get("per_shard", []))
    return {"images": summary["samples"], "seconds": secs, "shard_seconds": busy,
            "worker_peak_mb": _peak_mb(resource.RUSAGE_CHILDREN),
            "parent_peak_mb": _peak_mb(resource.RUSAGE_SELF), "kept": summary.get("kept"),
            "rejected": summary.get("rejected")}


def _child(args: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def stage_profile(shards: list[Path], runtime: str, n_images: int,
                  weights: str | None = None) -> dict[str, float]:
    """Seconds per image of each stage of the filter's work, in this process on one thread."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from collapseguard.detectors import create
    from collapseguard.detectors.crops import image_crops
    from collapseguard.images import decode_with_storage
    from collapseguard.io.shard_writer import ShardWriter
    from collapseguard.io.tar import ShardReader

    os.environ["OMP_NUM_THREADS"] = "1"
    det = create("cnn", device="cpu", runtime=runtime, **({"weights": weights} if weights else {}))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    t = {}
    t0 = time.perf_counter()
    samples, blobs = [], []
    for s in shards:
        for sample in ShardReader(str(s)):
            samples.append(sample)
            blobs += [m.data for m in sample.members if m.name.endswith(".jpg")]
            if len(blobs) >= n_images:
                break
        if len(blobs) >= n_images:
            break
    t["tar read"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    images = [decode_with_storage(b)[0] for b in blobs]
    t["decode"] = time.perf_counter() - t0
    size = getattr(det, "crop_size", None) or det.net.config.crop_size
    t0 = time.perf_counter()
    for im in images:
        image_crops(im, size, det.n_crops, det.mirror)
    t["crop"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scores = det.score(images)
    t["score"] = max(0.0, time.perf_counter() - t0 - t["crop"])  # det.score crops again
    tmp = Path(shards[0]).parent / ".profile-out"
    tmp.mkdir(exist_ok=True)
    # pyarrow's first parquet write loads its writer (~0.5 s, once per worker process): not per image
    pq.write_table(pa.table({"score": pa.array([0.0])}), tmp / "warm.parquet")
    t0 = time.perf_counter()
    w = ShardWriter(str(tmp / "out.tar"))
    for x in samples:
        w.write(x)
    w.close()
    pq.write_table(pa.table({"score": pa.array(np.asarray(scores, np.float64))}), tmp / "s.parquet")
    t["write"] = time.perf_counter() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    return {k: v / len(images) for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder for the generated shards (kept for reuse); required")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runtimes", default="auto",
                    help="filter --runtime values to time, comma-separated (auto, torch, onnx); "
                         "RUNTIME@N runs it with N worker processes instead of --workers (auto@1: "
                         "one process whose onnxruntime uses every core, threads against processes)")
    ap.add_argument("--profile-images", type=int, default=100)
    ap.add_argument("--weights", default=None, help="cnn weights to filter with (default: the shipped detector)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="with --weights: the threshold (default: the shipped cnn's calibrated one)")
    ap.add_argument("--phase", choices=["floor", "filter", "profile"], help=argparse.SUPPRESS)
    ap.add_argument("--runtime", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--shards", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase == "floor":
        print(json.dumps(floor_phase(a.shards, a.workers)))
        return
    if a.weights and a.threshold is None:
        from collapseguard.calibration.thresholds import resolve_threshold
        from collapseguard.detectors import create

        a.threshold = resolve_threshold(create("cnn"))[0]
    if a.phase == "filter":
        print(json.dumps(filter_phase(a.shards, a.workers, a.runtime, a.out, a.weights, a.threshold)))
        return
    if a.phase == "profile":
        print(json.dumps(stage_profile([Path(s) for s in a.shards], a.runtime, a.profile_images,
                                       a.weights)))
        return

    if not a.data:
        ap.error("--data FOLDER is required (the generated shards are written there)")
    data = Path(a.data)
    if a.images < PER_SHARD:
        raise SystemExit(f"--images must be at least {PER_SHARD}")
    shards = [str(p) for p in make_shards(data, a.images)]
    print(f"at the start: {load_line()}", flush=True)
    runtimes = [r.strip() for r in a.runtimes.split(",") if r.strip()]
    chosen = ["--weights", str(Path(a.weights).resolve()), "--threshold", repr(a.threshold)] if a.weights else []

    def split(entry: str) -> tuple[str, str]:
        rt, _, w = entry.partition("@")
        return rt, w or str(a.workers)

    outs = data / "filter-out"
    # start-up: one shard of two images, for each runtime (the export cache warmed first)
    tiny = data / "startup" / "tiny-0000.tar"
    tiny.parent.mkdir(exist_ok=True)
    with tarfile.open(shards[0]) as src, tarfile.open(tiny, "w") as dst:
        for m in list(src)[:4]:
            dst.addfile(m, src.extractfile(m))
    startup = {}
    for entry in runtimes:
        rt, w = split(entry)
        _child(["--phase", "filter", "--runtime", rt, "--workers", w, "--out",
                str(outs / f"startup-{entry}"), *chosen, "--shards", str(tiny)])  # warms the export cache
        startup[entry] = _child(["--phase", "filter", "--runtime", rt, "--workers", w, "--out",
                                 str(outs / f"startup-{entry}"), *chosen, "--shards", str(tiny)])["seconds"]
    res: dict[str, list[dict]] = {k: [] for k in ["floor", *runtimes]}
    for r in range(a.rounds):
        for kind in res:
            if kind == "floor":
                out = _child(["--phase", "floor", "--workers", str(a.workers), "--shards", *shards])
            else:
                rt, w = split(kind)
                out = _child(["--phase", "filter", "--runtime", rt, "--workers", w, "--out",
                              str(outs / f"{kind}-{r}"), *chosen, "--shards", *shards])
            res[kind].append(out)
            print(f"  round {r + 1} {kind:<6} {out['images']} images {out['seconds']:6.2f} s "
                  f"{out['images'] / out['seconds']:6.1f} img/s  worker peak {out['worker_peak_mb']:.0f} MB",
                  flush=True)
    profile = {rt: _child(["--phase", "profile", "--runtime", rt, "--profile-images",
                           str(a.profile_images), *chosen, "--shards", *shards])
               for rt in dict.fromkeys(split(e)[0] for e in runtimes)}
    shutil.rmtree(outs, ignore_errors=True)
    print(f"at the end: {load_line()}", flush=True)

    def rate(kind):
        return statistics.median(x["images"] / x["seconds"] for x in res[kind])

    floor = rate("floor")
    print(f"\n{a.images} images 1024x768 JPEG q92 4:2:0, floor on {a.workers} processes, median of "
          f"{a.rounds} alternating rounds; detector: "
          + (f"cnn:{a.weights} at threshold {a.threshold:.4f}" if a.weights
             else "the shipped default (cnn), default threshold"))
    print(f"{'':<16}{'img/s':>8}{'x floor':>9}{'start-up s':>12}{'x floor w/o start-up':>22}"
          f"{'worker peak MB':>16}")
    print(f"{'floor (PIL)':<16}{floor:8.1f}{1.0:9.2f}{'':>12}{'':>22}"
          f"{max(x['worker_peak_mb'] for x in res['floor']):16.0f}")
    for rt in runtimes:
        fr = rate(rt)
        secs = statistics.median(x["seconds"] for x in res[rt])
        steady = a.images / max(1e-9, secs - startup[rt])
        # one worker runs in the filter's own process: its peak is that process's
        key = "parent_peak_mb" if split(rt)[1] == "1" else "worker_peak_mb"
        print(f"{'filter ' + rt:<16}{fr:8.1f}{fr / floor:9.2f}{startup[rt]:12.2f}"
              f"{steady / floor:22.2f}{max(x[key] for x in res[rt]):16.0f}")
    print("\nper-stage profile, ms per image (one process, one thread; the filter's workers each "
          "run this on their own shards)")
    stages = ["tar read", "decode", "crop", "score", "write"]
    print(f"{'':<16}" + "".join(f"{s:>10}" for s in stages) + f"{'IPC':>10}")
    for rt in runtimes:
        p = profile[split(rt)[0]]
        workers = int(split(rt)[1])
        ipc = [(x["seconds"] - startup[rt] - x["shard_seconds"] / workers) / x["images"]
               for x in res[rt] if x.get("shard_seconds") is not None]
        ipc_txt = f"{max(0.0, statistics.median(ipc)) * 1e3:10.2f}" if ipc else f"{'n/a':>10}"
        print(f"{'filter ' + rt:<16}" + "".join(f"{p[s] * 1e3:10.2f}" for s in stages) + ipc_txt)


if __name__ == "__main__":
    main()
