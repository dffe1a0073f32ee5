"""Folders of symbolic links (data sets assembled without copying) are read by the rule of
collapseguard.io.walk: folder links are followed, loops and second links to a folder are
reported, a link to a single file outside the chosen folders is never read or exported."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from collapseguard.cli import main
from collapseguard.io.walk import OUTSIDE, walk


def _img(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 10, 3), value, np.uint8)).save(path)


@pytest.fixture()
def linked(tmp_path):
    """store/ holds the real chain folders; dataset/ links two families in (one twice), links a
    loop back to itself, and holds one file link to a private picture outside both."""
    store = tmp_path / "store"
    for fam in ("flux", "qwen"):
        for c in ("c1", "c2"):
            for s in range(3):
                _img(store / fam / c / f"step_{s}.png", 10 * s + (fam == "qwen"))
    _img(tmp_path / "private" / "secret.png", 200)
    ds = tmp_path / "dataset"
    ds.mkdir()
    (ds / "flux").symlink_to(store / "flux", target_is_directory=True)
    (ds / "qwen").symlink_to(store / "qwen", target_is_directory=True)
    (ds / "qwen_again").symlink_to(store / "qwen", target_is_directory=True)
    (ds / "loop").mkdir()
    (ds / "loop" / "back").symlink_to(ds, target_is_directory=True)
    (store / "flux" / "c1" / "step_3.png").symlink_to(tmp_path / "private" / "secret.png")
    (store / "flux" / "c2" / "step_3.png").symlink_to(store / "qwen" / "c2" / "step_2.png")
    return ds, tmp_path / "private" / "secret.png"


def test_walk_follows_folder_links_once_and_reports_the_rest(linked):
    ds, secret = linked
    w = walk(ds)
    seen = [p.relative_to(ds).as_posix() for p in w.paths]
    assert "flux/c1/step_0.png" in seen and "qwen/c2/step_2.png" in seen
    assert not any(s.startswith(("qwen_again/", "loop/")) for s in seen)
    assert "flux/c2/step_3.png" in seen  # a file link into a linked folder: chosen by the user
    assert secret.resolve() not in {real for _, real in w.files}
    why = dict(w.skipped)
    assert why["flux/c1/step_3.png"] == OUTSIDE
    assert why["qwen_again"] == "a link to a folder already read"
    assert why["loop/back"] == "a link loop: it points to a folder above it"


def test_chains_ls_and_export_read_symlinked_chain_folders(linked, tmp_path):
    ds, secret = linked
    res = CliRunner().invoke(main, ["chains", "ls", str(ds)])
    assert res.exit_code == 0, res.output
    assert "chains: 4  images: 13" in res.output, res.output
    assert "flux/c1/step_3.png: " + OUTSIDE in res.output
    res = CliRunner().invoke(main, ["chains", "export", str(ds), "--out", str(tmp_path / "shards")])
    assert res.exit_code == 0, res.output
    packed = []
    for shard in sorted((tmp_path / "shards").glob("*.tar")):
        with tarfile.open(shard) as tf:
            packed += [tf.extractfile(m).read() for m in tf.getmembers() if m.name.endswith(".png")]
    assert len(packed) == 13
    assert secret.read_bytes() not in packed  # never a file the user did not name or link
    store_files = {p.read_bytes() for p in (tmp_path / "store").rglob("*.png") if not p.is_symlink()}
    assert set(packed) <= store_files


def test_score_reads_a_folder_of_folder_links(linked, tmp_path):
    ds, _ = linked
    out = tmp_path / "scores.csv"
    res = CliRunner().invoke(main, ["score", str(ds), "-d", "nss", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    import pandas as pd
    keys = pd.read_csv(out)["key"].tolist()
    # score reads file links wherever they point; a file reached twice is scored once
    assert "flux/c1/step_0.png" in keys and "flux/c1/step_3.png" in keys
    assert "flux/c2/step_3.png" in keys and "qwen/c2/step_2.png" not in keys  # one file: first name
    assert len(keys) == 13 and not any(k.startswith(("qwen_again/", "loop/")) for k in keys)


def test_audit_finds_the_images_of_linked_folders_by_their_keys(linked):
    from collapseguard.scoring.readback import _file_path
    ds, _ = linked
    path = _file_path(str(ds), "flux/c1/step_0.png")
    assert path is not None and Image.open(path).size == (10, 8)
    assert _file_path(str(ds), "../private/secret.png") is None  # a key never climbs out
    assert _file_path(str(ds), "/etc/passwd") is None


def test_train_clean_folders_read_file_links_wherever_they_point(tmp_path):
    """The training recipe links its clean pictures out of unpacked packages: ``train --clean``
    reads them (it trains on them and never packs them), unlike the chain readers."""
    from skimage import data

    from collapseguard.images import encode_png
    from collapseguard.training.negatives import list_images
    elsewhere = tmp_path / "debs"
    elsewhere.mkdir()
    (elsewhere / "a.png").write_bytes(encode_png(data.astronaut()[:64, :64]))
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "a.png").symlink_to(elsewhere / "a.png")
    assert [p.name for p in list_images([clean])] == ["a.png"]
