"""A group holding a copy with transparency (a palette PNG with a transparent index) beside a
JPEG copy: ``dedup --gallery`` and ``audit --groups`` show it as PNG on a checkerboard."""

from __future__ import annotations

import numpy as np
import pytest
from cg_testutil import run_cli
from PIL import Image


@pytest.fixture(scope="module")
def transparent_group(tmp_path_factory):
    import skimage.data as sd

    root = tmp_path_factory.mktemp("alpha_group")
    src = root / "in"
    src.mkdir()
    im = Image.fromarray(sd.coffee()).resize((300, 200))
    im.convert("P", palette=Image.ADAPTIVE, colors=64).save(src / "a_palette_trns.png", transparency=0)
    im.save(src / "b_copy.jpg", quality=80)
    with Image.open(src / "a_palette_trns.png") as check:  # the copy really has transparent pixels
        assert np.asarray(check.convert("RGBA"))[..., 3].min() == 0
    return src


def _tiles(section: str) -> list[str]:
    return section.split("<div class='tile ")[1:]


def _shows_both_copies(section: str) -> None:
    tiles = _tiles(section)
    assert len(tiles) == 2, section[:2000]
    by_key = {("a_palette_trns.png" if "a_palette_trns.png" in t else "b_copy.jpg"): t for t in tiles}
    assert set(by_key) == {"a_palette_trns.png", "b_copy.jpg"}
    alpha = by_key["a_palette_trns.png"]
    assert "class=err" not in alpha
    assert "<img class=alpha src='data:image/png;base64," in alpha  # the thumbnail, lossless
    assert "<img class='crop alpha' src='data:image/png;base64," in alpha
    opaque = by_key["b_copy.jpg"]
    assert "<img src='data:image/jpeg;base64," in opaque and "class=crop src='data:image/png" in opaque


def test_the_dedup_gallery_shows_a_transparent_copy(transparent_group, tmp_path):
    out = tmp_path / "dd"
    run_cli(["dedup", transparent_group, "--out", out, "-q", "--gallery", "5"])
    page = (out / "groups.html").read_text()
    assert ".cg-groups img.alpha{" in page  # the checkerboard behind it
    _shows_both_copies(page[page.index("<div class=cg-groups>"):])


def test_the_audit_report_shows_a_transparent_copy_of_a_group(transparent_group, tmp_path):
    dd = tmp_path / "dd"
    run_cli(["dedup", transparent_group, "--out", dd, "-q"])
    out = tmp_path / "audit"
    run_cli(["audit", transparent_group, "--out", out, "-q", "--groups", dd / "groups.parquet"])
    assert (out / "summary.json").exists()
    page = (out / "report.html").read_text()
    section = page[page.index('<section id="groups">'):]
    _shows_both_copies(section[: section.index("</section>")])
