"""Parquet inputs (Hugging Face datasets with an Image feature, pyarrow tables with a jpg bytes
column): filter keeps every row once, in order, byte for byte; score gives the scores the same
images get in a tar shard; a killed run resumes to identical outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cg_testutil import add_member, degrade, run_cli

from collapseguard.images import encode_jpeg, encode_png


def _images(photos):
    """Clean and degraded JPEGs of the photos, interleaved (key, bytes)."""
    out = []
    for i, p in enumerate(photos):
        out.append((f"c{i}", encode_jpeg(p, 92)))
        out.append((f"d{i}", encode_jpeg(degrade(p, seed=i), 92)))
    return out


def _threshold(photos):
    from collapseguard.detectors import create
    det = create("nss")
    clean = det.score(photos)
    bad = det.score([degrade(p, seed=i) for i, p in enumerate(photos)])
    assert bad.min() > clean.max()
    return float((bad.min() + clean.max()) / 2)


def hf_parquet(path: Path, images, extra_rows=()) -> None:
    """A Parquet file written by ``datasets`` (Image feature), as the Hub serves them;
    ``extra_rows`` (``(image struct, caption)``) are appended with pyarrow under the same schema
    (``datasets`` itself refuses an image whose path does not exist)."""
    import datasets
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": f"{k}.jpg"} for k, b in images],
                                     "caption": [f"caption {k}" for k, _ in images],
                                     "n": list(range(len(images)))})
    ds.cast_column("image", datasets.Image()).to_parquet(str(path))
    if extra_rows:
        t = pq.read_table(path)
        more = pa.table({"image": [r for r, _ in extra_rows], "caption": [c for _, c in extra_rows],
                         "n": list(range(len(images), len(images) + len(extra_rows)))})
        pq.write_table(pa.concat_tables([t, more.cast(t.schema)]), path)


def jpg_parquet(path: Path, images, row_group_size=3) -> None:
    """An img2dataset-style table written by pyarrow: key, jpg bytes, caption, a float column."""
    t = pa.table({"key": [k for k, _ in images], "jpg": pa.array([b for _, b in images], pa.binary()),
                  "caption": [f"caption {k}" for k, _ in images],
                  "aesthetic": [float(i) / 3 for i in range(len(images))]})
    pq.write_table(t, path, row_group_size=row_group_size)


def _rows(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _check_conserved(src: Path, out: Path):
    """Every input row in exactly one of kept/ and rejected/, in order, every value identical;
    the schema (metadata included) unchanged; one scores row per input row."""
    rows = _rows(src)
    kept, rej = _rows(out / "kept" / src.name), _rows(out / "rejected" / src.name)
    scores = pd.read_parquet(out / "scores" / (src.stem + ".parquet"))
    assert len(scores) == len(rows) and list(scores["row"]) == list(range(len(rows)))
    is_kept = (scores["decision"] == "kept").tolist()
    assert kept == [r for r, k in zip(rows, is_kept) if k]
    assert rej == [r for r, k in zip(rows, is_kept) if not k]
    schema = pq.read_schema(src)
    for sub in ("kept", "rejected"):
        assert pq.read_schema(out / sub / src.name).equals(schema, check_metadata=True)
    return scores


@pytest.mark.parametrize("writer", ["datasets", "pyarrow"])
def test_filter_conserves_every_row_in_order(tmp_path, photos, writer):
    images = _images(photos)
    src = tmp_path / "in" / "part-0.parquet"
    src.parent.mkdir()
    if writer == "datasets":
        # a row without bytes (path only), one whose bytes are not an image, one of zero bytes
        hf_parquet(src, images, extra_rows=[({"bytes": None, "path": "gone.jpg"}, "no bytes"),
                                            ({"bytes": b"not an image", "path": "x.jpg"}, "junk"),
                                            ({"bytes": b"", "path": "empty.jpg"}, "empty")])
    else:
        jpg_parquet(src, images)
    t = _threshold(photos)
    res = run_cli(["filter", src, "-o", tmp_path / "out", "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    # a row kept without a judgement is never kept silently, even with -q
    assert ("note: 1 sample(s) hold no image to judge" in res.stderr) == (writer == "datasets"), res.stderr
    scores = _check_conserved(src, tmp_path / "out")
    reasons = scores["reason"].tolist()
    n = len(images)
    assert reasons[:n] == ["kept", "degraded"] * len(photos)
    if writer == "datasets":
        assert reasons[n:] == ["no_image", "decode_error", "decode_error"]
        assert "only the path 'gone.jpg'" in scores["error"][n] and scores["error"][n + 1]
        assert scores["error"][n + 2]  # zero bytes: an image that does not decode, as in a shard
        assert scores["key"].tolist() == [str(i) for i in range(n + 3)]
        import datasets  # the outputs read back as the dataset they came from
        kept = datasets.Dataset.from_parquet(str(tmp_path / "out/kept/part-0.parquet"))
        assert isinstance(kept.features["image"], datasets.Image) and len(kept) == len(photos) + 1
    else:
        assert scores["key"].tolist() == [k for k, _ in images]  # the key column names the rows
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["samples"] == len(scores) and summary["kept"] + summary["rejected"] == len(scores)
    # a second run resumes: nothing redone, nothing changed
    before = _all_outputs(tmp_path / "out")
    run_cli(["filter", src, "-o", tmp_path / "out", "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    assert _all_outputs(tmp_path / "out") == before
    assert json.loads((tmp_path / "out/summary.json").read_text())["per_shard"][0]["status"] == "resumed"


def test_image_column_is_a_setting_of_parquet_inputs_only(tmp_path, photos):
    """Naming the image column on a rerun redoes nothing for tar shards; for a Parquet file it is
    a setting like the threshold (another value: refused, as other settings are)."""
    import tarfile
    images = _images(photos[:1])
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for k, b in images:
            add_member(tf, f"{k}.jpg", b)
    jpg_parquet(tmp_path / "j.parquet", images)
    base = ["-o", tmp_path / "o", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"]
    run_cli(["filter", tmp_path / "s.tar", *base])
    run_cli(["filter", tmp_path / "s.tar", *base, "--image-column", "jpg"])  # resumed, no refusal
    run_cli(["filter", tmp_path / "j.parquet", *base, "--image-column", "jpg"])
    res = run_cli(["filter", tmp_path / "j.parquet", *base, "--image-column", "key"], expect=1)
    assert "image_column 'jpg' there, 'key' now" in res.output


def test_row_groups_are_bounded(tmp_path, photos, monkeypatch):
    from collapseguard.io import parquet as pqio
    monkeypatch.setattr(pqio, "ROW_GROUP_ROWS", 3)
    images = _images(photos) * 2
    src = tmp_path / "a.parquet"
    jpg_parquet(src, images, row_group_size=100)
    run_cli(["filter", src, "-o", tmp_path / "o", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    md = pq.ParquetFile(tmp_path / "o/kept/a.parquet").metadata
    assert md.num_rows == len(images) and md.num_row_groups == -(-len(images) // 3)
    assert all(md.row_group(i).num_rows <= 3 for i in range(md.num_row_groups))


def test_score_gives_the_scores_of_the_same_images_in_a_tar_shard(tmp_path, photos):
    import tarfile
    images = _images(photos)
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        for k, b in images:
            add_member(tf, f"{k}.jpg", b)
    hf_parquet(tmp_path / "h.parquet", images)
    jpg_parquet(tmp_path / "j.parquet", images)
    run_cli(["score", shard, tmp_path / "h.parquet", tmp_path / "j.parquet", "-d", "nss",
             "-o", tmp_path / "s.parquet", "-q"])
    df = pd.read_parquet(tmp_path / "s.parquet")
    by = {src: g["score"].to_numpy() for src, g in df.groupby("source", sort=False)}
    tar_scores = by[str(shard)]
    assert len(tar_scores) == len(images) and np.isfinite(tar_scores).all()
    flags = {src: g["flagged"].tolist() for src, g in df.groupby("source", sort=False)}
    assert (df["threshold"] > 0).all() and any(flags[str(shard)])  # nss's shipped calibration
    for name in ("h.parquet", "j.parquet"):
        got = next(v for s, v in by.items() if s.endswith(name))
        np.testing.assert_array_equal(got, tar_scores)
        assert next(v for s, v in flags.items() if s.endswith(name)) == flags[str(shard)]
    # a Parquet row is named by its index in its file too (a key can repeat there); shards have none
    rows = {src: g["row"].tolist() for src, g in df.groupby("source", sort=False)}
    assert rows[str(shard)] == [pd.NA] * len(images)
    assert all(v == list(range(len(images))) for s, v in rows.items() if s.endswith(".parquet"))
    # the pyarrow file's rows are named by its key column, the datasets file's by row index
    assert df[df["source"].str.endswith("j.parquet")]["key"].tolist() == [k for k, _ in images]


def test_image_column_found_or_named(tmp_path, photos):
    png = encode_png(photos[0][:64, :64])
    t = pa.table({"thumb": pa.array([png], pa.binary()), "pic": pa.array([png], pa.binary())})
    pq.write_table(t, tmp_path / "t.parquet")
    res = run_cli(["score", tmp_path / "t.parquet", "-d", "nss", "-o", tmp_path / "s.csv"], expect=1)
    assert "no image column" in res.output and "--image-column" in res.output
    run_cli(["score", tmp_path / "t.parquet", "-d", "nss", "-o", tmp_path / "s.csv", "-q",
             "--image-column", "pic"])
    assert np.isfinite(pd.read_csv(tmp_path / "s.csv")["score"]).all()
    res = run_cli(["score", tmp_path / "t.parquet", "-d", "nss", "-o", tmp_path / "s.csv",
                   "--image-column", "nope"], expect=1)
    assert "no column 'nope'" in res.output


def test_a_second_image_column_nothing_judges_is_named_not_passed_over_silently(tmp_path, photos):
    """A row with a clean jpg and a degraded png: one column is judged (jpg, found first), and the
    run says the png column was not, in its output and its summary; naming it judges it."""
    t = _threshold(photos)
    clean = [encode_jpeg(p, 92) for p in photos]
    bad = [encode_png(degrade(p, seed=i)) for i, p in enumerate(photos)]
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(len(photos))], "png": bad, "jpg": clean}),
                   tmp_path / "two.parquet")
    res = run_cli(["filter", tmp_path / "two.parquet", "-o", tmp_path / "o", "-d", "nss",
                   "--threshold", t, "-q"])
    assert "judged 'jpg', not 'png'" in res.output and "--image-column" in res.output
    shard = json.loads((tmp_path / "o/summary.json").read_text())["per_shard"][0]
    assert (shard["image_column"], shard["unjudged_image_columns"], shard["kept"]) == ("jpg", ["png"], len(photos))
    res = run_cli(["filter", tmp_path / "two.parquet", "-o", tmp_path / "o2", "-d", "nss",
                   "--threshold", t, "-q", "--image-column", "png"])
    shard = json.loads((tmp_path / "o2/summary.json").read_text())["per_shard"][0]
    assert "not 'png'" not in res.output and "unjudged_image_columns" not in shard
    assert shard["rejected"] == len(photos)


def test_a_folder_reads_parquet_files_but_not_img2dataset_sidecars(tmp_path, photos):
    from collapseguard.io.inputs import expand
    images = _images(photos[:1])
    d = tmp_path / "d"
    d.mkdir()
    jpg_parquet(d / "data.parquet", images)
    import tarfile
    with tarfile.open(d / "00000.tar", "w") as tf:
        add_member(tf, "a.jpg", images[0][1])
    pq.write_table(pa.table({"key": ["a"], "caption": ["x"]}), d / "00000.parquet")
    (d / "scores").mkdir()  # a table with no bytes column (a filter's scores) holds no images
    pq.write_table(pa.table({"key": ["a"], "score": [1.0]}), d / "scores" / "data.parquet")
    (d / "broken.parquet").write_bytes(b"PAR1 not really")  # unreadable: an input, fails loudly
    (d / "zeros.parquet").write_bytes(b"PAR1" + bytes(64) + b"PAR1")  # a footer that does not parse
    data, _ = expand([str(d)])
    assert sorted((Path(i.name).name, i.kind) for i in data) == [
        ("00000.tar", "tar"), ("broken.parquet", "parquet"), ("data.parquet", "parquet"),
        ("zeros.parquet", "parquet")]
    res = run_cli(["score", d, "-d", "nss", "-o", tmp_path / "s.csv"], expect=1)
    assert "broken.parquet: not a readable Parquet file" in res.output
    assert "zeros.parquet: not a readable Parquet file" in res.output
    assert len(pd.read_csv(tmp_path / "s.csv")) == 1 + len(images)  # the shard's sample, the rows


def test_audit_reads_parquet(tmp_path, photos):
    src = tmp_path / "h.parquet"
    hf_parquet(src, _images(photos))
    run_cli(["audit", src, "-o", tmp_path / "a", "-d", "nss", "--threshold", _threshold(photos),
             "-q", "--gallery-size", "2"])
    summary = json.loads((tmp_path / "a/summary.json").read_text())
    assert summary["failures"] == []
    # every row read, and the threshold that splits clean from degraded flags the degraded half
    n = len(_images(photos))
    assert summary["scored"] == n and summary["flagged"] == n // 2, summary
    html = (tmp_path / "a/report.html").read_text()
    assert "data:image/jpeg;base64" in html and "not read" not in html


def test_audit_shows_the_rows_of_a_piped_parquet_file(tmp_path, photos):
    """A ``pipe:`` command ending in ``.parquet`` is a Parquet input for scoring, and for the
    gallery's second read too: every card shows its image."""
    src = tmp_path / "h.parquet"
    hf_parquet(src, _images(photos))
    run_cli(["audit", f"pipe:cat {src}", "-o", tmp_path / "a", "-d", "nss", "--threshold",
             _threshold(photos), "-q", "--gallery-size", "2"])
    summary = json.loads((tmp_path / "a/summary.json").read_text())
    assert summary["failures"] == [] and summary["samples"] == 2 * len(photos)
    html = (tmp_path / "a/report.html").read_text()
    assert "data:image/jpeg;base64" in html and "image not shown" not in html


