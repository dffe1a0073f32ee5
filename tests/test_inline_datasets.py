"""The batched function for Hugging Face ``datasets``: on a real ``datasets.Dataset`` built
offline from Parquet files, ``.filter`` keeps exactly the rows ``collapseguard filter`` keeps and
``.map`` adds the scores filter writes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from cg_testutil import degrade, run_cli

from collapseguard.images import decode_image, encode_jpeg


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory, photos):
    import datasets
    d = tmp_path_factory.mktemp("hf")
    files = []
    for part, chunk in enumerate((photos[:2], photos[2:])):
        imgs = []
        for i, p in enumerate(chunk):
            imgs += [encode_jpeg(p, 92), encode_jpeg(degrade(p, seed=i), 92)]
        imgs.append(b"not an image")
        ds = datasets.Dataset.from_dict({
            "image": [{"bytes": b, "path": f"{part}-{i}.jpg"} for i, b in enumerate(imgs)],
            "n": [part * 100 + i for i in range(len(imgs))]})
        path = d / f"part-{part}.parquet"
        ds.cast_column("image", datasets.Image()).to_parquet(str(path))
        files.append(path)
    return files


def test_dataset_filter_and_map_decide_as_filter_does(parquet_files, tmp_path, photos):
    import datasets

    from collapseguard.detectors import create
    from collapseguard.inline import hf_scorer
    # a threshold that splits the stored clean photos from their degraded copies (as the fixture
    # stores them), so both decisions occur
    nss = create("nss")
    chunks = [list(enumerate(c)) for c in (photos[:2], photos[2:])]
    clean = nss.score([decode_image(encode_jpeg(p, 92)) for c in chunks for _, p in c])
    bad = nss.score([decode_image(encode_jpeg(degrade(p, seed=i), 92)) for c in chunks for i, p in c])
    assert bad.min() > clean.max()
    threshold = float((clean.max() + bad.min()) / 2)
    run_cli(["filter", *parquet_files, "-o", tmp_path / "out", "-d", "nss", "--threshold", threshold,
             "-w", "1", "-q"])
    want_kept = [n for f in parquet_files for n in pq.read_table(tmp_path / "out/kept" / f.name)["n"].to_pylist()]
    scores = pd.concat([pd.read_parquet(tmp_path / "out/scores" / f"{f.stem}.parquet") for f in parquet_files])
    assert 0 < len(want_kept) < len(scores) and "degraded" in scores["reason"].tolist()

    ds = datasets.Dataset.from_parquet([str(f) for f in parquet_files])
    assert len(ds) == len(scores)
    ds = ds.cast_column("image", datasets.Image(decode=False))
    scorer = hf_scorer("nss", threshold=threshold)
    kept = ds.filter(scorer.keep, batched=True, batch_size=3)
    assert kept["n"] == want_kept
    scored = ds.map(scorer, batched=True, batch_size=4)
    np.testing.assert_allclose(np.array(scored["score"], dtype=float), scores["score"].to_numpy(),
                               equal_nan=True)
    assert scored["decision"] == scores["decision"].tolist()
    assert scored["reason"] == scores["reason"].tolist()
    assert "decode_error" in scored["reason"] and all(scored["score_error"][i] for i, r in
                                                      enumerate(scored["reason"]) if r == "decode_error")


def test_decoded_images_are_refused_with_the_cast_to_use(tmp_path, photos):
    import datasets

    from collapseguard.inline import hf_scorer
    ds = datasets.Dataset.from_dict({"image": [{"bytes": encode_jpeg(photos[0]), "path": "a.jpg"}]})
    ds.cast_column("image", datasets.Image()).to_parquet(str(tmp_path / "a.parquet"))
    ds = datasets.Dataset.from_parquet(str(tmp_path / "a.parquet"))  # decode=True: PIL images
    with pytest.raises(TypeError, match=r"decode=False"):
        ds.filter(hf_scorer("nss", threshold=1.0).keep, batched=True)


def test_the_image_column_is_found_as_filter_finds_it_and_has_alpha_is_carried(tmp_path, photos):
    """An ``Image`` feature under a name of its own (``picture``): ``filter`` finds it by type, and
    so does the scorer; ``.map`` carries ``has_alpha`` as filter's scores do."""
    import datasets

    from collapseguard.images import encode_png
    from collapseguard.inline import hf_scorer
    rgba = np.dstack([photos[1][:96, :96], np.where(np.arange(96) < 48, 0, 255).astype(np.uint8)
                      [None, :].repeat(96, 0)])
    imgs = [encode_jpeg(photos[0], 92), encode_png(rgba), encode_png(photos[2][:96, :96])]
    ds = datasets.Dataset.from_dict({"picture": [{"bytes": b, "path": f"{i}.img"} for i, b in enumerate(imgs)],
                                     "n": list(range(len(imgs)))})
    src = tmp_path / "p.parquet"
    ds.cast_column("picture", datasets.Image()).to_parquet(str(src))
    run_cli(["filter", src, "-o", tmp_path / "out", "-d", "nss", "--threshold", 5.0, "-w", "1", "-q"])
    want = pd.read_parquet(tmp_path / "out/scores/p.parquet")
    assert want["has_alpha"].tolist() == [False, True, False]

    ds = datasets.Dataset.from_parquet(str(src)).cast_column("picture", datasets.Image(decode=False))
    scored = ds.map(hf_scorer("nss", threshold=5.0), batched=True, batch_size=2)
    np.testing.assert_allclose(scored["score"], want["score"].to_numpy())
    assert scored["decision"] == want["decision"].tolist()
    assert scored["has_alpha"] == want["has_alpha"].tolist()


