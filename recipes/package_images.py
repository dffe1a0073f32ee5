"""Clean pictures from Debian packages, picked by rule: what recipes/eval_set.py and
recipes/calibration_kinds.py share.

``fetch_packages`` runs ``apt-get download`` and ``dpkg -x`` (into ``DEBS/x/<package>``);
``package_table`` lists each package's version and the licences its copyright file names;
``pick_sources`` takes, rule by rule (kind, package, file pattern, how many, window), files at least
``min_side`` on the short side, not blank (the spread of all pixel values, channels together, at
least 4 levels: one grey is blank, a single flat colour is flat art), no near-duplicates, evenly
spaced over the sorted matches; larger images are cut to a native-resolution ``side`` x ``side``
window (never resized), the centre one or, for sprites, the top one, moved to the busiest of five
places when that window is nearly flat. A rule's pattern is an fnmatch pattern under the package
root (``*`` crosses folders); ``|`` separates alternatives; ``ARCHIVE.pk3:PATTERN`` reads the
members of a zip archive.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from collapseguard.images import DecodeError, decode_image

#: (kind, package, pattern, at most how many, window "centre" or "top")
Rule = tuple[str, str, str, int, str]


def log(msg: str) -> None:
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fetch_packages(debs: Path, packages: Sequence[str]) -> None:
    """Download and unpack each of ``packages`` not unpacked under ``DEBS/x`` yet."""
    x = debs / "x"
    missing = [p for p in packages if not (x / p / ".unpacked").exists()]
    if not missing:
        return
    debs.mkdir(parents=True, exist_ok=True)
    log(f"apt-get download {len(missing)} package(s)")
    subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True, stdout=subprocess.DEVNULL)
    for p in missing:
        deb = sorted(debs.glob(f"{p}_*.deb"))
        if not deb:
            raise SystemExit(f"apt-get download did not bring {p}")
        (x / p).mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(deb[-1]), str(x / p)], check=True)
        (x / p / ".unpacked").touch()


def package_table(debs: Path, packages: Sequence[str], out: Path) -> None:
    """``out`` (TSV): package, version, licences named in its copyright file."""
    rows = []
    for p in packages:
        deb = sorted(debs.glob(f"{p}_*.deb"))
        version = deb[-1].name.split("_")[1].replace("%3a", ":") if deb else ""
        cp = next((debs / "x" / p / "usr/share/doc").glob("*/copyright"), None)
        lic = []
        if cp is not None:
            for line in cp.read_text(errors="replace").splitlines():
                m = re.match(r"\s*License:\s*(\S.*)", line)
                if m and m.group(1).strip() not in lic:
                    lic.append(m.group(1).strip())
        rows.append((p, version, "; ".join(lic) or "(see copyright file)"))
    with open(out, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(("package", "version", "licences"))
        w.writerows(rows)


def _candidates(root: Path, pattern: str):
    """(label, read bytes) of the files (or zip members) matching ``pattern``, sorted by label."""
    if ".pk3:" in pattern:
        arch_pat, member_pat = pattern.split(":", 1)
        out = []
        for arch in sorted(p for p in root.rglob("*.pk3") if fnmatch.fnmatch(p.relative_to(root).as_posix(), arch_pat)):
            with zipfile.ZipFile(arch) as z:
                for info in z.infolist():
                    if info.is_dir() or info.file_size > 32 << 20 or not fnmatch.fnmatch(info.filename, member_pat):
                        continue
                    out.append((f"{arch.name}:{info.filename}",
                                lambda a=arch, n=info.filename: zipfile.ZipFile(a).read(n)))
        return sorted(out, key=lambda t: t[0])
    alts = pattern.split("|")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                   and any(fnmatch.fnmatch(p.relative_to(root).as_posix(), a) for a in alts))
    return [(p.relative_to(root).as_posix(), p.read_bytes) for p in files]


def _window(img: np.ndarray, where: str, side: int) -> np.ndarray:
    """A native ``side`` x ``side`` window (the whole side where the image is smaller)."""
    h, w = img.shape[:2]
    sh, sw = min(side, h), min(side, w)
    cx = (w - sw) // 2
    places = [((h - sh) // 2 if where == "centre" else 0, cx)]
    places += [(y, x) for y in (0, h - sh) for x in (0, w - sw)]
    first = img[places[0][0]:places[0][0] + sh, places[0][1]:places[0][1] + sw]
    if first.std() >= 8:
        return first
    return max((img[y:y + sh, x:x + sw] for y, x in places), key=lambda a: float(a.std()))


def _thumb_key(img: np.ndarray) -> bytes:
    small = np.asarray(Image.fromarray(img).resize((12, 12), Image.BILINEAR), dtype=np.int16) // 16
    return hashlib.sha256(small.tobytes()).digest()


def pick_sources(x: Path, out_dir: Path, table: Path, rules: Sequence[Rule], side: int,
                 min_side: int) -> list[tuple[str, str]]:
    """Write the pictures ``rules`` choose from the packages unpacked under ``x`` as PNGs in
    ``out_dir`` and list them in ``table`` (CSV: name, kind, package, file); returns
    [(name, kind)] sorted by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: set[bytes] = set()
    rows = []
    for kind, pkg, pattern, n, where in rules:
        cands = _candidates(x / pkg, pattern)
        good = []
        for label, read in cands:
            try:
                img = decode_image(read())
            except (DecodeError, OSError):
                continue
            if min(img.shape[:2]) < min_side or img.std() < 4:
                continue
            good.append((label, img))
        spaced = sorted({int(i * len(good) / n) for i in range(min(n, len(good)))})
        order = spaced + [i for i in range(len(good)) if i not in set(spaced)]  # fill after duplicates
        took = 0
        for i in order:
            if took >= n:
                break
            label, img = good[i]
            win = np.ascontiguousarray(_window(img, where, side))
            key = _thumb_key(win)
            if key in seen or win.std() < 4:
                continue
            seen.add(key)
            stem = re.sub(r"[^A-Za-z0-9]+", "-", Path(label.split(":")[-1]).stem).strip("-")[:40]
            name = f"{kind}-{pkg}-{stem}-{hashlib.sha256(label.encode()).hexdigest()[:6]}"
            Image.fromarray(win).save(out_dir / f"{name}.png", compress_level=3)
            rows.append((name, kind, pkg, label))
            took += 1
        if took < n:
            log(f"rule {kind} {pkg} {pattern}: {took} of {n} (only {len(good)} usable files)")
    rows.sort()
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("name", "kind", "package", "file"))
        w.writerows(rows)
    return [(r[0], r[1]) for r in rows]
