"""What counts as an image file: JPEG under its other names (.jfif, .jpe, .pjpeg, .pjp) and AVIF
(where this Pillow decodes it) are scored in folders and judged as shard members, not skipped or
kept unjudged; a sample with no image member names what it holds; a folder's files of no image
type are counted once in a note."""

from __future__ import annotations

import io
import tarfile
from collections import Counter

import pandas as pd
import pytest
from cg_testutil import add_member, run_cli
from PIL import Image

from collapseguard.images import IMAGE_EXTENSIONS, decode_image, is_image_name
from collapseguard.io.inputs import expand

FILTER = ["-d", "nss", "--threshold", "1e9", "-w", "1", "-q"]


def _avif_ok() -> bool:
    return "avif" in IMAGE_EXTENSIONS


def _encoded(arr, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def _members(photos) -> list[tuple[str, bytes]]:
    jpeg = _encoded(photos[0], "JPEG")
    out = [("a.jfif", jpeg), ("b.jpe", jpeg), ("c.pjpeg", jpeg), ("d.pjp", jpeg), ("e.jpg", jpeg)]
    if _avif_ok():
        out.append(("f.avif", _encoded(photos[1], "AVIF")))
    return out


def test_jpeg_under_other_names_and_avif_are_image_names():
    for name in ("x.jfif", "x.JPE", "x.pjpeg", "x.pjp", "x.jpg", "x.png"):
        assert is_image_name(name), name
    assert not is_image_name("x.xyz") and not is_image_name("x.txt") and not is_image_name("x.psd")
    if _avif_ok():
        assert is_image_name("x.avif")


@pytest.mark.skipif(not _avif_ok(), reason="this Pillow has no AVIF decoder")
def test_avif_bytes_decode(photos):
    assert decode_image(_encoded(photos[1], "AVIF")).shape == photos[1].shape


def test_a_folder_scores_every_image_type_and_counts_the_rest_once(tmp_path, photos):
    d = tmp_path / "photos"
    d.mkdir()
    members = _members(photos)
    for name, data in members:
        (d / name).write_bytes(data)
    (d / "g.psd").write_bytes(b"8BPS")
    (d / "h.xyz").write_bytes(b"?")
    (d / "i.xyz").write_bytes(b"?")
    others: Counter = Counter()
    _, files = expand([str(d)], others=others)
    assert sorted(f.key for f in files) == sorted(n for n, _ in members)
    assert others == {".psd": 1, ".xyz": 2}
    res = run_cli(["score", d, "--out", tmp_path / "s.csv", *FILTER[:4], "-q"])
    df = pd.read_csv(tmp_path / "s.csv")
    assert sorted(df["key"]) == sorted(n for n, _ in members)
    assert df["score"].notna().all() and df["error"].isna().all()
    assert "note: 3 file(s) in the folders given were not read, not being an image type: " \
           ".xyz (2), .psd (1)" in res.output, res.output
    assert ".jfif" in res.output and res.output.count("not being an image type") == 1


def test_shard_members_of_every_image_type_are_judged_and_a_sample_without_one_says_why(tmp_path, photos):
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        for name, data in _members(photos):
            add_member(tf, name, data)
        add_member(tf, "k.xyz", _encoded(photos[2], "JPEG"))
        add_member(tf, "t.txt", b"a caption")
        add_member(tf, "t.json", b"{}")
    run_cli(["filter", shard, "--out", tmp_path / "out", *FILTER])
    s = pd.read_parquet(tmp_path / "out" / "scores" / "s.parquet").set_index("key")
    for name, _ in _members(photos):
        key = name.rsplit(".", 1)[0]
        assert s.loc[key, "reason"] == "kept" and pd.notna(s.loc[key, "score"]), (key, s.loc[key].to_dict())
    assert s.loc["k", "reason"] == "no_image"
    assert s.loc["k", "error"].startswith("no image file in the sample (k.xyz is not an image type; "
                                          "images are .png, .jpg"), s.loc["k", "error"]
    assert s.loc["t", "error"].startswith("no image file in the sample (t.txt, t.json are not image types")


def test_an_empty_file_or_member_says_so(tmp_path, photos):
    """Zero bytes read as "empty file (0 bytes)", not as Pillow's "cannot identify image file", in
    a folder given to score and as a shard member given to filter."""
    from collapseguard.images import DecodeError

    with pytest.raises(DecodeError, match=r"^empty file \(0 bytes\)$"):
        decode_image(b"")
    d = tmp_path / "photos"
    d.mkdir()
    (d / "zero.png").write_bytes(b"")
    (d / "ok.png").write_bytes(_encoded(photos[0], "PNG"))
    run_cli(["score", d, "--out", tmp_path / "s.csv", *FILTER[:4], "-q"])
    df = pd.read_csv(tmp_path / "s.csv").set_index("key")
    assert df.loc["zero.png", "error"] == f"{d / 'zero.png'}: empty file (0 bytes)"
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "zero.jpg", b"")
        add_member(tf, "ok.jpg", _encoded(photos[0], "JPEG"))
    run_cli(["filter", shard, "--out", tmp_path / "out", *FILTER])
    s = pd.read_parquet(tmp_path / "out" / "scores" / "s.parquet").set_index("key")
    assert s.loc["zero", "reason"] == "decode_error" and s.loc["zero", "error"] == "zero.jpg: empty file (0 bytes)"
