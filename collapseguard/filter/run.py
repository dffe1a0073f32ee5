"""``run_filter``: filter many shards into kept/, rejected/, scores/ and summary.json.

Completed shards (those with a completion marker made with the same settings) are skipped on
resume; ``overwrite=True`` redoes them. A shard that fails is reported by name and the others go on.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None


from collapseguard.engines import make_engine
from collapseguard.errors import CollapseguardError
from collapseguard.filter import sidecars
from collapseguard.filter.decisions import (
    KEPT_ELSEWHERE,
    kept_elsewhere_note,
    stand_ins,
    table_stems,
    unmatched_inputs,
    unmatched_inputs_note,
)
from collapseguard.filter.pipeline import (
    FilterOptions,
    file_digest,
    filter_task,
    input_identity,
    lock_owner,
    output_names,
    outputs_match,
    read_marker,
    shard_name,
    shard_stem,
)
from collapseguard.filter.reshard import FOLDER as RESHARD_FOLDER
from collapseguard.io.inputs import (
    Input,
    expand,
    expand_shards,
    failed_text,
    path_key,
    unique_inputs,
    unread_text,
)
from collapseguard.io.outdir import out_dir as open_out_dir
from collapseguard.io.outdir import wrong_entries
from collapseguard.io.parse import parse_argument
from collapseguard.io.terminal import printable
from collapseguard.io.urls import inside, is_fsspec, is_remote, join, local_path
from collapseguard.scoring.progress import progress_bar


class FilterError(CollapseguardError, RuntimeError):
    """The run cannot start (bad inputs, clashing shard names, settings changed on resume), or
    its --out failed. The message names paths from the data: it is stored terminal-safe."""

    def __init__(self, message: str):
        super().__init__(printable(message))


def refuse_out_inside_inputs(inputs: Sequence[str], out_dir: str) -> None:
    """Refuse an ``--out`` inside an input folder: its kept/ and rejected/ shards would be read as
    inputs by the next run (and by ``score`` or ``audit`` of that folder)."""
    parsed = [i for raw in inputs for i in parse_argument(raw)]  # nothing runs or is listed here
    if is_fsspec(out_dir):
        for i in parsed:
            if i.via == "url" and inside(out_dir, i.name):
                raise FilterError(f"--out {out_dir} is inside the input {i.display}: its kept/ and "
                                  "rejected/ shards would be read as input next time; choose an "
                                  "--out outside the inputs")
        return
    out = Path(out_dir).resolve()
    for i in parsed:
        if i.kind == "folder":
            p = i.display
            if out.is_relative_to(Path(p).resolve()):
                raise FilterError(f"--out {out_dir} is inside the input folder {p}: its kept/ and "
                                  "rejected/ shards would be read as input next time; choose an "
                                  "--out outside the inputs")


def same_shard(a: str, b: str) -> bool:
    """Do two spellings of a shard path name the same file (``data/x.tar``, ``./data/x.tar``,
    an absolute path)? URLs are the same when ``io.inputs.path_key`` makes them the same."""
    if is_remote(a) or is_remote(b):
        return path_key(a) == path_key(b)
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _file_identity(name: str):
    """What ``same_shard`` compares, as a key: (device, inode) of a local file, a URL's
    ``io.inputs.path_key``, else the path."""
    if is_remote(name):
        return ("url", path_key(name))  # one object under two spellings (a space or %20) is one
    try:
        st = os.stat(name)
        return ("file", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(name))


def _input_shards(inputs: Sequence[str], loose: list[str] | None = None,
                  failed: list[tuple[str, str]] | None = None, *,
                  allow_pipe: bool = True, image_column: str | None = None) -> list[Input]:
    """The shards and Parquet files ``inputs`` name; FilterError naming what an input folder
    holds and cannot be read (a broken link to a folder, a subfolder that cannot be listed): the
    shards there would be in no output and no summary. ``loose`` (optional) receives the loose
    image files beside the shards, which filter does not read (the summary counts them).
    ``failed`` (optional) receives ``(url, why)`` for each URL input that cannot be listed
    (``io.inputs``): it fails, the others are filtered; FilterError when no shard is left."""
    unread: list[tuple[str, str]] = []
    shards, files = expand(inputs, unread, failed, allow_pipe=allow_pipe, image_column=image_column)
    if failed and not shards:
        raise FilterError(failed_text(failed, "no shard is left to filter"))
    if unread:
        raise FilterError(unread_text(unread, "the shards there would not be filtered: fix or remove "
                                              "it, or name the shards to filter"))
    if loose is not None and shards:
        loose.extend(f.path for f in unique_inputs([], files)[1])  # a file named twice counts once
    return shards if shards else expand_shards(inputs)  # none: expand_shards says why


def plan_shards(inputs: Sequence[str], out_dir: str | None = None,
                loose: list[str] | None = None,
                failed: list[tuple[str, str]] | None = None, *,
                allow_pipe: bool = True, image_column: str | None = None) -> list[Input]:
    """Expand inputs to shards and Parquet files (``io.parse.Input``), once per file however
    often or however spelled it was given; ``loose`` (optional) receives the loose image files
    found beside them, which are not filtered; ``failed`` (optional) receives the URL inputs that
    cannot be listed; ``allow_pipe=False`` refuses ``pipe:`` commands; ``image_column``
    (``--image-column``) is read as an image-named column when a folder's Parquet files are
    judged inputs or not (``io.parquet.may_hold_images``).

    Refuses what an input folder holds and cannot be read, two different shards that would write
    to the same output name, and (given ``out_dir``) a shard lying in ``out_dir``'s kept/ or
    rejected/ folder, which this run would overwrite with its own output.
    """
    shards: list[Input] = []
    seen: set = set()
    for s in _input_shards(inputs, loose, failed, allow_pipe=allow_pipe, image_column=image_column):
        ident = _file_identity(s.name)
        if ident not in seen:
            seen.add(ident)
            shards.append(s)
    if out_dir is not None and is_fsspec(out_dir):
        for s in shards:
            for sub in ("kept", "rejected"):
                if inside(s.name, join(out_dir, sub)):
                    raise FilterError(f"input shard {s} lies in {out_dir}/{sub}, where this run "
                                      "writes its outputs; filter it into another --out")
    elif out_dir is not None:
        out = Path(out_dir).resolve()
        # each output folder as it resolves: one that is a link (to an input's folder, say) would
        # have the run remove and overwrite the inputs and their sidecars there
        targets = {sub: (out / sub).resolve() for sub in (*OUT_FOLDERS, RESHARD_FOLDER)}
        for s in shards:
            if s.path is None:
                continue
            real = Path(s.path).resolve()
            for sub, target in targets.items():
                if real.is_relative_to(target) or real.parent == target:
                    via = f" (a link to {printable(str(target))})" if target != out / sub else ""
                    raise FilterError(f"input shard {s} lies in {out_dir}/{sub}{via}, where this run "
                                      "writes its outputs; filter it into another --out")
    by_name: dict[str, Input] = {}
    by_stem: dict[str, Input] = {}
    for s in shards:
        other = by_name.setdefault(s.basename, s)
        if other != s:
            raise FilterError(f"two input shards share the name {s.basename!r} ({other} and {s}); "
                              "their outputs would collide: filter them into different --out folders")
        # scores/<stem>.parquet, .done/<stem>.json and the img2dataset sidecars are named by the
        # stem: x.tar and x.tar.gz (or x.parquet) in one run would overwrite each other's scores
        # and marker
        other = by_stem.setdefault(s.stem, s)
        if other != s:
            raise FilterError(f"two input shards share the stem {s.stem!r} ({other} and {s}); their "
                              "scores, completion markers and sidecars would collide: filter them into "
                              "different --out folders")
    return shards


_HELD_LOCKS: dict[str, str] = {}


@contextlib.contextmanager
def out_lock(out_dir: Path):
    """Hold ``<out>/.lock`` for the run, so two runs cannot write one --out at once (re-entrant
    within this process, for the two passes of ``--drop-fraction``). Yields this run's id, which
    is written into the lock file: workers compare it before every commit, so a worker of a run
    that lost the lock (its parent was killed and another run took over) commits nothing."""
    remote = is_fsspec(str(out_dir))
    key = str(out_dir).rstrip("/") if remote else os.path.realpath(out_dir)
    if key in _HELD_LOCKS:
        yield _HELD_LOCKS[key]
        return
    run_id = uuid.uuid4().hex[:16]
    if remote:  # no flock on object storage: a lock object and a check before each commit
        with open_out_dir(key).lock(run_id):
            _HELD_LOCKS[key] = run_id
            try:
                yield run_id
            finally:
                del _HELD_LOCKS[key]
        return
    try:
        fd = os.open(os.path.join(key, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise FilterError(f"cannot write {printable(out_dir)}/.lock: {exc.strerror or exc}") from None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FilterError(f"another filter run is writing to {out_dir} (it holds "
                                  f"{out_dir}/.lock); wait for it to finish or choose another "
                                  "--out") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, run_id.encode() + b"\n", 0)
            os.fsync(fd)
        except OSError as exc:
            raise FilterError(f"cannot write {printable(out_dir)}/.lock: "
                              f"{exc.strerror or exc}") from None
        _HELD_LOCKS[key] = run_id
        try:
            yield run_id
        finally:
            del _HELD_LOCKS[key]
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def make_out_dir(out_dir: str) -> Path | str:
    if is_fsspec(out_dir):
        try:
            o = open_out_dir(out_dir)
            o.write_text(".write-test", "")
            o.remove(".write-test")
        except (OSError, ValueError) as exc:
            raise FilterError(f"cannot write to --out {out_dir}: {exc}") from None
        return out_dir.rstrip("/")
    out = Path(local_path(out_dir) or out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise FilterError(f"cannot write to --out {out_dir}: {exc.strerror or exc}") from None
    wrong = wrong_entries(str(out), OUT_FOLDERS, OUT_FILES)
    if wrong:
        raise FilterError(f"--out {out_dir} holds entries of the wrong type ({'; '.join(wrong)}): "
                          "filter writes folders there under those names; move them away or "
                          "choose another --out")
    return out


#: the folders and files a run writes in a local --out: an entry of another type under one of
#: these names is refused before any work
OUT_FOLDERS = ("kept", "rejected", "scores", ".done", sidecars.ORPHAN_FOLDER, ".prepass")
OUT_FILES = ("summary.json", ".lock")


def _has_marker(shard: Input, out_dir: str) -> bool:
    try:
        return read_marker(shard, out_dir) is not None
    except Exception:  # noqa: BLE001 - only a count in a message: an unreadable marker is not one
        return False


def other_settings_shards(out: Path | str, inputs: Sequence[Input],
                          options: FilterOptions) -> list[tuple[str, str]]:
    """``(marker stem, what differs)`` for each shard completed in a local ``out`` by an earlier
    run with other settings and not among ``inputs`` (a run over a subset, or ``--overwrite``
    with new settings over some shards): kept/ and rejected/ mix two settings until those shards
    are run again."""
    if not isinstance(out, Path) or not (out / ".done").is_dir():
        return []
    mine = {s.stem for s in inputs}
    found = []
    for f in sorted((out / ".done").glob("*.json")):
        if f.stem in mine:
            continue
        try:
            marker = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(marker, dict):
            continue
        now = options.fingerprint(parquet=str(marker.get("shard", "")).endswith(".parquet"))
        if marker.get("options") != now and not _named_the_column_found(marker, now):
            found.append((f.stem, settings_diff(marker.get("options"), now)))
    return found


#: what a fingerprint's missing setting stands for
_LEFT_OUT = {"drop_duplicates": False, "groups_digest": "(no --groups)", "groups_stand_ins": "(none)",
             "image_column": "(found)"}


def settings_diff(before, now: dict) -> str:
    """Only the settings that differ between a completed shard's marker and this run:
    ``threshold 0.5 there, 0.7 now; detector nss there, cnn now``."""
    if not isinstance(before, dict):
        return "settings not recorded"
    parts = []
    for k in sorted(set(before) | set(now)):
        # a setting a fingerprint leaves out at its default (``FilterOptions.fingerprint``) is
        # shown as that default
        a, b = before.get(k, _LEFT_OUT.get(k, "(unset)")), now.get(k, _LEFT_OUT.get(k, "(unset)"))
        if a != b:
            parts.append(f"{k} {a!r} there, {b!r} now")
    return "; ".join(parts) or "settings differ"


def _threshold_alone_differs(before, now: dict) -> bool:
    return isinstance(before, dict) and {**before, "threshold": now.get("threshold")} == now


def _named_the_column_found(marker: dict, now: dict) -> bool:
    """Does this run name (``--image-column``) the very column an earlier run found in a Parquet
    file by itself? Then the outputs are the same, and the completed file is reused: the earlier
    run's own note asks for the option to silence its warning about other image columns."""
    before = marker.get("options")
    return (isinstance(before, dict) and "image_column" not in before
            and now.get("image_column") is not None
            and marker.get("image_column") == now["image_column"]
            and {**before, "image_column": now["image_column"]} == now)


