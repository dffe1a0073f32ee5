"""Checks that a chains manifest read from a folder describes chains: numbered files in one
folder are one chain by the layout rule, so a folder of unrelated photos would otherwise be
evaluated or calibrated as a chain."""
from __future__ import annotations

import pandas as pd

#: below this thumbnail correlation a chain's first two steps are taken for two pictures (dedup
#: joins copies at 0.80; a re-rendering keeps its picture well above 0.5)
UNRELATED_CORR = 0.5


def unrelated_step_notes(manifest: pd.DataFrame, max_chains: int = 50) -> list[str]:
    """A note when the chains read from a folder without family folders (family ``unknown``) are
    not chains: files numbered in one folder (``p0000.png`` ... or ``IMG_0001.jpg`` ...) are read
    as one chain by the layout rule, and a folder of unrelated photos then gives a verdict on
    nothing. The first two steps of up to ``max_chains`` such chains are compared by their
    thumbnails (``detectors.fingerprint``); unreadable files are passed over."""
    from collapseguard.detectors.fingerprint import correlation, fingerprint
    from collapseguard.images import DecodeError, load_image

    if "family" not in manifest.columns:
        return []
    loose = manifest[manifest["family"].astype(str) == "unknown"]
    notes = []
    for cid, g in list(loose.groupby("chain_id", sort=True))[:max_chains]:
        g = g.sort_values("step")
        if len(g) < 2:
            continue
        try:
            (_, a), (_, b) = (fingerprint(load_image(p)) for p in g["path"].iloc[:2])
        except (DecodeError, OSError):
            continue
        corr = float(correlation(a, b))
        if corr < UNRELATED_CORR:
            steps = g["step"].iloc[:2].tolist()
            notes.append(f"chain {cid!s}: its steps {steps[0]} and {steps[1]} look like two different "
                         f"pictures (thumbnail correlation {corr:.2f}); files numbered in one folder are "
                         f"read as one chain of {len(g)} steps: a folder of unrelated pictures is no chain, "
                         "and what is measured on it means nothing")
    return notes
