"""The teacher side of distillation: label images once per detector version, cached and resumable."""

from __future__ import annotations

import hashlib
import os
import stat

import numpy as np
import pandas as pd
import pytest

from collapseguard.detectors import Detector, DetectorError, create
from collapseguard.images import decode_image, encode_png
from collapseguard.scoring.label_cache import image_key, label_images, read_cache


class Counting(Detector):
    """The real nss detector, counting how many images it is asked to score (and able to fail)."""

    def __init__(self, fail_after: int | None = None, nan_every: int | None = None):
        self.inner = create("nss")
        self.name, self.version, self.batch_size = "nss", self.inner.version, 2
        self.seen = 0
        self.fail_after, self.nan_every = fail_after, nan_every

    def score(self, images):
        if self.fail_after is not None and self.seen >= self.fail_after:
            raise RuntimeError("teacher crashed")
        self.seen += len(images)
        s = self.inner.score(images).astype(np.float32)
        if self.nan_every:
            s[:: self.nan_every] = np.nan
        return s


def _files(folder, n, seed=0):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        img = np.clip(128 + rng.normal(0, 5 + 10 * i, (48, 48, 3)), 0, 255).astype(np.uint8)
        p = folder / f"img{seed}_{i}.png"
        p.write_bytes(encode_png(img))
        paths.append(p)
    return paths


def test_labels_match_the_detector_and_keys_are_content_hashes(tmp_path):
    paths = _files(tmp_path, 5)
    det = Counting()
    cache = tmp_path / "labels.parquet"
    df = label_images(det, paths, cache)
    assert list(df["path"]) == [str(p) for p in paths] and (df["status"] == "ok").all()
    assert list(df["key"]) == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    expected = create("nss").score([decode_image(p.read_bytes()) for p in paths])
    np.testing.assert_allclose(df["score"], expected, rtol=1e-6)
    np.testing.assert_allclose(df["raw"], df["score"])  # nss has no separate raw value
    assert set(df["detector"]) == {"nss"} and set(df["detector_version"]) == {det.version}
    assert len(read_cache(cache)) == 5


def test_resume_scores_only_new_images(tmp_path):
    first = _files(tmp_path, 4, seed=1)
    cache = tmp_path / "labels.parquet"
    det = Counting()
    label_images(det, first, cache)
    assert det.seen == 4
    again = Counting()
    df = label_images(again, first, cache)
    assert again.seen == 0 and len(df) == 4  # everything from the cache
    more = first + _files(tmp_path, 3, seed=2)
    third = Counting()
    df = label_images(third, more, cache)
    assert third.seen == 3 and len(df) == 7 and len(read_cache(cache)) == 7


def test_interrupted_run_keeps_flushed_labels(tmp_path):
    paths = _files(tmp_path, 8, seed=3)
    cache = tmp_path / "labels.parquet"
    crashing = Counting(fail_after=4)
    with pytest.raises(RuntimeError, match="crashed"):
        label_images(crashing, paths, cache, flush_every=2)
    assert len(read_cache(cache)) == 4  # two batches of two were written before the crash
    rest = Counting()
    df = label_images(rest, paths, cache)
    assert rest.seen == 4 and (df["status"] == "ok").all()


def test_duplicates_bytes_records_and_bad_items(tmp_path):
    (p,) = _files(tmp_path, 1, seed=4)
    data = p.read_bytes()
    items = [p, data, {"path": "in-shard/a.png", "data": data}, b"not an image",
             tmp_path / "missing.png", {"path": str(p)}]
    det = Counting()
    df = label_images(det, items, tmp_path / "labels.csv")
    assert det.seen == 1  # four references to the same bytes, scored once
    assert list(df["status"]) == ["ok", "ok", "ok", "decode_error", "missing", "ok"]
    assert df.loc[2, "path"] == "in-shard/a.png" and df.loc[0, "key"] == image_key(data)
    assert df["score"].iloc[[0, 1, 2, 5]].nunique() == 1 and np.isnan(df["score"].iloc[3])
    back = read_cache(tmp_path / "labels.csv")  # CSV round trip keeps statuses and NaN
    assert set(back["status"]) == {"ok", "decode_error"} and back["score"].isna().sum() == 1
    with pytest.raises(DetectorError, match="cannot label"):
        label_images(det, [123], tmp_path / "x.parquet")