def completed_marker(inp: Input | str, options: FilterOptions, out: Path,
                     detector_version: str | None) -> dict | None:
    """The marker of the input's earlier completion in ``out`` if it can be reused; None when the
    shard must be (re)done; FilterError when reusing or redoing it would be wrong."""
    marker = read_marker(inp, options.out_dir)
    shard = str(inp)
    now = options.fingerprint(parquet=isinstance(inp, Input) and inp.kind == "parquet")
    if marker is None:
        return None
    if not same_shard(str(marker.get("shard", "")), shard):
        raise FilterError(
            f"{shard_name(inp)} was completed in {out} from another shard "
            f"({marker.get('shard')}); use --overwrite or another --out")
    if marker.get("options") != now and not _named_the_column_found(marker, now):
        if (options.scores_from and marker.get("decided_from_scoring_pass")
                and _threshold_alone_differs(marker.get("options"), now)):
            return None  # a --drop-fraction split, cut again: split again from the kept scores
        raise FilterError(
            f"{shard_name(inp)} was completed in {out} with other settings "
            f"({settings_diff(marker.get('options'), now)}); use --overwrite or "
            "another --out")
    done_with = marker.get("detector_version")
    if detector_version is not None and done_with is not None and done_with != detector_version:
        raise FilterError(
            f"{shard_name(inp)} was completed in {out} by detector version {done_with}; "
            f"{options.detector} is now version {detector_version} (other weights or code): "
            "use --overwrite or another --out")
    seen = marker.get("input")
    if seen is not None:
        now = input_identity(shard)
        now.pop("path")
        if seen != now and not _same_bytes(shard, seen, now, marker.get("input_digest")):
            return None  # the shard changed since: its outputs are stale, filter it again
    if not outputs_match(marker, options.out_dir):
        return None  # outputs missing, cut short or changed since the marker: filter it again
    return marker