def _all_outputs(out: Path) -> dict[str, bytes]:
    """Every output but the markers (which record how long the run took)."""
    return {str(p.relative_to(out)): p.read_bytes() for sub in ("kept", "rejected", "scores")
            for p in sorted((out / sub).glob("*")) if not p.name.endswith(".tmp")}


@pytest.mark.parametrize("writer", ["datasets", "pyarrow"])
def test_killed_run_resumes_to_identical_outputs(tmp_path, writer):
    from skimage import data
    big = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()] * 3
    d = tmp_path / "data"
    d.mkdir()
    images = [(f"k{i}", encode_jpeg(im if i % 2 else degrade(im, seed=i), 90)) for i, im in enumerate(big)]
    for s in range(3):
        (hf_parquet if writer == "datasets" else jpg_parquet)(d / f"part-{s}.parquet", images)
    cmd = [sys.executable, "-m", "collapseguard.cli", "filter", str(d / "part-{0..2}.parquet"),
           "-d", "nss", "--threshold", "3.2", "--workers", "1", "--batch-size", "1", "-q"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    ref = tmp_path / "ref"
    subprocess.run(cmd + ["--out", str(ref)], check=True, env=env)
    out = tmp_path / "out"
    proc = subprocess.Popen(cmd + ["--out", str(out)], start_new_session=True, env=env)
    deadline = time.time() + 120
    # kill once the second file is being written: one complete, one mid-way
    while time.time() < deadline:
        if (out / ".done/part-0.json").exists() and list((out / "kept").glob("part-1.parquet*.tmp")):
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / ".done/part-2.json").exists(), "run finished before it could be killed"
    assert list((out / "kept").glob("*.tmp")), "expected a partial output at the kill"
    subprocess.run(cmd + ["--out", str(out)], check=True, env=env)
    assert not list(out.rglob("*.tmp"))
    assert _all_outputs(out) == _all_outputs(ref)
    statuses = {Path(s["shard"]).name: s["status"]
                for s in json.loads((out / "summary.json").read_text())["per_shard"]}
    assert statuses["part-0.parquet"] == "resumed" and statuses["part-2.parquet"] == "done"
    for s in range(3):
        _check_conserved(d / f"part-{s}.parquet", out)