def test_nan_labels_are_cached_and_retried_on_request(tmp_path):
    paths = _files(tmp_path, 4, seed=5)
    cache = tmp_path / "labels.parquet"
    df = label_images(Counting(nan_every=2), paths, cache)
    assert list(df["status"]) == ["nan", "ok", "nan", "ok"]
    again = Counting()
    label_images(again, paths, cache)
    assert again.seen == 0  # a deterministic failure is not retried by default
    retry = Counting()
    df = label_images(retry, paths[:1], cache, retry_nan=True)  # retry one image only
    assert retry.seen == 1 and (df["status"] == "ok").all()
    kept = read_cache(cache).set_index("key")  # the other nan row is not the retry's to drop
    assert len(kept) == 4 and sorted(kept["status"]) == ["nan", "ok", "ok", "ok"]
    retry = Counting()
    df = label_images(retry, paths, cache, retry_nan=True)
    assert retry.seen == 1 and (df["status"] == "ok").all()


def test_cache_of_another_detector_version_is_refused(tmp_path):
    paths = _files(tmp_path, 2, seed=6)
    cache = tmp_path / "labels.parquet"
    label_images(Counting(), paths, cache)
    other = Counting()
    other.version = "000000000000"
    with pytest.raises(DetectorError, match="use another cache file"):
        label_images(other, paths, cache)


class Interleaving(Counting):
    """A teacher during whose first batch another labelling run into the same cache finishes (as
    a second process on the same cache file would)."""

    def __init__(self, other_items, cache):
        super().__init__()
        self.other_items, self.cache = other_items, cache

    def score(self, images):
        if self.other_items:
            items, self.other_items = self.other_items, None
            label_images(Counting(), items, self.cache)
        return super().score(images)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_two_writers_on_one_cache_keep_each_others_labels(tmp_path, suffix):
    mine, theirs = _files(tmp_path, 4, seed=7), _files(tmp_path, 3, seed=8)
    cache = tmp_path / f"labels{suffix}"
    df = label_images(Interleaving(theirs, cache), mine, cache, flush_every=2)
    assert (df["status"] == "ok").all() and len(df) == 4
    stored = read_cache(cache)
    expected = {image_key(p.read_bytes()) for p in mine + theirs}
    assert set(stored["key"]) == expected and len(stored) == 7  # nobody's labels were dropped
    again = Counting()
    label_images(again, mine + theirs, cache)
    assert again.seen == 0


def test_a_bytes_item_never_gets_a_path_from_the_cache(tmp_path):
    (p,) = _files(tmp_path, 1, seed=9)
    cache = tmp_path / "labels.parquet"
    label_images(Counting(), [p], cache)
    df = label_images(Counting(), [p.read_bytes(), {"data": p.read_bytes()}], cache)
    assert list(df["path"]) == ["", ""] and (df["status"] == "ok").all()


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_the_cache_file_gets_the_users_umask_not_owner_only(tmp_path, mask):
    """The cache is written to a temporary file first (mkstemp: mode 0600) and then moved into
    place; a team's shared labels must end up with the mode the user's umask gives any file."""
    old = os.umask(mask)
    try:
        label_images(Counting(), _files(tmp_path, 2), tmp_path / "labels.parquet")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "labels.parquet").stat().st_mode) == 0o666 & ~mask
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_cache_write_leaves_the_old_cache_and_no_temporary_file(tmp_path):
    from collapseguard.io.atomic import replaced_when_done

    dest = tmp_path / "labels.parquet"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), replaced_when_done(dest) as tmp:
        open(tmp, "wb").write(b"half")
        raise RuntimeError("killed mid-write")
    assert dest.read_bytes() == b"old" and list(tmp_path.iterdir()) == [dest]


