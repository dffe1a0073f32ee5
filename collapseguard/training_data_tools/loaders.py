"""Load replication chains from a manifest, a folder of chains, or a Banana100 download.

``load_chains(path)`` accepts:

- a manifest file (``.csv``, ``.tsv``, ``.parquet``) or a folder holding ``manifest.csv``;
- a folder without a manifest whose subfolders hold them (several ``chains make`` outputs): each
  manifest is read as ``read_manifest`` reads it and they are combined (a chain id given by two
  of them with different images is refused); images no manifest names are reported as unplaced;
- a folder of chains in common layouts: one folder per chain whose files carry the step in their
  names (``0.png``, ``step_012.png``, ``iter12.jpg``, ``012.webp``, ``image_0012.png``), optionally
  nested under family and task folders (``FAMILY/TASK/CHAIN/step.png`` or ``FAMILY/CHAIN/...``),
  which become those columns; or flat files ``CHAIN_<step>.png`` grouped by their prefix. A
  folder named directly that holds its images at its top, with bare step numbers
  (``IMG_0001.jpg``, ``step_000.png``), is one chain named after the folder, as when its parent
  is named;
- a Hugging Face ``imagefolder`` with ``metadata.csv``/``metadata.jsonl`` (a ``file_name`` column
  plus chain/step columns under common names);
- a Hugging Face Parquet dataset (for example ``kenantang/Banana100`` as downloaded, whose exact
  layout is not known here): image bytes are extracted once to ``extract_dir`` and chains are
  inferred from column names.

``discover_chains(path)`` returns a ``Discovery``: the manifest, the layout it inferred, notes on
what it guessed, and every file it could not place with the reason. When nothing can be read,
``ChainLayoutError`` says what was seen (file counts by type, example paths, columns).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pandas as pd

from collapseguard.errors import CollapseguardError
from collapseguard.images import is_image_name
from collapseguard.io.atomic import replaced_when_done
from collapseguard.io.walk import walk
from collapseguard.training_data_tools.manifest import (
    MANIFEST_NAMES,
    MAX_STEP,
    ManifestError,
    read_manifest,
    validate_manifest,
)

#: words that precede a step number in a file name (and are not a chain name)
STEP_WORDS = {"", "step", "steps", "iter", "iteration", "iterations", "it", "round", "turn",
              "gen", "generation", "image", "img", "frame", "t", "s", "epoch", "edit", "output",
              "out", "result", "sample", "pass", "v", "p"}
#: names of a chain's original (step 0) when it is not numbered
ORIGINAL_NAMES = {"original", "orig", "source", "src", "input", "init", "start", "reference",
                  "ref", "gt", "base", "seed"}
#: column aliases for metadata/parquet datasets
ALIASES = {
    "chain_id": ["chain_id", "chain", "chain_idx", "sequence", "sequence_id", "seq_id", "trajectory",
                 "trajectory_id", "run", "run_id", "sample_id", "image_id", "img_id", "id"],
    "step": ["step", "iteration", "iter", "round", "turn", "generation", "gen", "index", "t", "idx"],
    "family": ["family", "model", "model_name", "generator", "editor", "method"],
    "task": ["task", "task_type", "edit_type", "prompt_type", "category", "setting", "instruction"],
    "source_image": ["source_image", "source", "original", "source_id", "image_name", "start_image"],
}
_NUM = re.compile(r"^(.*?)(\d+)$")


class ChainLayoutError(CollapseguardError, ValueError):
    """No chains could be inferred; the message lists what was seen."""


@dataclass
class Discovery:
    """What ``discover_chains`` found."""

    manifest: pd.DataFrame
    layout: str
    notes: list[str] = field(default_factory=list)
    #: (path, reason) for every image file that is in no chain
    unplaced: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        """A short human-readable report (used by ``collapseguard chains ls``)."""
        df = self.manifest
        lines = [f"layout: {self.layout}",
                 (f"chains: {df['chain_id'].nunique()}  images: {len(df)}  "
                 f"source images: {df['source_image'].nunique()}")]
        for col in ("family", "task"):
            counts = df.groupby(col)["chain_id"].nunique().sort_values(ascending=False)
            lines.append(f"{col + ' chains':<14}" + ", ".join(f"{k}: {v}" for k, v in counts.items()))
        steps = sorted(df["step"].unique())
        lines.append(f"steps: {_ranges(steps)}")
        per = df.groupby("chain_id")["step"].agg(["count", "max"])
        lines.append(f"images per chain: {per['count'].min()}-{per['count'].max()}, "
                     f"last step per chain: {per['max'].min()}-{per['max'].max()}")
        for n in self.notes:
            lines.append(f"note: {n}")
        if self.unplaced:
            lines.append(f"could not place {len(self.unplaced)} file(s):")
            for p, why in self.unplaced[:20]:
                lines.append(f"  {p}: {why}")
            if len(self.unplaced) > 20:
                lines.append(f"  ... and {len(self.unplaced) - 20} more")
        return "\n".join(lines)


def _ranges(values: list[int]) -> str:
    if len(values) > 12:
        return f"{len(values)} distinct, {values[0]}..{values[-1]}: " + ",".join(map(str, values[:12])) + ",..."
    return ",".join(str(v) for v in values)


#: the note on chains whose steps were shifted down by one (``_finish``): every reader says it,
#: since a step k of the user's files is then step k - 1 of every figure
RENUMBERED = ("chain(s) numbered from 1 without an original were renumbered from 0 (their first "
              "image is taken as the original, and each step is one less than its file's number)")


def load_chains(path: str | Path, extract_dir: str | Path | None = None,
                check_files: bool = True, notes: list[str] | None = None) -> pd.DataFrame:
    """Load chains from any supported input (see module doc) as a validated manifest DataFrame.
    ``notes`` (optional) receives one line when image files under ``path`` are in no chain
    (``unplaced_note``): a reader that goes on without them says so; and one when chains
    numbered from 1 were renumbered from 0 (``RENUMBERED``)."""
    found = discover_chains(path, extract_dir=extract_dir, check_files=check_files)
    if notes is not None:
        notes.extend(n for n in found.notes if RENUMBERED in n)
        if found.unplaced:
            notes.append(unplaced_note(path, found.unplaced))
    return found.manifest


def unplaced_note(path: str | Path, unplaced: list[tuple[str, str]]) -> str:
    """One line for the image files under ``path`` that are in no chain, the first named with
    why, and where to see them all."""
    first, why = unplaced[0]
    return (f"{len(unplaced)} image file(s) under {_shown(str(path))} are in no chain and not read "
            f"(e.g. {_shown(first)}: {why}); `collapseguard chains ls` lists each with its reason")


def discover_chains(path: str | Path, extract_dir: str | Path | None = None,
                    check_files: bool = True, one_based: bool | None = None) -> Discovery:
    """Find chains under ``path`` and say how (see module doc).

    ``one_based``: when a chain has no step 0 and no original-named file but starts at step 1,
    ``None`` (default) renumbers it from 0 and says so in ``notes`` when no chain of the set has a
    step 0 (a set numbered from 1), and drops it as unplaced otherwise (a set numbered from 0 that
    lost one original: its step 1 is no original); ``False`` drops such chains as unplaced;
    ``True`` always renumbers.
    """
    path = Path(path)
    if not path.exists():
        raise ChainLayoutError(f"{path} does not exist")
    if path.is_file():
        if path.suffix.lower() in (".csv", ".tsv", ".parquet"):
            try:
                return Discovery(read_manifest(path, check_files=check_files), "manifest file")
            except ManifestError:
                if path.suffix.lower() != ".parquet":
                    raise
                return _from_parquet([path], path.parent, extract_dir, one_based)
        raise ChainLayoutError(f"{path}: expected a manifest (.csv/.tsv/.parquet) or a folder")
    for name in MANIFEST_NAMES:
        if (path / name).is_file():
            return Discovery(read_manifest(path / name, check_files=check_files), f"manifest {name}")
    walked = walk(path)  # folder links followed, loops and outside file links reported (io.walk)
    shown = [(p, real) for p, real in walked.files if not _hidden(p.relative_to(path))]
    skipped = [(r, why) for r, why in walked.skipped
               if not _hidden(Path(r)) and (is_image_name(r) or "folder" in why)]
    nested = _nested_manifests(path, [p for p, _ in shown])
    if nested:
        return _from_nested_manifests(path, nested, shown, skipped, check_files)
    for name in ("metadata.csv", "metadata.jsonl"):
        meta = sorted(p for p, _ in walked.files if p.name == name)
        if meta:
            return _from_metadata(path, meta, one_based)
    parquets = sorted(p for p, _ in shown if p.suffix == ".parquet")
    images = sorted(p for p, _ in shown if is_image_name(p.name))
    if images:
        try:
            return _from_folders(path, images, one_based, dict(shown), skipped)
        except ChainLayoutError:
            if not parquets:
                raise
    if parquets:
        return _from_parquet(parquets, path, extract_dir, one_based)
    raise ChainLayoutError(_seen(path, "no image, manifest, metadata or parquet files"))


def _nested_manifests(root: Path, files: list[Path]) -> list[Path]:
    """The manifests of sets inside ``root`` (a folder holding several ``chains make`` outputs):
    one per folder (``manifest.csv`` before ``manifest.parquet``, as ``read_manifest`` picks), and
    none inside a folder whose own manifest is read (that manifest covers its folder)."""
    by_folder: dict[Path, Path] = {}
    for p in files:
        if p.name in MANIFEST_NAMES and p.is_file():
            have = by_folder.get(p.parent)
            if have is None or MANIFEST_NAMES.index(p.name) < MANIFEST_NAMES.index(have.name):
                by_folder[p.parent] = p
    return [m for folder, m in sorted(by_folder.items())
            if not any(other in folder.parents for other in by_folder)]


def _listed(names: list[str], n: int = 5) -> str:
    """The first ``n`` names and a count of the rest (messages are one line)."""
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _same_chain(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """The same chain given twice: the same steps and labels, and files of the same bytes."""
    import filecmp

    cols = ["step", "source_image", "family", "task"]
    a, b = a.sort_values("step"), b.sort_values("step")
    if a[cols].astype(str).values.tolist() != b[cols].astype(str).values.tolist():
        return False
    try:
        return all(filecmp.cmp(x, y, shallow=False) for x, y in zip(a["path"], b["path"]))
    except OSError:
        return False


def _from_nested_manifests(root: Path, manifests: list[Path], shown: list[tuple[Path, Path]],
                           skipped: list[tuple[str, str]], check_files: bool) -> Discovery:
    """Chains from the manifests of several sets in subfolders of ``root`` (which has no manifest
    of its own), each read and validated as ``read_manifest`` reads it (paths relative to its own
    folder), combined. A chain id in two manifests is read once when both give the same images,
    and refused otherwise: two chains under one id would be read as one chain, or ranked one
    against the other. Images that no manifest names are reported as unplaced."""
    frames, first, twice, named = [], {}, [], set()
    rels = [m.relative_to(root).as_posix() for m in manifests]
    for m, rel in zip(manifests, rels):
        df = read_manifest(m, check_files=check_files)
        named |= {Path(p).resolve() for p in df["path"]}
        keep = pd.Series(True, index=df.index)
        for cid, g in df.groupby("chain_id", sort=False):
            if cid not in first:
                first[cid] = (rel, g)
                continue
            where, other = first[cid]
            if not _same_chain(other, g):
                raise ChainLayoutError(
                    f"chain {_shown(str(cid))!r} is in both {where} and {rel} with different images "
                    f"or labels: two chains under one chain_id would be read as one (or ranked one "
                    f"against the other); give them different chain_ids, or read each set on its own")
            twice.append(str(cid))
            keep &= df["chain_id"] != cid
        frames.append(df[keep])
    df = pd.concat(frames, ignore_index=True)
    validate_manifest(df, check_files=False, where=f"the manifests under {root}")
    notes = [f"read {len(manifests)} manifest(s) in subfolders: {_listed(rels)}"]
    if twice:
        notes.append(f"{len(twice)} chain(s) given with the same images by two manifests were read "
                     f"once: {_listed([_shown(c) for c in twice])}")
    inner = sorted(p.relative_to(root).as_posix() for p, _ in shown
                   if p.name in MANIFEST_NAMES and p not in manifests)
    if inner:
        notes.append(f"not read: {_listed(inner)} (inside a folder whose own manifest was read)")
    unplaced = list(skipped)
    for seen, real in shown:
        if is_image_name(seen.name) and real.resolve() not in named:
            unplaced.append((_shown(seen.relative_to(root).as_posix()), "named by no manifest"))
    df = df.sort_values(["family", "task", "chain_id", "step"], kind="stable").reset_index(drop=True)
    return Discovery(df, f"manifests in subfolders ({len(manifests)})", notes, unplaced)


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _seen(root: Path, why: str, extra: list[str] | None = None) -> str:
    """A one-line message listing what is under ``root`` (for layouts that could not be read):
    the command line prints errors as one line, so its parts are joined with "; "."""
    files = [p for p in walk(root).paths if not _hidden(p.relative_to(root))]
    exts = Counter(p.suffix.lower() or "(none)" for p in files)
    dirs = sorted({p.parent.relative_to(root).as_posix() for p in files})
    parts = [f"could not find replication chains under {root}: {why}",
             f"seen: {len(files)} file(s) in {len(dirs)} folder(s), by type: "
             + (", ".join(f"{e} {n}" for e, n in exts.most_common(10)) or "none")]
    if files:
        parts.append("e.g. " + _listed([_shown(p.relative_to(root).as_posix()) for p in files]))
    parts += [x.strip() for x in extra or []]
    parts.append("supported: a manifest (.csv/.parquet with chain_id, source_image, family, task, "
                 "step, path), CHAIN/STEP.png folders (optionally under FAMILY/TASK/), flat "
                 "CHAIN_STEP.png files, an imagefolder metadata.csv/jsonl with file_name + chain and "
                 "step columns, or Parquet with an image column plus chain and step columns")
    return "; ".join(parts)


def parse_step(stem: str) -> tuple[str, int] | None:
    """Split a file stem into (chain prefix, step) or None when it carries no step.

    ``"012"`` -> ("", 12); ``"step_012"``/``"iter12"``/``"image_0012"`` -> ("", 12);
    ``"cat_007"`` -> ("cat", 7); ``"original"`` -> ("", 0).
    """
    s = stem.strip()
    if s.lower() in ORIGINAL_NAMES:
        return "", 0
    m = _NUM.match(s)
    if not m:
        return None
    prefix = m.group(1)
    step = int(m.group(2))
    # "-1", "step_-1": a minus sign after a separator (or at the start) makes the step negative
    # (such a file is reported, not read as step 1); "cat-7" is chain "cat", step 7
    if prefix.endswith("-") and (len(prefix) == 1 or prefix[-2] in "_. -"):
        step = -step
    prefix = prefix.rstrip("_-. ")
    if prefix.lower() in STEP_WORDS:
        prefix = ""
    else:
        # "cat_iter_7" -> chain "cat"
        parts = re.split(r"[_\-. ]+", prefix)
        if parts and parts[-1].lower() in STEP_WORDS and len(parts) > 1:
            prefix = "_".join(parts[:-1])
    return prefix, step


def _finish(rows: list[dict], unplaced: list[tuple[str, str]], notes: list[str],
            one_based: bool | None) -> pd.DataFrame:
    """Group rows into chains: drop duplicate steps, fix or drop chains without step 0."""
    by_chain: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_chain[r["chain_id"]].append(r)
    out, renumbered = [], 0
    # numbered from 1 is a property of the set: where any chain starts at 0, a chain that starts
    # at 1 has lost its original, and its step 1 must not become one
    from_zero = any(r["step"] == 0 for r in rows)

    def name(r: dict) -> str:  # as found (relative to the folder), not the resolved file
        return r.get("_rel", r["path"])

    for cid, rs in by_chain.items():
        keep = []
        for r in rs:
            if not 0 <= r["step"] <= MAX_STEP:
                unplaced.append((name(r), f"step {r['step']} is not a number from 0 to {MAX_STEP}"))
            else:
                keep.append(r)
        rs = keep
        steps = Counter(r["step"] for r in rs)
        first = min(steps, default=0)  # before duplicates go: a doubled original is no "from 1"
        dups = {s for s, n in steps.items() if n > 1}
        if dups:
            keep = []
            for r in rs:
                if r["step"] in dups:
                    unplaced.append((name(r), f"chain {cid} has step {r['step']} more than once"))
                else:
                    keep.append(r)
            rs = keep
        if len(rs) < 2:
            unplaced += [(name(r), f"chain {cid}: a chain needs at least two steps") for r in rs]
            continue
        if min(r["step"] for r in rs) != 0:
            if (one_based is False or (one_based is None and from_zero) or first != 1
                    or min(r["step"] for r in rs) != 1):
                why = "an ambiguous step 0 (original)" if first == 0 else "no step 0 (original)"
                unplaced += [(name(r), f"chain {cid} has {why}") for r in rs]
                continue
            for r in rs:
                r["step"] -= 1
            renumbered += 1
        out += rs
    if renumbered:
        notes.append(f"{renumbered} {RENUMBERED}")
    if not out:
        raise ChainLayoutError("")
    df = pd.DataFrame(out)
    validate_manifest(df, check_files=False, where="discovered chains")
    return df.sort_values(["family", "task", "chain_id", "step"], kind="stable").reset_index(drop=True)


def _rows_from_names(items: list[tuple[PurePosixPath, str]],
                     top_chain: str | None = None) -> tuple[list[dict], list, Counter]:
    """Place files by their relative names: ``(relative name, real path)`` -> chain rows.

    ``top_chain``: the chain that files with a bare step number at the top level belong to (the
    named folder is itself one chain's folder); ``None``: such files are unplaced."""
    rows, unplaced, kinds = [], [], Counter()
    for rel, real in items:
        parsed = parse_step(rel.stem)
        if parsed is None:
            unplaced.append((rel.as_posix(), "no step number in the file name"))
            continue
        prefix, step = parsed
        folders = list(rel.parent.parts)
        if prefix:  # flat: CHAIN_STEP files; folders above are family/task
            chain_name, above = prefix, folders
            kinds["flat"] += 1
        else:  # one folder per chain
            if not folders and top_chain:
                folders = [top_chain]
            if not folders:
                unplaced.append((rel.as_posix(), ("a bare step number at the top level: put each "
                                 "chain in its own folder")))
                continue
            chain_name, above = folders[-1], folders[:-1]
            kinds["folder"] += 1
        family = above[0] if above else "unknown"
        task = "/".join(above[1:]) if len(above) > 1 else "unknown"
        cid = "/".join(above + [chain_name])
        # the same chain name under several family/task folders = the same start image
        rows.append({"chain_id": cid, "source_image": chain_name, "family": family, "task": task,
                     "step": step, "path": real, "_rel": rel.as_posix()})
    return rows, unplaced, kinds


def _safe_rel(name: str) -> PurePosixPath:
    """An untrusted stored file name as a relative name (no root, no '..'), for parsing only."""
    parts = [p for p in str(name).replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return PurePosixPath(*parts) if parts else PurePosixPath("unnamed")


def _shown(name: str) -> str:
    """A file name as it can be printed: bytes that are not UTF-8 (surrogate escapes) as \\xNN."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _from_folders(root: Path, images: list[Path], one_based: bool | None,
                  reals: dict[Path, Path], skipped: list[tuple[str, str]]) -> Discovery:
    """Chains from image files found by ``io.walk`` (``reals``: seen path -> real path; links to
    files outside the folders the user named or linked are already in ``skipped``)."""
    items, unplaced = [], list(skipped)
    for p in images:
        rel = p.relative_to(root).as_posix()
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            unplaced.append((_shown(rel), "the file name is not valid UTF-8"))
            continue
        items.append((PurePosixPath(rel), str(reals[p])))
    notes: list[str] = []
    # every image at the top, none in a subfolder: the named folder is one chain's folder
    # (``IMG_0001.jpg``, ``step_000.png`` ...), read as it is when its parent is named: one chain
    # named after the folder
    top_chain = None
    if items and all(len(rel.parts) == 1 for rel, _ in items):
        name = root.name if root.name not in ("", ".", "..") else root.resolve().name
        top_chain = _shown(name) or "chain"
    rows, more, kinds = _rows_from_names(items, top_chain)
    unplaced += more
    if top_chain and any(r["chain_id"] == top_chain for r in rows):
        notes.append(f"files numbered at the top of {_shown(str(root))} are read as one chain named "
                     f"after the folder ({top_chain!r}), as they are when its parent folder is named")
    _image_model_layout(rows, notes)
    try:
        df = _finish(rows, unplaced, notes, one_based)
    except ChainLayoutError:
        listed = [f"  unplaced {p}: {w}" for p, w in unplaced[:5]]
        if len(unplaced) > 5:
            listed.append(f"and {len(unplaced) - 5} more file(s) unplaced")
        raise ChainLayoutError(_seen(root, "no folder or file group forms a chain with numbered steps",
                                     listed)) from None
    depth = Counter(len(Path(r).parts) for r in df["_rel"])
    df = df.drop(columns=["_rel"])
    layout = " + ".join(f"{k} ({n} files)" for k, n in kinds.items())
    layout = f"chain folders: {layout}; path depth {dict(depth)}"
    if (df["family"] == "unknown").all():
        notes.append("no family folders: family is 'unknown'")
    return Discovery(df, layout, notes, unplaced)


def _image_model_layout(rows: list[dict], notes: list[str]) -> None:
    """Read ``IMAGE/MODEL/step.png`` (Banana100-like: one folder per start image, one chain per
    model inside) the right way round.

    Read as ``FAMILY/CHAIN`` such a tree swaps family and source image, and a split by source would
    put one picture on both sides. The originals tell the layouts apart: in ``IMAGE/MODEL`` the
    chains under one top folder share their step-0 file; in ``FAMILY/CHAIN`` they start from
    different pictures. Only when that is so for every top folder (at least two, one holding two
    chains, each with its own original, and a name below recurring under two of them) are family
    and source swapped, in place, with a note.
    """
    import hashlib

    if not rows or any(r["task"] != "unknown" or r["chain_id"] != f"{r['family']}/{r['source_image']}"
                       for r in rows):
        return
    originals: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r["step"] == 0:
            originals[r["chain_id"]].append(r["path"])
    by_top: dict[str, set[bytes]] = defaultdict(set)
    n_chains: Counter = Counter()
    for cid, paths in originals.items():
        if len(paths) != 1:
            continue
        try:
            digest = hashlib.sha256(Path(paths[0]).read_bytes()).digest()
        except OSError:
            return
        top = cid.split("/", 1)[0]
        by_top[top].add(digest)
        n_chains[top] += 1
    if len(by_top) < 2 or max(n_chains.values()) < 2 or any(len(d) != 1 for d in by_top.values()):
        return
    tops_of = defaultdict(set)
    for cid in originals:
        top, _, leaf = cid.partition("/")
        tops_of[leaf].add(top)
    if max(len(t) for t in tops_of.values()) < 2:  # no model name recurs under two images
        return
    if len({next(iter(d)) for d in by_top.values()}) < len(by_top):  # two top folders, one picture
        return
    for r in rows:
        r["family"], r["source_image"] = r["source_image"], r["family"]
    notes.append("the chains in each top folder share one original (step 0): read as "
                 "IMAGE/MODEL/step files (top folders are source images, the names below them "
                 "families)")


def _pick(columns: list[str], key: str) -> str | None:
    lower = {c.lower(): c for c in columns}
    for alias in ALIASES[key]:
        if alias in lower:
            return lower[alias]
    return None


def _rows_from_table(t: pd.DataFrame, where: str, path_of) -> tuple[list[dict], list[str]]:
    """Map a metadata table to manifest rows; ``path_of(row)`` gives the image path."""
    cols = list(t.columns)
    step_c, chain_c = _pick(cols, "step"), _pick(cols, "chain_id")
    fam_c, task_c, src_c = _pick(cols, "family"), _pick(cols, "task"), _pick(cols, "source_image")
    notes = [(f"{where}: columns {cols}; using step={step_c}, chain={chain_c or src_c}, "
             f"family={fam_c}, task={task_c}")]
    if step_c is None or (chain_c is None and src_c is None):
        raise ChainLayoutError(f"{where}: cannot tell chain and step apart; columns seen: {cols}. "
                               f"Step columns tried: {ALIASES['step']}; chain columns tried: "
                               f"{ALIASES['chain_id'] + ALIASES['source_image']}")
    rows = []
    for _, r in t.iterrows():
        fam = str(r[fam_c]) if fam_c else "unknown"
        task = str(r[task_c]) if task_c else "unknown"
        chain = str(r[chain_c] if chain_c else r[src_c])
        # the same image id may be replicated by several models / tasks: one chain each
        cid = "/".join(x for x in (fam if fam_c else "", task if task_c else "", chain) if x)
        step = pd.to_numeric(r[step_c], errors="coerce")
        if pd.isna(step):
            continue
        rows.append({"chain_id": cid, "source_image": str(r[src_c]) if src_c else chain,
                     "family": fam, "task": task, "step": int(step), "path": path_of(r)})
    return rows, notes


def _from_metadata(root: Path, metas: list[Path], one_based: bool | None) -> Discovery:
    rows, notes, unplaced = [], [], []
    for meta in metas:
        if meta.suffix == ".csv":
            t = pd.read_csv(meta, dtype=str, keep_default_na=False, na_values=[""])  # "NA" is a name
        else:
            t = pd.DataFrame([json.loads(line) for line in meta.read_text().splitlines() if line.strip()])
        if "file_name" not in t.columns:
            raise ChainLayoutError(f"{meta}: an imagefolder metadata file needs a file_name column; "
                                   f"columns seen: {list(t.columns)}")
        base = meta.parent.resolve()

        def path_of(r, base=base, meta=meta):
            p = (base / str(r["file_name"])).resolve()
            if base not in p.parents:
                raise ChainLayoutError(f"{meta}: file_name {r['file_name']!r} points outside its folder")
            return str(p)

        r, n = _rows_from_table(t, meta.relative_to(root).as_posix(), path_of)
        rows += r
        notes += n
    df = _finish(rows, unplaced, notes, one_based)
    gone = [p for p in df["path"] if not Path(p).is_file()]
    if gone:
        raise ChainLayoutError(f"metadata names {len(gone)} missing file(s), e.g. {gone[:3]}")
    return Discovery(df, "imagefolder metadata", notes, unplaced)


def _image_column(t) -> str | None:
    import pyarrow as pa
    for name, typ in zip(t.schema.names, t.schema.types):
        if pa.types.is_struct(typ) and "bytes" in [f.name for f in typ]:
            return name
        if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
            return name
    return None


def _from_parquet(files: list[Path], root: Path, extract_dir, one_based: bool | None) -> Discovery:
    """Read a Hugging Face Parquet dataset; extract image bytes to ``extract_dir`` (once)."""
    import pyarrow.parquet as pq

    extract = Path(extract_dir) if extract_dir else root / ".collapseguard_extracted"
    rows, notes, unplaced, seen = [], [], [], []
    for f in files:
        t = pq.read_table(f)
        img_c = _image_column(t)
        seen.append(f"  {f.relative_to(root).as_posix() if root in f.parents else f}: "
                    f"{t.num_rows} rows, columns {t.schema.names}")
        if img_c is None:
            continue
        meta = t.drop_columns([img_c]).to_pandas()
        col = t.column(img_c).to_pylist()
        # one folder per parquet file: config folders often hold files of the same name
        # (flux2/train-00000.parquet, qwen/train-00000.parquet), whose images must not mix
        out_dir = extract / (f.relative_to(root).with_suffix("") if root in f.parents else f.stem)
        _refuse_links(extract, out_dir, check_root=not extract_dir)
        out_dir.mkdir(parents=True, exist_ok=True)

        def path_of(r, col=col, out_dir=out_dir, f=f):
            i = int(r.name)
            v = col[i]
            data = v.get("bytes") if isinstance(v, dict) else v
            if not data:
                raise ChainLayoutError(f"{f}: row {i} has no image bytes")
            ext = _sniff(data)
            p = out_dir / f"{i:07d}.{ext}"
            # kept only when it is this file already: a link (a dataset can ship one here) is
            # replaced, never written through or followed
            if p.is_symlink() or not p.is_file() or p.stat().st_size != len(data):
                with replaced_when_done(p) as tmp:
                    Path(tmp).write_bytes(data)
            return str(p.resolve())

        try:
            r, n = _rows_from_table(meta, f.name, path_of)
        except ChainLayoutError as e:
            names = _stored_names(col, meta)
            if names is None:
                raise ChainLayoutError(f"{e}; no stored file names to infer chains from either; "
                                       "parquet files seen: " + "; ".join(x.strip() for x in seen)) from None
            r, un, _ = _rows_from_names([(_safe_rel(nm), path_of(meta.iloc[i]))
                                         for i, nm in enumerate(names)])
            unplaced += un
            n = [(f"{f.name}: no chain/step columns ({list(meta.columns)}); chains inferred from the "
                 "stored image file names as if they were a folder layout")]
            _image_model_layout(r, n)
        for row in r:
            row.pop("_rel", None)
        rows += r
        notes += n
    if not rows:
        raise ChainLayoutError(_seen(root, "parquet files hold no image column", seen))
    notes.append(f"images extracted to {extract}")
    df = _finish(rows, unplaced, notes, one_based)
    return Discovery(df, "parquet dataset", notes, unplaced)


def _refuse_links(extract: Path, out_dir: Path, check_root: bool) -> None:
    """The extraction folders are written to: a link among them, which a downloaded dataset can
    ship inside its own folder, would send the writes elsewhere. ``check_root``: the extraction
    root itself too (the default one, inside the dataset; a folder the user named may be a link)."""
    folders = [out_dir, *[q for q in out_dir.parents if extract in q.parents]]
    for q in folders + ([extract] if check_root else []):
        if q.is_symlink():
            raise ChainLayoutError(f"{q} is a link: images are extracted only into real folders "
                                   "(remove the link, or extract elsewhere with `collapseguard chains "
                                   "ls PATH --extract-dir DIR --manifest-out M.csv` and use M.csv)")


def _stored_names(col: list, meta: pd.DataFrame) -> list[str] | None:
    """File names stored with the images (HF ``Image`` struct ``path``, or a name column)."""
    names = [v.get("path") if isinstance(v, dict) else None for v in col]
    if sum(1 for n in names if n) >= 0.9 * max(1, len(names)):
        return [n or "" for n in names]
    for c in ("file_name", "filename", "path", "image_path", "name", "file"):
        if c in meta.columns and meta[c].notna().mean() >= 0.9:
            return [str(v) for v in meta[c].fillna("")]
    return None


def _sniff(data: bytes) -> str:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "bin"
