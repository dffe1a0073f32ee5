"""Chain loaders: a folder holding several sets (each with its own manifest), and a folder that is
itself one chain's folder."""

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from PIL import Image

from collapseguard.cli import main
from collapseguard.training_data_tools.loaders import ChainLayoutError, discover_chains
from collapseguard.training_data_tools.manifest import ManifestError, write_manifest


def _img(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 10, 3), value, np.uint8)).save(path)


def _set(folder, family, chains, value=0, params="{}"):
    """A ``chains make``-like output: FAMILY/CHAIN/step_XXX.png and manifest.csv (relative paths)."""
    rows = []
    for c in chains:
        for s in (0, 1, 3):
            rel = f"{family}/{c}/step_{s:03d}.png"
            _img(folder / rel, value + s)
            rows.append({"chain_id": c, "source_image": c.split("-")[0], "family": family,
                         "task": "replicate", "step": s, "path": str(folder / rel), "params": params})
    write_manifest(pd.DataFrame(rows), folder / "manifest.csv")


def test_a_folder_of_sets_reads_each_sets_manifest(tmp_path):
    sets = tmp_path / "sets"
    _set(sets / "setA", "codec", ["astro-codec", "cat-codec"], params='{"q": 5}')
    _set(sets / "setB", "texture_simplify", ["astro-tex"])
    _img(sets / "setB" / "texture_simplify" / "astro-tex" / "step_009.png")  # in no manifest
    d = discover_chains(sets)
    df = d.manifest
    # the families and sources of the manifests, not the set folders' names
    assert set(df["family"]) == {"codec", "texture_simplify"}
    assert set(df["task"]) == {"replicate"}
    assert sorted(df["source_image"].unique()) == ["astro", "cat"]
    assert sorted(df["chain_id"].unique()) == ["astro-codec", "astro-tex", "cat-codec"]
    assert "params" in df.columns and len(df) == 9
    assert any("setA/manifest.csv" in n and "setB/manifest.csv" in n for n in d.notes)
    assert d.unplaced == [("setB/texture_simplify/astro-tex/step_009.png", "named by no manifest")]
    assert "setA/manifest.csv" in d.summary()


def test_a_chain_id_in_two_sets_with_different_images_is_refused(tmp_path):
    sets = tmp_path / "sets"
    _set(sets / "setA", "codec", ["astro-codec"], value=0)
    _set(sets / "setB", "codec", ["astro-codec"], value=50)
    with pytest.raises(ChainLayoutError) as e:
        discover_chains(sets)
    msg = str(e.value)
    assert "astro-codec" in msg and "setA/manifest.csv" in msg and "setB/manifest.csv" in msg
    assert "\n" not in msg


def test_a_set_given_twice_is_read_once_and_a_bad_nested_manifest_is_refused(tmp_path):
    sets = tmp_path / "sets"
    _set(sets / "setA", "codec", ["astro-codec"])
    _set(sets / "copy", "codec", ["astro-codec"])
    d = discover_chains(sets)
    assert d.manifest["chain_id"].nunique() == 1 and len(d.manifest) == 3 and not d.unplaced
    assert any("read once" in n for n in d.notes)
    # each manifest is validated as read_manifest validates it: no path outside its own folder
    (sets / "copy" / "manifest.csv").write_text(
        "chain_id,source_image,family,task,step,path\nx,x,f,t,0,../setA/codec/astro-codec/step_000.png\n"
        "x,x,f,t,1,../setA/codec/astro-codec/step_001.png\n")
    with pytest.raises(ManifestError, match="outside"):
        discover_chains(sets)


@pytest.mark.parametrize("names", [[f"IMG_{i:04d}.jpg" for i in range(1, 8)],
                                   [f"step_{i:03d}.png" for i in range(4)]])
def test_a_folder_that_is_one_chain_is_read_as_that_chain(tmp_path, names):
    """Named directly, one chain's folder is read as it is when its parent is named: one chain
    named after the folder (README: files numbered in one folder are one chain)."""
    chain = tmp_path / "imgjpg"
    for i, n in enumerate(names):
        _img(chain / n, 10 * i)
    d = discover_chains(chain)
    parent = discover_chains(tmp_path)
    cols = ["chain_id", "source_image", "family", "task", "step", "path"]
    assert d.manifest[cols].equals(parent.manifest[cols])
    assert list(d.manifest["chain_id"].unique()) == ["imgjpg"] and len(d.manifest) == len(names)
    assert not d.unplaced and any("one chain named after the folder" in n for n in d.notes)


def test_a_refusal_lists_a_few_files_not_all(tmp_path):
    for i in range(30):
        _img(tmp_path / "photos" / f"holiday photo {chr(97 + i // 26)}{chr(97 + i % 26)}.png")
    res = CliRunner().invoke(main, ["chains", "ls", str(tmp_path / "photos")])
    assert res.exit_code == 1
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and line.count("unplaced ") == 5, line
    assert "and 25 more" in line and len(line) < 1200, len(line)
