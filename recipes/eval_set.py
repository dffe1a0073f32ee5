"""The evaluation set no training run touches: clean images of every kind users hold, from Debian
packages no shipped recipe trains or calibrates on, made into replication chains of every family
and stored four ways. Run through ``recipes/eval_set.sh OUT`` (which says what it builds).

Stages, each skipped when its output exists (delete the folder to redo it):

1. ``OUT/debs``: ``apt-get download`` of ``PACKAGES`` (below), unpacked with ``dpkg -x`` into
   ``OUT/debs/x/<package>``; ``OUT/packages.tsv`` lists each package, its version and the licences
   its copyright file names.
2. ``OUT/sources``: the clean step-0 images, one PNG per source, picked by ``RULES`` (package,
   file pattern, kind, how many): files at least ``MIN_SIDE`` on the short side, not blank (the
   spread of all pixel values, channels together, at least 4 levels: one grey is blank, a single
   flat colour is flat art), no near-duplicates, evenly spaced over the sorted matches; larger images are cut to a native-
   resolution ``SIDE`` x ``SIDE`` window (never resized), the centre one or, for sprites, the top
   one, moved to the busiest of five places when that window is nearly flat.
   ``OUT/sources.csv``: name, kind, package, file.
3. ``OUT/chains``: every source through two of the eight default replicator families (the i-th
   source of the sorted list gets families i and i+3, mod 8, so every kind meets every family) and
   every 10th source also through ``super_resolution`` (a pretrained network; on the source's centre
   192 x 192 window, named ``<source>@centre192``, to keep its cost down), 20 steps, steps 0, 1,
   5, 10, 20 kept, seed ``SEED``; the manifest gets the source's ``kind``. Family by family
   (``manifest_<family>.csv``), so a rerun goes on where it stopped.
4. ``OUT/stored``: every chain stored as PNG, JPEG q90 4:2:0, JPEG q75 4:2:0 and WebP q80
   (``collapseguard.training_data_tools.storage``), family by family; the merged manifest is
   ``OUT/stored/manifest.csv``.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from collapseguard.images import DecodeError, decode_image

SIDE = 384
MIN_SIDE = 128
SEED = 20261202
STEPS = 20
KEEP = (0, 1, 5, 10, 20)

#: every package used. None of them is used by recipes/train_cnn.sh (gnome/mate-backgrounds,
#: lomiri-wallpapers*, mypaint-data-extras, stellarium-data, supertuxkart-data; with KINDS=1
#: marble-data, gcompris-qt-data, colobot-common-textures, extremetuxracer-data), by
#: recipes/make_default_calibration.sh (ukui-wallpapers, plasma-workspace-wallpapers,
#: stellarium-data) or by the fresh set (desktop-base, sway-backgrounds, openarena-081-textures);
#: lxqt-themes' photos are also a clean-check folder (recipes/lxqt_photos.sh), never trained on.
PACKAGES = (
    "palapeli-data", "lxqt-themes", "tuxpaint-data", "kstars-data", "wesnoth-1.16-data",
    "openclipart-png", "renpy-thequestion", "renpy-demo", "cataclysm-dda-data", "freeciv-data",
    "freedroid-data", "pingus-data", "supertux-data", "kgeography-data", "xfdesktop4-data",
    "debian-edu-artwork-emerald", "debian-edu-artwork-softwaves", "debian-edu-artwork-spacefun",
    "gnucash-docs", "fotoxx-common", "khangman", "kpat", "debian-handbook", "octave-doc",
    "graphviz-doc", "ufoai-textures", "hedgewars-data", "krita-data", "neverball-data",
    "lincity-ng-data",
)

#: (kind, package, path pattern under the package root (fnmatch, ``*`` crosses folders), at most
#: how many, window "centre" or "top"). ``|`` separates alternative patterns; ``ARCHIVE.pk3:PATTERN``
#: reads the members of a zip archive.
RULES = (
    ("photo", "palapeli-data", "*/collection/[ep]*.jpg|*/castle-*.jpg|*/citrus-*.jpg", 4, "centre"),
    ("photo", "lxqt-themes", "*/wallpapers/[BVbc]*.*|*/this-is-not-windows.jpg|*/fog.jpg", 7, "centre"),
    ("photo", "tuxpaint-data", ("*/templates/cliff.jpg|*/jellyfish.jpg|*/lighthouse.jpg|*/mudstone.jpg"
                                "|*/ocean_*.jpg|*/rocks.jpg|*/sheep.jpg|*/spiders_web.jpg"
                                "|*/sun_behind_clouds.jpg|*/wool_mill_machine.jpg"), 11, "centre"),
    ("photo", "renpy-demo", "*/bg w*.jpg", 2, "centre"),
    ("foliage", "lxqt-themes", "*/wallpapers/[adf][fprl]*.*", 4, "centre"),
    ("foliage", "tuxpaint-data", ("*/templates/burnt_bark.jpg|*/corn_maze.jpg|*/mossy_*.jpg"
                                  "|*/redwoods_above.jpg|*/sun_behind_leaves.jpg|*/trees_*.jpg"), 8, "centre"),
    ("night_photo", "palapeli-data", "*/collection/cincinnati-bridge.jpg", 1, "centre"),
    ("night_photo", "kstars-data", "*/kstars/textures/moon*.png", 9, "centre"),
    ("portrait", "wesnoth-1.16-data", "*/images/portraits/*.png", 30, "top"),
    ("illustration", "wesnoth-1.16-data", "*/images/story/*.jpg", 18, "centre"),
    ("illustration", "kstars-data", "*/skycultures/western/*.png", 12, "centre"),
    ("illustration", "openclipart-png", "*/png/people/*.png", 10, "centre"),
    ("illustration", "openclipart-png", "*/png/animals/*.png", 10, "centre"),
    ("illustration", "supertux-data", "*/images/background*.png", 8, "centre"),
    ("anime", "renpy-thequestion", "*/sylvie *.png", 8, "top"),
    ("anime", "renpy-thequestion", "*/bg *.jpg", 4, "centre"),
    ("anime", "renpy-demo", "*/[el][iu][lc]*.png", 5, "top"),
    ("anime", "renpy-demo", "*/bg cave.jpg", 1, "centre"),
    ("pixel_art", "cataclysm-dda-data", "*/gfx/*.png", 12, "centre"),
    ("pixel_art", "freeciv-data", ("*/freeciv/trident/*.png|*/freeciv/isotrident/*.png"
                                   "|*/freeciv/hex2t/*.png|*/freeciv/isophex/*.png"), 10, "centre"),
    ("pixel_art", "freedroid-data", "*/graphics/*.png", 6, "centre"),
    ("pixel_art", "supertux-data", "*/images/tiles/*.png", 8, "centre"),
    ("pixel_art", "pingus-data", "*/data/images/*.png", 8, "centre"),
    ("flat_art", "kgeography-data", "*/share/kgeography/*.png", 16, "centre"),
    ("flat_art", "kgeography-data", "*/kgeography/flags/*.png", 8, "centre"),
    ("flat_art", "xfdesktop4-data", "*/backgrounds/*.png|*/backgrounds/*.jpg", 4, "centre"),
    ("flat_art", "openclipart-png", "*/png/signs_and_symbols/*.png", 8, "centre"),
    ("flat_art", "debian-edu-artwork-emerald", "*/grub/*.png", 2, "centre"),
    ("flat_art", "debian-edu-artwork-softwaves", "*/grub/*.png", 2, "centre"),
    ("flat_art", "debian-edu-artwork-spacefun", "*/grub/*.png", 2, "centre"),
    ("screenshot", "gnucash-docs", "*/gnucash-guide-en/figures/*.png", 16, "centre"),
    ("screenshot", "fotoxx-common", "*/fotoxx/images/*.png", 10, "centre"),
    ("screenshot", "kstars-data", "*/doc/HTML/en/*.png", 10, "centre"),
    ("screenshot", "khangman", "*/doc/HTML/en/*.png", 4, "centre"),
    ("screenshot", "kpat", "*/doc/HTML/en/*.png", 1, "centre"),
    ("screenshot", "debian-handbook", "*/en-US/images/inst-*.png", 8, "centre"),
    ("diagram_text", "octave-doc", "*/octave.html/*.png", 20, "centre"),
    ("diagram_text", "graphviz-doc", "*.png", 10, "centre"),
    ("diagram_text", "debian-handbook", "*/en-US/images/[a-hj-z]*.png", 12, "centre"),
    ("game_texture", "ufoai-textures", "*/0textures.pk3:*.jpg", 24, "centre"),
    ("game_texture", "hedgewars-data", "*/Themes/*/LandTex.png", 10, "centre"),
    ("game_texture", "krita-data", "*/krita/patterns/*.png", 10, "centre"),
    ("game_texture", "palapeli-data", "*/backgrounds/*.jpg", 5, "centre"),
    ("game_render", "neverball-data", "*/shot-*/*.png", 14, "centre"),
    ("game_render", "neverball-data", "*/shot-*/*.jpg", 14, "centre"),
    ("game_render", "lincity-ng-data", "*/images/*.png", 12, "centre"),
)

FAMILIES = ("noise_tint", "contour_wrinkles", "scattered_dots", "texture_simplify", "aspect_drift",
            "codec", "learned", "mixed")
#: families run on every NET_EVERY-th source only, on its centre NET_SIDE x NET_SIDE window (a
#: pretrained network: tens of times slower a step than the hand-written families)
NET_FAMILIES = ("super_resolution",)
NET_EVERY = 10
NET_SIDE = 192


def log(msg: str) -> None:
    print(f"[eval_set {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# 1. packages ------------------------------------------------------------------------------------

def fetch_packages(debs: Path) -> None:
    x = debs / "x"
    missing = [p for p in PACKAGES if not (x / p / ".unpacked").exists()]
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


def package_table(debs: Path, out: Path) -> None:
    """OUT/packages.tsv: package, version, licences named in its copyright file."""
    rows = []
    for p in PACKAGES:
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


# 2. sources -------------------------------------------------------------------------------------

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


def _window(img: np.ndarray, where: str) -> np.ndarray:
    """A native SIDE x SIDE window (the whole side where the image is smaller)."""
    h, w = img.shape[:2]
    sh, sw = min(SIDE, h), min(SIDE, w)
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


def pick_sources(x: Path, out_dir: Path, table: Path) -> list[tuple[str, str]]:
    """Write the chosen step-0 images as PNGs; returns [(name, kind)] sorted by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: set[bytes] = set()
    rows = []
    for kind, pkg, pattern, n, where in RULES:
        cands = _candidates(x / pkg, pattern)
        good = []
        for label, read in cands:
            try:
                img = decode_image(read())
            except (DecodeError, OSError):
                continue
            if min(img.shape[:2]) < MIN_SIDE or img.std() < 4:
                continue
            good.append((label, img))
        spaced = sorted({int(i * len(good) / n) for i in range(min(n, len(good)))})
        order = spaced + [i for i in range(len(good)) if i not in set(spaced)]  # fill after duplicates
        took = 0
        for i in order:
            if took >= n:
                break
            label, img = good[i]
            win = np.ascontiguousarray(_window(img, where))
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