def _same_bytes(shard: str, seen: dict, now: dict, digest: dict | None) -> bool:
    """Is a local shard whose size and mtime are the marker's, but whose inode or change time are
    not (copied with ``cp -p``, ``rsync -a``, moved, or replaced by a file of that size and mtime),
    the shard the marker was made from? Only if its SHA-256 is the one the marker recorded."""
    def stable(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in ("ino", "ctime_ns")}

    path = local_path(shard)
    if path is None or not isinstance(digest, dict) or stable(seen) != stable(now):
        return False
    return file_digest(Path(path)) == {"size": digest.get("size"), "sha256": digest.get("sha256")}


def clear_shard_outputs(shard: Input | str, out_dir: str) -> None:
    """Remove a shard's (or Parquet file's) outputs, marker first, and any temporary files a
    killed run left."""
    out, names = open_out_dir(out_dir), output_names(shard)
    for key in ("marker", "kept", "rejected", "scores"):
        out.remove(names[key])
    parquet = isinstance(shard, Input) and shard.kind == "parquet"
    for name in () if parquet else sidecars.output_names(str(shard)):  # img2dataset's sidecars
        out.remove(name)


def run_filter(inputs: Sequence[str], options: FilterOptions, *, workers: int = 2,
               engine: str = "local", resume: bool = True, quiet: bool = False,
               threshold_source: str = "", detector=None,
               detector_version: str | None = None, allow_pipe: bool = True) -> dict:
    """Filter ``inputs`` and write ``summary.json`` into ``options.out_dir``; returns the summary.

    ``detector`` (optional) is an already-created detector to reuse when running inline.
    ``detector_version`` (taken from ``detector`` when not given) must match the version that
    completed a shard for the shard to be resumed. Workers get absolute paths, so engines whose
    workers run in another folder (Ray actors) read and write the same files.
    """
    t0 = time.perf_counter()
    options = replace(options, out_dir=local_path(options.out_dir) or options.out_dir)  # file:
    refuse_out_inside_inputs(inputs, options.out_dir)
    loose: list[str] = []
    failed_inputs: list[tuple[str, str]] = []  # URL folders that cannot be listed: failed, named
    shards = plan_shards(inputs, options.out_dir, loose, failed_inputs, allow_pipe=allow_pipe,
                         image_column=options.image_column or None)
    out = make_out_dir(options.out_dir)
    for url, why in failed_inputs:
        if not quiet:
            print(f"FAILED input {printable(url)}: {printable(why)}", file=sys.stderr)
    if detector_version is None and detector is not None:
        detector_version = detector.version
    with out_lock(out) as run_id:
        options = replace(options, run_id=run_id)
        return _run_locked(shards, options, out, t0, workers=workers, engine=engine,
                           resume=resume, quiet=quiet, threshold_source=threshold_source,
                           detector=detector, detector_version=detector_version, loose=loose,
                           failed_inputs=failed_inputs)


