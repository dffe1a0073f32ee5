"""Images with transparent pixels: scored composited over mid-grey (images.ALPHA_BACKGROUND), so
light overlays on a transparent canvas no longer all score as a flat white field; a has_alpha
column in score, filter and audit outputs; the audit shows them on a checkerboard."""

from __future__ import annotations

import io
import re
import tarfile

import numpy as np
import pandas as pd
import pytest
from cg_testutil import add_member
from click.testing import CliRunner
from PIL import Image, ImageDraw

from collapseguard.cli import main
from collapseguard.detectors import create
from collapseguard.images import ALPHA_BACKGROUND, decode_detailed, decode_image, encode_png


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def overlays() -> dict[str, bytes]:
    """Four white overlays of the kind that sits on a transparent canvas (a logo, a watermark,
    text, a sticker), different shapes at different opacities. Over white each is a flat white
    field, the same picture for all four."""
    out = {}
    for i, (name, fill) in enumerate([("logo", (255, 255, 255, 255)), ("watermark", (255, 255, 255, 150)),
                                      ("text", (255, 255, 255, 230)), ("sticker", (255, 255, 255, 90))]):
        im = Image.new("RGBA", (320, 240), (0, 0, 0, 0))
        d = ImageDraw.Draw(im)
        for k in range(6 + i * 3):  # shapes that differ from overlay to overlay
            x, y = 20 + (k * 47 + i * 31) % 260, 15 + (k * 29 + i * 53) % 190
            d.ellipse([x, y, x + 30 + 7 * i, y + 18 + 5 * k % 20], fill=fill)
            d.rectangle([x + 5, y + 40, x + 60, y + 44 + i], fill=fill)
        out[name] = _png(im)
    return out


