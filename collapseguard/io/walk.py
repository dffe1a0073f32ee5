"""Walking a folder the user named, links included: one rule for every command that reads folders
(score, calibrate, train, chains ls/export).

People assemble data sets without copying: a folder whose family or chain subfolders are symbolic
links to where the data really lies. The rule:

- **A link to a folder is followed, wherever it points.** Whoever put the link inside the folder
  chose that folder as part of the data set, exactly as if it had been copied there; reading it
  gives that user nothing they could not read already.
- **A folder is read once.** A link back to a folder above it (a loop) is reported and not
  followed; a second link to a folder already read is reported and not read again (its images
  would count twice).
- **A link to a single file** is read wherever it points by the commands that read data to score
  it (``score``, ``calibrate``, ``audit``, ``train --clean``; ``file_links="anywhere"``): a folder
  of links to shards or images is an ordinary way to name data (the training recipe links its
  clean pictures out of unpacked packages), and a broken link becomes a row with its OS error.
  The chain readers (``chains ls/export``, ``train --chains``; ``file_links="inside"``) read a file link
  only when the file lies inside the named folder or inside a folder reached through a folder
  link (the trees the user chose). Any other (``step_2.png -> ~/private.png``) is reported as "a
  link to a file outside the folder" and never read: ``chains export`` packs image files into
  shards meant to be shared, chain folders often come from downloaded archives, and an archive
  can carry such a link, so export never packs a file from outside the folders the user named
  or linked.
- Folders that cannot be listed are reported, not fatal. With ``file_links="anywhere"``, FIFOs,
  devices and links to them are listed like files, so the command that reads them refuses each by
  name (a FIFO would block a reader); the chain readers skip and report them.

``walk(root)`` returns the files in os.walk's order (a folder's files by name, then its
subfolders by name) as ``(path as seen under root, real path)``, and the ``(relative name, why)``
of what was skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

OUTSIDE = "a link to a file outside the folder"


@dataclass
class Walk:
    #: ``(path as seen under the root, resolved path)``, in walk order
    files: list[tuple[Path, Path]] = field(default_factory=list)
    #: ``(path relative to the root, why it was not read)``
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def paths(self) -> list[Path]:
        return [seen for seen, _ in self.files]


def walk(root: str | os.PathLike, file_links: str = "inside") -> Walk:
    """Every file under ``root`` by the module's rule (see the module docstring);
    ``file_links`` is ``"inside"`` or ``"anywhere"``."""
    if file_links not in ("inside", "anywhere"):
        raise ValueError(f"file_links must be 'inside' or 'anywhere', not {file_links!r}")
    root = Path(root)
    out = Walk()
    real_root = root.resolve()
    trees = [real_root]  # the real folders the user chose: the root and every linked folder
    visited = {real_root}
    links: list[tuple[int, Path, Path]] = []  # file links (position, seen, real): judged at the end

    def rel(p: Path) -> str:
        return p.relative_to(root).as_posix()

    def visit(folder: Path, ancestors: frozenset) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            if folder != root:
                out.skipped.append((rel(folder), f"cannot list the folder ({exc.strerror or exc})"))
            return
        subfolders: list[tuple[Path, Path, bool]] = []  # (seen, real, reached by a link)
        for e in entries:
            p = folder / e.name
            try:
                if e.is_symlink():
                    try:
                        real = p.resolve(strict=True)
                    except (OSError, RuntimeError):
                        if file_links == "anywhere":  # read, and its OS error recorded
                            out.files.append((p, p))
                        else:
                            out.skipped.append((rel(p), "a broken link (or a link loop)"))
                        continue
                    if real.is_dir():
                        subfolders.append((p, real, True))
                    elif real.is_file() or file_links == "anywhere":
                        links.append((len(out.files), p, real))
                        out.files.append((p, real))
                    else:
                        out.skipped.append((rel(p), "a link to something that is not a file"))
                elif e.is_dir(follow_symlinks=False):
                    subfolders.append((p, p.resolve(), False))
                elif e.is_file(follow_symlinks=False) or file_links == "anywhere":
                    # "anywhere": FIFOs and devices are listed too, for the reader to refuse by name
                    out.files.append((p, p.resolve()))
                else:
                    out.skipped.append((rel(p), "not a regular file"))
            except OSError as exc:
                out.skipped.append((rel(p), f"cannot read it ({exc.strerror or exc})"))
        for p, real, linked in subfolders:
            if real in ancestors:
                out.skipped.append((rel(p), "a link loop: it points to a folder above it"))
            elif real in visited:
                if linked:
                    out.skipped.append((rel(p), "a link to a folder already read"))
            else:
                visited.add(real)
                if linked:
                    trees.append(real)
                visit(p, ancestors | {real})

    visit(root, frozenset({real_root}))
    outside = set()
    for i, seen, real in links if file_links == "inside" else ():
        if not any(real.is_relative_to(t) for t in trees):
            outside.add(i)
            out.skipped.append((rel(seen), OUTSIDE))
    if outside:
        out.files = [f for i, f in enumerate(out.files) if i not in outside]
    return out
