"""Make simulated replication chains: run replicators for N steps, keep selected steps.

``make_chains(sources, families, ...)`` makes one chain per (source, family, repeat): it creates a
replicator seeded from ``(seed, source name, family, repeat)`` (so a chain does not depend on
which other chains are made, or in which order, or by how many workers), runs it for ``steps``
steps, writes the kept steps as PNG under ``out_dir/<family>/<chain_id>/step_XXX.png`` and returns
the manifest (also written to ``out_dir/manifest.csv``). Each finished chain's folder holds a
record (``.chain.json``, written last) of what it was made from and its files' SHA-256: a run
into the same ``out_dir`` after an interrupted one reuses every chain whose record matches its
settings, source pixels and the chain-making code, and makes the rest, to the same files.

Manifest columns: ``chain_id, source_image, family, task, step, path`` plus ``repeat, generator,
width, height, seed, params`` (the replicator's drawn parameters as JSON) and, where a replicator
records state, one column per state key (``content_scale_x``, ``content_scale_y``,
``content_aspect_drift`` for aspect drift).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from collapseguard.engines.local import set_thread_budget, spawn_context
from collapseguard.training_data_tools.manifest import MANIFEST_NAME, write_manifest
from collapseguard.training_data_tools.replicators import (
    create_replicator,
    list_families,
    missing_families,
    needs_text,
)
from collapseguard.training_data_tools.replicators.base import ReplicatorError

DEFAULT_KEEP = (0, 1, 2, 3, 5, 10, 20, 30, 50, 100)
#: task name written for simulated chains (real chains carry the study's task names)
SIMULATED_TASK = "replicate"


def chain_seed(seed: int, source_name: str, family: str, repeat: int) -> np.random.SeedSequence:
    """The seed sequence of one chain: depends only on these four values."""
    h = hashlib.sha256(f"{seed}\0{source_name}\0{family}\0{repeat}".encode()).digest()
    return np.random.SeedSequence([int.from_bytes(h[i:i + 4], "little") for i in range(0, 16, 4)])


def chain_id_for(source_name: str, family: str, repeat: int) -> str:
    """A readable, file-system-safe, unique chain id."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", source_name).strip("-")[:48] or "src"
    h = hashlib.sha256(f"{source_name}\0{family}\0{repeat}".encode()).hexdigest()[:8]
    return f"{family}-{slug}-r{repeat}-{h}"


def run_chain(image: np.ndarray, family: str, steps: int, keep: Sequence[int],
              seed: np.random.SeedSequence | int) -> tuple[dict, list[tuple[int, np.ndarray, dict]]]:
    """Run one chain in memory. Returns (params, [(step, image, state) for kept steps])."""
    rng = np.random.default_rng(seed)
    rep = create_replicator(family, rng)
    keep = {int(k) for k in keep}
    out = [(0, image, {})] if 0 in keep else []
    x = image
    for k in range(1, steps + 1):
        x = rep.step(x, rng)
        if k in keep:
            out.append((k, x, dict(rep.state)))
    return rep.params, out