def _run_locked(inputs: list[Input], options: FilterOptions, out: Path, t0: float, *, workers: int,
                engine: str, resume: bool, quiet: bool, threshold_source: str, detector,
                detector_version: str | None, loose: Sequence[str] = (),
                failed_inputs: Sequence[tuple[str, str]] = ()) -> dict:
    records: dict[str, dict] = {}
    todo: list[Input] = []
    shards = [s.name for s in inputs]  # the names markers, summaries and messages use
    # which groups keep a copy outside these inputs depends on all of them: read once, here, and
    # each shard's options carry its own stand-ins (what its decisions and resume check read)
    away = (stand_ins(options.groups, {shard_stem(s) for s in inputs}) if options.groups
            else {"groups": [], "by_stem": {}})

    def of(s: Input) -> FilterOptions:
        if options.kept_elsewhere != "stand-in":
            return options
        return replace(options, stand_ins=away["by_stem"].get(shard_stem(s), ()))

    for s in inputs:
        marker = completed_marker(s, of(s), out, detector_version) if resume else None
        if marker is not None:
            records[s.name] = {**marker, "shard": s.name}
        else:
            clear_shard_outputs(s, options.out_dir)
            todo.append(s)
    errors: dict[str, str] = {}
    bar = progress_bar(len(shards), initial=len(records), unit="shard", quiet=quiet, desc="filter")
    samples_done = 0
    t_run = time.perf_counter()

    def on_progress(n: int) -> None:
        nonlocal samples_done
        samples_done += n
        rate = samples_done / max(1e-9, time.perf_counter() - t_run)
        bar.set_postfix_str(f"{samples_done} samples, {rate:.1f}/s", refresh=True)

    def on_done(i: int, rec: dict | None, err: str | None) -> None:
        shard = todo[i].name
        if err is not None:
            errors[shard] = err
            bar.write(f"FAILED {printable(shard)}: {printable(err.splitlines()[0])}",
                      file=sys.stderr)
        else:
            records[shard] = rec
        bar.update(1)

    if records and not quiet:
        bar.write(f"resuming: {len(records)} of {len(shards)} shard(s) already complete in "
                  f"{printable(str(options.out_dir))}, skipped", file=sys.stderr)
    others = other_settings_shards(out, inputs, options)
    if others:  # a warning about what --out holds, so printed with --quiet too
        name, diff = others[0]
        bar.write(f"note: {len(others)} other shard(s) in {printable(str(options.out_dir))} were "
                  f"completed by an earlier run with other settings (e.g. {printable(name)}: {diff}); "
                  "they are not among these inputs and stay as that run wrote them, and "
                  "summary.json describes these inputs only", file=sys.stderr)
    groups_summary = None
    if options.groups:
        named = [(s.name, shard_stem(s)) for s in inputs]
        stems = table_stems(options.groups)
        note = unmatched_inputs_note(options.groups, named, stems)
        if note:  # about the inputs, so printed with --quiet too
            bar.write(note, file=sys.stderr)
        unmatched = unmatched_inputs(named, stems)
        if away["groups"]:  # about the inputs, so printed with --quiet too
            bar.write(kept_elsewhere_note(len(away["groups"]), options.kept_elsewhere), file=sys.stderr)
        groups_summary = {"table": options.groups, "sha256": options.groups_digest,
                          "drop_duplicates": options.drop_duplicates,
                          "inputs_with_rows": len(named) - len(unmatched),
                          "inputs_without_rows": unmatched,
                          "groups_kept_elsewhere": len(away["groups"]),
                          "kept_elsewhere": options.kept_elsewhere}
    if todo:
        absolute = replace(options, out_dir=_absolute(options.out_dir),
                           scores_from=options.scores_from and _absolute(options.scores_from))
        try:
            make_engine(engine, workers, detector).run(
                filter_task, [(s.with_name(_absolute(s.name)), replace(absolute, stand_ins=of(s).stand_ins))
                              for s in todo],
                options.detector,
                options.detector_kwargs, on_progress if not quiet else None, on_done)
        except KeyboardInterrupt:
            bar.close()
            # workers may have committed shards whose results never reached this process: count
            # the markers, which are what a resume reads
            complete = sum(s.name in records or _has_marker(s, options.out_dir) for s in inputs)
            print(f"interrupted: {complete} of {len(shards)} shard(s) complete in "
                  f"{printable(str(options.out_dir))} (each with its .done marker; no partial "
                  "shard is left); run the same command again to resume", file=sys.stderr)
            raise
    bar.close()
    run_seconds = time.perf_counter() - t_run
    summary = summarize(shards, records, errors, options, [s.name for s in todo], run_seconds,
                        threshold_source)
    summary["elapsed_seconds"] = round(time.perf_counter() - t0, 3)
    # loose image files in the input folders are not filtered: counted, one named, never silent
    summary["loose_files_not_filtered"] = len(loose)
    summary["loose_file_example"] = loose[0] if loose else None
    # inputs that could not be listed (a URL folder answering 404/500, a redirect loop): failed
    summary["inputs_failed"] = [{"input": url, "error": why} for url, why in failed_inputs]
    summary["other_settings_shards"] = [name for name, _ in others]
    if groups_summary is not None:  # --groups: the table, and which inputs it had rows for
        if away["groups"] and options.kept_elsewhere == "stand-in":
            lost = groups_without_kept_copy(options.out_dir, [s for s in inputs if s.name in records],
                                            set(away["groups"]))
            groups_summary["kept_elsewhere_without_kept_copy"] = len(lost)
            if lost:  # said even with -q: a picture with no copy in kept/
                print(f"warning: {len(lost)} group(s) kept outside these inputs have no copy in kept/ "
                      f"(e.g. {printable(lost[0])}): the detector rejected the copy standing in for "
                      "the kept one, and the others are degraded copies or duplicates of the copy kept "
                      "elsewhere; the scores tables name them (column group)", file=sys.stderr)
        summary["groups"] = groups_summary
    write_summary(options.out_dir, summary, options.run_id)
    return summary


