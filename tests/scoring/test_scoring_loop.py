"""Every scorer of images goes through the one scoring loop (scoring.records): the same bad file
gets the same reason from score_records, the calibration table, training's held-out scoring, the
label cache and evaluate, and the same image the same score; a detector that refuses a batch is
asked again image by image where the caller wants that."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collapseguard.calibration.scoring import score_table
from collapseguard.detectors import create
from collapseguard.detectors.base import Detector, DetectorError
from collapseguard.evaluation.scoring import score_manifest
from collapseguard.images import DecodeError, encode_png, load_image
from collapseguard.scoring.label_cache import label_images
from collapseguard.scoring.records import decode_members, score_batch, score_records
from collapseguard.training.metrics import score_images, score_paths


class RefusesBatches(Detector):
    """nss's scores, but refuses any batch of more than one image, and every image wider than 250."""

    name, version = "test-refuses-batches", "1"

    def __init__(self):
        self.inner = create("nss")

    def score(self, images):
        if len(images) > 1:
            raise RuntimeError("batch refused")
        if images[0].shape[1] > 250:
            raise RuntimeError("too wide")
        return self.inner.score(images)


class WrongCount(Detector):
    name, version = "test-wrong-count", "1"

    def score(self, images):
        return np.zeros(len(images) + 1, np.float32)


@pytest.fixture(scope="module")
def files(photos, tmp_path_factory):
    """Three real photos as PNG files, a truncated PNG and a file that is no image at all."""
    d = tmp_path_factory.mktemp("imgs")
    paths = []
    for i, p in enumerate(photos[:3]):
        path = d / f"p{i}.png"
        path.write_bytes(encode_png(p[:160, :200]))
        paths.append(path)
    cut = d / "cut.png"
    cut.write_bytes(encode_png(photos[3])[:3000])
    junk = d / "junk.png"
    junk.write_bytes(b"not a png")
    return paths, cut, junk


def test_one_reason_for_a_bad_file_everywhere(files, tmp_path):
    good, cut, junk = files
    nss = create("nss")
    reason = decode_members([(str(cut), cut.read_bytes())])[1][0]
    assert reason.startswith(f"{cut}: ")
    [(_, res)] = list(score_records([cut], nss, members_of=lambda p: [(str(p), p.read_bytes())]))
    assert res.status == "decode_error" and res.error == reason

    # training's held-out scoring: every bad file named, once all were tried
    with pytest.raises(DecodeError) as info:
        score_paths(nss, [str(p) for p in [good[0], cut, good[1], junk]])
    assert str(cut) in str(info.value) and str(junk) in str(info.value)
    with pytest.raises(DecodeError, match="missing.png"):
        score_paths(nss, [str(tmp_path / "missing.png")])

    # the calibration's table: NaN for the bad file, the others scored
    m = pd.DataFrame({"chain_id": "c", "source_image": "s", "family": "f", "task": "t",
                      "step": [0, 1, 2], "path": [str(good[0]), str(cut), str(good[1])]})
    t = score_table(nss, m)
    assert np.isnan(t["score"].iloc[1]) and np.isfinite(t["score"].iloc[[0, 2]]).all()
    assert t["storage"].tolist() == ["png", "", "png"]

    # the label cache: a recorded decode_error
    lab = label_images(nss, [str(good[0]), str(cut)], tmp_path / "labels.parquet")
    assert lab["status"].tolist() == ["ok", "decode_error"]

    # evaluate: decode_error with the same reason for every detector
    scores, _, _ = score_manifest(m, [nss], warmup=False)
    assert scores["error"].iloc[1] == f"decode_error: {reason}"[:300]

    # and the same image scores the same in each
    direct = nss.score([load_image(good[0])])[0]
    assert t["score"].iloc[0] == pytest.approx(direct, rel=1e-6)
    assert lab["score"].iloc[0] == pytest.approx(direct, rel=1e-6)
    assert scores["score"].iloc[0] == pytest.approx(direct, rel=1e-6)
    assert score_paths(nss, [str(good[0])])[0] == pytest.approx(direct, rel=1e-6)