def _save_png(arr: np.ndarray, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    Image.fromarray(arr).save(tmp, format="PNG", compress_level=3)
    os.replace(tmp, path)


def _chain_job(job: dict) -> list[dict]:
    """Worker: make one chain and write its PNGs; returns its manifest rows. torch runs one
    thread a chain while it makes it (in a worker process or, with one worker, in the caller,
    whose thread count is given back afterwards)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return _chain_rows(job)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _chain_rows(job)
    finally:
        torch.set_num_threads(threads)


#: a chain folder's record of its finished chain (written last): what a rerun reuses
DONE_NAME = ".chain.json"


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """SHA-256 of the chain-making code (this module and the replicators): a chain made by other
    code is made again, not reused."""
    here = Path(__file__).resolve()
    files = [here, *sorted((here.parent / "replicators").glob("*.py"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _identity(job: dict) -> dict:
    """What a finished chain was made from: its settings, its source's pixels and the code."""
    image = np.ascontiguousarray(job["image"])
    return {"chain_id": job["chain_id"], "family": job["family"], "steps": job["steps"],
            "keep": list(job["keep"]), "seed": job["seed"], "repeat": job["repeat"],
            "source_image": job["source_image"],
            "source_sha256": hashlib.sha256(repr(image.shape).encode() + image.tobytes()).hexdigest(),
            "code": _code_digest()}


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _finished_rows(identity: dict, folder: Path) -> list[dict] | None:
    """The rows of a chain an earlier run finished in ``folder`` (its record names ``identity``
    and every kept file is there with its recorded bytes); else None."""
    try:
        done = json.loads((folder / DONE_NAME).read_text())
        if done.get("identity") != identity:
            return None
        rows = []
        for row, sha in zip(done["rows"], done["sha256"], strict=True):
            path = folder / row["path"]  # the file's name: rows keep their columns' order
            if row["path"] != path.name or _file_sha256(path) != sha:
                return None
            rows.append({**row, "path": str(path)})
        return rows
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _chain_rows(job: dict) -> list[dict]:
    folder = Path(job["out_dir"]) / job["family"] / job["chain_id"]
    identity = _identity(job)
    reused = _finished_rows(identity, folder)
    if reused is not None:  # a rerun after an interrupted one: this chain was finished then
        return reused
    params, kept = run_chain(job["image"], job["family"], job["steps"], job["keep"], job["seed_seq"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / DONE_NAME).unlink(missing_ok=True)
    rows = []
    h, w = job["image"].shape[:2]
    for step, img, state in kept:
        path = folder / f"step_{step:03d}.png"
        _save_png(img, path)
        rows.append({"chain_id": job["chain_id"], "source_image": job["source_image"],
                     "family": job["family"], "task": SIMULATED_TASK, "step": step,
                     "path": str(path), "repeat": job["repeat"],
                     "generator": f"simulated:{job['family']}", "width": w, "height": h,
                     "seed": job["seed"], "params": json.dumps(params, sort_keys=True), **state})
    record = {"identity": identity, "rows": [{**r, "path": Path(r["path"]).name} for r in rows],
              "sha256": [_file_sha256(Path(r["path"])) for r in rows]}
    tmp = folder / (DONE_NAME + ".tmp")
    tmp.write_text(json.dumps(record, default=float))
    os.replace(tmp, folder / DONE_NAME)
    return rows


def check_families(families: Sequence[str] | None) -> list[str]:
    """The families to run (every default one for None or empty); ReplicatorError naming the
    unknown ones."""
    families = list(families) if families else list_families()
    known = list_families(opt_in=True)
    absent = missing_families(opt_in=True)
    unusable = [f for f in families if f in absent]
    if unusable:
        raise ReplicatorError("; ".join(f"family {f} {needs_text(absent[f])}" for f in unusable))
    bad = [f for f in families if f not in known]
    if bad:
        raise ReplicatorError(f"unknown famil{'y' if len(bad) == 1 else 'ies'} {bad}; known: {known}")
    twice = sorted({f for f in families if families.count(f) > 1})
    if twice:  # the same chains twice would write the same files and ids
        raise ReplicatorError(f"famil{'y' if len(twice) == 1 else 'ies'} {twice} named more than once "
                              "(--repeats makes more chains of one family)")
    return families


def make_chains(sources: Iterable[tuple[str, np.ndarray]], families: Sequence[str] | None = None,
                steps: int = 100, keep: Sequence[int] = DEFAULT_KEEP, out_dir: str | Path = "chains",
                seed: int = 0, workers: int = 2, progress: bool = True, repeats: int = 1,
                manifest_name: str = MANIFEST_NAME, skipped: list[str] | None = None) -> pd.DataFrame:
    """Make one chain per (source, family, repeat), write PNGs + manifest, return the manifest.

    ``keep`` steps above ``steps`` are dropped; step 0 (the source itself) is always kept.
    ``workers`` > 1 runs chains in that many processes. Raises ValueError for unknown families,
    an empty source, or bad step settings, and for a source under 16 pixels a side unless
    ``skipped`` is a list: then such a source is left out and named there.
    """
    families = check_families(families)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    keep = sorted({0} | {int(k) for k in keep if 0 <= int(k) <= steps})
    if steps > 0 and keep == [0]:  # every step computed and thrown away: chains of one image
        raise ValueError(f"no kept step between 1 and --steps {steps}: keep at least one (e.g. --keep {steps})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs, seen = [], set()
    for name, image in sources:
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"source {name!r}: expected (H, W, 3) uint8, got {image.dtype} {image.shape}")
        if min(image.shape[:2]) < 16:  # what every replicator refuses: say so now, and which source
            why = (f"{image.shape[1]}x{image.shape[0]} is too small for a replicator (16 pixels a "
                   "side at least)")
            if skipped is None:
                raise ValueError(f"source {name!r}: {why}")
            skipped.append(f"{name}: {why}")  # an icon in a folder of photos: left out, named
            continue
        if name in seen:
            raise ValueError(f"duplicate source name {name!r}")
        seen.add(name)
        for fam in families:
            for r in range(repeats):
                jobs.append({"image": image, "family": fam, "steps": steps, "keep": keep,
                             "seed_seq": chain_seed(seed, name, fam, r), "seed": seed,
                             "chain_id": chain_id_for(name, fam, r), "source_image": name,
                             "repeat": r, "out_dir": str(out_dir)})
    if not jobs:
        raise ValueError("the sources gave no picture (an empty folder, or every image left out): "
                         "nothing to make")
    bar = None
    if progress:  # on a terminal only, as every command's bars: a log gets no bar lines
        from collapseguard.scoring.progress import progress_bar
        bar = progress_bar(len(jobs), desc="chains", unit="chain")
    rows: list[dict] = []
    if workers <= 1:
        for job in jobs:
            rows += _chain_job(job)
            if bar is not None:
                bar.update(1)
    else:
        # spawn (see spawn_context); each worker gets an even share of the cores so torch-based
        # replicators don't oversubscribe
        threads = max(1, (os.cpu_count() or 1) // workers)
        with ProcessPoolExecutor(max_workers=workers, mp_context=spawn_context(),
                                 initializer=set_thread_budget, initargs=(threads,)) as ex:
            futs = [ex.submit(_chain_job, job) for job in jobs]
            for f in as_completed(futs):
                rows += f.result()
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    df = pd.DataFrame(rows).sort_values(["chain_id", "step"], kind="stable").reset_index(drop=True)
    write_manifest(df, out_dir / manifest_name)
    return df