# 3 + 4. chains and storage ----------------------------------------------------------------------

def families_for(i: int) -> tuple[str, str]:
    return FAMILIES[i % len(FAMILIES)], FAMILIES[(i + 3) % len(FAMILIES)]


def _done(folder: Path, fam: str) -> pd.DataFrame | None:
    """A family's finished manifest in ``folder`` (``manifest_<family>.csv``, or its rows of the
    merged ``manifest.csv``), or None when that family is not made yet."""
    from collapseguard.training_data_tools.manifest import read_manifest

    if (folder / f"manifest_{fam}.csv").exists():
        return read_manifest(folder / f"manifest_{fam}.csv")
    if (folder / "manifest.csv").exists():
        m = read_manifest(folder / "manifest.csv")
        if (m["family"] == fam).any():
            return m[m["family"] == fam].reset_index(drop=True)
    return None


def make_all_chains(src_dir: Path, sources: list[tuple[str, str]], out: Path, workers: int) -> pd.DataFrame:
    """Every family's chains (one family at a time, each kept in ``manifest_<family>.csv`` so that
    a rerun goes on where it stopped), merged into ``out/manifest.csv`` with the sources' kinds."""
    from collapseguard.images import load_image
    from collapseguard.training_data_tools.chains import make_chains
    from collapseguard.training_data_tools.manifest import source_group, write_manifest

    by_family: dict[str, list[str]] = {f: [] for f in (*FAMILIES, *NET_FAMILIES)}
    for i, (name, _) in enumerate(sources):
        for fam in families_for(i):
            by_family[fam].append(name)
        if i % NET_EVERY == 0:
            for fam in NET_FAMILIES:
                by_family[fam].append(name)

    def load(name: str, fam: str):
        img = load_image(src_dir / f"{name}.png")
        if fam not in NET_FAMILIES:
            return name, img
        h, w = img.shape[:2]  # a view of the same picture: "@" keeps it with the picture in splits
        y, x = max(0, (h - NET_SIDE) // 2), max(0, (w - NET_SIDE) // 2)
        return f"{name}@centre{NET_SIDE}", np.ascontiguousarray(img[y:y + NET_SIDE, x:x + NET_SIDE])

    kinds = dict(sources)
    parts = []
    for fam, names in by_family.items():
        done = _done(out, fam)
        if done is None:
            log(f"chains {fam}: {len(names)}")
            done = make_chains((load(n, fam) for n in names), [fam],
                               steps=STEPS, keep=KEEP, out_dir=out, seed=SEED, workers=workers,
                               progress=False, manifest_name=f"manifest_{fam}.csv")
        parts.append(done)
    df = pd.concat(parts, ignore_index=True)
    df["kind"] = df["source_image"].map(lambda s: kinds[source_group(s)])
    write_manifest(df, out / "manifest.csv")
    return df


def store_all(chains: pd.DataFrame, out: Path, workers: int) -> pd.DataFrame:
    """Every family's chains stored four ways under ``out`` (family by family, resumable), merged
    into ``out/manifest.csv``."""
    from collapseguard.training_data_tools.manifest import write_manifest
    from collapseguard.training_data_tools.storage import DEFAULT_STORAGES, store_chains

    parts = []
    for fam in chains["family"].unique():
        done = _done(out, fam)
        if done is None:
            log(f"storing {fam} four ways")
            done = store_chains(chains[chains["family"] == fam], DEFAULT_STORAGES, out, workers=workers,
                                manifest_name=f"manifest_{fam}.csv")
        parts.append(done)
    df = pd.concat(parts, ignore_index=True)
    write_manifest(df, out / "manifest.csv")
    return df


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    out = a.out.resolve()
    t0 = time.time()
    fetch_packages(out / "debs")
    package_table(out / "debs", out / "packages.tsv")
    if not (out / "sources.csv").exists():
        pick_sources(out / "debs" / "x", out / "sources", out / "sources.tmp.csv")
        (out / "sources.tmp.csv").rename(out / "sources.csv")
    with open(out / "sources.csv") as f:
        sources = [(r["name"], r["kind"]) for r in csv.DictReader(f)]
    counts: dict[str, int] = {}
    for _, k in sources:
        counts[k] = counts.get(k, 0) + 1
    log(f"{len(sources)} sources: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    chains = make_all_chains(out / "sources", sources, out / "chains", a.workers)
    m = store_all(chains, out / "stored", a.workers)
    fam = m.groupby("family")["stored_from"].nunique()
    log(f"done in {time.time() - t0:.0f} s: {m['chain_id'].nunique()} stored chains "
        f"({m['stored_from'].nunique()} chains x {m['storage'].nunique()} storages), {len(m)} images; "
        "chains per family: " + ", ".join(f"{k} {v}" for k, v in fam.items()))


if __name__ == "__main__":
    main()
