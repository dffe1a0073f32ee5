"""A group of more copies than the gallery draws (``gallery.MAX_MEMBERS``): the kept copy and its
degraded copies are drawn first, and the heading says how many copies the group holds."""

from __future__ import annotations

import re

import numpy as np
from cg_testutil import run_cli
from PIL import Image


def test_the_gallery_draws_a_large_groups_degraded_copies_and_says_what_it_leaves_out(tmp_path):
    import skimage.data as sd

    from collapseguard.dedup.gallery import MAX_MEMBERS

    src = tmp_path / "in"
    src.mkdir()
    im = Image.fromarray(sd.coffee()).resize((320, 214))
    im.save(src / "orig.png")
    for q in range(95, 50, -5):  # nine re-saves: copies the comparator barely tells apart
        im.save(src / f"q{q}.jpg", quality=q)
    im.convert("L").convert("RGB").save(src / "grey.png")  # a degraded copy (lost colour)
    n = len(list(src.iterdir()))
    assert n > MAX_MEMBERS
    run_cli(["dedup", src, "--out", tmp_path / "d", "--gallery", "5", "-w", "1"])
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "d" / "groups.parquet").to_pylist()
    assert len({r["group"] for r in rows}) == 1  # one picture
    grey = next(r for r in rows if r["key"] == "grey.png")
    assert grey["decision"] == "degraded_copy"
    page = (tmp_path / "d" / "groups.html").read_text()
    tiles = page.split("<div class='tile ")[1:]
    assert len(tiles) == MAX_MEMBERS
    assert any("grey.png" in t and t.startswith("degraded_copy") for t in tiles), "the degraded copy is drawn"
    assert re.search(rf"{MAX_MEMBERS} of its {n} copies shown", page)
    ranks = [int(m) for m in re.findall(r"rank (\d+)", page)]
    assert ranks == sorted(ranks) and ranks[0] == 0  # in rank order, the kept copy first
    assert np.isfinite(grey["p_worse"])
