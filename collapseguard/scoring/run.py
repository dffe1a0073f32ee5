"""``run_score``: score images in files, folders and shards into one table (CSV or Parquet).

Uses the same reading (``tario``), batching (``scoring``) and engines as the filter. Rows come out
in input order: shards first in the order given, then loose image files.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from collapseguard.engines import make_engine
from collapseguard.images import IMAGE_EXTENSIONS, heif_hint
from collapseguard.io.csv_cells import csv_cell
from collapseguard.io.inputs import (
    ImageFile,
    InputError,
    expand,
    failed_text,
    unique_inputs,
)
from collapseguard.io.tar import ShardReader
from collapseguard.io.terminal import printable
from collapseguard.io.urls import read_bytes
from collapseguard.scoring.progress import count_samples, progress_bar
from collapseguard.scoring.records import sample_error, score_records, set_aside_reason

if TYPE_CHECKING:
    import pandas as pd

FILES_PER_TASK = 64
COLUMNS = ["source", "key", "score", "detector", "detector_version", "image", "width", "height",
           "storage", "has_alpha", "error"]


def _file_members(f: ImageFile, read_errors: dict[str, str] | None = None) -> list[tuple[str, bytes]]:
    try:
        return [(f.path, read_bytes(f.path))]
    except OSError as exc:  # unreadable: empty bytes (a decode error), and the real reason kept
        if read_errors is not None:
            read_errors[f.path] = f"cannot read the file: {_why_unreadable(f.path, exc)}"
        return [(f.path, b"")]


def _why_unreadable(path: str, exc: OSError) -> str:
    """The OS's reason, or that the file is a link to nothing (named: the table's row names the
    link, not where it leads)."""
    import os

    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        try:
            return f"a broken link (to {printable(os.readlink(path))})"
        except OSError:
            return "a broken link"
    return str(exc.strerror or exc)


def _selected(samples, source: str, select):
    """The samples ``select(source, key, nth)`` accepts; ``nth`` counts earlier samples of the same
    key in the shard (a key can repeat, and each repeat is a sample of its own)."""
    seen: dict[str, int] = {}
    for s in samples:
        nth = seen.get(s.key, 0)
        seen[s.key] = nth + 1
        if select(source, s.key, nth):
            yield s


def score_task(task: tuple, detector, progress=None, decode=None, set_aside: bool = False,
               digest: bool = True) -> list[dict]:
    """Engine task: ``("shard", path)``, ``("parquet", (path, image column or None))`` or
    ``("files", [ImageFile, ...])`` -> list of rows.

    A shard or Parquet task may carry a third element, ``select(source, key, nth) -> bool``:
    samples (rows) it rejects are skipped before anything is decoded (used by ``audit --sample``).
    ``decode`` is ``score_records``' (reduced decoding, for a detector that reads reduced images).
    With ``set_aside`` each row also holds ``set_aside``: why ``filter`` rejects the sample
    whatever its score (``records.set_aside_reason``; "" for none, and for files and Parquet
    rows). ``digest=False`` reads a shard without hashing its bytes (no row holds the digest;
    a caller that hashes its sources elsewhere, or never, is spared the work)."""
    kind = task[0]
    if kind != "parquet":
        return _score_task(task, detector, progress, decode=decode, set_aside=set_aside, digest=digest)
    from collapseguard.io.parquet import parquet_file
    with parquet_file(task[1][0]) as pf:  # closed once its rows are scored
        return _score_task(task, detector, progress, pf, decode, set_aside)


def _score_task(task: tuple, detector, progress=None, pf=None, decode=None, set_aside: bool = False,
                digest: bool = True) -> list[dict]:
    kind, payload = task[0], task[1]
    select = task[2] if len(task) > 2 else None
    rows: list[dict] = []
    if kind == "parquet":
        from collapseguard.io.parquet import find_image_column, read_rows
        name, column = payload
        records = read_rows(pf, find_image_column(pf.schema_arrow, column, name), all_columns=False)
        if select is not None:
            records = _selected(records, name, select)
        members_of = lambda r: r.members
        ident = lambda r: (name, r.key)
    elif kind == "shard":
        records = ShardReader(str(payload), digest=digest)
        if select is not None:
            records = _selected(records, str(payload), select)
        members_of = lambda s: [(m.name, m.data) for m in s.members]
        ident = lambda s: (str(payload), s.key)
    else:
        records = payload
        read_errors: dict[str, str] = {}
        members_of = lambda f: _file_members(f, read_errors)
        ident = lambda f: (f.source, f.key)
    n = 0
    for rec, res in score_records(records, detector, members_of=members_of,
                                  images_only=kind != "parquet", decode=decode):
        source, key = ident(rec)
        if kind == "shard":
            error = sample_error(rec, res.error, say_repeat=not set_aside)
        elif kind == "parquet":
            error = res.error if rec.data is not None else rec.missing
        else:
            error = read_errors.get(rec.path, res.error)
        row = {"source": source, "key": key, "score": res.score, "detector": detector.name,
               "detector_version": detector.version,
               "image": res.image if kind != "files" else "", "width": res.width,
               "height": res.height, "storage": res.storage, "has_alpha": res.has_alpha,
               "error": error}
        row.update({f"{k}": v for k, v in res.extra.items()})
        if kind == "parquet":  # a key can repeat in a file: the row's index names it
            row["row"] = rec.index
        if set_aside:
            row["set_aside"] = set_aside_reason(rec) if kind == "shard" else ""
        rows.append(row)
        n += 1
        if progress is not None and n % 16 == 0:
            progress(16)
    if progress is not None and n % 16:
        progress(n % 16)
    return rows


def data_task(inp, image_column: str | None = None) -> tuple:
    """The score task of a shard or Parquet input (an ``io.parse.Input``)."""
    if inp.kind == "parquet":
        return ("parquet", (inp.name, image_column or None))
    return ("shard", inp.name)


def plan_score_tasks(inputs: Sequence[str], select=None,
                     unread: list[tuple[str, str]] | None = None, *,
                     image_column: str | None = None,
                     failed: list[tuple[str, str]] | None = None,
                     others=None) -> list[tuple]:
    """One task per shard, per Parquet file and per chunk of image files.
    ``select(source, key, nth=0) -> bool`` (optional, picklable for worker processes) limits
    scoring to the samples it accepts; ``unread`` receives what the folders hold and cannot be
    read (``io.inputs.expand``); ``image_column`` names the image column of Parquet inputs;
    ``failed`` (optional) receives ``(url, why)`` for each URL input that cannot be listed (it
    fails, the others are scored; InputError naming them when nothing is left); ``others``
    (optional, a ``Counter``) counts by extension the files the folders hold that are neither
    image, shard nor Parquet file (``io.inputs.expand``)."""
    # a file named twice (or under two spellings, or also inside a folder given) is scored once,
    # under its first name: one row per image, no repeated (source, key)
    data, files = expand(inputs, unread, failed, others=others, image_column=image_column)
    shards, files = unique_inputs(data, files)
    if failed and not shards and not files:
        raise InputError(failed_text(failed, "nothing is left to score"))
    if not shards and not files:
        hint = heif_hint(others or ())  # a folder of iPhone photos without pillow-heif
        raise InputError(f"no image files or .tar shards (nor Parquet files) in "
                         f"{', '.join(map(str, inputs))} (images: {', '.join(IMAGE_EXTENSIONS)}; "
                         f"shards: .tar, .tar.gz, .tgz; .parquet){'; ' + hint if hint else ''}")
    tasks: list[tuple] = [data_task(s, image_column) + ((select,) if select is not None else ())
                          for s in shards]
    if select is not None:
        files = [f for f in files if select(f.source, f.key)]
    for i in range(0, len(files), FILES_PER_TASK):
        tasks.append(("files", files[i: i + FILES_PER_TASK]))
    return tasks


def _total(tasks: list[tuple]) -> int | None:
    """Samples and files the tasks will score, when every shard can be counted cheaply."""
    total = 0
    from collapseguard.io.parquet import count_rows
    for t in tasks:
        n = (count_samples(t[1]) if t[0] == "shard" else count_rows(t[1][0]) if t[0] == "parquet"
             else len(t[1]))
        if n is None:
            return None
        total += n
    return total


def run_score(inputs: Sequence[str], detector: str, *, workers: int = 1, quiet: bool = False,
              detector_obj=None, detector_kwargs: tuple = (),
              select=None, planned: tuple[list, list] | None = None,
              image_column: str | None = None, set_aside: bool = False,
              others=None) -> tuple[pd.DataFrame, list[str]]:
    """Score every image named by ``inputs``; returns (table, errors of tasks that failed).

    ``select(source, key) -> bool`` (optional) scores only the samples it accepts; the others are
    read past without being decoded. What a folder holds and cannot be read (a subfolder that
    cannot be listed, a broken link) is among the errors, so nothing goes missing unsaid.
    A URL input whose listing fails (a 404, an error status, a redirect loop) is one error line
    (its ``why`` names the URL) and the other inputs are scored.
    ``planned``: ``(tasks, unread, failed)`` from an earlier
    ``plan_score_tasks(inputs, select, unread, failed=failed)`` (a caller that checks its inputs
    before loading a detector), instead of planning here.
    ``set_aside``: the table's last column, ``set_aside``, holds why ``filter`` would set a sample
    aside whatever its score (``score_task(set_aside=True)``; "" for none). ``others`` (a
    ``Counter``) receives the extensions of the folders' files that no reader takes, as
    ``plan_score_tasks`` counts them (``io.inputs.other_files_note`` says them in one line)."""
    if planned is None:
        unread: list[tuple[str, str]] = []
        failed: list[tuple[str, str]] = []
        tasks = plan_score_tasks(inputs, select, unread, image_column=image_column, failed=failed,
                                 others=others)
    else:
        tasks, unread, failed = planned
    results: list[list[dict] | None] = [None] * len(tasks)
    failures: list[str] = [why for _url, why in failed]
    failures += [f"{path}: not read: {why}" for path, why in unread]
    bar = progress_bar(_total(tasks) if select is None else None, desc="score", unit="img",
                       quiet=quiet)

    def on_done(i, rows, err):
        if err is not None:
            what = {"shard": tasks[i][1], "parquet": tasks[i][1][0]}.get(tasks[i][0], "image files")
            failures.append(f"{what}: {err}")
        results[i] = rows or []

    import pandas as pd  # here, not at import: the engine's workers import this module and never need it

    task = partial(score_task, set_aside=True) if set_aside else score_task
    make_engine("local", workers, detector_obj).run(
        task, tasks, detector, detector_kwargs, (bar.update if not quiet else None), on_done)
    bar.close()
    rows = [r for part in results if part for r in part]
    extra = {k for r in rows for k in r} - set(COLUMNS) - {"set_aside"}
    if any(t[0] == "parquet" for t in tasks):  # a table of Parquet rows has the column even if
        extra.add("row")                       # no row was read: one header for every run
    extra = sorted(extra)
    df = pd.DataFrame(rows, columns=COLUMNS + extra + (["set_aside"] if set_aside else []))
    if set_aside:
        df["set_aside"] = df["set_aside"].fillna("").astype(str)
    # integers with empty cells where the size is unknown (an image that could not be read), not
    # floats (640.0 in a CSV) nor 0
    df[["width", "height"]] = df[["width", "height"]].astype("Int64")
    if "row" in df.columns:  # Parquet rows' indices; empty for shard samples and image files
        df["row"] = df["row"].astype("Int64")
    return df, failures


TABLE_SUFFIXES = (".parquet", ".csv", ".tsv")


def check_table_suffix(path: str | Path) -> None:
    """ValueError unless ``write_table`` knows the suffix of ``path``."""
    if Path(path).suffix not in TABLE_SUFFIXES:
        raise ValueError(f"--out must end in .csv, .tsv or .parquet, got {Path(path).name}")


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write CSV or Parquet by the file's suffix. In CSV/TSV, text that a spreadsheet would run as
    a formula (a key such as ``=HYPERLINK(...)``), or that starts with ``'``, gets a leading ``'``
    (``io.csv_cells.csv_cell``); Parquet keeps every value as it is. The table appears whole or
    not at all (written beside it, then renamed): a run killed while writing leaves no half table
    that reads as complete."""
    import pandas as pd

    from collapseguard.io.atomic import replaced_when_done

    path = Path(path)
    check_table_suffix(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_when_done(path) as tmp:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        else:
            text = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])]
            df = df.assign(**{c: df[c].map(csv_cell) for c in text})
            df.to_csv(tmp, index=False, sep="\t" if path.suffix == ".tsv" else ",")
    return path
