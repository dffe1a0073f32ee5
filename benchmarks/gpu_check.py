"""The `cnn` detector and its training on a CUDA device, against the CPU, in one run.

    python benchmarks/gpu_check.py --out DIR [--device cuda] [--n 96] [--train-iters 300] [--parts ...]

Four parts, each printed and written to DIR/gpu_check.json:

1. agreement: the shipped weights score clean 1024x768 images and chain copies of them (steps 3
   and 10 of every simulated family) on the CPU and on the device; max |difference|, Spearman,
   whether the order is the same, and whether a second device pass repeats the first exactly;
2. scoring speed: images/s of ``CNNDetector.score`` (crop cutting included, decoding not) on the
   device at several batch sizes and on the CPU at 2 threads (this 2-core project machine) and at
   every core of the machine it runs on, in the same run; plus the network alone on crops already
   on the device (crops/s), which is where a GPU helps;
3. training speed: iterations/s of ``train_net`` with the shipped recipe (width 16, 48 px crops,
   12 chains x 3 steps + 12 clean images x 6 crops per batch) on the CPU (2 threads) and on the
   device in fp32 and bf16, and with a 4x larger batch on the device; the same seed gives the same
   batches, so the first logged losses must agree;
4. end to end: ``collapseguard train --device DEVICE`` on the same chains writes weights that the
   ``cnn`` detector loads, and its held-out AUROC (a smoke figure: few iterations, tiny data).

Chains are made here from the bundled photos and procedural art (nothing is downloaded). On a
machine without CUDA, ``--device cpu`` runs every part against the CPU itself (to test the script).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from detector_speed import (
    test_images,  # the same 1024x768 images as the CPU speed benchmark
)
from PIL import Image


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def chain_copies(images: list[np.ndarray], steps=(3, 10)) -> list[np.ndarray]:
    """Steps ``steps`` of one chain per (image, family), every simulated family but the learned one."""
    from collapseguard.training_data_tools.chains import run_chain
    from collapseguard.training_data_tools.replicators import list_families

    fams = [f for f in list_families() if f != "learned"]
    out = []
    for i, im in enumerate(images):
        fam = fams[i % len(fams)]
        _, kept = run_chain(im, fam, max(steps), steps, seed=i)
        out += [x for _, x, _ in kept]
    return out


def agreement(device: torch.device, images: list[np.ndarray]) -> dict:
    from scipy.stats import spearmanr

    from collapseguard.detectors import create

    torch.set_num_threads(os.cpu_count() or 2)
    cpu = create("cnn", device="cpu").score(images)
    det = create("cnn", device=str(device))
    a, b = det.score(images), det.score(images)
    # the same network on the same crops with cuDNN's TF32 convolutions allowed (torch's default,
    # which CNNDetector.score turns off)
    from collapseguard.detectors.cnn import image_crops

    crops = np.stack([image_crops(im, det.net.config.crop_size, det.n_crops) for im in images])
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        with torch.inference_mode():
            tf32 = np.concatenate([det.net(torch.from_numpy(crops[i: i + 32]).to(device)).float().cpu().numpy()
                                   for i in range(0, len(crops), 32)])
    finally:
        torch.backends.cudnn.allow_tf32 = before
    return {
        "n_images": len(images),
        "max_abs_diff": float(np.abs(a - cpu).max()),
        "max_abs_diff_tf32_allowed": float(np.abs(tf32 - cpu).max()),
        "score_spread_std": float(cpu.std()),
        "spearman": float(spearmanr(a, cpu).statistic),
        "same_order": bool((np.argsort(a) == np.argsort(cpu)).all()),
        "repeat_identical": bool(np.array_equal(a, b)),
    }


def rate(fn, n_items: int, device: torch.device, repeats: int = 3) -> float:
    """Items/s: the best of ``repeats`` timed calls after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return n_items / best


def scoring_speed(device: torch.device, images: list[np.ndarray], batches=(8, 32, 128)) -> dict:
    from collapseguard.detectors import create
    from collapseguard.detectors.cnn import image_crops

    res = {"images": f"{len(images)} x 1024x768"}
    cpu_det = create("cnn", device="cpu")
    for threads in sorted({2, os.cpu_count() or 2}):
        torch.set_num_threads(threads)
        cpu_det.batch_size = 32
        res[f"cpu_{threads}threads_images_per_s"] = rate(lambda: cpu_det.score(images), len(images),
                                                         torch.device("cpu"), repeats=2)
    torch.set_num_threads(os.cpu_count() or 2)
    det = create("cnn", device=str(device))
    for b in batches:
        det.batch_size = b
        res[f"device_batch{b}_images_per_s"] = rate(lambda: det.score(images), len(images), device)
    # the network alone: crops already cut and on the device
    size, k = det.net.config.crop_size, det.n_crops
    res["crops_per_image"] = k
    crops = np.stack([image_crops(im, size, k) for im in images[:32]])
    res["crop_cut_images_per_s"] = rate(lambda: [image_crops(im, size, k) for im in images[:32]], 32,
                                        torch.device("cpu"))
    for b in (32, 256, 1024):
        x = torch.from_numpy(crops[np.arange(b) % len(crops)]).to(device)
        with torch.inference_mode():
            res[f"net_only_batch{b}_crops_per_s"] = rate(lambda: det.net(x), b * k, device)
    return res


