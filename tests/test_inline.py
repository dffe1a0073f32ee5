"""Inline filtering: the webdataset stage and the Ray Data scorer drop exactly the samples
`collapseguard filter` rejects on the same shards, and pass the kept ones through unchanged."""

from __future__ import annotations

import itertools
import tarfile

import numpy as np
import pandas as pd
import pytest
from cg_testutil import add_member, make_shard, run_cli

from collapseguard.images import encode_jpeg


@pytest.fixture(scope="module")
def shards(tmp_path_factory, photos):
    """Two shards of clean photos and degraded copies, plus a broken image, a sample without an
    image and an unsafe member name."""
    d = tmp_path_factory.mktemp("inline")
    good = encode_jpeg(photos[0])
    make_shard(d / "a.tar", photos[:2], extra=[("broken.jpg", good[: len(good) // 3]),
                                               ("notes.txt", b"no image here")])
    make_shard(d / "b.tar", photos[2:])
    with tarfile.open(d / "b.tar", "a") as tf:
        add_member(tf, "sub/../escape.jpg", good)
    return [d / "a.tar", d / "b.tar"]


def filter_decisions(shards, out, *args) -> pd.DataFrame:
    run_cli(["filter", *shards, "--out", out, "-w", "1", "-q", *args])
    return pd.concat([pd.read_parquet(out / "scores" / f"{s.stem}.parquet") for s in shards])


def wds_samples(shards, stage=None):
    import webdataset as wds
    ds = wds.WebDataset([str(s) for s in shards], shardshuffle=False)
    if stage is not None:
        ds = ds.compose(stage)
    return list(ds)


def test_wds_stage_keeps_what_filter_keeps_with_the_shipped_calibration(shards, tmp_path):
    from collapseguard.inline import wds_filter
    scores = filter_decisions(shards, tmp_path / "out")  # cnn, its shipped calibration
    stage = wds_filter()
    kept = wds_samples(shards, stage)
    assert [s["__key__"] for s in kept] == scores.loc[scores["decision"] == "kept", "key"].tolist()
    assert stage.rejected == int((scores["decision"] == "rejected").sum())
    assert stage.threshold == pytest.approx(
        __import__("json").loads((tmp_path / "out/summary.json").read_text())["threshold"])
    # unchanged: the very dicts webdataset yields without the stage
    everything = {s["__key__"]: s for s in wds_samples(shards)}
    assert all(s == everything[s["__key__"]] for s in kept)
    reasons = scores.set_index("key")["reason"]
    assert reasons["broken"] == "decode_error" and "broken" not in {s["__key__"] for s in kept}


def test_wds_stage_and_filter_agree_on_an_explicit_threshold(shards, tmp_path):
    from collapseguard.detectors import create
    from collapseguard.inline import wds_filter
    from collapseguard.io.tar import clean_member_name
    det = create("nss")
    first = filter_decisions(shards, tmp_path / "probe", "-d", "nss", "--threshold", "1e9")
    t = float(np.nanmedian(first["score"]))
    scores = filter_decisions(shards, tmp_path / "out", "-d", "nss", "--threshold", t)
    dropped = []
    kept = wds_samples(shards, wds_filter(det, threshold=t,
                                          on_reject=lambda s, why, score: dropped.append((s["__key__"], why))))
    rejected = scores[scores["decision"] == "rejected"]
    assert len(kept) and len(dropped), "the threshold must split the fixture"
    # filter names a sample by its cleaned member names; webdataset by the raw ones
    assert [(clean_member_name(k), why) for k, why in dropped] == list(zip(rejected["key"],
                                                                           rejected["reason"]))
    assert ("sub/../escape", "unsafe_name") in dropped


def test_wds_stage_rejects_a_repeated_key_as_filter_does(tmp_path, photos):
    """Keys ``j, k, i, k`` in one shard, and ``k`` again in the next: filter rejects the second
    ``k`` of the first shard as repeated_key and keeps the next shard's ``k``; so must the stage."""
    from collapseguard.inline import wds_filter
    shards = [tmp_path / "r0.tar", tmp_path / "r1.tar"]
    for shard, keys in zip(shards, (["j", "k", "i", "k"], ["k"])):
        with tarfile.open(shard, "w") as tf:
            for i, key in enumerate(keys):
                add_member(tf, f"{key}.jpg", encode_jpeg(photos[i]))
    scores = filter_decisions(shards, tmp_path / "out", "-d", "nss", "--threshold", "1e9")
    dropped = []
    stage = wds_filter("nss", threshold=1e9, on_reject=lambda s, why, score: dropped.append((s["__key__"], why)))
    kept = wds_samples(shards, stage)
    assert scores["reason"].tolist()[3] == "repeated_key"
    assert len(kept) == int((scores["decision"] == "kept").sum()) == 4
    assert dropped == [("k", "repeated_key")] and stage.reasons["repeated_key"] == 1


def test_a_resampled_shard_is_judged_afresh_on_every_pass(tmp_path, photos):
    """webdataset's ``resampled=True`` streams one shard over and over: each pass starts at the
    shard's first key and is judged as the first was (no ``repeated_key``), so 12 samples
    streamed from a shard of 3 all come through, every pass keeping what the first keeps."""
    import webdataset as wds

    from collapseguard.inline import wds_filter
    shard = tmp_path / "one.tar"
    with tarfile.open(shard, "w") as tf:
        for i, key in enumerate(["a", "b", "c"]):
            add_member(tf, f"{key}.jpg", encode_jpeg(photos[i]))
    stage = wds_filter("nss", threshold=1e9)
    ds = wds.WebDataset(str(shard), resampled=True, shardshuffle=False)  # endless: 12 samples of it
    keys = [s["__key__"] for s in ds.compose(lambda src: itertools.islice(src, 12)).compose(stage)]
    assert keys == ["a", "b", "c"] * 4 and stage.reasons == {"kept": 12}


def test_wds_stage_refuses_decoded_samples(shards):
    import webdataset as wds

    from collapseguard.inline import wds_filter
    ds = wds.WebDataset(str(shards[1]), shardshuffle=False).decode("rgb").compose(
        wds_filter("nss", threshold=1.0))
    with pytest.raises(TypeError, match="before .decode"):
        next(iter(ds))



def test_the_stage_and_the_ray_scorer_pickle_as_their_settings(shards):
    """Pickled (a spawned DataLoader worker, a process pool), the stage carries its settings, not
    its detector; the copy creates its own and keeps what the original keeps."""
    import pickle

    from collapseguard.inline import RayScorer, wds_filter
    stage = wds_filter()
    data = pickle.dumps(stage)
    assert len(data) < 2000
    copy = pickle.loads(data)
    assert copy.threshold == stage.threshold
    assert [s["__key__"] for s in wds_samples(shards, copy)] == [s["__key__"] for s in wds_samples(shards, stage)]
    assert len(pickle.dumps(RayScorer())) < 2000

@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("batch_format", ["pandas", "numpy"])
def test_ray_scorer_decides_as_filter(shards, tmp_path, ray_local, batch_format):
    from collapseguard.inline import RayScorer
    first = filter_decisions(shards, tmp_path / "probe", "-d", "nss", "--threshold", "1e9")
    t = float(np.nanmedian(first["score"]))
    scores = filter_decisions(shards, tmp_path / "out", "-d", "nss", "--threshold", t)
    # half a CPU each: on the fixture's one-CPU Ray the reader and the scorer actor both fit
    ds = ray_local.data.read_webdataset([str(s) for s in shards], decoder=None, num_cpus=0.5)
    out = ds.map_batches(RayScorer, fn_constructor_kwargs={"detector": "nss", "threshold": t},
                         compute=ray_local.data.ActorPoolStrategy(size=1), num_cpus=0.5,
                         batch_size=8, batch_format=batch_format).to_pandas()
    from collapseguard.io.tar import clean_member_name
    out["__key__"] = out["__key__"].map(clean_member_name)  # filter names samples by clean names
    got = out[["__key__", "score", "decision", "reason"]].set_index("__key__")
    want = scores.set_index("key")
    assert sorted(got.index) == sorted(want.index)
    got = got.loc[want.index]
    assert got["decision"].tolist() == want["decision"].tolist()
    assert got["reason"].tolist() == want["reason"].tolist()
    np.testing.assert_allclose(got["score"].to_numpy(float), want["score"].to_numpy(float),
                               rtol=1e-6)  # NaN where filter has NaN
    assert set(got.loc[got["decision"] == "rejected"].index) == set(want[want["decision"] == "rejected"].index)


def test_without_a_threshold_the_python_stages_say_which_arguments_to_pass():
    from collapseguard.inline import RayScorer, wds_filter
    from collapseguard.io.calibration_file import NoThresholdError

    for make in (wds_filter, RayScorer):  # an ensemble has no shipped calibration
        with pytest.raises(NoThresholdError, match="pass threshold=T or calibration=FILE") as err:
            make("ens:cnn+nss")
        assert "--" not in str(err.value)  # no command-line options in a Python error
    assert wds_filter("ens:cnn+nss", threshold=0.5).threshold == 0.5


def test_wds_stage_passes_samples_without_an_image_on_as_they_come():
    """A stream of caption-only samples: the stage decides each within ``batch_size`` samples, so
    an endless stream of them yields at once instead of being held in memory."""
    from collapseguard.inline import wds_filter

    pulled = 0

    def stream():
        nonlocal pulled
        for i in range(10_000):
            pulled += 1
            yield {"__key__": f"k{i}", "txt": b"a caption"}

    stage = wds_filter("nss", threshold=1e9, batch_size=4)
    first = next(iter(stage(stream())))
    assert first["__key__"] == "k0" and pulled <= 4


def test_ray_scorer_judges_the_columns_it_is_given_whatever_their_names(photos):
    """``image_columns=["photo"]`` (a read_parquet table's column): the bytes are judged as in a
    column named ``png``, not passed over as a file of no image type."""
    import pandas as pd

    from collapseguard.images import encode_png
    from collapseguard.inline import RayScorer

    png = encode_png(photos[0])
    by_ext = RayScorer("nss", threshold=0.0, image_columns=["png"])(pd.DataFrame({"png": [png]}))
    for col in ("photo", "image"):
        got = RayScorer("nss", threshold=0.0, image_columns=[col])(pd.DataFrame({col: [png]}))
        assert got["reason"].tolist() == by_ext["reason"].tolist() != ["no_image"]
        assert got["score"].tolist() == by_ext["score"].tolist()