def groups_without_kept_copy(out_dir: str, done: Sequence[Input], groups: set[str]) -> list[str]:
    """Of ``groups`` (kept outside the inputs, each with a stand-in among them), those with no
    row kept in the scores tables of the ``done`` inputs, sorted."""
    out, seen, kept = open_out_dir(out_dir), set(), set()
    for s in done:
        try:
            t = out.read_table(f"scores/{shard_stem(s)}.parquet", ["group", "decision"])
        except Exception:  # noqa: BLE001 - a table without a group column (no rows of the groups)
            continue
        for g, d in zip(t.column("group").to_pylist(), t.column("decision").to_pylist()):
            if g in groups:
                seen.add(g)
                if d == "kept":
                    kept.add(g)
    return sorted(seen - kept)


def write_summary(out_dir: str, summary: dict, run_id: str = "") -> None:
    """Write summary.json; a full, read-only or vanished --out is one FilterError line and leaves
    no temporary file. Given ``run_id``, the lock must still hold it: an --out removed (or
    replaced) during the run is not written into again."""
    if run_id and lock_owner(out_dir) != run_id:
        raise FilterError(f"--out {out_dir} was removed or replaced during the run (its .lock is "
                          "gone): its outputs are not complete; run again to finish them")
    try:
        open_out_dir(out_dir).write_text("summary.json", json.dumps(summary, indent=2,
                                                                    sort_keys=False))
    except OSError as exc:
        local = None if is_fsspec(str(out_dir)) else Path(local_path(out_dir) or out_dir)
        if local is not None and local.is_dir():
            for q in local.glob("summary.json*tmp"):
                with contextlib.suppress(OSError):
                    q.unlink()
        failed = summary.get("shards_failed") or []
        raise FilterError(f"cannot write summary.json to --out {printable(out_dir)}: "
                          f"{exc.strerror or exc}" + (f" ({len(failed)} shard(s) failed)" if failed
                                                      else " (the shards marked done are complete)")
                          ) from None


