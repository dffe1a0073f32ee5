"""Every data file the package needs (weights, default calibrations) is declared in setup.cfg's
package_data, so a wheel install works like the editable one CI uses."""

from __future__ import annotations

import configparser
import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_package_data_covers_every_data_file():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["collapseguard"].split(",")]
    pkg = ROOT / "collapseguard"
    data = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(d.startswith("weights/") for d in data) and any(d.startswith("calibration/defaults/") for d in data)
    missing = [d for d in data if not any(fnmatch.fnmatch(d, pat) for pat in patterns)]
    assert not missing, f"not in setup.cfg package_data, so missing from a wheel: {missing}"