def test_training_scoring_applies_the_transform_and_scores_arrays(files, photos):
    good, _, _ = files
    nss = create("nss")
    flat = score_paths(nss, [str(p) for p in good], transform=lambda im: np.full_like(im, 128))
    assert len(set(flat.tolist())) == 1  # every image became the same grey picture
    arrays = [p[:160, :200] for p in photos[:3]]
    np.testing.assert_allclose(score_images(nss, arrays, batch=2), nss.score(arrays), rtol=1e-6)
    np.testing.assert_allclose(score_paths(nss, [str(p) for p in good], batch=2),
                               nss.score(arrays), rtol=1e-6)


def test_the_transform_runs_on_a_record_right_after_its_members(files):
    """score_records' contract that calibration's pixel digests rest on: each record's images go
    through ``transform`` right after its ``members_of`` and before the next record's, whatever
    the batches; results come in input order."""
    good, cut, junk = files
    paths = [good[0], cut, good[1], junk, good[2], None, good[0]]  # None: a caption-only record
    events = []

    def members(i):
        events.append(("members", i))
        return [("c.txt", b"a caption")] if paths[i] is None else [(str(paths[i]), paths[i].read_bytes())]

    def transform(arr):
        events.append(("transform",))
        return arr

    out = list(score_records(range(len(paths)), create("nss"), members_of=members, batch_size=2,
                             transform=transform))
    assert [i for i, _ in out] == list(range(len(paths)))
    assert [e for e in events if e[0] == "members"] == [("members", i) for i in range(len(paths))]
    decoded = [i for i, res in out if res.status == "ok"]
    assert decoded == [0, 2, 4, 6]
    # one transform call for each decoded record, right after that record's members call
    assert [events[k - 1] for k, e in enumerate(events) if e[0] == "transform"] == [
        ("members", i) for i in decoded]


def test_a_refused_batch_is_retried_one_by_one_only_when_asked(photos, files):
    imgs = [photos[0][:200, :200], photos[1][:200, :300], photos[2][:200, :200]]
    det = RefusesBatches()
    with pytest.raises(RuntimeError, match="batch refused"):
        score_batch(det, imgs)
    detail, errors = score_batch(det, imgs, retry=True)
    assert errors == ["", "RuntimeError: too wide", ""]
    assert np.isfinite(detail["score"][[0, 2]]).all() and np.isnan(detail["score"][1])
    out = list(score_records(imgs, det, members_of=lambda im: [("x.png", im)], retry=True))
    assert [r.status for _, r in out] == ["ok", "score_error", "ok"]
    assert out[1][1].error == "RuntimeError: too wide"
    # the file was decoded: its row says how it was stored and its size, as a scored row does
    out = list(score_records(imgs, det, members_of=lambda im: [("x.png", encode_png(im))], retry=True))
    assert [r.status for _, r in out] == ["ok", "score_error", "ok"]
    assert out[1][1].storage == out[0][1].storage == "png" and (out[1][1].height, out[1][1].width) == (200, 300)
    with pytest.raises(RuntimeError, match="batch refused"):
        list(score_records(imgs, det, members_of=lambda im: [("x.png", im)]))
    # evaluate asks again, image by image; the calibration stops at a detector that raises
    good, _, _ = files
    m = pd.DataFrame({"chain_id": "c", "source_image": "s", "family": "f", "task": "t",
                      "step": [0, 1], "path": [str(good[0]), str(good[1])]})
    scores, _, _ = score_manifest(m, [det], warmup=False)
    assert np.isfinite(scores["score"]).all() and (scores["error"] == "").all()
    with pytest.raises(RuntimeError, match="batch refused"):
        score_table(det, m)


def test_a_wrong_number_of_scores_is_a_detector_error(photos, tmp_path):
    imgs = [photos[0][:64, :64]]
    with pytest.raises(DetectorError, match="returned 2 scores for 1 images"):
        list(score_records(imgs, WrongCount(), members_of=lambda im: [("x.png", im)]))
    with pytest.raises(DetectorError, match="returned 2 scores"):
        label_images(WrongCount(), [encode_png(imgs[0])], tmp_path / "l.parquet")