def _absolute(name: str) -> str:
    """An absolute path for a local name (workers may run in another folder); URLs unchanged."""
    return name if is_remote(name) else os.path.abspath(local_path(name) or name)


def summarize(shards, records, errors, options: FilterOptions, todo, run_seconds,
              threshold_source: str) -> dict:
    reasons: Counter = Counter()
    per_shard = []
    for s in shards:
        rec = records.get(s)
        if rec is None:
            per_shard.append({"shard": s, "status": "failed", "error": errors.get(s, "not run")})
            continue
        reasons.update(rec["reasons"])
        per_shard.append({"shard": s, "status": "resumed" if s not in todo else "done",
                          **{k: rec[k] for k in ("samples", "images", "kept", "rejected",
                                                 "reasons", "skipped_members", "seconds")},
                          **({"orphan_rows": rec["orphan_rows"]} if rec.get("orphan_rows") else {}),
                          **({"sidecar_notes": rec["sidecar_notes"]} if rec.get("sidecar_notes") else {}),
                          **({"image_column": rec["image_column"]} if rec.get("image_column") else {}),
                          # a run that names the column (--image-column) judged the one it chose
                          **({"unjudged_image_columns": rec["unjudged_image_columns"]}
                             if rec.get("unjudged_image_columns") and not options.image_column
                             else {})})
    ran = [records[s] for s in todo if s in records]
    # images scored by this run: none when it decides from an earlier pass's scores (scores_from)
    images_run = 0 if options.scores_from else sum(r["images"] for r in ran)
    version = next((r.get("detector_version") for r in records.values()), None)
    return {
        "detector": options.detector,
        "detector_version": version,
        "threshold": options.threshold,
        "threshold_source": threshold_source,
        "dry_run": options.dry_run,
        "write_rejected": options.write_rejected and not options.dry_run,
        "shards": len(shards),
        "shards_failed": sorted(errors),
        "samples": sum(reasons.values()),
        "kept": sum(r["kept"] for r in records.values()),
        "rejected": sum(r["rejected"] for r in records.values()),
        "reasons": dict(sorted(reasons.items())),
        # sidecar parquet rows that match no sample: in <out>/orphan_rows/, per shard in per_shard
        "orphan_rows": sum(o["rows"] for r in records.values() for o in r.get("orphan_rows") or ()),
        "orphan_rows_not_failed": sum(o["not_failed"] for r in records.values()
                                      for o in r.get("orphan_rows") or ()),
        "images_this_run": images_run,
        "images_per_second": round(images_run / run_seconds, 3) if run_seconds > 0 and images_run else None,
        "per_shard": per_shard,
    }


