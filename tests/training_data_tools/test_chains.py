"""make_chains: files, manifest, determinism independent of workers, bad input."""

import json

import numpy as np
import pytest

from collapseguard.images import load_image
from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.manifest import read_manifest
from collapseguard.training_data_tools.replicators import ReplicatorError
from collapseguard.training_data_tools.sources import procedural_art


@pytest.fixture(scope="module")
def sources():
    return procedural_art(2, seed=11, min_side=64, max_side=96)


def test_make_chains_writes_pngs_and_manifest(tmp_path, sources):
    df = make_chains(sources, ["codec", "aspect_drift"], steps=4, keep=(0, 1, 3, 50), out_dir=tmp_path,
                     seed=1, workers=1, progress=False)
    assert len(df) == 2 * 2 * 3  # sources x families x kept steps (50 > steps is dropped)
    assert sorted(df["step"].unique()) == [0, 1, 3]
    back = read_manifest(tmp_path / "manifest.csv")
    assert len(back) == len(df) and set(back["family"]) == {"codec", "aspect_drift"}
    for _, row in back.iterrows():
        img = load_image(row["path"])
        src = dict(sources)[row["source_image"]]
        assert img.shape == src.shape
        if row["step"] == 0:
            np.testing.assert_array_equal(img, src)
    drift = back[(back["family"] == "aspect_drift") & (back["step"] == 3)]
    assert (drift["content_aspect_drift"].notna()).all()
    params = json.loads(back["params"].iloc[0])
    assert "strength" in params


def test_chains_same_for_any_worker_count(tmp_path, sources):
    a = make_chains(sources, ["noise_tint"], steps=2, keep=(0, 2), out_dir=tmp_path / "a",
                    seed=3, workers=1, progress=False)
    b = make_chains(sources[::-1], ["noise_tint"], steps=2, keep=(0, 2), out_dir=tmp_path / "b",
                    seed=3, workers=2, progress=False)
    assert list(a["chain_id"]) == list(b["chain_id"])
    for pa, pb in zip(a["path"], b["path"]):
        np.testing.assert_array_equal(load_image(pa), load_image(pb))


def test_run_chain_matches_written_images(tmp_path, sources):
    df = make_chains(sources[:1], ["scattered_dots"], steps=3, keep=(0, 3), out_dir=tmp_path,
                     seed=0, workers=1, progress=False, repeats=2)
    assert sorted(df["repeat"].unique()) == [0, 1]
    c0, c1 = (df[df["repeat"] == r] for r in (0, 1))
    assert not np.array_equal(load_image(c0["path"].iloc[-1]), load_image(c1["path"].iloc[-1]))


def test_bad_input_rejected(tmp_path, sources):
    with pytest.raises(ReplicatorError, match="unknown family"):
        make_chains(sources, ["nope"], steps=1, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="the sources gave no picture"):
        make_chains([], ["codec"], steps=1, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="uint8"):
        make_chains([("x", np.zeros((8, 8), np.uint8))], ["codec"], steps=1, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="duplicate source"):
        make_chains(sources[:1] * 2, ["codec"], steps=1, out_dir=tmp_path, progress=False)


