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
    HEIF_INSTALL,
    IMAGE_EXTENSIONS,
    decode_image,
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


def test_without_pillow_heif_heic_files_are_unread_and_the_messages_say_what_to_install(tmp_path, photos):
    """A HEIC file is made here by hand where pillow-heif is absent: a real HEIC only where it is
    installed. Unread, its bytes do not matter."""
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
from collapseguard.images import IMAGE_EXTENSIONS, decode_image, DecodeError
def run(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    return [res.exit_code, " ".join(res.output.split())]
try:
    decode_image(open({str(only / 'c.heic')!r}, 'rb').read())  # a HEIC under any name
    under_another_name = ""
except DecodeError as exc:
    under_another_name = str(exc)
print(json.dumps({{
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
    assert HEIF_INSTALL == "pip install 'collapseguard[heic]'"
    assert got["under_another_name"].endswith(f"(a HEIF image: {HEIF_INSTALL} reads it)"), got
    code, text = got["score"]
    assert code == 0, text
    assert ("note: 2 file(s) in the folders given were not read, not being an image type: .heic (1), .hif (1) "
            "(images are .png") in text, text
    assert f"; .parquet); to read .heic, .hif files: {HEIF_INSTALL}" in text, text
    assert pd.read_csv(tmp_path / "m.csv")["key"].tolist() == ["a.png"]
    code, text = got["audit"]
    assert code == 0 and f"to read .heic, .hif files: {HEIF_INSTALL}" in text, text
    assert json.loads((tmp_path / "au" / "summary.json").read_text())["other_files"] == {".heic": 1, ".hif": 1}
    for key in ("score_only", "calibrate_only"):  # nothing else to read: the refusal says it
        code, text = got[key]
        assert code != 0 and text.endswith(f"; to read .heic files: {HEIF_INSTALL}"), (key, text)
    code, text = got["filter"]
    assert code == 0, text
    s = pd.read_parquet(tmp_path / "out" / "scores" / "s.parquet").set_index("key")
    assert s.loc["p", "reason"] == "no_image" and s.loc["p", "decision"] == "kept", s.loc["p"].to_dict()
    assert s.loc["p", "error"].startswith("no image file in the sample (p.heic, p.txt are not image types")
    assert s.loc["p", "error"].endswith(f"; to read .heic files: {HEIF_INSTALL}"), s.loc["p", "error"]
    assert s.loc["q", "reason"] == "kept"
    assert read_members(tmp_path / "out/kept/s.tar") == members  # nothing lost: kept unjudged, as it came
