"""An image whose size cannot be known (bytes that are no image, zero bytes) has empty width and
height, not 0, in score's table, filter's scores and audit's scores.parquet; an image refused for
its pixel count carries the size its header claims, also where Pillow refuses it first."""

from __future__ import annotations

import struct
import tarfile
import zlib

import pandas as pd
from cg_testutil import add_member, run_cli

from collapseguard.detectors import create
from collapseguard.images import encode_png
from collapseguard.scoring.records import score_records

NSS = ["-d", "nss", "--threshold", "1e9", "-q"]


def _png_header(w: int, h: int) -> bytes:
    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) + chunk(b"IEND", b"")


def _members(photos):
    return [("ok.png", encode_png(photos[0][:96, :128])), ("junk.png", b"not a png"), ("zero.png", b""),
            ("big.png", _png_header(12000, 11000)), ("bomb.png", _png_header(20000, 20000))]


def _check(df: pd.DataFrame) -> None:
    df = df.set_index(df["key"].str.replace(".png", "", regex=False))
    assert (df.loc["ok", "width"], df.loc["ok", "height"]) == (128, 96)
    for k in ("junk", "zero"):
        assert pd.isna(df.loc[k, "width"]) and pd.isna(df.loc[k, "height"]), df.loc[k].to_dict()
    assert (df.loc["big", "width"], df.loc["big", "height"]) == (12000, 11000)
    assert (df.loc["bomb", "width"], df.loc["bomb", "height"]) == (20000, 20000)  # Pillow refused it first


def test_a_size_pillow_refuses_to_open_is_still_read_from_the_header():
    (_, res), = list(score_records([[("bomb.png", _png_header(20000, 20000))]], create("nss")))
    assert res.status == "decode_error" and "over the 128,000,000-pixel limit" in res.error
    assert (res.width, res.height) == (20000, 20000)
    (_, res), = list(score_records([[("junk.png", b"not a png")]], create("nss")))
    assert res.width is None and res.height is None


def test_unknown_sizes_are_empty_in_score_filter_and_audit(tmp_path, photos):
    d = tmp_path / "photos"
    d.mkdir()
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        for name, data in _members(photos):
            (d / name).write_bytes(data)
            add_member(tf, name, data)

    run_cli(["score", d, "--out", tmp_path / "s.csv", *NSS])
    _check(pd.read_csv(tmp_path / "s.csv"))
    text = pd.read_csv(tmp_path / "s.csv", dtype=str, keep_default_na=False)
    assert sorted(text["width"]) == sorted(["", "", "128", "12000", "20000"])  # not 0, not 128.0
    run_cli(["score", d, "--out", tmp_path / "s.parquet", *NSS])
    _check(pd.read_parquet(tmp_path / "s.parquet"))

    run_cli(["filter", shard, "--out", tmp_path / "f", "-w", "1", *NSS])
    _check(pd.read_parquet(tmp_path / "f" / "scores" / "s.parquet"))

    run_cli(["audit", shard, "--out", tmp_path / "a", "-w", "1", *NSS])
    _check(pd.read_parquet(tmp_path / "a" / "scores.parquet"))