def _serve(folder: Path, ranges: bool):
    """An http server on loopback serving ``folder``, answering single range requests (as object
    stores and the Hugging Face Hub do) or not (python's own server)."""
    import functools
    import http.server
    import threading

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            spec = self.headers.get("Range", "")
            if not (ranges and spec.startswith("bytes=")):
                return super().do_GET()
            path = Path(self.translate_path(self.path))
            data = path.read_bytes()
            a, _, b = spec[len("bytes="):].partition("-")
            start = int(a) if a else len(data) - int(b)
            end = min(int(b), len(data) - 1) if a and b else len(data) - 1
            body = data[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self.wfile.write(body)
            self.server.ranges_served += 1

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    srv.ranges_served = 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("ranges", [True, False])
def test_parquet_by_url_and_pipe_filters_like_the_file(tmp_path, photos, ranges, monkeypatch):
    d = tmp_path / "d"
    d.mkdir()
    hf_parquet(d / "h.parquet", _images(photos))
    t = _threshold(photos)
    args = ["-d", "nss", "--threshold", t, "-w", "1", "-q"]
    run_cli(["filter", d / "h.parquet", "-o", tmp_path / "local", *args])
    srv = _serve(d, ranges)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/h.parquet"
        run_cli(["filter", url, "-o", tmp_path / "url", *args])
        run_cli(["score", url, "-d", "nss", "-o", tmp_path / "s.csv", "-q"])
        assert (srv.ranges_served > 0) == ranges  # random access where the server offers it
    finally:
        srv.shutdown()
        srv.server_close()
    local = {k: v for k, v in _all_outputs(tmp_path / "local").items()}
    assert local and _all_outputs(tmp_path / "url") == local
    assert len(pd.read_csv(tmp_path / "s.csv")) == len(_images(photos))
    if ranges:  # a pipe: command the user gave: its output read once into a temporary file
        monkeypatch.chdir(d)
        run_cli(["filter", "pipe:cat h.parquet", "-o", tmp_path / "pipe", *args])
        assert _all_outputs(tmp_path / "pipe") == local


def test_drop_fraction_dry_run_and_no_rejected_on_parquet(tmp_path, photos):
    src = tmp_path / "j.parquet"
    images = _images(photos)
    jpg_parquet(src, images)
    run_cli(["filter", src, "-o", tmp_path / "df", "-d", "nss", "--drop-fraction", "0.5", "-w", "1", "-q"])
    scores = _check_conserved(src, tmp_path / "df")
    assert (scores["decision"] == "rejected").sum() == len(images) // 2
    assert set(scores.loc[scores["decision"] == "rejected", "key"]) == {k for k, _ in images if k.startswith("d")}
    run_cli(["filter", src, "-o", tmp_path / "dry", "-d", "nss", "--threshold", "3", "--dry-run", "-w", "1", "-q"])
    assert not (tmp_path / "dry/kept").exists() and len(pd.read_parquet(tmp_path / "dry/scores/j.parquet")) == len(images)
    t = _threshold(photos)
    run_cli(["filter", src, "-o", tmp_path / "nr", "-d", "nss", "--threshold", t, "--no-rejected", "-w", "1", "-q"])
    assert not (tmp_path / "nr/rejected").exists()
    decided = pd.read_parquet(tmp_path / "nr/scores/j.parquet")
    kept_keys = set(decided.loc[decided["decision"] == "kept", "key"])
    assert kept_keys == {k for k, _ in images if k.startswith("c")}  # the clean half, no more
    assert [r for r in _rows(src) if r["key"] in kept_keys] == _rows(tmp_path / "nr/kept/j.parquet")


@pytest.mark.parametrize("mode", ["threshold", "drop_fraction"])
def test_parquet_scores_note_transparency(tmp_path, photos, mode):
    """A transparent PNG row carries has_alpha in the Parquet filter's scores, on both the plain
    run and --drop-fraction's two passes, as a tar shard's does."""
    rgba = np.zeros((96, 128, 4), np.uint8)
    rgba[..., :3] = photos[0][:96, :128]
    rgba[..., 3] = np.linspace(0, 255, 128, dtype=np.uint8)[None]
    images = [("t", encode_png(rgba)), ("o", encode_jpeg(photos[1], 92))]
    src = tmp_path / "a.parquet"
    jpg_parquet(src, images)
    how = (["--threshold", "1e9"] if mode == "threshold" else ["--drop-fraction", "0.5"])
    run_cli(["filter", src, "-o", tmp_path / "o", "-d", "nss", "-w", "1", "-q", *how])
    scores = pd.read_parquet(tmp_path / "o" / "scores" / "a.parquet")
    assert dict(zip(scores["key"], scores["has_alpha"])) == {"t": True, "o": False}


def test_a_piped_parquet_file_is_read_only_up_to_max_shard_bytes(tmp_path, photos):
    """A ``pipe:`` Parquet input is copied aside before it is read (Parquet keeps its schema at the
    end): the copy stops at --max-shard-bytes and the input fails in one line naming the limit
    (a command that sends forever would otherwise fill the disk); the file beside it is filtered."""
    src = tmp_path / "a.parquet"
    jpg_parquet(src, _images(photos[:2]))
    local = tmp_path / "b.parquet"
    jpg_parquet(local, _images(photos[2:4]))
    piped = f"pipe:head -c 40000000 /dev/zero; cat {src}"
    out = tmp_path / "out"
    run_cli(["filter", piped, local, "-o", out, "-d", "nss", "--threshold", "1e9", "-w", "1", "-q",
             "--max-shard-bytes", 4_000_000], expect=1)
    summary = json.loads((out / "summary.json").read_text())
    errors = {r["shard"]: r.get("error") for r in summary["per_shard"]}
    assert errors[str(local)] is None and len(_rows(out / "kept" / "b.parquet")) == 4
    assert "ShardTooLargeError" in errors[piped] and "4000000" in errors[piped]
    assert "\n" not in errors[piped]


def test_a_completed_parquet_file_resumes_under_another_max_sample_bytes(tmp_path, photos):
    """--max-sample-bytes bounds tar samples and changes nothing a Parquet input writes: a second
    run with another value resumes the completed file."""
    src = tmp_path / "a.parquet"
    jpg_parquet(src, _images(photos[:2]))
    args = ["filter", src, "-o", tmp_path / "out", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"]
    run_cli(args)
    marker = (tmp_path / "out/.done/a.json").read_bytes()
    run_cli([*args, "--max-sample-bytes", 1_000_000])
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert [r["status"] for r in summary["per_shard"]] == ["resumed"]
    assert (tmp_path / "out/.done/a.json").read_bytes() == marker


def test_reshard_names_the_parquet_files_it_leaves_in_kept(tmp_path, photos):
    import tarfile
    src = tmp_path / "p.parquet"
    jpg_parquet(src, _images(photos[:2]))
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tf:
        for k, b in _images(photos[2:4]):
            add_member(tf, f"{k}.jpg", b)
    res = run_cli(["filter", src, shard, "-o", tmp_path / "out", "-d", "nss", "--threshold", "1e9",
                   "-w", "1", "--reshard", 3])
    assert "resharded: 4 kept samples into 2 shard(s)" in res.output
    assert "1 Parquet file(s) not resharded" in res.output and "p.parquet" in res.output
    assert len(_rows(tmp_path / "out/kept/p.parquet")) == 4
