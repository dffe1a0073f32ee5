"""HEIC/HEIF (iPhone photos) with the ``[heic]`` extra (pillow-heif): real HEIC files, encoded by
pillow-heif, are scored in a folder as their PNG twins are, judged as shard members and passed
through ``filter`` byte for byte; without pillow-heif (its import blocked in a subprocess, a real
import failure) they stay unread and every message says what to install."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cg_testutil import add_member, degrade, read_members, run_cli
from PIL import Image

from collapseguard.images import (
    IMAGE_EXTENSIONS,
    decode_image,
    heif_install,
    is_image_name,
)

ROOT = Path(__file__).resolve().parents[2]

try:
    import pillow_heif
except ImportError:
    pillow_heif = None

needs_heif = pytest.mark.skipif(pillow_heif is None, reason="pillow-heif is not installed (the [heic] "
                                "extra: pip install 'collapseguard[heic]'), so HEIC files cannot be made or read")


def _heic(arr: np.ndarray, exif: bytes | None = None) -> bytes:
    buf = io.BytesIO()
    kwargs = {"exif": exif} if exif else {}
    pillow_heif.from_pillow(Image.fromarray(arr)).save(buf, quality=90, **kwargs)
    return buf.getvalue()


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@needs_heif
def test_heic_files_are_image_names_and_decode_as_shown(photos):
    for name in ("x.heic", "x.HEIC", "x.heif", "x.hif"):
        assert is_image_name(name), name
    assert IMAGE_EXTENSIONS[-3:] == ("heic", "heif", "hif")
    data = _heic(photos[0])
    assert data[4:12] == b"ftypheic"
    arr = decode_image(data)
    assert arr.shape == photos[0].shape and arr.dtype == np.uint8
    assert np.abs(arr.astype(int) - photos[0]).mean() < 4  # quality 90: the same picture
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees clockwise, as a phone held upright writes it
    turned = decode_image(_heic(photos[0], exif.tobytes()))
    assert turned.shape == (photos[0].shape[1], photos[0].shape[0], 3)  # turned once, not twice
    assert np.abs(turned.astype(int) - np.rot90(photos[0], -1)).mean() < 4


@needs_heif
def test_a_heic_in_a_folder_scores_like_its_png_twin(tmp_path, photos):
    d = tmp_path / "phone"
    d.mkdir()
    (d / "IMG_0001.heic").write_bytes(_heic(photos[1]))
    (d / "IMG_0001.png").write_bytes(_png(photos[1]))
    res = run_cli(["score", d, "--out", tmp_path / "s.csv", "-w", "1", "-q"])
    assert "not read" not in res.output, res.output
    df = pd.read_csv(tmp_path / "s.csv").set_index("key")
    heic, png = df.loc["IMG_0001.heic"], df.loc["IMG_0001.png"]
    assert heic["storage"] == "heif" and pd.isna(heic["error"]), heic.to_dict()
    h, w = photos[1].shape[:2]
    assert (heic["width"], heic["height"]) == (png["width"], png["height"]) == (w, h)
    assert np.isfinite(heic["score"]) and np.isfinite(png["score"])
    assert abs(heic["score"] - png["score"]) < 0.5, (heic["score"], png["score"])
    assert heic["flagged"] == png["flagged"]


@needs_heif
def test_heic_shard_members_are_judged_and_pass_through_filter_byte_for_byte(tmp_path, photos):
    from collapseguard.detectors import create

    clean, bad = _heic(photos[0]), _heic(degrade(photos[0], seed=3))
    scores = create("nss").score([decode_image(clean), decode_image(bad)])
    assert scores[1] > scores[0], "the degradation must survive HEIC encoding for nss to see it"
    members = [("clean.heic", clean), ("clean.txt", b"a clean photo"),
               ("bad.HEIC", bad), ("bad.json", b"{}"),
               ("twin.png", _png(photos[2])), ("twin.txt", b"a png")]
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        for name, data in members:
            add_member(tf, name, data)
    run_cli(["filter", shard, "--out", tmp_path / "out", "-d", "nss", "--threshold",
             float(scores.mean()), "-w", "1", "-q"])
    s = pd.read_parquet(tmp_path / "out" / "scores" / "s.parquet").set_index("key")
    assert s.loc["clean", "decision"] == "kept" and s.loc["bad", "decision"] == "rejected", s.to_dict()
    assert np.isclose(s.loc["clean", "score"], scores[0]) and np.isclose(s.loc["bad", "score"], scores[1])
    assert read_members(tmp_path / "out/kept/s.tar") == [m for m in members if not m[0].startswith("bad")]
    assert read_members(tmp_path / "out/rejected/s.tar") == members[2:4]


def _without_heif(script: str) -> dict:
    """Run ``script`` in a fresh interpreter where ``import pillow_heif`` fails (ImportError), as
    it does where the extra is not installed; it prints one JSON object."""
    block = "import sys; sys.modules['pillow_heif'] = None\n"
    out = subprocess.run([sys.executable, "-c", block + script], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_install_hint_is_the_heic_extra_from_python_3_11_and_a_newer_python_before(monkeypatch):
    """pillow-heif 1.9, the ``[heic]`` extra's floor, needs Python 3.11: on 3.10 the extra installs
    nothing, and the hint says what HEIC needs instead."""
    for version, hint in (((3, 10, 14, "final", 0), "HEIC needs Python 3.11 or later (pillow-heif 1.9)"),
                          ((3, 11, 0, "final", 0), "pip install 'collapseguard[heic]'"),
                          ((3, 13, 2, "final", 0), "pip install 'collapseguard[heic]'")):
        with monkeypatch.context() as m:
            m.setattr(sys, "version_info", version)
            got = heif_install()
        assert got == hint, (version, got)


def test_without_pillow_heif_heic_files_are_unread_and_the_messages_say_what_to_install(tmp_path, photos):
    """A HEIC file is made here by hand where pillow-heif is absent: a real HEIC only where it is
    installed. Unread, its bytes do not matter. The messages are those of the running Python, and
    with ``sys.version_info`` set to 3.10 those of Python 3.10."""
    heic = _heic(photos[0]) if pillow_heif is not None else b"\x00\x00\x00\x18ftypheic" + bytes(64)
    mixed, only = tmp_path / "mixed", tmp_path / "only"
    mixed.mkdir()
    only.mkdir()
    (mixed / "a.png").write_bytes(_png(photos[0]))
    (mixed / "a.heic").write_bytes(heic)
    (mixed / "b.HIF").write_bytes(heic)
    (only / "c.heic").write_bytes(heic)
    shard = tmp_path / "s.tar"
    members = [("p.heic", heic), ("p.txt", b"an iPhone photo"), ("q.png", _png(photos[1]))]
    with tarfile.open(shard, "w") as tf:
        for name, data in members:
            add_member(tf, name, data)
    got = _without_heif(f"""
