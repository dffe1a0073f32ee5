"""How many of the shipped recipe's held-out chain sources were also training clean negatives.

    python benchmarks/recipe_overlap.py /tmp/cg_train     # the $WORK of benchmarks/train_cnn.sh

Needs only the first stage's folders ($WORK/photos, $WORK/nightsky), not the chains: it names the
photo and night-sky chain sources as ``benchmarks/make_train_chains.py`` does (``--both-views``,
``--extra-n 24``), splits them as ``collapseguard train`` does and counts the held-out ones whose
picture is in a ``--clean`` folder on the training side (MODEL_CARD.md, the caveat under "How the
shipped weights were made"). ``collapseguard train`` prints the same count as a warning.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from collapseguard.training.negatives import list_images, split_clean
from collapseguard.training.run import sources_among_clean, split_chains
from collapseguard.training_data_tools.sources import _clean_name


def main(work: Path, extra_n: int = 24) -> None:
    photos_train, _ = split_clean(list_images([work / "photos"]))
    night_train, _ = split_clean(list_images([work / "nightsky"]))
    pick = np.random.default_rng(0).permutation(len(night_train))[:extra_n]  # make_train_chains.py
    night = [night_train[i] for i in sorted(pick)]
    names = {f"photo:{p.stem}": [_clean_name(f"{p.stem}@native"), _clean_name(f"{p.stem}@web")]
             for p in photos_train}
    names.update({f"night:{p.stem}": [_clean_name(f"{p.stem}@native")] for p in night})
    rows = [(kind, s) for kind, views in names.items() for s in views]
    df = pd.DataFrame({"source_image": [s for _, s in rows], "chain_id": [s for _, s in rows]})
    _, held = split_chains(df)
    clean_train, _ = split_clean(list_images([work / "photos", work / "nightsky"]))
    shared = sources_among_clean(held, clean_train)
    groups = {s.split("@", 1)[0] for s in shared}
    print(f"photo and night-sky pictures that are chain sources: {len(names)} "
          f"({len(photos_train)} photos, {len(night)} night skies)")
    print(f"held out by the chain split: {held['source_image'].str.split('@').str[0].nunique()} pictures "
          f"({len(held)} sources); trained on as clean negatives: {len(groups)} pictures "
          f"({len(shared)} sources)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
