"""The fingerprint pass decodes a JPEG reduced (DCT scaling, luma only): its fingerprints stay those
of the full decoding within the grouping's tolerance, a PNG and a JPEG copy of one picture still
agree, widths and heights are those of the full image, and bad bytes fail as a full decoding does."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from cg_testutil import add_member
from PIL import Image

from collapseguard.dedup.groups import GroupingParams
from collapseguard.dedup.run import _image_runs_by_headers, _multi_image_samples
from collapseguard.detectors.fingerprint import (
    REDUCED_SIDE,
    box_factor,
    correlation,
    fingerprint,
    hamming,
)
from collapseguard.images import (
    DecodeError,
    decode_detailed,
    decode_reduced,
    encode_jpeg,
    encode_png,
)


@pytest.fixture(scope="module")
def large_photos() -> list[np.ndarray]:
    from skimage import data
    return [data.astronaut(), data.coffee(), data.chelsea(), np.asarray(
        Image.fromarray(data.rocket()).resize((1024, 683), Image.LANCZOS))]


def _near(a, b):
    return int(hamming(np.uint64(a[0]), np.uint64(b[0]))), float(correlation(a[1], b[1]))


def test_a_reduced_jpeg_has_nearly_the_fingerprint_of_its_full_decoding(large_photos):
    params = GroupingParams()
    for img in large_photos:
        data = encode_jpeg(img, 90)
        full, storage, _ = decode_detailed(data)
        small, storage_r, alpha, shape = decode_reduced(data, REDUCED_SIDE)
        assert small.ndim == 2 and min(small.shape) < min(full.shape[:2]) // 2  # decoded reduced
        assert shape == full.shape[:2] and storage_r == storage and not alpha
        bits, corr = _near(fingerprint(full), fingerprint(small))
        assert bits <= 2 and corr >= 0.97, (bits, corr)
        # a PNG copy (decoded in full) and the JPEG decoded reduced: well inside the grouping's bounds
        bits, corr = _near(fingerprint(decode_detailed(encode_png(img))[0]), fingerprint(small))
        assert bits <= params.max_distance // 2 and corr >= params.min_corr + 0.1, (bits, corr)


def test_the_box_reduction_is_done_once():
    # what the fingerprint reduces to is not reduced again: a reduced decoding that stops at the
    # box factor's size gives exactly the fingerprint of the full image
    rng = np.random.default_rng(0)
    img = np.asarray(Image.fromarray(rng.integers(0, 256, (48, 64, 3), np.uint8)).resize((1030, 777)))
    f = box_factor(1030, 777)
    assert f == 8 and box_factor(*Image.new("L", (1030, 777)).reduce(f).size) == 1
    grey = np.asarray(Image.fromarray(img).convert("L").reduce(f))
    h1, t1 = fingerprint(img)
    h2, t2 = fingerprint(grey)
    assert h1 == h2 and (t1 == t2).all()


def test_orientation_and_size_follow_the_full_decoding(large_photos):
    img = large_photos[3]  # 1024 x 683
    pil = Image.fromarray(img)
    exif = pil.getexif()
    exif[0x0112] = 6  # shown turned by 90 degrees
    buf = io.BytesIO()
    pil.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    full = decode_detailed(buf.getvalue())[0]
    small, _, _, shape = decode_reduced(buf.getvalue(), REDUCED_SIDE)
    assert shape == full.shape[:2] == (1024, 683)
    assert small.shape[0] > small.shape[1]  # turned too
    bits, corr = _near(fingerprint(full), fingerprint(small))
    assert bits <= 2 and corr >= 0.97


def test_bad_bytes_fail_as_in_a_full_decoding(large_photos):
    data = encode_jpeg(large_photos[0], 90)
    for bad in (data[: len(data) // 2], b"not an image at all", b""):
        with pytest.raises(DecodeError) as full:
            decode_detailed(bad)
        with pytest.raises(DecodeError) as reduced:
            decode_reduced(bad, REDUCED_SIDE)
        assert str(reduced.value) == str(full.value)


def test_pngs_and_small_jpegs_come_as_a_full_decoding_gives_them(large_photos):
    png = encode_png(large_photos[1])
    arr, storage, alpha, shape = decode_reduced(png, REDUCED_SIDE)
    full = decode_detailed(png)
    assert (arr == full[0]).all() and (storage, alpha) == full[1:] and shape == arr.shape[:2]
    tiny = encode_jpeg(large_photos[1][:100, :90], 90)  # under twice the side: not reduced
    arr, _, _, shape = decode_reduced(tiny, REDUCED_SIDE)
    assert arr.shape == shape == (100, 90)


def _shard(path, names):
    with tarfile.open(path, "w") as tf:
        for name in names:
            add_member(tf, name, b"x")


@pytest.mark.parametrize("names, several", [
    (["a.jpg", "a.txt", "b.png", "b.json"], False),
    (["a.jpg", "a.txt", "b.png", "b.left.png"], True),
    (["dir/a.jpg", "dir/b.jpg", "c.txt"], False),
    (["a.jpg", "a.png"], True),
])
def test_samples_of_several_images_are_found_from_the_headers(tmp_path, names, several):
    p = tmp_path / "s.tar"
    _shard(p, names)
    assert _image_runs_by_headers(str(p)) is several
    assert _multi_image_samples(("shard", str(p))) is several
    gz = tmp_path / "s.tar.gz"  # compressed: read through instead, the same answer
    with tarfile.open(gz, "w:gz") as tf:
        for name in names:
            add_member(tf, name, b"x")
    assert _image_runs_by_headers(str(gz)) is None
    assert _multi_image_samples(("shard", str(gz))) is several


def test_a_jpeg_decoded_reduced_groups_with_a_png_copy_and_keeps_its_full_size(photos, tmp_path):
    import json

    import pyarrow.parquet as pq

    from collapseguard.dedup.run import run_dedup

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(encode_jpeg(photos[0], 85))
    (folder / "a_copy.png").write_bytes(encode_png(photos[0]))
    (folder / "b.jpg").write_bytes(encode_jpeg(photos[1], 85))
    summary = run_dedup([str(folder)], tmp_path / "out", quiet=True)
    rows = {r["key"].rsplit("/", 1)[-1]: r for r in pq.read_table(tmp_path / "out" / "groups.parquet").to_pylist()}
    assert rows["a.jpg"]["group"] and rows["a.jpg"]["group"] == rows["a_copy.png"]["group"]
    assert rows["b.jpg"]["group"] == ""
    h, w = photos[0].shape[:2]
    assert (rows["a.jpg"]["width"], rows["a.jpg"]["height"]) == (w, h)  # the full image's size
    assert rows["a.jpg"]["storage"].startswith("jpeg")
    # each pass's wall time comes back, and stays out of the file (its bytes depend on the inputs)
    assert set(summary["seconds"]) == {"fingerprint", "group", "describe", "decide"}
    assert summary["seconds"]["describe"] > 0 and min(summary["seconds"].values()) >= 0
    assert "seconds" not in json.loads((tmp_path / "out" / "summary.json").read_text())
