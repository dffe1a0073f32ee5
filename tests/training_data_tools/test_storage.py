"""Storing chains several ways (`chains store`) and reading the storage back from file headers."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from PIL import Image

from collapseguard.cli import main
from collapseguard.images import encode_jpeg, load_image, storage_label
from collapseguard.training_data_tools.chains import make_chains
from collapseguard.training_data_tools.manifest import read_manifest, split_by_source
from collapseguard.training_data_tools.storage import (
    DEFAULT_STORAGES,
    parse_storage,
    parse_storages,
    store_chains,
)


@pytest.fixture(scope="module")
def chains(tmp_path_factory, photos):
    out = tmp_path_factory.mktemp("chains")
    srcs = [("astronaut", photos[0][:64, :80]), ("coffee", photos[1][:72, :64])]
    make_chains(srcs, ["codec", "noise_tint"], steps=2, keep=(0, 1, 2), out_dir=out, workers=1,
                progress=False)
    return out


@pytest.mark.parametrize("q,sub,label", [(90, None, "jpeg q90 4:2:0"), (75, 2, "jpeg q75 4:2:0"),
                                         (92, 0, "jpeg q92 4:4:4"), (60, 1, "jpeg q60 4:2:2")])
def test_storage_label_reads_jpeg_quality_and_subsampling(photos, q, sub, label):
    assert storage_label(encode_jpeg(photos[2], q, sub)) == label


def test_storage_label_other_formats(photos, tmp_path):
    import io

    def enc(**kw):
        buf = io.BytesIO()
        Image.fromarray(photos[3]).save(buf, **kw)
        return buf.getvalue()

    assert storage_label(enc(format="PNG")) == "png"
    assert storage_label(enc(format="WEBP", quality=80)) == "webp"
    assert storage_label(enc(format="WEBP", lossless=True)) == "webp lossless"
    # a table no libjpeg quality makes: quality unknown, subsampling still read
    custom = enc(format="JPEG", qtables=[[7] * 64, [9] * 64], subsampling=2)
    assert storage_label(custom) == "jpeg 4:2:0"
    assert storage_label(b"not an image") == ""


def test_parse_storage_specs():
    assert [s.label for s in parse_storages(",".join(DEFAULT_STORAGES))] == [
        "png", "jpeg q90 4:2:0", "jpeg q75 4:2:0", "webp q80"]
    assert parse_storage("jpeg:85:444").tag == "jpeg85-444"
    assert parse_storage("webp:lossless").label == "webp lossless"
    for bad in ("gif", "jpeg:0", "jpeg:101", "jpeg:90:411", "webp:80:420", "jpeg"):
        with pytest.raises(ValueError, match="storage"):
            parse_storage(bad)
    with pytest.raises(ValueError, match="twice"):
        parse_storages("jpeg:90,jpeg:90:420")


def test_store_chains_every_chain_in_every_storage(chains, tmp_path):
    m = read_manifest(chains)
    out = store_chains(m, DEFAULT_STORAGES, tmp_path / "stored")
    assert len(out) == 4 * len(m)
    back = read_manifest(tmp_path / "stored")  # a valid manifest: one chain per (chain, storage)
    assert set(back["storage"]) == {"png", "jpeg q90 4:2:0", "jpeg q75 4:2:0", "webp q80"}
    assert back.groupby("stored_from")["storage"].nunique().eq(4).all()
    for _, r in back.iterrows():  # each file is what its storage column says
        header = storage_label(Path(r["path"]).read_bytes())
        assert header == ("webp" if r["storage"] == "webp q80" else r["storage"])
        assert r["chain_id"].startswith(r["stored_from"] + "~")
    orig = m.set_index(["chain_id", "step"])["path"]
    for _, r in back.iterrows():
        a = load_image(orig[(r["stored_from"], r["step"])]).astype(int)
        b = load_image(r["path"]).astype(int)
        if r["storage"] == "png":
            assert np.array_equal(a, b)
        else:  # lossy, but the same picture
            assert 0 < np.abs(a - b).mean() < 12
    # the split by source keeps every storage of a picture on one side
    parts = split_by_source(back, {"a": 0.5, "b": 0.5}, salt="x")
    assert not set(parts["a"]["source_image"]) & set(parts["b"]["source_image"])
    with pytest.raises(ValueError, match="already stored"):
        store_chains(back, ["png"], tmp_path / "again")


def test_store_workers_write_the_same_files(chains, tmp_path):
    m = read_manifest(chains)
    one = store_chains(m, ["jpeg:80", "png"], tmp_path / "one", workers=1)
    two = store_chains(m, ["jpeg:80", "png"], tmp_path / "two", workers=2)
    for a, b in zip(one["path"], two["path"]):
        assert Path(a).read_bytes() == Path(b).read_bytes()


def test_chains_store_cli(chains, tmp_path):
    out = tmp_path / "cli"
    res = CliRunner().invoke(main, ["chains", "store", str(chains), "--out", str(out),
                                    "--storages", "png,webp:80", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "8 chains, 24 images in storages png, webp q80" in res.output
    df = pd.read_csv(out / "manifest.csv")
    assert sorted(df["storage"].unique()) == ["png", "webp q80"]
    res = CliRunner().invoke(main, ["chains", "store", str(chains), "--out", str(out), "--storages", "tiff"])
    assert res.exit_code != 0 and "unknown storage" in res.output