import json
from click.testing import CliRunner
from collapseguard.cli import main
from collapseguard.images import IMAGE_EXTENSIONS, decode_image, heif_hint, DecodeError
def run(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    return [res.exit_code, " ".join(res.output.split())]
try:
    decode_image(open({str(only / 'c.heic')!r}, 'rb').read())  # a HEIC under any name
    under_another_name = ""
except DecodeError as exc:
    under_another_name = str(exc)
real_version, sys.version_info = sys.version_info, (3, 10, 14, "final", 0)
try:
    decode_image(open({str(only / 'c.heic')!r}, 'rb').read())
except DecodeError as exc:
    on_3_10 = [heif_hint(["x.heic"]), str(exc)]
finally:
    sys.version_info = real_version
print(json.dumps({{
    "on_3_10": on_3_10,
    "extensions": list(IMAGE_EXTENSIONS), "under_another_name": under_another_name,
    "score": run("score", {str(mixed)!r}, "--out", {str(tmp_path / "m.csv")!r}, "-d", "nss", "-w", "1", "-q"),
    "score_only": run("score", {str(only)!r}, "--out", {str(tmp_path / "o.csv")!r}, "-d", "nss", "-w", "1", "-q"),
    "audit": run("audit", {str(mixed)!r}, "--out", {str(tmp_path / "au")!r}, "-d", "nss", "--threshold", "3",
                 "-w", "1"),
    "calibrate_only": run("calibrate", "--clean", {str(only)!r}, "-d", "nss", "--no-plot", "--out",
                          {str(tmp_path / "c.json")!r}),
    "filter": run("filter", {str(shard)!r}, "--out", {str(tmp_path / "out")!r}, "-d", "nss", "--threshold",
                  "1e9", "-w", "1", "-q"),
}}))
""")
    assert "heic" not in got["extensions"] and "hif" not in got["extensions"]
    install = heif_install()
    assert got["under_another_name"].endswith(f"(a HEIF image; to read it: {install})"), got
    on_3_10 = "HEIC needs Python 3.11 or later (pillow-heif 1.9)"
    assert got["on_3_10"][0] == f"to read .heic files: {on_3_10}", got["on_3_10"]
    assert got["on_3_10"][1].endswith(f"(a HEIF image; to read it: {on_3_10})"), got["on_3_10"]
    code, text = got["score"]
    assert code == 0, text
    assert ("note: 2 file(s) in the folders given were not read, not being an image type: .heic (1), .hif (1) "
            "(images are .png") in text, text
    assert f"; .parquet); to read .heic, .hif files: {install}" in text, text
    assert pd.read_csv(tmp_path / "m.csv")["key"].tolist() == ["a.png"]
    code, text = got["audit"]
    assert code == 0 and f"to read .heic, .hif files: {install}" in text, text
    assert json.loads((tmp_path / "au" / "summary.json").read_text())["other_files"] == {".heic": 1, ".hif": 1}
    for key in ("score_only", "calibrate_only"):  # nothing else to read: the refusal says it
        code, text = got[key]
        assert code != 0 and text.endswith(f"; to read .heic files: {install}"), (key, text)
    code, text = got["filter"]
    assert code == 0, text
    s = pd.read_parquet(tmp_path / "out" / "scores" / "s.parquet").set_index("key")
    assert s.loc["p", "reason"] == "no_image" and s.loc["p", "decision"] == "kept", s.loc["p"].to_dict()
    assert s.loc["p", "error"].startswith("no image file in the sample (p.heic, p.txt are not image types")
    assert s.loc["p", "error"].endswith(f"; to read .heic files: {install}"), s.loc["p", "error"]
    assert s.loc["q", "reason"] == "kept"
    assert read_members(tmp_path / "out/kept/s.tar") == members  # nothing lost: kept unjudged, as it came


def _with_ispe(data: bytes, width: int, height: int) -> bytes:
    """``data`` (a HEIC holding one image item) with its ``ispe`` box (the image's size as the
    container states it, ISO/IEC 23008-12) claiming ``width`` x ``height``; the coded HEVC stream
    is left as it was."""
    import struct

    assert data.count(b"ispe") == 1, "one image item, no grid or thumbnail"
    at = data.index(b"ispe") + 8  # the box type, then its version and flags (4 bytes)
    return data[:at] + struct.pack(">II", width, height) + data[at + 8:]


def _count_heif_decodes(monkeypatch) -> list:
    """The size of each picture pillow-heif asks libheif to decode (``BaseImage.load`` with no
    pixels yet), each call passed on to the real one."""
    from pillow_heif.heif import BaseImage

    calls, real = [], BaseImage.load

    def load(self):
        if not self._data:
            calls.append(self.size)
        return real(self)

    monkeypatch.setattr(BaseImage, "load", load)
    return calls


@needs_heif
def test_a_heic_claiming_a_huge_size_is_refused_before_decoding(photos, monkeypatch):
    """A HEIC whose ``ispe`` claims 20000 x 20000 or 100000 x 100000 pixels (over ``MAX_PIXELS``)
    is refused from its header: no picture is decoded, the reason says its size and the row carries
    it. 20000 x 20000 (400 million) is over Pillow's own refusal (twice ``Image.MAX_IMAGE_PIXELS``),
    so the refusal and its text are collapseguard's as for any format."""
    from collapseguard.detectors import create
    from collapseguard.images import DecodeError
    from collapseguard.scoring.records import score_records

    small = _heic(photos[3][:64, :64])
    loads = _count_heif_decodes(monkeypatch)
    for (w, h), pixels in (((20000, 20000), "400,000,000"), ((100000, 100000), "10,000,000,000")):
        with pytest.raises(DecodeError) as err:
            decode_image(_with_ispe(small, w, h))
        assert str(err.value) == f"image too large: {pixels} pixels, over the 128,000,000-pixel limit"
        assert err.value.size == (w, h)
    (_, res), = list(score_records([[("IMG_0002.heic", _with_ispe(small, 20000, 20000))]], create("nss")))
    assert res.status == "decode_error" and "400,000,000 pixels" in res.error, res.error
    assert (res.width, res.height) == (20000, 20000)
    assert loads == [], "nothing decoded"
    assert decode_image(small).shape == (64, 64, 3) and loads == [(64, 64)]  # the spy sees a decode


@needs_heif
def test_a_heic_claiming_a_small_size_over_a_large_coded_picture_is_refused_by_libheif(photos, monkeypatch):
    """A HEIC whose ``ispe`` claims 64 x 48 pixels over a coded picture of 640 x 480: the claim is
    under ``MAX_PIXELS``, so collapseguard's size check passes it to pillow-heif to decode; there
    libheif refuses it by its own security limit (the coded frame may exceed the ``ispe`` size by
    one coding unit at most), before libde265 decodes the picture. A decode error, no array; its
    text is libheif's, checked only for naming the limit (libheif words it as it chooses)."""
    from collapseguard.images import DecodeError

    big = _heic(np.tile(photos[3][:240, :160], (2, 4, 1)))  # 640 x 480
    assert decode_image(big).shape == (480, 640, 3)
    loads = _count_heif_decodes(monkeypatch)
    with pytest.raises(DecodeError) as err:
        decode_image(_with_ispe(big, 64, 48))
    assert loads == [(64, 48)], "passed to libheif as the 64 x 48 its header claims"
    text = str(err.value)
    assert "limit" in text.lower(), (text, pillow_heif.libheif_info()["libheif"])


@needs_heif
def test_pillow_heif_decodes_with_no_more_threads_than_the_workers_budget(photos, tmp_path):
    """collapseguard registers pillow-heif's opener with the first HEIF file a process opens; its
    decoding threads (``pillow_heif.options.DECODE_THREADS``) are then capped to the process's
    thread budget as a worker sets it (``set_thread_budget``), and left at pillow-heif's default
    where the process has none."""
    path = tmp_path / "IMG_0003.heic"
    path.write_bytes(_heic(photos[3][:64, :64]))
    script = f"""
import json, sys
import pillow_heif
from collapseguard.engines.local import set_thread_budget
from collapseguard.images import decode_image
before = pillow_heif.options.DECODE_THREADS
if sys.argv[1] != "none":
    set_thread_budget(int(sys.argv[1]))
decode_image(open({str(path)!r}, "rb").read())
print(json.dumps([before, pillow_heif.options.DECODE_THREADS]))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                              "OPENBLAS_NUM_THREADS")}
    got = {}
    for budget in ("1", "2", "64", "none"):
        out = subprocess.run([sys.executable, "-c", script, budget], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        got[budget] = json.loads(out.stdout.strip().splitlines()[-1])
    default = got["none"][0]
    assert got == {"1": [default, 1], "2": [default, 2], "64": [default, default], "none": [default, default]}