def test_a_crash_keeps_every_label_made_and_an_unreadable_path_is_a_row(tmp_path, monkeypatch):
    """A teacher that stops after 3 images keeps those 3 labels (not only flushed ones); a path
    that cannot be read (through a file) is a row with its status, not the end of the run; a path
    that starts like a spreadsheet formula is written inert in a CSV cache."""
    paths = _files(tmp_path, 5, seed=6)
    cache = tmp_path / "labels.csv"
    with pytest.raises(RuntimeError, match="crashed"):
        label_images(Counting(fail_after=3), paths, cache, flush_every=100, batch_size=1)
    assert len(read_cache(cache)) == 3
    monkeypatch.chdir(tmp_path)
    formula = "=HYPERLINK(1).png"  # a relative path, as a listing gives it
    (tmp_path / formula).write_bytes(_files(tmp_path, 1, seed=7)[0].read_bytes())  # new content
    df = label_images(Counting(), [*paths, paths[0] / "x.png", formula], cache, batch_size=1)
    assert list(df["status"]) == ["ok"] * 5 + ["missing", "ok"]
    assert "'=HYPERLINK" in cache.read_text() and ",=HYPERLINK" not in cache.read_text()
    # read back as given, and stable when the cache is rewritten (no quote added each time)
    assert formula in set(read_cache(cache)["path"])
    text = cache.read_text()
    label_images(Counting(), [formula], cache, batch_size=1)
    assert cache.read_text() == text and "''=HYPERLINK" not in text


def test_a_teacher_killed_outright_keeps_the_labels_of_its_last_seconds(tmp_path):
    """SIGKILL (or SIGTERM, which skips the final write) ends a labelling process without its
    ``finally``: the cache, rewritten at least every ``flush_seconds`` while labels come, holds
    what was labelled before the last flush, not nothing (with fewer than ``flush_every``)."""
    import subprocess
    import sys
    import textwrap

    paths = _files(tmp_path, 6, seed=9)
    cache = tmp_path / "labels.parquet"
    code = textwrap.dedent(f"""
        import os, signal, numpy as np
        from collapseguard.detectors import create
        from collapseguard.detectors.base import Detector
        from collapseguard.scoring.label_cache import label_images

        class Slow(Detector):
            def __init__(self):
                self.inner = create("nss")
                self.name, self.version, self.batch_size, self.seen = "nss", self.inner.version, 1, 0
            def score(self, images):
                if self.seen == 4:
                    os.kill(os.getpid(), signal.SIGKILL)
                self.seen += len(images)
                return self.inner.score(images).astype(np.float32)

        label_images(Slow(), {[str(p) for p in paths]!r}, {str(cache)!r}, flush_every=512, flush_seconds=0.0)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == -9, res.stderr
    got = read_cache(cache)
    assert len(got) == 4 and set(got["status"]) == {"ok"}
    # the next run labels only the rest
    counting = Counting()
    df = label_images(counting, paths, cache, batch_size=1)
    assert counting.seen == 2 and list(df["status"]) == ["ok"] * 6


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_cache_edited_into_nonsense_is_refused_by_row_not_trained_on(tmp_path, suffix):
    """A cache whose ok rows hold NaN or inf scores (one NaN made every soft target of a student
    NaN and wrote a NaN network), whose key appears twice (the later row won without a word), or
    whose scores are text, is refused with one line naming what is wrong."""
    paths = _files(tmp_path, 4, seed=9)
    cache = tmp_path / f"labels{suffix}"
    label_images(Counting(), paths, cache)
    good = read_cache(cache)

    def write(df):
        df.to_csv(cache, index=False) if suffix == ".csv" else df.to_parquet(cache, index=False)

    for bad in (np.nan, np.inf):
        df = good.copy()
        df.loc[1, "score"] = bad
        write(df)
        with pytest.raises(DetectorError, match=r"row 2 .*status ok.* score is not a finite number"):
            read_cache(cache)
    doubled = pd.concat([good, good.assign(score=-good["score"])], ignore_index=True)
    write(doubled)
    with pytest.raises(DetectorError, match=f"holds the key {good['key'][0][:12]}.* twice"):
        label_images(Counting(), paths, cache)
    write(good.assign(score=["high", "low", "x", "y"]))
    with pytest.raises(DetectorError, match="score column holds text, not numbers"):
        read_cache(cache)
    write(good)
    assert len(label_images(Counting(), paths, cache)) == 4  # the repaired cache is read again
