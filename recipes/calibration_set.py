"""Build the default calibration's images: chains and extra clean images (run by
recipes/make_default_calibration.sh, which documents the sets; settings come from its environment:
WORK, SEED, WORKERS, ART_CHAINS, ART_CLEAN). A file, not a here-document, because make_chains'
worker processes are spawned and re-import the parent's main module, which stdin cannot give them."""

import os
import shutil
from pathlib import Path

import torch

from collapseguard.calibration.clean_sets import (
    largest_per_folder,
    load_files,
    write_variants,
)
from collapseguard.detectors.crops import crop_grid
from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.sources import procedural_art


def main() -> None:
    torch.set_num_threads(1)
    work, seed = Path(os.environ["WORK"]), int(os.environ["SEED"])
    deb = work / "debs" / "x" / "usr" / "share"
    files = largest_per_folder(deb / "wallpapers")  # KDE: one folder per wallpaper
    files += sorted(p for p in (deb / "backgrounds").glob("*") if p.is_file())  # ukui: flat folder
    photos = []
    for p in files:
        for _, img in load_files([p]):  # skips undecodable files
            name = p.parents[2].name if "wallpapers" in p.parts else p.stem  # KDE: <Name>/contents/images/
            photos.append((f"wp-{len(photos):03d}-{name}", img))
    print(f"{len(photos)} wallpapers")
    chain_photos = [(n, crop_grid(img, min(512, *img.shape[:2]), 1)[0]) for n, img in photos[::3]]
    clean_photos = [x for i, x in enumerate(photos) if i % 3]
    art_chain = procedural_art(int(os.environ["ART_CHAINS"]), seed=seed, min_side=320, max_side=640)
    n_clean = int(os.environ["ART_CLEAN"])
    art_clean = procedural_art(n_clean, seed=seed + 1, min_side=320, max_side=768)

    clean = work / "clean"
    shutil.rmtree(clean, ignore_errors=True)
    n = len(write_variants(clean_photos, clean / "photos", crops=2, crop_size=768, jpeg_quality=85))
    n += len(write_variants(art_clean[: n_clean // 2], clean / "art_png", crops=1, crop_size=4096,
                            jpeg_quality=None))
    n += len(write_variants(art_clean[n_clean // 2:], clean / "art_jpeg", crops=1, crop_size=4096,
                            jpeg_quality=80, png=False))
    (clean / ".done").write_text("ok\n")
    print(f"{n} extra clean images in {clean}")
    shutil.rmtree(work / "chains", ignore_errors=True)
    make_chains(chain_photos + art_chain, steps=20, keep=[0, 1, 3, 5, 10, 20], out_dir=work / "chains",
                seed=seed, workers=int(os.environ["WORKERS"]), progress=False)
    print("chains written to", work / "chains")


if __name__ == "__main__":
    main()
