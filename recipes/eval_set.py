"""The evaluation set no training run touches: clean images of every kind users hold, from Debian
packages no shipped recipe trains or calibrates on, made into replication chains of every family
and stored four ways. Run through ``recipes/eval_set.sh OUT`` (which says what it builds).

Stages, each skipped when its output exists (delete the folder to redo it):

1. ``OUT/debs``: ``apt-get download`` of ``PACKAGES`` (below), unpacked with ``dpkg -x`` into
   ``OUT/debs/x/<package>``; ``OUT/packages.tsv`` lists each package, its version and the licences
   its copyright file names.
2. ``OUT/sources``: the clean step-0 images, one PNG per source, picked by ``RULES`` (kind,
   package, file pattern, how many, window) as ``recipes/package_images.py`` says: native-resolution
   ``SIDE`` x ``SIDE`` windows of files at least ``MIN_SIDE`` on the short side, never resized, no
   blank pictures, no near-duplicates. ``OUT/sources.csv``: name, kind, package, file.
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
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))  # package_images, beside this file
import package_images

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

#: (kind, package, path pattern under the package root, at most how many, window "centre" or
#: "top"): ``package_images.Rule``, whose module says how patterns read.
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
#: with ``--networks`` (the ``networks`` extra): real re-rendering networks, each on every
#: n-th source (a different offset per family), on the same centre window; realesrgan (about 4 s
#: a step there on one core) on fewer. Training recipes may use animevideov3 and waifu2x;
#: realesrgan and waifu2x_upconv7 are held out of every training and calibration recipe, and so
#: are the MAXIM families (npm tarballs, ``replicators.maxim``; about 7 s a step there), on every
#: 24th source
NETWORK_FAMILIES = {"realesrgan": 42, "animevideov3": 14, "waifu2x": 14, "waifu2x_upconv7": 14,
                    "maxim_restore": 24, "maxim_retouch": 24}


log = package_images.log


# 1 + 2. packages and sources ---------------------------------------------------------------------

def pick_sources(x: Path, out_dir: Path, table: Path) -> list[tuple[str, str]]:
    """The step-0 images ``RULES`` choose, as PNGs; returns [(name, kind)] sorted by name."""
    return package_images.pick_sources(x, out_dir, table, RULES, SIDE, MIN_SIDE)


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


def make_all_chains(src_dir: Path, sources: list[tuple[str, str]], out: Path, workers: int,
                    networks: bool = False, only: tuple[str, ...] = ()) -> pd.DataFrame:
    """Every family's chains (one family at a time, each kept in ``manifest_<family>.csv`` so that
    a rerun goes on where it stopped), merged into ``out/manifest.csv`` with the sources' kinds;
    with ``only``, only those families are made now (a later run makes the rest) and the merged
    manifest holds every family made so far."""
    from collapseguard.images import load_image
    from collapseguard.training_data_tools.chains import make_chains
    from collapseguard.training_data_tools.manifest import source_group, write_manifest

    nets = tuple(NETWORK_FAMILIES) if networks else ()
    by_family: dict[str, list[str]] = {f: [] for f in (*FAMILIES, *NET_FAMILIES, *nets)}
    for i, (name, _) in enumerate(sources):
        for fam in families_for(i):
            by_family[fam].append(name)
        if i % NET_EVERY == 0:
            for fam in NET_FAMILIES:
                by_family[fam].append(name)
        for j, fam in enumerate(nets):
            if i % NETWORK_FAMILIES[fam] == (j * 3) % NETWORK_FAMILIES[fam]:
                by_family[fam].append(name)
    if only:
        unknown = sorted(set(only) - set(by_family))
        if unknown:
            raise SystemExit(f"--only: no such family here: {', '.join(unknown)} "
                             f"(network families need --networks)")

    def load(name: str, fam: str):
        img = load_image(src_dir / f"{name}.png")
        if fam not in (*NET_FAMILIES, *NETWORK_FAMILIES):
            return name, img
        h, w = img.shape[:2]  # a view of the same picture: "@" keeps it with the picture in splits
        y, x = max(0, (h - NET_SIDE) // 2), max(0, (w - NET_SIDE) // 2)
        return f"{name}@centre{NET_SIDE}", np.ascontiguousarray(img[y:y + NET_SIDE, x:x + NET_SIDE])

    kinds = dict(sources)
    parts = []
    for fam, names in by_family.items():
        done = _done(out, fam)
        if done is None and only and fam not in only:
            continue
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
    ap.add_argument("--networks", action="store_true",
                    help="also the real re-rendering network families (NETWORK_FAMILIES; the networks "
                         "extra, and the MAXIM families' npm tarballs)")
    ap.add_argument("--only", default="",
                    help="comma-separated families to make now (a later run makes the rest); the "
                         "merged manifests hold every family made so far")
    a = ap.parse_args(argv)
    only = tuple(f for f in a.only.split(",") if f)
    out = a.out.resolve()
    t0 = time.time()
    package_images.fetch_packages(out / "debs", PACKAGES)
    package_images.package_table(out / "debs", PACKAGES, out / "packages.tsv")
    if not (out / "sources.csv").exists():
        pick_sources(out / "debs" / "x", out / "sources", out / "sources.tmp.csv")
        (out / "sources.tmp.csv").rename(out / "sources.csv")
    with open(out / "sources.csv") as f:
        sources = [(r["name"], r["kind"]) for r in csv.DictReader(f)]
    counts: dict[str, int] = {}
    for _, k in sources:
        counts[k] = counts.get(k, 0) + 1
    log(f"{len(sources)} sources: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    chains = make_all_chains(out / "sources", sources, out / "chains", a.workers, networks=a.networks,
                             only=only)
    m = store_all(chains, out / "stored", a.workers)
    fam = m.groupby("family")["stored_from"].nunique()
    log(f"done in {time.time() - t0:.0f} s: {m['chain_id'].nunique()} stored chains "
        f"({m['stored_from'].nunique()} chains x {m['storage'].nunique()} storages), {len(m)} images; "
        "chains per family: " + ", ".join(f"{k} {v}" for k, v in fam.items()))


if __name__ == "__main__":
    main()