@pytest.fixture(scope="module")
def clean_and_degraded(photos):
    """A ``datasets.Dataset`` of 8 rows: each photo encoded, then a degraded copy of it."""
    import datasets
    imgs = [b for i, p in enumerate(photos) for b in (encode_jpeg(p, 92), encode_jpeg(degrade(p, seed=i), 92))]
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in imgs], "n": list(range(len(imgs)))},
        features=datasets.Features({"image": datasets.Image(decode=False), "n": datasets.Value("int64")}))


def test_map_with_num_proc_sends_the_scorer_to_the_workers_as_its_settings(clean_and_degraded):
    """``num_proc=2`` pickles the scorer into each worker, which creates its own detector: the
    default cnn (onnxruntime, as ``filter --runtime auto``) decides exactly as with one process."""
    import pickle

    from collapseguard.inline import hf_scorer
    scorer = hf_scorer()
    assert len(pickle.dumps(scorer)) < 2000  # settings, not a session or a network
    from collapseguard.detectors import create
    assert scorer._decider.detector.runtime == create("cnn", runtime="auto").runtime  # as `filter`
    one = clean_and_degraded.map(scorer, batched=True, batch_size=3)
    two = clean_and_degraded.map(scorer, batched=True, batch_size=3, num_proc=2)
    assert two["n"] == one["n"] and two["decision"] == one["decision"]
    np.testing.assert_allclose(two["score"], one["score"], atol=1e-5)  # batched otherwise
    again = pickle.loads(pickle.dumps(scorer))
    assert again.threshold == scorer.threshold and again(clean_and_degraded[:4]) == scorer(clean_and_degraded[:4])


