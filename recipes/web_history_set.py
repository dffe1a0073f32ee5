"""The web-history clean set: the evaluation set's clean sources (Debian packages no training run
or calibration reads, 12 kinds; ``recipes/eval_set.sh``) each given one web history
(``collapseguard.training_data_tools.web_history``: 1-4 JPEG saves at q60-95 4:2:0, resizes with
common filters, upload sharpening, screenshots), stored as PNG and as JPEG q90 4:2:0. Every
picture is clean: a detector should drop no more of them than of the plain sources.

    python recipes/web_history_set.py build EVAL OUT        # EVAL: an eval_set.sh folder
    python recipes/web_history_set.py score OUT [--weights W ...]
    python recipes/web_history_set.py folder SRC OUT [--seed S]   # any folder of clean images

``build`` writes ``OUT/png/<name>.png``, ``OUT/jpeg90/<name>.jpg`` and ``OUT/manifest.csv``
(name, kind, history, plain, png, jpeg90; seed ``SEED``, one history per source, the i-th source
drawing from ``default_rng([SEED, i])``); it skips the files that exist. ``score`` scores the plain
sources and both stored copies with each cnn weights file (default: the packaged weights) and
prints, per kind and overall, the median score and the share above the shipped calibration's
threshold; ``--table FILE`` also writes every score. ``folder`` gives every image under SRC one
web history (the i-th file of the sorted list draws from ``default_rng([S, i])``) and writes it as
``OUT/<same relative path>.png``: a web-history copy of a calibration's clean folder
(``CG_CALIB_WEB=1 recipes/make_default_calibration.sh``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SEED = 20261204


def build(eval_dir: Path, out: Path) -> pd.DataFrame:
    from PIL import Image

    from collapseguard.images import encode_jpeg, load_image
    from collapseguard.training_data_tools.web_history import (
        apply_history,
        draw_history,
        history_label,
    )

    with open(eval_dir / "sources.csv") as f:
        sources = [(r["name"], r["kind"]) for r in csv.DictReader(f)]
    if not sources:
        raise SystemExit(f"{eval_dir}/sources.csv lists no sources")
    (out / "png").mkdir(parents=True, exist_ok=True)
    (out / "jpeg90").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (name, kind) in enumerate(sorted(sources)):
        plain = eval_dir / "sources" / f"{name}.png"
        ops = draw_history(np.random.default_rng([SEED, i]))
        png, jpg = out / "png" / f"{name}.png", out / "jpeg90" / f"{name}.jpg"
        if not (png.exists() and jpg.exists()):
            img = apply_history(load_image(plain), ops)
            Image.fromarray(img).save(png)
            jpg.write_bytes(encode_jpeg(img, 90, subsampling=2))
        rows.append({"name": name, "kind": kind, "history": history_label(ops), "plain": str(plain),
                     "png": str(png), "jpeg90": str(jpg)})
    df = pd.DataFrame(rows)
    df.to_csv(out / "manifest.csv", index=False)
    print(f"{len(df)} pictures, {df['kind'].nunique()} kinds: "
          + ", ".join(f"{k} {v}" for k, v in df["kind"].value_counts().sort_index().items()))
    return df


def folder(src: Path, out: Path, seed: int = SEED) -> int:
    from PIL import Image

    from collapseguard.images import DecodeError, load_image
    from collapseguard.training.negatives import list_images
    from collapseguard.training_data_tools.web_history import (
        apply_history,
        draw_history,
    )

    files = sorted(list_images([src]))
    n = 0
    for i, f in enumerate(files):
        dest = (out / f.relative_to(src)).with_suffix(".png")
        if dest.exists():
            n += 1
            continue
        try:
            img = load_image(f)
        except (OSError, DecodeError):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(apply_history(img, draw_history(np.random.default_rng([seed, i])))).save(dest)
        n += 1
    print(f"{n} web-history copies of {len(files)} files under {out}")
    return n


def score(out: Path, weights: list[str], table: Path | None) -> None:
    from collapseguard.calibration.thresholds import default_calibration
    from collapseguard.detectors.cnn import CNNDetector
    from collapseguard.training.metrics import score_paths

    df = pd.read_csv(out / "manifest.csv")
    tables = []
    for w in weights or [None]:
        det = CNNDetector(weights=w, device="cpu")
        cal = default_calibration("cnn", det.version)
        thr = cal.threshold if cal is not None else float("nan")
        print(f"weights {Path(w).name if w else 'packaged'} (version {det.version}), threshold {thr:.4f}")
        t = df[["name", "kind"]].copy()
        t["weights"] = Path(w).name if w else "packaged"
        for col in ("plain", "png", "jpeg90"):
            t[col] = score_paths(det, df[col].tolist())
        tables.append(t)
        rows = []
        for kind, g in [*t.groupby("kind"), ("all", t)]:
            row = {"kind": kind, "n": len(g)}
            for col in ("plain", "png", "jpeg90"):
                row[f"median {col}"] = round(float(np.median(g[col])), 2)
            for col in ("plain", "png", "jpeg90"):
                row[f"over {col}"] = f"{np.mean(g[col] > thr):.1%}"
            rows.append(row)
        print(pd.DataFrame(rows).set_index("kind").to_string())
    if table is not None:
        pd.concat(tables).to_csv(table, index=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("eval_dir", type=Path)
    b.add_argument("out", type=Path)
    s = sub.add_parser("score")
    s.add_argument("out", type=Path)
    s.add_argument("--weights", nargs="*", default=[])
    s.add_argument("--table", type=Path)
    f = sub.add_parser("folder")
    f.add_argument("src", type=Path)
    f.add_argument("out", type=Path)
    f.add_argument("--seed", type=int, default=SEED)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.eval_dir.resolve(), a.out.resolve())
    elif a.cmd == "folder":
        folder(a.src.resolve(), a.out.resolve(), a.seed)
    else:
        score(a.out.resolve(), a.weights, a.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
