"""Cropped copies: the central windows' fingerprints find a crop of up to about 10% a side, the
search between windows and whole pictures finds what brute force finds, a group keeps its crops
beside the picture they were cut from, and a crop is never a ``degraded_copy`` by the comparator
(which reads a crop's missing content as a difference)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from collapseguard.dedup import search
from collapseguard.dedup.groups import GroupingParams, framed_apart, group_ids
from collapseguard.dedup.search import MAX_DISTANCE, candidate_pairs_between
from collapseguard.detectors.fingerprint import (
    WINDOWS,
    correlation,
    fingerprint,
    fingerprint_and_windows,
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
    monkeypatch.setattr(search, "BRUTE_FORCE", 0 if tables else 10_000)
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
    q, j, dist = candidate_pairs_between(queries, index)
    got = list(zip(q.tolist(), j.tolist()))
    assert len(got) == len(set(got)) and set(got) == want and len(want) > 150
    assert (dist == d[q, j]).all()


def _prints(images):
    prints = [fingerprint_and_windows(img) for img in images]
    hashes = np.array([h for h, _, _ in prints], np.uint64)
    thumbs = np.array([t for _, t, _ in prints], np.int8)
    whashes = np.array([[h for h, _ in w] for _, _, w in prints], np.uint64)
    wthumbs = np.array([[t for _, t in w] for _, _, w in prints], np.int8)
    return hashes, thumbs, whashes, wthumbs


def test_a_group_keeps_its_crops_beside_the_picture_they_were_cut_from(pictures):
    img = pictures[0]
    small = np.asarray(Image.fromarray(img).resize((400, 400), Image.LANCZOS))
    members = [img, small, _crop(img, 0.03), _crop(img, 0.06), _crop(img, 0.09), _crop(small, 0.08)]
    others = pictures[1:]
    hashes, thumbs, whashes, wthumbs = _prints(members + others)
    labels, stats = group_ids(hashes, thumbs, GroupingParams(), whashes, wthumbs)
    assert (labels[: len(members)] == 0).all() and (labels[len(members):] == -1).all()
    assert stats["left_medoid"] == 0 and stats["window_verified_pairs"] > 0
    plain, _ = group_ids(hashes, thumbs, GroupingParams())  # whole pictures only
    assert (plain[[3, 4]] != plain[0]).all()  # the 6% and 9% crops join it only through the windows
    apart = framed_apart(thumbs, wthumbs, np.arange(len(members)), 0)
    assert apart.tolist() == [False, False, True, True, True, True]


def test_a_crop_is_never_a_degraded_copy_where_a_resized_copy_is(pictures, tmp_path):
    import pyarrow.parquet as pq

    from collapseguard.dedup.run import run_dedup

    folder = tmp_path / "in"
    folder.mkdir()
    img = pictures[1]
    noisy = np.clip(img + np.random.default_rng(0).normal(0, 20, img.shape), 0, 255).astype(np.uint8)
    (folder / "a.png").write_bytes(encode_png(img))
    (folder / "a_noisy.png").write_bytes(encode_png(noisy))
    (folder / "a_crop8.png").write_bytes(encode_png(_crop(img, 0.08)))
    (folder / "a_crop10.jpg").write_bytes(encode_jpeg(_crop(img, 0.10), 90))
    (folder / "b.png").write_bytes(encode_png(pictures[2]))
    # level 0: every copy the comparator ranks after the kept one is past it
    run_dedup([str(folder)], tmp_path / "out", quiet=True, level=0.0)
    rows = {r["key"].rsplit("/", 1)[-1]: r for r in pq.read_table(tmp_path / "out" / "groups.parquet").to_pylist()}
    group = rows["a.png"]["group"]
    assert group and all(rows[k]["group"] == group for k in ("a_noisy.png", "a_crop8.png", "a_crop10.jpg"))
    assert rows["b.png"]["decision"] == "single"
    kept = [k for k, r in rows.items() if r["group"] == group and r["rank"] == 0]
    assert kept == ["a.png"]
    assert rows["a_noisy.png"]["decision"] == "degraded_copy"  # same framing: the comparator decides
    for k in ("a_crop8.png", "a_crop10.jpg"):
        assert (rows[k]["decision"], rows[k]["reason"]) == ("keep", "other_framing")
