"""Cropped copies: the central windows' fingerprints find a crop of up to about 10% a side, the
search between windows and whole pictures finds what brute force finds, a group keeps its crops
beside the picture they were cut from, and a crop is never a ``degraded_copy`` by the comparator
(which reads a crop's missing content as a difference)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from collapseguard.dedup import search
from collapseguard.dedup.groups import (
    GroupingParams,
    framed_apart,
    group_ids,
    narrower,
)
from collapseguard.dedup.search import MAX_DISTANCE, candidate_pairs_between
from collapseguard.detectors.fingerprint import (
    WINDOWS,
    correlation,
    fingerprint,
    fingerprint_and_windows,
    fingerprint_arrays,
    hamming,
    popcount,
    windows,
)
from collapseguard.images import encode_jpeg, encode_png


@pytest.fixture(scope="module")
def pictures() -> list[np.ndarray]:
    from skimage import data
    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]


def _crop(img: np.ndarray, share: float) -> np.ndarray:
    h, w = img.shape[:2]
    dy, dx = round(h * share), round(w * share)
    return np.ascontiguousarray(img[dy: h - dy, dx: w - dx])


def _folder(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    return folder


def _dedup_rows(tmp_path, level=None, strip_suffix=False) -> dict[str, dict]:
    """``run_dedup`` over ``tmp_path/in``: its groups.parquet rows by file name (without the
    suffix with ``strip_suffix``)."""
    import pyarrow.parquet as pq

    from collapseguard.dedup.run import run_dedup

    run_dedup([str(tmp_path / "in")], tmp_path / "out", quiet=True, level=level)
    rows = pq.read_table(tmp_path / "out" / "groups.parquet").to_pylist()
    name = (lambda k: k.rsplit("/", 1)[-1].rsplit(".", 1)[0]) if strip_suffix else (lambda k: k.rsplit("/", 1)[-1])
    return {name(r["key"]): r for r in rows}


def _noisy(img: np.ndarray, rng: np.random.Generator, sigma: float = 25) -> np.ndarray:
    return np.clip(img + rng.normal(0, sigma, img.shape), 0, 255).astype(np.uint8)


def _matches(a: tuple[int, np.ndarray], b: tuple[int, np.ndarray]) -> bool:
    p = GroupingParams()
    return (int(hamming(np.uint64(a[0]), np.uint64(b[0]))) <= p.max_distance
            and float(correlation(a[1], b[1])) >= p.min_corr)


@pytest.mark.parametrize("share", [0.05, 0.08, 0.10])
def test_a_crop_matches_a_window_of_its_original_where_the_whole_pictures_do_not(pictures, share):
    whole_found = window_found = 0
    for img in pictures:
        crop = fingerprint(_crop(img, share))
        whole_found += _matches(fingerprint(img), crop)
        window_found += any(_matches(w, crop) for w in windows(img))
    assert window_found == len(pictures)
    assert whole_found <= 1  # without the windows these crops are (nearly) never found


def test_the_windows_come_from_the_same_reduction_as_the_whole_fingerprint(pictures):
    h, t, wins = fingerprint_and_windows(pictures[0])
    assert (h, t.tolist()) == (fingerprint(pictures[0])[0], fingerprint(pictures[0])[1].tolist())
    assert [(a, b.tolist()) for a, b in wins] == [(a, b.tolist()) for a, b in windows(pictures[0])]
    assert len(wins) == len(WINDOWS) and len({a for a, _ in wins}) == len(WINDOWS)


@pytest.mark.parametrize("tables", [True, False])
def test_the_search_between_windows_and_wholes_finds_what_brute_force_finds(tables, monkeypatch):
    # the tables, and the every-pair comparison (in chunks of a few queries) used below them
    monkeypatch.setattr(search, "BRUTE_FORCE_PAIRS", 0 if tables else 1 << 30)
    monkeypatch.setattr(search, "BRUTE_FORCE_CHUNK", 5000)  # a few queries a chunk
    rng = np.random.default_rng(3)
    index = rng.integers(0, 2**63, 900, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    queries = rng.integers(0, 2**63, 1200, dtype=np.int64).astype(np.uint64)
    for q in range(0, 1200, 4):  # near some indexed hashes: 0..10 bits apart
        h = index[rng.integers(0, 900)]
        for b in rng.choice(64, rng.integers(0, 11), replace=False):
            h ^= np.uint64(1) << np.uint64(int(b))
        queries[q] = h
    d = popcount(queries[:, None] ^ index[None, :])
    want = {(int(a), int(b)) for a, b in zip(*np.nonzero(d <= MAX_DISTANCE))}
    for chunk in (1 << 22, 16):  # in one piece, and in many
        q, j, dist = candidate_pairs_between(queries, index, chunk=chunk)
        got = list(zip(q.tolist(), j.tolist()))
        assert len(got) == len(set(got)) and set(got) == want and len(want) > 150
        assert (dist == d[q, j]).all()


def test_packed_thumbnails_come_back_byte_for_byte():
    from collapseguard.detectors.compare import THUMB_COLUMNS, pack_thumbnails, unpack_thumbnails

    t = np.random.default_rng(4).integers(-128, 128, (7, 256)).astype(np.int8)
    t[0] = -128
    t[1] = 127
    t[2, -4:] = [-1, -128, 127, 0]  # the last column holds 4 bytes
    packed = pack_thumbnails(t)
    assert packed.shape == (7, len(THUMB_COLUMNS)) and packed.max() < 2 ** 48
    assert np.array_equal(unpack_thumbnails(packed), t)
    assert np.array_equal(unpack_thumbnails(packed[2]), t[2])


def test_a_group_keeps_its_crops_beside_the_picture_they_were_cut_from(pictures):
    img = pictures[0]
    small = np.asarray(Image.fromarray(img).resize((400, 400), Image.LANCZOS))
    members = [img, small, _crop(img, 0.03), _crop(img, 0.06), _crop(img, 0.09), _crop(small, 0.08)]
    others = pictures[1:]
    hashes, thumbs, whashes, wthumbs = fingerprint_arrays(members + others)
    labels, stats = group_ids(hashes, thumbs, GroupingParams(), whashes, wthumbs)
    assert (labels[: len(members)] == 0).all() and (labels[len(members):] == -1).all()
    assert stats["left_medoid"] == 0 and stats["window_verified_pairs"] > 0
    plain, _ = group_ids(hashes, thumbs, GroupingParams())  # whole pictures only
    assert (plain[[3, 4]] != plain[0]).all()  # the 6% and 9% crops join it only through the windows
    # a 3% crop is compared with its original (it best matches the 94% window); 6% and more not
    apart = framed_apart(thumbs, wthumbs, np.arange(len(members)), 0)
    assert apart.tolist() == [False, False, False, True, True, True]
    assert narrower(thumbs, wthumbs, np.arange(len(members))).tolist() == apart.tolist()


def test_a_crop_is_never_a_degraded_copy_where_a_resized_copy_is(pictures, tmp_path):
    folder = _folder(tmp_path)
    img = pictures[1]
    noisy = _noisy(img, np.random.default_rng(0), 20)
    (folder / "a.png").write_bytes(encode_png(img))
    (folder / "a_noisy.png").write_bytes(encode_png(noisy))
    (folder / "a_crop10.jpg").write_bytes(encode_jpeg(_crop(img, 0.10), 90))
    (folder / "b.png").write_bytes(encode_png(pictures[2]))
    # level 0: every copy the comparator ranks after the kept one is past it
    rows = _dedup_rows(tmp_path, level=0.0)
    group = rows["a.png"]["group"]
    assert group and all(rows[k]["group"] == group for k in ("a_noisy.png", "a_crop10.jpg"))
    assert rows["b.png"]["decision"] == "single"
    kept = [k for k, r in rows.items() if r["group"] == group and r["rank"] == 0]
    assert kept == ["a.png"]
    assert rows["a_noisy.png"]["decision"] == "degraded_copy"  # same framing: the comparator decides
    # the crop opens a framing of its own: compared with nothing, whatever the level
    assert (rows["a_crop10.jpg"]["decision"], rows["a_crop10.jpg"]["reason"]) == ("keep", "other_framing")
    assert rows["a_crop10.jpg"]["p_worse"] != rows["a_crop10.jpg"]["p_worse"]  # NaN


def test_a_crop_beside_a_less_degraded_copy_of_its_own_framing_is_a_degraded_copy(pictures, tmp_path):
    """A chain of a cropped view (as the evaluation set's centre crops of a source picture): its
    noisy step is decided against the clean crop, not against the uncropped picture."""
    folder = _folder(tmp_path)
    img = pictures[1]
    crop = _crop(img, 0.09)
    noisy = _noisy(crop, np.random.default_rng(1))
    (folder / "a.png").write_bytes(encode_png(img))
    (folder / "a_crop.png").write_bytes(encode_png(crop))
    (folder / "a_crop_noisy.png").write_bytes(encode_png(noisy))
    rows = _dedup_rows(tmp_path, level=0.6)
    assert len({r["group"] for r in rows.values()}) == 1 and rows["a.png"]["rank"] == 0
    assert (rows["a_crop.png"]["decision"], rows["a_crop.png"]["reason"]) == ("keep", "other_framing")
    assert (rows["a_crop_noisy.png"]["decision"], rows["a_crop_noisy.png"]["reason"]) == (
        "degraded_copy", "degraded_copy")
    assert rows["a_crop_noisy.png"]["p_worse"] > 0.6


def test_a_slightly_cropped_degraded_copy_is_compared_with_its_original(pictures, tmp_path):
    """A 3% crop stays in its original's framing: cropped and noisy, it is compared with its
    original (``p_worse`` against it) and is a ``degraded_copy`` past the level, as a copy of the
    same framing would be."""
    folder = _folder(tmp_path)
    img = pictures[0]
    crop = _crop(img, 0.03)
    noisy = _noisy(crop, np.random.default_rng(2))
    (folder / "a.png").write_bytes(encode_png(img))
    (folder / "a_crop3.png").write_bytes(encode_png(noisy))
    rows = _dedup_rows(tmp_path, level=0.6)
    assert rows["a.png"]["group"] == rows["a_crop3.png"]["group"] != "" and rows["a.png"]["rank"] == 0
    assert (rows["a_crop3.png"]["decision"], rows["a_crop3.png"]["reason"]) == ("degraded_copy", "degraded_copy")
    assert rows["a_crop3.png"]["p_worse"] > 0.6


def test_the_kept_copy_is_of_the_widest_framing(pictures, tmp_path):
    """A crop at full resolution beside a reduced copy of the whole picture: the whole picture is
    kept (rank 0), so ``--drop-duplicates`` never keeps only part of it; the crop is
    ``other_framing``."""
    folder = _folder(tmp_path)
    img = pictures[2]
    h, w = img.shape[:2]
    small = np.asarray(Image.fromarray(img).resize((w * 3 // 5, h * 3 // 5), Image.LANCZOS))
    (folder / "a_small.png").write_bytes(encode_png(small))
    (folder / "a_crop8.png").write_bytes(encode_png(_crop(img, 0.08)))
    rows = _dedup_rows(tmp_path)
    assert rows["a_small.png"]["group"] == rows["a_crop8.png"]["group"] != ""
    assert (rows["a_small.png"]["rank"], rows["a_small.png"]["decision"]) == (0, "keep")
    assert (rows["a_crop8.png"]["decision"], rows["a_crop8.png"]["reason"]) == ("keep", "other_framing")


def test_window_fingerprints_of_the_wrong_shape_are_refused():
    rng = np.random.default_rng(5)
    h = rng.integers(0, 2**63, 4, dtype=np.int64).astype(np.uint64)
    t = np.zeros((4, 256), np.int8)
    labels, stats = group_ids(h, t, GroupingParams(), np.zeros((4, 3), np.uint64), np.zeros((4, 3, 256), np.int8))
    assert stats["window_candidate_pairs"] >= 0 and (labels == -1).all()
    with pytest.raises(ValueError, match="window_hashes must be"):
        group_ids(h, t, GroupingParams(), np.zeros((4, 3), np.uint64), np.zeros((4, 2, 256), np.int8))
    with pytest.raises(ValueError, match="window_hashes must be"):
        group_ids(h, t, GroupingParams(), np.zeros((3, 3), np.uint64), np.zeros((3, 3, 256), np.int8))


def test_the_gallery_shows_the_same_part_of_a_crop(pictures):
    from collapseguard.dedup.gallery import _crop_at, place_in

    img = pictures[0]
    crop = _crop(img, 0.09)
    for fy, fx in ((0.3, 0.6), (0.5, 0.5), (0.75, 0.25)):
        my, mx = place_in(crop, img, fy, fx)
        a = _crop_at(img, fy, fx, 64).astype(np.float64)
        b = _crop_at(crop, my, mx, 64).astype(np.float64)
        assert np.abs(a - b).mean() < 12  # the same pixels, within a window's rounding
        # and the other way round: the whole picture's place of the crop's place
        oy, ox = place_in(img, crop, my, mx)
        assert abs(oy - fy) < 0.02 and abs(ox - fx) < 0.02
    assert place_in(img, img, 0.3, 0.6) == (0.3, 0.6)  # framed alike: the same relative place


def test_two_framings_in_one_group_and_a_grey_crop(pictures, tmp_path):
    """The whole picture and a 9% crop, each with a noisy copy, and a greyscale 9% crop: each
    noisy copy is decided against the clean copy of its own framing, the clean crop is its
    framing's ``other_framing``, and the grey crop loses to colour (``lost_colour``) as any
    monochrome copy does."""
    folder = _folder(tmp_path)
    img = pictures[1]
    crop = _crop(img, 0.09)
    rng = np.random.default_rng(6)

    grey = np.repeat(np.asarray(Image.fromarray(crop).convert("L"))[..., None], 3, axis=2)
    for name, a in (("a", img), ("a_noisy", _noisy(img, rng)), ("c", crop), ("c_noisy", _noisy(crop, rng)),
                    ("c_grey", grey)):
        (folder / f"{name}.png").write_bytes(encode_png(a))
    rows = _dedup_rows(tmp_path, level=0.6, strip_suffix=True)
    assert len({r["group"] for r in rows.values()}) == 1 and rows["a"]["rank"] == 0
    got = {k: (r["decision"], r["reason"]) for k, r in rows.items()}
    assert got == {"a": ("keep", "least_degraded"), "a_noisy": ("degraded_copy", "degraded_copy"),
                   "c": ("keep", "other_framing"), "c_noisy": ("degraded_copy", "degraded_copy"),
                   "c_grey": ("degraded_copy", "lost_colour")}
    assert rows["c"]["p_worse"] != rows["c"]["p_worse"] and rows["c_noisy"]["p_worse"] > 0.6