def test_map_with_num_proc_after_torch_ran_in_the_parent_finishes(clean_and_degraded, tmp_path):
    """The torch cnn run in the parent, then ``num_proc=2``: forked workers limit torch to one
    thread before creating their detector (OpenMP's pool does not survive a fork; it hung)."""
    import subprocess
    import sys
    clean_and_degraded.to_parquet(str(tmp_path / "d.parquet"))
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, datasets\n"
        "from collapseguard.inline import hf_scorer\n"
        "if __name__ == '__main__':\n"
        "    ds = datasets.Dataset.from_parquet(sys.argv[1], keep_in_memory=True)\n"
        "    ds = ds.cast_column('image', datasets.Image(decode=False))\n"
        "    probe = hf_scorer(threshold=0.0, detector_kwargs={'runtime': 'torch'})\n"
        "    scores = sorted(probe(ds[:])['score'])\n"
        "    s = hf_scorer(threshold=(scores[3] + scores[4]) / 2, detector_kwargs={'runtime': 'torch'})\n"
        "    one = ds.map(s, batched=True, batch_size=3)\n"
        "    two = ds.map(s, batched=True, batch_size=3, num_proc=2)\n"
        "    assert two['decision'] == one['decision'], (one['score'], two['score'])\n"
        "    assert max(abs(a - b) for a, b in zip(one['score'], two['score'])) < 1e-5\n"
        "    print(one['decision'])\n")
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "2", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    try:
        res = subprocess.run([sys.executable, str(script), str(tmp_path / "d.parquet")], env=env,
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("ds.map(scorer, num_proc=2) hung after torch ran in the parent")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "'kept'" in res.stdout and "'rejected'" in res.stdout


def test_scorers_made_alike_hash_alike_so_datasets_caches_their_map(clean_and_degraded, tmp_path):
    import datasets
    from datasets.fingerprint import Hasher

    from collapseguard.inline import hf_scorer
    onnx = {"runtime": "onnx"}  # the core install's cnn, an onnxruntime session
    assert Hasher.hash(hf_scorer(detector_kwargs=onnx)) == Hasher.hash(hf_scorer(detector_kwargs=onnx))
    assert Hasher.hash(hf_scorer(detector_kwargs=onnx).keep) == Hasher.hash(hf_scorer(detector_kwargs=onnx).keep)
    assert Hasher.hash(hf_scorer("nss", threshold=5.0)) != Hasher.hash(hf_scorer("nss", threshold=6.0))
    clean_and_degraded.to_parquet(str(tmp_path / "d.parquet"))
    ds = datasets.Dataset.from_parquet(str(tmp_path / "d.parquet"), cache_dir=str(tmp_path / "cache"))
    first = ds.map(hf_scorer(detector_kwargs=onnx), batched=True)
    second = ds.map(hf_scorer(detector_kwargs=onnx), batched=True)  # read from the cache
    assert second._fingerprint == first._fingerprint and second.cache_files == first.cache_files
    assert second["score"] == first["score"]


@pytest.mark.parametrize("column", ["image", "jpg"])
def test_without_batched_the_scorer_says_to_pass_batched_true(clean_and_degraded, column):
    """One row instead of a batch (``batched=True`` forgotten), for an ``Image`` column and a
    binary one: the error says so, not that the column needs a cast."""
    ds = clean_and_degraded.select(range(2))
    if column == "jpg":
        import datasets
        ds = datasets.Dataset.from_dict({"jpg": [r["bytes"] for r in ds["image"]], "n": ds["n"]})

    from collapseguard.inline import hf_scorer
    scorer = hf_scorer("nss", threshold=5.0)
    with pytest.raises(TypeError, match=r"takes batches: pass batched=True"):
        ds.map(scorer)
    with pytest.raises(TypeError, match=r"takes batches: pass batched=True"):
        ds.filter(scorer.keep)
    assert len(ds.map(scorer, batched=True)["decision"]) == 2  # with batched=True it scores


def test_rows_holding_only_a_path_are_kept_as_no_image_with_a_warning(tmp_path, photos):
    """A local imagefolder dataset cast with decode=False holds paths, not bytes: each row is
    no_image (kept), and the scorer warns with the map that reads the files in; after that map
    the same rows are judged."""
    import warnings

    import datasets
    from PIL import Image

    from collapseguard.inline import hf_scorer

    (tmp_path / "train").mkdir()
    Image.fromarray(degrade(photos[0], seed=0)).save(tmp_path / "train" / "p.png")
    ds = datasets.load_dataset("imagefolder", data_dir=str(tmp_path), split="train",
                               cache_dir=str(tmp_path / "cache"))
    ds = ds.cast_column("image", datasets.Image(decode=False))
    scorer = hf_scorer("nss", threshold=-1e9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert scorer(ds[:1])["reason"] == ["no_image"]
    assert any("hold only a file path" in str(w.message) for w in caught)
    read = ds.map(lambda r: {"image": {"bytes": open(r["image"]["path"], "rb").read(),
                                       "path": r["image"]["path"]}})
    assert scorer(read[:1])["reason"] == ["degraded"]
