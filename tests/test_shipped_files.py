"""Files shipped inside the package (every JSON that setup.cfg's package_data puts in a wheel)
hold no absolute paths: a maintainer's folders mean nothing on a user's machine, and
`collapseguard calibrations` prints none."""

from __future__ import annotations

import configparser
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "collapseguard"

#: an absolute path: /a/b (POSIX, two parts at least, at the start of a word), C:\ or C:/, ~/
ABSOLUTE = re.compile(r"(?:^|[\s'\"(=,:;\[])(/[\w.@+-]+/[\w.@+-]+)|\b[A-Za-z]:[\\/][\w.]|(?:^|\s)~/")


def shipped_json() -> list[Path]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["collapseguard"].split(",")]
    return sorted(p for p in PKG.rglob("*.json")
                  if any(fnmatch.fnmatch(p.relative_to(PKG).as_posix(), pat) for pat in patterns))


def strings(value, where="$"):
    """Every string in a JSON value (keys too), with where it is."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"{where}.{k} (key)", str(k)
            yield from strings(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{where}[{i}]")


@pytest.mark.parametrize("text, absolute", [
    ("/work/data/cal/x.png", True), ("scores table /home/me/s.csv", True),
    ("--from-scores /tmp/a/s.csv --x 1", True), (r"C:\Users\me\x.json", True), ("~/data/x", True),
    ("$CG_CALIB_WORK/clean/photos/a.jpg", False), ("step 0 of 1/3 of the wallpapers", False),
    ("clean/photos/wp-041", False), ("JPEG 4:2:0 q60-95", False), ("a/b", False),
])
def test_the_pattern_finds_absolute_paths_only(text, absolute):
    assert bool(ABSOLUTE.search(text)) == absolute


def test_shipped_json_holds_no_absolute_paths():
    files = shipped_json()
    names = {p.relative_to(PKG).as_posix() for p in files}
    assert {"calibration/defaults/cnn.json", "calibration/defaults/nss.json",
            "weights/cnn.onnx.json"} <= names
    hits = []
    for p in files:
        for where, s in strings(json.loads(p.read_text(encoding="utf-8"))):
            if ABSOLUTE.search(s):
                hits.append(f"{p.relative_to(PKG)} {where}: {s[:120]!r}")
    assert not hits, "absolute paths in shipped files:\n" + "\n".join(hits)


def test_printing_the_shipped_calibrations_shows_no_absolute_path():
    out = subprocess.run([sys.executable, "-c", "from collapseguard.cli import main; main()", "calibrations"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    assert "== cnn.json (shipped with the package)" in out and "threshold" in out
    hits = [line for line in out.splitlines() if ABSOLUTE.search(line)]
    assert not hits, "\n".join(hits)