def test_the_progress_count_reads_an_upper_case_tar_as_it_reads_a_lower_case_one(tmp_path, photos):
    """``00000.TAR`` is a shard to every reader: the progress bar counts its samples too."""
    from cg_testutil import make_shard

    from collapseguard.scoring.progress import count_samples

    make_shard(tmp_path / "a.tar", photos[:3], degraded=False)
    (tmp_path / "b.TAR").write_bytes((tmp_path / "a.tar").read_bytes())
    assert count_samples(str(tmp_path / "a.tar")) == count_samples(str(tmp_path / "b.TAR")) == 3


def test_a_rows_size_is_that_of_the_image_it_names():
    """A sample of a flat 300 x 100 image and a noisy 480 x 640 one: the noisy one scores higher
    and is named, and the row's width and height are its own."""
    import numpy as np

    from collapseguard.detectors import create
    from collapseguard.images import encode_png
    from collapseguard.scoring.records import score_records

    flat = np.full((100, 300, 3), 120, np.uint8)
    noisy = np.random.default_rng(0).integers(0, 255, (640, 480, 3), dtype=np.uint8)
    (_, res), = list(score_records([[("a.png", encode_png(flat)), ("b.png", encode_png(noisy))]], create("nss")))
    assert res.image == "b.png" and (res.width, res.height) == (480, 640)


def test_a_table_that_fails_while_being_written_leaves_the_earlier_one_whole(tmp_path):
    """``score -o``'s writer: an error half way (here a cell that cannot be written) leaves the
    table that was there untouched and no half-written file under its name."""
    import pandas as pd
    import pytest

    from collapseguard.scoring.run import write_table

    class Unwritable:
        def __str__(self):
            raise RuntimeError("cannot be written")

    out = tmp_path / "scores.csv"
    write_table(pd.DataFrame({"key": ["a", "b"], "score": [1.0, 2.0]}), out)
    before = out.read_bytes()
    rows = 120_000  # more than one of pandas' write chunks
    bad = pd.DataFrame({"key": [f"k{i}" for i in range(rows)], "note": ["x"] * (rows - 1) + [Unwritable()]})
    with pytest.raises(RuntimeError, match="cannot be written"):
        write_table(bad, out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.csv"]


def test_an_image_over_the_pixel_limit_keeps_its_size_in_the_row():
    """A PNG whose header claims 13000 x 11000 pixels (over ``MAX_PIXELS``) is refused without
    decoding; its row says why and still carries the size its header gave."""
    import struct
    import zlib

    from collapseguard.scoring.records import score_records

    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    header = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 13000, 11000, 8, 0, 0, 0, 0)) + chunk(b"IEND", b"")
    (_, res), = list(score_records([[("big.png", header)]], create("nss")))
    assert res.status == "decode_error" and "13000x11000 pixels" in res.error, res.error
    assert (res.width, res.height) == (13000, 11000)


def test_score_says_which_rows_repeat_an_earlier_key_of_their_shard(tmp_path, photos):
    """``a.png, b.png, a.png`` in one shard: two rows of key ``a``; the later says its key repeats
    (filter sets that sample aside as repeated_key), so a join on (source, key) is not trusted
    blindly; the first and the other sample say nothing of it."""
    import tarfile

    import pandas as pd
    from cg_testutil import add_member, run_cli

    from collapseguard.images import encode_png

    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        for name, img in (("a.png", photos[0]), ("b.png", photos[1]), ("a.png", photos[2])):
            add_member(tf, name, encode_png(img[:64, :64]))
    run_cli(["score", shard, "-d", "nss", "-o", tmp_path / "s.csv", "-q"])
    t = pd.read_csv(tmp_path / "s.csv", keep_default_na=False)
    assert t["key"].tolist() == ["a", "b", "a"]
    said = ["repeats an earlier sample's" in e for e in t["error"]]
    assert said == [False, False, True] and "repeated_key" in t["error"].iloc[2]
    assert t["score"].iloc[2] != ""  # still scored
