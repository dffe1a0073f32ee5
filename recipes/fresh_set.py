"""Build the fresh set of recipes/fresh_set.sh (which documents it) from the unpacked packages
under WORK (environment: WORK, SEED). A file, not a here-document, because make_chains' worker
processes are spawned and re-import the parent's main module, which stdin cannot give them."""

import os
import shutil
from pathlib import Path

import torch

from collapseguard.calibration.clean_sets import load_files, write_variants
from collapseguard.detectors.crops import crop_grid
from collapseguard.images import is_image_name, load_image
from collapseguard.training_data_tools.chains import make_chains


def window(img, i, n):
    """The i-th of n 512 px native-resolution windows on crop_grid's fixed grid."""
    return crop_grid(img, min(512, *img.shape[:2]), n)[i]


def main() -> None:
    torch.set_num_threads(1)
    work, seed = Path(os.environ["WORK"]), int(os.environ["SEED"])
    share = work / "debs" / "x" / "usr" / "share"

    photos = list(load_files(sorted((work / "lxqt").iterdir())))
    art_files = sorted(share.glob("desktop-base/*-theme/grub/grub-16x9.png"))
    art_files += sorted(p for p in share.glob("plymouth/themes/*/*background*.png"))
    sway = sorted(share.glob("backgrounds/sway/*.png"), key=lambda p: p.stat().st_size)[-1:]
    art = [(f"{p.parents[1].name if 'grub' in p.parts else p.parent.name}-{p.stem}", load_image(p))
           for p in art_files + sway]
    tex_files = sorted(p for p in (work / "openarena").rglob("*") if p.is_file() and is_image_name(p.name))
    textures = [(name.replace("/", "-"), img) for name, img in load_files(tex_files, root=work / "openarena")
                if min(img.shape[:2]) >= 256]
    print(f"{len(photos)} photos, {len(art)} art pictures, {len(textures)} textures >= 256 px")

    sources = [(f"wp-{n}-w{i}", window(img, i, 3)) for n, img in photos for i in (0, 2)]
    sources += [(f"art-{n}", window(img, 0, 1)) for n, img in art]
    tex_chain = textures[::6]
    sources += [(f"tex-{n}", window(img, 0, 1)) for n, img in tex_chain]
    tex_clean = [x for i, x in enumerate(textures) if i % 6][:240]

    clean = work / "clean"
    shutil.rmtree(clean, ignore_errors=True)
    n = len(write_variants(photos, clean / "photos", crops=2, crop_size=768, jpeg_quality=85))
    n += len(write_variants(art, clean / "art", crops=2, crop_size=768, jpeg_quality=None))
    half = len(tex_clean) // 2
    n += len(write_variants(tex_clean[:half], clean / "textures_png", crops=1, crop_size=4096,
                            jpeg_quality=None))
    n += len(write_variants(tex_clean[half:], clean / "textures_jpeg", crops=1, crop_size=4096,
                            jpeg_quality=85, png=False))
    print(f"{n} extra clean images in {clean}")
    shutil.rmtree(work / "chains", ignore_errors=True)
    m = make_chains(sources, steps=20, keep=[0, 1, 3, 5, 10, 20], out_dir=work / "chains", seed=seed,
                    workers=2, progress=False)
    print(f"{m['chain_id'].nunique()} chains from {len(sources)} sources written to {work / 'chains'}")


if __name__ == "__main__":
    main()