def test_transparent_pixels_are_composited_over_mid_grey_and_noted():
    rgba = np.zeros((40, 50, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = np.linspace(0, 255, 50, dtype=np.uint8)[None]
    arr, storage, alpha = decode_detailed(encode_png(rgba))
    a = rgba[..., 3:4].astype(np.float64) / 255
    want = np.round(rgba[..., :3] * a + np.array(ALPHA_BACKGROUND) * (1 - a))
    assert storage == "png" and alpha
    np.testing.assert_allclose(arr, want, atol=1)
    assert ALPHA_BACKGROUND == (128, 128, 128)
    # an alpha channel opaque everywhere is no transparency: the same as the RGB picture
    opaque = rgba.copy()
    opaque[..., 3] = 255
    arr, _, alpha = decode_detailed(encode_png(opaque))
    assert not alpha and np.array_equal(arr, opaque[..., :3])
    # a palette image with a transparent index, and grey + alpha
    p = Image.new("P", (8, 8), 0)
    p.putpalette([10, 20, 30, 250, 250, 250] + [0] * 762)
    p.putpixel((1, 1), 1)
    buf = io.BytesIO()
    p.save(buf, format="PNG", transparency=0)
    arr, _, alpha = decode_detailed(buf.getvalue())
    assert alpha and tuple(arr[0, 0]) == ALPHA_BACKGROUND and tuple(arr[1, 1]) == (250, 250, 250)
    la = Image.new("LA", (8, 8), (255, 0))
    assert decode_detailed(_png(la))[2] and tuple(decode_image(_png(la))[0, 0]) == ALPHA_BACKGROUND
    # kept for a gallery: the RGBA pixels themselves
    kept, _, _ = decode_detailed(encode_png(rgba), keep_alpha=True)
    assert kept.shape == (40, 50, 4) and np.array_equal(kept, rgba)


def test_light_overlays_score_apart_over_grey_and_as_a_white_field_over_white():
    det = create("cnn")
    ovs = overlays()
    over_grey = det.score([decode_image(b) for b in ovs.values()])
    flat_white = float(det.score([np.full((240, 320, 3), 255, np.uint8)])[0])
    # what compositing over white did: every overlay is a white field, scored as one
    white = [np.asarray(Image.alpha_composite(Image.new("RGBA", (320, 240), (255,) * 4),
                                              Image.open(io.BytesIO(b)))).astype(np.uint8)[..., :3]
             for b in ovs.values()]
    over_white = det.score(white)
    assert np.ptp(over_white) == 0 and abs(float(over_white[0]) - flat_white) < 1e-4
    assert len({round(float(s), 3) for s in over_grey}) == 4  # each overlay its own score
    assert np.ptp(over_grey) > 0.1


def _shard(path, members):
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            add_member(tf, name, data)


def test_has_alpha_in_score_filter_and_audit_and_a_checkerboard_in_the_gallery(tmp_path, photos):
    ovs = overlays()
    shard = tmp_path / "in" / "s-000.tar"
    shard.parent.mkdir()
    members = [(f"{n}.png", b) for n, b in ovs.items()]
    members += [("photo.png", encode_png(photos[0][:200, :200])),
                ("opaque_rgba.png", encode_png(np.dstack([photos[1][:120, :120],
                                                           np.full((120, 120), 255, np.uint8)])))]
    _shard(shard, members)
    want = {"logo": True, "watermark": True, "text": True, "sticker": True, "photo": False,
            "opaque_rgba": False}

    res = CliRunner().invoke(main, ["score", str(shard), "--out", str(tmp_path / "s.csv"), "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    s = pd.read_csv(tmp_path / "s.csv")
    assert dict(zip(s["key"], s["has_alpha"])) == want

    res = CliRunner().invoke(main, ["filter", str(shard), "--out", str(tmp_path / "f"), "-q",
                                    "--workers", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    f = pd.read_parquet(tmp_path / "f" / "scores" / "s-000.parquet")
    assert dict(zip(f["key"], f["has_alpha"])) == want
    np.testing.assert_allclose(f["score"], s["score"], atol=1e-4)
    # a --drop-fraction run splits from its scoring pass's table: the column is carried over
    res = CliRunner().invoke(main, ["filter", str(shard), "--out", str(tmp_path / "d"), "-q",
                                    "--workers", "1", "--drop-fraction", "0.3"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    d = pd.read_parquet(tmp_path / "d" / "scores" / "s-000.parquet")
    assert dict(zip(d["key"], d["has_alpha"])) == want

    # every image in a gallery: a threshold in the middle, all kept/flagged/borderline shown
    t = float(np.median(s["score"]))
    res = CliRunner().invoke(main, ["audit", str(shard), "--out", str(tmp_path / "a"), "-q",
                                    "--threshold", str(t)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    a = pd.read_parquet(tmp_path / "a" / "scores.parquet")
    assert dict(zip(a["key"], a["has_alpha"])) == want
    html = (tmp_path / "a" / "report.html").read_text()
    assert "img.alpha{" in html and "background-image:linear-gradient" in html
    cards = re.findall(r'<figure class="card[^"]*">.*?</figure>', html, flags=re.S)
    seen = {}
    for c in cards:
        key = re.search(r'<span class="key">([^<]*)</span>', c).group(1)
        thumb = re.search(r'<img class="thumb( alpha)?" src="data:image/(png|jpeg)', c)
        seen[key] = (bool(thumb.group(1)), thumb.group(2), "transparent</span>" in c)
    assert seen, "no gallery card in the report"
    for key, (checker, fmt, tag) in seen.items():
        assert checker == tag == want[key], key
        assert (fmt == "png") == want[key], key  # JPEG has no transparency
    assert any(want[k] for k in seen) and not all(want[k] for k in seen)
    assert "4 scored image(s) have transparent pixels" in html


@pytest.mark.parametrize("spec", ["cnn", "nss"])
def test_an_rgba_array_scores_as_its_file(spec):
    det = create(spec)
    b = overlays()["watermark"]
    arr = np.asarray(Image.open(io.BytesIO(b)).convert("RGBA"))
    np.testing.assert_allclose(det.score([arr]), det.score([decode_image(b)]), atol=1e-5)