def _check_group_ranks(shown: str, path: str) -> None:
    """Refuse (``FilterError``, naming the table and the column) a groups table whose ``rank``
    is not whole numbers from 0, or one of whose groups has no single rank-0 row: the rules read
    the rank to know the kept copy, and a group without one would lose every copy to them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(path, columns=["group", "rank"])
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise FilterError(f"cannot read --groups {shown}: {exc}") from None
    rank, group = t.column("rank"), t.column("group")
    if not pa.types.is_integer(rank.type) or not (pa.types.is_string(group.type)
                                                  or pa.types.is_large_string(group.type)):
        raise FilterError(f"--groups {shown}: column rank holds {rank.type} and group {group.type}, "
                          "not whole numbers and text as dedup writes them")
    grouped = pc.fill_null(pc.not_equal(pc.fill_null(group, ""), ""), False)
    ranks = pc.filter(rank, grouped)
    if ranks.null_count or (len(ranks) and pc.min(ranks).as_py() < 0):
        raise FilterError(f"--groups {shown}: a grouped row has no rank, or a negative one")
    firsts = pc.value_counts(pc.filter(pc.filter(group, grouped), pc.equal(ranks, 0)))
    n_groups = len(pc.unique(pc.filter(group, grouped)))
    if len(firsts) != n_groups or (len(firsts) and pc.max(firsts.field("counts")).as_py() != 1):
        raise FilterError(f"--groups {shown}: every group needs exactly one rank-0 row (its kept "
                          f"copy); {n_groups} group(s), {len(firsts)} with a rank-0 row")


def groups_options(groups: str, drop_duplicates: bool, kept_elsewhere: str = "stand-in") -> dict:
    """The ``FilterOptions`` fields of ``--groups``: the table's absolute path and SHA-256 (a
    setting like the others: resuming into an ``--out`` made with another table is refused,
    naming the difference), after checking that it is a groups table."""
    import pyarrow.parquet as pq

    path = os.path.abspath(groups)
    try:
        names = set(pq.read_schema(path).names)
        digest = file_digest(Path(path))["sha256"]
    except (OSError, ValueError) as exc:
        raise FilterError(f"cannot read --groups {groups}: {exc}") from None
    missing = {"shard", "key", "group", "decision", "rank"} - names
    if missing:
        raise FilterError(f"--groups {groups} is not a dedup groups.parquet (no column "
                          f"{', '.join(sorted(missing))})")
    _check_group_ranks(groups, path)
    if kept_elsewhere not in KEPT_ELSEWHERE:
        raise FilterError(f"kept_elsewhere must be one of {', '.join(KEPT_ELSEWHERE)}, not {kept_elsewhere!r}")
    return {"groups": path, "groups_digest": digest, "drop_duplicates": bool(drop_duplicates),
            "kept_elsewhere": kept_elsewhere}


def run_filter_cli(inputs: Sequence[str], out: str, detector, *, kwargs: tuple = (),
                   threshold: float | None = None, calibration: str | None = None,
                   drop_fraction: float | None = None, workers: int = 2, engine: str = "local",
                   resume: bool = True, write_rejected: bool = True, reject_no_image: bool = False,
                   dry_run: bool = False, batch_size: int = 0, quiet: bool = False,
                   limits: dict | None = None, allow_pipe: bool = True,
                   image_column: str = "", groups: str | None = None,
                   drop_duplicates: bool = False, kept_elsewhere: str = "stand-in") -> dict:
    """Resolve the threshold (explicit, calibration file, packaged default, or a drop-fraction
    cut over this data) and run the filter. ``detector`` is a created detector. ``limits``: the
    ``max_sample_bytes`` and ``max_shard_bytes`` of ``FilterOptions`` to set. ``groups``: a
    ``dedup`` groups.parquet whose decisions are applied (``decisions.apply_group``);
    ``kept_elsewhere``: ``decisions.KEPT_ELSEWHERE``."""
    from collapseguard.calibration.thresholds import (
        resolve_threshold,
        threshold_for_drop_fraction,
    )

    out = local_path(str(out)) or str(out)  # a file: URL is its local path
    base = dict(out_dir=str(out), detector=detector.name, detector_kwargs=tuple(kwargs),
                batch_size=batch_size, reject_no_image=reject_no_image,
                write_rejected=write_rejected, dry_run=dry_run, image_column=image_column,
                **(limits or {}))
    if groups:
        base.update(groups_options(groups, drop_duplicates, kept_elsewhere))
    inline = detector if workers <= 1 else None
    common = dict(workers=workers, engine=engine, resume=resume, quiet=quiet, detector=inline,
                  detector_version=detector.version, allow_pipe=allow_pipe)
    if drop_fraction is None:
        t, source, _ = resolve_threshold(detector, threshold, calibration)
        return run_filter(inputs, FilterOptions(threshold=t, **base), threshold_source=source,
                          **common)
    t0 = time.perf_counter()
    refuse_out_inside_inputs(inputs, str(out))
    # run_filter records the failed inputs
    shards = plan_shards(inputs, str(out), failed=[], allow_pipe=allow_pipe,
                         image_column=image_column or None)
    with out_lock(make_out_dir(str(out))) as run_id:  # one lock over both passes
        # pass 1: score everything (resumable like any run), pass 2: decide from those scores
        prepass = join(str(out), ".prepass")
        # the scoring pass decides nothing, so it applies no groups (the second pass does)
        first = FilterOptions(**{**base, "out_dir": prepass, "dry_run": True,
                                 "threshold": float("inf"), "groups": "", "groups_digest": "",
                                 "drop_duplicates": False})
        s1 = run_filter(inputs, first, threshold_source="scoring pass for --drop-fraction", **common)
        if s1["shards_failed"]:
            raise FilterError("scoring pass failed for: " + ", ".join(s1["shards_failed"]))
        # only this run's shards: .prepass may hold scores of shards filtered here before
        pre = open_out_dir(prepass)
        scores = []
        for s in shards:
            scores += [v for v in pre.read_table(output_names(s)["scores"], ["score"]).column("score").to_pylist()
                       if v is not None]
        t = threshold_for_drop_fraction(scores, drop_fraction)
        n_cut = sum(1 for v in scores if not math.isnan(v))  # the cut ranks every score, +-inf too
        unscored = f", {len(scores) - n_cut} sample(s) without a score left out" if n_cut < len(scores) else ""
        source = (f"uncalibrated: --drop-fraction {drop_fraction:g} of this data (threshold {t:.6g} "
                  f"from {n_cut} scores{unscored}; no guarantee about clean images)")
        second = FilterOptions(threshold=t, scores_from=prepass, **base)
        s2 = run_filter(inputs, second, threshold_source=source, **common)
        # the images were scored in the first pass (none when it was resumed): the speed is theirs
        # over both passes
        images = s1["images_this_run"]
        s2["images_this_run"] = images
        s2["images_per_second"] = round(images / (time.perf_counter() - t0), 3) if images else None
        write_summary(str(out), s2, run_id)
        return s2
