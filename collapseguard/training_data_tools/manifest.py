"""The chain manifest: one row per image of a replication chain.

Required columns: ``chain_id, source_image, family, task, step, path``. Optional columns (for
example ``repeat``, ``generator``, ``width``, ``height``) pass through. ``step`` 0 is the original.
``path`` is stored relative to the manifest's folder when it lies under it, so a chain folder can
be moved as a whole. Splits are always made by ``source_image`` (see ``split_by_source``), never by
row, so no source image leaks across a split.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.errors import CollapseguardError

REQUIRED_COLUMNS = ("chain_id", "source_image", "family", "task", "step", "path")
#: default file name of a manifest inside a chains folder
MANIFEST_NAME = "manifest.csv"
#: the file names a chains folder's manifest is read from, in this order
MANIFEST_NAMES = (MANIFEST_NAME, "manifest.parquet")
#: the largest step a manifest may hold (larger numbers do not survive float/int64 conversion)
MAX_STEP = 2**53


class ManifestError(CollapseguardError, ValueError):
    """A manifest is malformed; the message says what is wrong and where."""


def _empty(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _under(p: str, root: Path) -> bool:
    return Path(p).resolve().is_relative_to(root)


def read_manifest(path: str | Path, *, check_files: bool = True, outside_ok: bool = False) -> pd.DataFrame:
    """Read a CSV or Parquet manifest (or a folder holding ``manifest.csv``/``.parquet``).

    Returns a DataFrame whose ``path`` column holds absolute paths. Validates it (see
    ``validate_manifest``). Paths that resolve outside the manifest's folder (``../..``, an
    absolute path elsewhere) raise ManifestError unless ``outside_ok``: a manifest is untrusted
    data, and ``chains export`` would otherwise pack any readable file into a shard.
    """
    path = Path(path)
    if path.is_dir():
        for name in MANIFEST_NAMES:
            if (path / name).exists():
                path = path / name
                break
        else:
            raise ManifestError(f"no manifest.csv or manifest.parquet in {path} (for chains in "
                                f"another layout, `collapseguard chains ls {path} --manifest-out "
                                f"{path / 'manifest.csv'}` writes one)")
    if path.suffix == ".parquet":
        df = pd.read_parquet(path)
    elif path.suffix in (".csv", ".tsv"):
        try:
            # a name is text whatever it spells ("NA", "null", "None" are sources too): only an
            # empty cell is missing
            df = pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",", dtype={"chain_id": str,
                             "source_image": str, "family": str, "task": str, "path": str, "kind": str,
                             "storage": str}, keep_default_na=False, na_values=[""])
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{path}: not a readable manifest ({exc})") from None
        from collapseguard.io.csv_cells import csv_uncell
        for c in df.columns:  # as write_manifest wrote them (io.csv_cells)
            if df[c].dtype == object or pd.api.types.is_string_dtype(df[c]):
                df[c] = df[c].map(csv_uncell)
    else:
        raise ManifestError(f"manifest must be .csv, .tsv or .parquet, got {path.name}")
    root = path.parent.resolve()
    if "path" in df.columns:
        # an empty cell (NaN) stays as it is, for validate_manifest to report
        df["path"] = [p if _empty(p) else str(p) if Path(p).is_absolute() else str(root / p)
                      for p in df["path"]]
        if not outside_ok:  # a manifest is data: it must not point the tools at any file on disk
            out = [p for p in df["path"] if isinstance(p, str) and not _under(p, root)]
            if out:
                # a link under the folder that points out of it reads as a path inside: say so
                shown = [p if not os.path.abspath(p).startswith(str(root) + os.sep)
                         else f"{p} (a link to {Path(p).resolve()})" for p in out[:2]]
                raise ManifestError(
                    f"{path}: {len(out)} path(s) lie outside the manifest's folder or link to files "
                    f"outside it, e.g. {shown}; a manifest may only name files under its own folder")
    validate_manifest(df, check_files=check_files, where=str(path))
    return df


def write_manifest(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a manifest as CSV, TSV or Parquet (by suffix, as ``read_manifest`` reads them), its
    paths relative to its folder. ManifestError, before anything is written, when a path lies
    outside that folder: ``read_manifest`` refuses such a manifest (a manifest is data, and must
    not point the tools at any file on disk), so it is never written."""
    path = Path(path)
    if path.suffix not in (".csv", ".tsv", ".parquet"):
        raise ManifestError(f"manifest must be .csv, .tsv or .parquet, got {path.name}")
    validate_manifest(df, check_files=False, where=str(path))
    root = path.parent.resolve()
    outside = [p for p in df["path"] if not _under(str(p), root)]
    if outside:
        raise ManifestError(
            f"{path}: {len(outside)} chain image(s) lie outside its folder (e.g. {outside[0]}), "
            "and a manifest may only name files under its own folder; write it inside the "
            "chains folder")
    out = df.copy()

    out["path"] = [Path(p).resolve().relative_to(root).as_posix() for p in out["path"]]
    out = out.sort_values(["chain_id", "step"], kind="stable").reset_index(drop=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    # written beside and renamed: a manifest that exists is whole, so recipes that make a chains
    # folder once (when its manifest is missing) resume correctly after a kill
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".parquet":
        out.to_parquet(tmp, index=False)
    else:  # names come from folders and keys: a cell that starts like a formula is made inert
        from collapseguard.io.csv_cells import csv_cell
        for c in out.columns:
            if out[c].dtype == object or pd.api.types.is_string_dtype(out[c]):
                out[c] = out[c].map(csv_cell)
        out.to_csv(tmp, index=False, sep="\t" if path.suffix == ".tsv" else ",")
    os.replace(tmp, path)
    return path


def bad_steps(step: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(numeric steps, mask of rows whose step is not an integer in [0, MAX_STEP]: text, NaN, inf,
    1.5, -1, 1e30)."""
    steps = pd.to_numeric(step, errors="coerce")
    return steps, (steps.isna() | ~np.isfinite(steps) | (steps < 0) | (steps > MAX_STEP)
                   | (steps != steps.round()))


def validate_manifest(df: pd.DataFrame, *, check_files: bool = True, where: str = "manifest") -> None:
    """Raise ManifestError unless: required columns exist, no chain_id, source_image, family,
    task or path cell is empty, steps are non-negative integers, every chain has a step 0, no
    (chain, step) repeats, one source/family/task per chain, files exist."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ManifestError(f"{where}: missing column(s) {missing}; have {list(df.columns)}")
    if len(df) == 0:
        raise ManifestError(f"{where}: no rows")
    for col in ("chain_id", "source_image", "family", "task", "path"):
        empty = df[col].isna() | (df[col].astype(str).str.strip() == "")  # "" in a Parquet file too
        if empty.any():
            raise ManifestError(f"{where}: empty {col} in row(s) {list(df.index[empty][:5])}")
    steps, bad = bad_steps(df["step"])
    if bad.any():
        raise ManifestError(f"{where}: step must be an integer >= 0; bad rows {list(df.index[bad][:5])}")
    dup = df.assign(step=steps.astype(int)).duplicated(["chain_id", "step"], keep=False)
    if dup.any():
        ex = df.loc[dup, ["chain_id", "step"]].head(3).to_dict("records")
        raise ManifestError(f"{where}: duplicate (chain_id, step) pairs, e.g. {ex}")
    no_zero = sorted(set(df["chain_id"]) - set(df.loc[steps == 0, "chain_id"]))
    if no_zero:
        raise ManifestError(f"{where}: chain(s) without step 0 (the original): {no_zero[:5]}")
    for col in ("source_image", "family", "task"):
        n = df.groupby("chain_id")[col].nunique(dropna=False)
        if (n > 1).any():
            raise ManifestError(f"{where}: chain(s) with more than one {col}: {list(n.index[n > 1][:5])}")
    if check_files:
        gone = [p for p in df["path"] if not Path(p).is_file()]
        if gone:
            raise ManifestError(f"{where}: {len(gone)} file(s) do not exist, e.g. {gone[:3]}")
    df["step"] = steps.astype(int)


def source_bucket(source_image: str, salt: str = "") -> float:
    """A stable number in [0, 1) from a source image's name, for reproducible splits."""
    h = hashlib.sha256((salt + "\0" + str(source_image)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def source_group(source_image: str) -> str:
    """The picture a source comes from: views of one photo (``<name>@<view>``, as
    ``sources.photo_views`` names them) share it, so a split keeps them on one side."""
    return str(source_image).split("@", 1)[0]


def split_by_source(df: pd.DataFrame, fractions: dict[str, float], salt: str = "") -> dict[str, pd.DataFrame]:
    """Split rows into named parts by ``source_image`` (no source in two parts; views of one
    picture, ``<name>@<view>``, stay together: see ``source_group``).

    ``fractions`` maps part name to its share, e.g. ``{"train": 0.7, "calib": 0.15, "test": 0.15}``.
    The assignment depends only on the source name and ``salt``, so it is reproducible and stable
    when chains are added.
    """
    total = sum(fractions.values())
    if total <= 0:
        raise ValueError("fractions must sum to a positive number")
    edges, acc = [], 0.0
    for name, frac in fractions.items():
        acc += frac / total
        edges.append((acc, name))
    buckets = {s: source_bucket(source_group(s), salt) for s in df["source_image"].unique()}

    def part_of(s: str) -> str:
        b = buckets[s]
        for edge, name in edges:
            if b < edge:
                return name
        return edges[-1][1]

    parts = df["source_image"].map(part_of)
    return {name: df[parts == name].reset_index(drop=True) for name in fractions}