def make_clean(root: Path) -> Path:
    """Clean negatives for training: procedural art not used by the chains, as PNG files."""
    from collapseguard.training_data_tools import sources

    root.mkdir(parents=True, exist_ok=True)
    for name, a in sources.procedural_art(16, seed=11, max_side=640):
        Image.fromarray(a).save(root / f"{name.replace('/', '_')}.png")
    return root


def make_chains(root: Path) -> Path:
    from collapseguard.training_data_tools import sources
    from collapseguard.training_data_tools.chains import make_chains as make
    from collapseguard.training_data_tools.replicators import list_families

    srcs = sources.bundled_photos() + sources.procedural_art(12, seed=7, max_side=512)
    srcs = [(n, np.asarray(Image.fromarray(a).resize((min(512, a.shape[1]), min(384, a.shape[0]))))) for n, a in srcs]
    fams = [f for f in list_families() if f != "learned"]
    make(srcs, families=fams, steps=10, keep=(0, 1, 3, 5, 10), out_dir=root, seed=0,
         workers=min(8, os.cpu_count() or 2), progress=False)
    return root


def training_speed(device: torch.device, chains: Path, clean_dir: Path, iters: int) -> dict:
    from collapseguard.training.loop import TrainConfig, train_net
    from collapseguard.training.run import build_banks, load_chains, split_chains

    train_df, _ = split_chains(load_chains([chains], ()))
    base = TrainConfig(iterations=iters, log_every=max(1, iters // 3))
    bank, clean = build_banks(train_df, sorted(clean_dir.glob("*.png")), base, 48, 4, log=lambda s: None)
    runs = {"cpu_fp32_2threads": dict(device="cpu", threads=2),
            "device_fp32": dict(device=str(device)),
            "device_bf16": dict(device=str(device), precision="bf16"),
            "device_fp32_batch4x": dict(device=str(device), chains_per_batch=48, clean_per_batch=48)}
    res = {"iterations": iters}
    for name, kw in runs.items():
        cfg = TrainConfig(iterations=iters, log_every=max(1, iters // 3), **kw)
        _, hist = train_net(bank, clean, cfg, log=lambda s: None)
        # timed from the first log on: the first block holds one-off start-up (kernel choice, caches)
        rate_ = (hist[-1]["iteration"] - hist[0]["iteration"]) / max(1e-9, hist[-1]["seconds"] - hist[0]["seconds"])
        res[name] = {"iterations_per_s": rate_, "first_block_seconds": hist[0]["seconds"],
                     "first_loss": hist[0]["loss"], "last_loss": hist[-1]["loss"]}
    return res


def end_to_end(device: torch.device, chains: Path, clean_dir: Path, work: Path) -> dict:
    out = work / "e2e" / "cnn.safetensors"
    cmd = [sys.executable, "-m", "collapseguard.cli", "train", "--chains", str(chains), "--clean", str(clean_dir),
           "--out", str(out),
           "--steps", "400", "--device", str(device), "--threads", "2"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    res = {"command": " ".join(cmd[2:]), "returncode": proc.returncode, "seconds": time.perf_counter() - t}
    if proc.returncode != 0:
        res["stderr_tail"] = proc.stderr[-2000:]
        return res
    summary = json.loads(out.with_suffix(".json").read_text())
    from collapseguard.detectors import create

    det = create("cnn", weights=str(out), device=str(device))
    res.update(version=summary["version"], loads_as=det.version, trained_on=summary["config"]["device"],
               first_loss=summary["first_loss"], final_loss=summary["final_loss"],
               heldout_auroc=summary["heldout_auroc"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=96, help="1024x768 images for the scoring speed")
    ap.add_argument("--train-iters", type=int, default=300)
    ap.add_argument("--parts", default="agreement,scoring,training,end_to_end",
                    help="comma-separated parts to run (default: all four)")
    args = ap.parse_args()
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"torch": torch.__version__, "cpu_count": os.cpu_count(), "device": str(device)}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)

    def part(name, fn):
        t = time.perf_counter()
        report[name] = fn()
        report[name]["part_seconds"] = round(time.perf_counter() - t, 1)
        print(name, json.dumps(report[name], indent=1, default=float), flush=True)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=float))

    parts = set(args.parts.split(","))
    if "agreement" in parts:
        clean = test_images(24)
        part("agreement", lambda: agreement(device, clean + chain_copies(clean)))
    if "scoring" in parts:
        part("scoring_speed", lambda: scoring_speed(device, test_images(args.n)))
    if not parts & {"training", "end_to_end"}:
        return
    with tempfile.TemporaryDirectory() as tmp:
        chains, clean_dir = make_chains(Path(tmp) / "chains"), make_clean(Path(tmp) / "clean")
        if "training" in parts:
            part("training_speed", lambda: training_speed(device, chains, clean_dir, args.train_iters))
        if "end_to_end" in parts:
            part("end_to_end", lambda: end_to_end(device, chains, clean_dir, Path(tmp)))


if __name__ == "__main__":
    main()
