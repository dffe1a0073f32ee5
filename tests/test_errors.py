"""One error base: every error collapseguard raises on purpose is a CollapseguardError (keeping its
other base), and the command line prints one as one line, ``collapseguard: error: ...``, exit 1."""

from __future__ import annotations

import importlib
import pkgutil
import tarfile

import pytest
from click.testing import CliRunner

import collapseguard
from collapseguard.cli import main
from collapseguard.errors import CollapseguardError


def package_exceptions() -> dict[str, type]:
    """Every exception class defined in a collapseguard module (modules whose optional extra is
    missing here are skipped; ``__main__`` modules are not imported, they run)."""
    found = {}
    for info in pkgutil.walk_packages(collapseguard.__path__, "collapseguard."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:
            continue
        for obj in vars(mod).values():
            if (isinstance(obj, type) and issubclass(obj, BaseException)
                    and obj.__module__ == info.name):
                found[f"{info.name}.{obj.__name__}"] = obj
    return found


def test_every_domain_error_derives_from_the_base_and_keeps_its_other_base():
    found = package_exceptions()
    names = {k.rsplit(".", 1)[-1] for k in found}
    # the walk sees them (a walk that found nothing would pass the check below)
    assert {"DecodeError", "InputError", "DetectorError", "CalibrationError", "CalibrationMismatch",
            "NoThresholdError", "NotEnoughCleanSamples", "ManifestError", "FilterError",
            "EngineError", "TruncatedShardError", "RunLostError", "AuditError"} <= names
    stray = sorted(k for k, cls in found.items()
                   if not issubclass(cls, CollapseguardError)
                   and k not in (
                       "collapseguard.cli.CommandError",  # click's exception that prints them
                       # a signal's unwinding, not an error: a BaseException, so that no
                       # `except Exception` (a per-image decode error, say) can swallow it
                       "collapseguard.engines.local.WorkerStopped",
                       # SIGTERM taken as Ctrl-C: a KeyboardInterrupt, for the same reason
                       "collapseguard.cli.Terminated"))
    assert not stray, f"not a CollapseguardError: {stray}"
    from collapseguard.cli import Terminated
    from collapseguard.engines.local import WorkerStopped
    assert not issubclass(WorkerStopped, Exception) and not issubclass(Terminated, Exception)
    by_name = {k.rsplit(".", 1)[-1]: v for k, v in found.items()}
    for name in ("DecodeError", "InputError", "CalibrationError", "ManifestError", "SourceError"):
        assert issubclass(by_name[name], ValueError), name
    for name in ("DetectorError", "FilterError", "EngineError", "AuditError"):
        assert issubclass(by_name[name], RuntimeError), name
    assert issubclass(by_name["TruncatedShardError"], tarfile.ReadError)


def test_errors_module_is_the_floor():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(importlib.import_module("collapseguard.errors").__file__).read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(getattr(n, "module", None) == "__future__" for n in imports)


def test_a_domain_error_keeps_its_message_and_pickles():
    import pickle

    from collapseguard.calibration.bounds import NotEnoughCleanSamples
    from collapseguard.io.tar import TruncatedShardError

    for exc in (TruncatedShardError("a.tar: cut short"), NotEnoughCleanSamples(5, 60, 0.01, 0.95)):
        back = pickle.loads(pickle.dumps(exc))  # errors cross worker processes
        assert type(back) is type(exc) and str(back) == str(exc)


@pytest.fixture()
def empty(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not an image")
    return tmp_path


#: (command line, text the one error line holds); "{t}" is a fresh temporary folder with an empty
#: folder "empty" and a text file "notes.txt" in it
KNOWN_ERRORS = [
    ("score {t}/none.tar -o {t}/o.csv", "no such file or folder"),
    ("score -d nope {t}/empty -o {t}/o.csv", "unknown detector 'nope'"),
    # the inputs are checked before a model loads (a 7B judge takes minutes): the missing input
    # is the error, not the missing weights
    ("score -d cnn:{t}/no.safetensors {t}/none.tar -o {t}/o.csv", "none.tar: no such file or folder"),
    ("filter {t}/none.tar --out {t}/f", "no such file or folder"),
    ("filter {t}/empty --out {t}/f --threshold 1", "no .tar shards found"),
    ("audit {t}/none.tar --out {t}/a -d nss", "no such file or folder"),
    ("calibrate --chains {t}/empty --out {t}/c.json --detector nss", "could not find replication chains"),
    ("evaluate --chains {t}/empty --out {t}/ev --detectors nss", "could not find replication chains"),
    ("train --chains {t}/empty --out {t}/w.safetensors", "no manifest.csv or manifest.parquet in"),
    ("chains store {t}/empty --out {t}/st", "--manifest-out"),
    ("chains ls {t}/empty", "could not find replication chains"),
    ("train --steps 2 --teacher nss --images {t}/notes.txt --out {t}/w.safetensors",
     "notes.txt: not a folder or an image file"),
    ("chains make --sources folder:{t}/empty --out {t}/m", "the sources gave no picture (an empty folder"),
    ("chains make --sources art:0 --out {t}/m", "'art:0' makes no pictures: N must be 1 or more"),
    ("chains make --sources pixel:0 --out {t}/m", "'pixel:0' makes no pictures: N must be 1 or more"),
    ("chains make --sources art:1:8-8 --out {t}/m", "'art:1:8-8': the sides MIN-MAX need 32 <= MIN <= MAX"),
    ("chains export {t}/empty --out {t}/x", "could not find replication chains"),
    ("chains sheet {t}/empty --out {t}/s.png", "could not find replication chains"),
    ("chains store {t}/empty --out {t}/st", "no manifest.csv or manifest.parquet"),
    ("demo {t}/d -d nope", "unknown detector 'nope'"),
]


@pytest.mark.parametrize("line,text", KNOWN_ERRORS, ids=[c.split(" {")[0] for c, _ in KNOWN_ERRORS])
def test_a_known_error_is_one_line_and_exit_1(empty, line, text):
    res = CliRunner().invoke(main, line.format(t=empty).split())
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("collapseguard: error: ")]
    assert len(errors) == 1 and text in errors[0], res.stderr
    assert "Error:" not in res.output  # not click's own format beside ours


def test_usage_errors_stay_clicks_with_exit_2(empty):
    res = CliRunner().invoke(main, ["score", str(empty / "empty")])  # no --out
    assert res.exit_code == 2 and "Missing option '--out'" in res.output


def test_an_error_listing_what_a_folder_holds_reads_as_one_line(tmp_path):
    """The chains loaders' "could not find replication chains" lists what was seen; on the command
    line it is one readable line, its parts joined with "; ", not escaped newlines."""
    import numpy as np
    from PIL import Image

    (tmp_path / "photos").mkdir()
    for name in ("sunset.png", "beach.jpg"):
        Image.fromarray(np.full((24, 32, 3), 120, np.uint8)).save(tmp_path / "photos" / name)
    res = CliRunner().invoke(main, ["chains", "ls", str(tmp_path / "photos")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("collapseguard: error: ")]
    assert len(errors) == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    line = errors[0]
    assert "\\n" not in line, line
    assert "seen: 2 file(s)" in line and "e.g. beach.jpg, sunset.png" in line
    assert "unplaced sunset.png: no step number" in line and "; supported: a manifest" in line