def test_workers_from_a_stdin_script_fail_with_a_clear_error(tmp_path):
    """Spawned workers re-import the parent's main file; `python - <<EOF` has none. Before this
    was caught, every worker died and the pool raised an opaque BrokenProcessPool (seen when the
    calibration script ran make_chains from a here-document)."""
    import subprocess
    import sys
    script = f"""
from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.sources import procedural_art
make_chains(procedural_art(1, seed=1, min_side=64, max_side=64), ["codec"], steps=1,
            out_dir={str(tmp_path)!r}, workers=2, progress=False)
"""
    r = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "RuntimeError" in r.stderr and "<stdin>" in r.stderr and "one worker" in r.stderr
    assert "BrokenProcessPool" not in r.stderr
    # the same script from a file, with the guard the message asks for, runs
    f = tmp_path / "make.py"
    f.write_text("if __name__ == '__main__':\n" + "".join(f"    {line}\n" for line in script.strip().splitlines()))
    r = subprocess.run([sys.executable, str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "manifest.csv").exists()


def test_too_small_source_is_named_before_any_chain_is_made(tmp_path, sources):
    # a 1x40 picture in a folder used to fail only when its chain ran, as "image too small for a
    # replicator: 1x40" with no name, after the chains before it were written
    tiny = ("photos/strip", np.zeros((40, 1, 3), np.uint8))
    with pytest.raises(ValueError, match="'photos/strip': 1x40 is too small"):
        make_chains(list(sources) + [tiny], ["codec"], steps=1, out_dir=tmp_path, workers=1,
                    progress=False)
    assert not list(tmp_path.rglob("*.png"))


def test_make_chains_in_the_callers_process_gives_its_torch_threads_back(tmp_path, sources):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        make_chains(sources[:1], ["codec"], steps=1, keep=[1], out_dir=tmp_path, workers=1, progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_manifest_is_whole_or_absent(tmp_path, sources, monkeypatch):
    """Recipes make a chains folder once, when its manifest is missing; a write stopped halfway
    must leave no manifest behind (it is written beside and renamed), and a rewrite replaces it."""
    import pandas as pd

    from collapseguard.training_data_tools.manifest import write_manifest

    df = make_chains(sources, ["codec"], steps=1, keep=(0, 1), out_dir=tmp_path, seed=1, workers=1,
                     progress=False, manifest_name="first.csv")
    real = pd.DataFrame.to_csv

    def stops_halfway(self, path, **kw):
        with open(path, "w") as f:
            f.write(real(self, **kw)[:40])
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_csv", stops_halfway)
    with pytest.raises(KeyboardInterrupt):
        write_manifest(df, tmp_path / "manifest.csv")
    assert not (tmp_path / "manifest.csv").exists()
    monkeypatch.setattr(pd.DataFrame, "to_csv", real)
    write_manifest(df, tmp_path / "manifest.csv")
    assert len(read_manifest(tmp_path / "manifest.csv")) == len(df)
    assert sorted(p.name for p in tmp_path.glob("*.csv")) == ["first.csv", "manifest.csv"]


def test_a_rerun_reuses_the_chains_an_interrupted_run_finished(tmp_path, sources, monkeypatch):
    """An interrupted run (stopped inside its third chain) leaves two finished chains; the rerun
    into the same folder makes only the others, and writes the manifest and files of a run that
    never stopped. A finished chain whose file changed, or made with other settings, is made
    again."""
    import pandas as pd

    from collapseguard.training_data_tools import chains as chains_mod

    kw = dict(steps=3, keep=(0, 1, 3), seed=2, workers=1, progress=False)
    whole = make_chains(sources, ["noise_tint", "codec"], out_dir=tmp_path / "whole", **kw)
    real, made = chains_mod.run_chain, []

    def stops_at_the_third(*args, **kwargs):
        made.append(args[1])
        if len(made) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(chains_mod, "run_chain", stops_at_the_third)
    out = tmp_path / "split"
    with pytest.raises(KeyboardInterrupt):
        make_chains(sources, ["noise_tint", "codec"], out_dir=out, **kw)
    assert len(list(out.rglob(chains_mod.DONE_NAME))) == 2 and not (out / "manifest.csv").exists()
    made.clear()
    monkeypatch.setattr(chains_mod, "run_chain", lambda *a, **k: made.append(a[1]) or real(*a, **k))
    again = make_chains(sources, ["noise_tint", "codec"], out_dir=out, **kw)
    assert len(made) == 2  # the two unfinished chains only
    rel = lambda df, root: df.assign(path=[str(p).replace(str(root), "") for p in df["path"]])  # noqa: E731
    pd.testing.assert_frame_equal(rel(again, out), rel(whole, tmp_path / "whole"))
    for a, b in zip(sorted((tmp_path / "whole").rglob("*.png")), sorted(out.rglob("*.png"))):
        assert a.read_bytes() == b.read_bytes()
    # a changed file, or another --steps, is not reused
    (out / "manifest.csv").unlink()
    first = sorted(out.rglob("step_003.png"))[0]
    first.write_bytes(b"changed")
    made.clear()
    make_chains(sources, ["noise_tint", "codec"], out_dir=out, **kw)
    assert len(made) == 1 and first.read_bytes() != b"changed"
    (out / "manifest.csv").unlink()
    made.clear()
    make_chains(sources, ["noise_tint", "codec"], out_dir=out, **{**kw, "steps": 4, "keep": (0, 1, 4)})
    assert len(made) == 4
