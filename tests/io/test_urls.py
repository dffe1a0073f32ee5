"""Inputs and outputs by URL on real servers on loopback: Python's HTTP server serving a folder of
shards, a real S3 implementation (moto's server mode), ``pipe:`` commands and ``.tar.gz`` shards.
Each filters to bytes identical to the same shard filtered from a local file."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from cg_testutil import degrade, make_shard, read_members, run_cli

from collapseguard.io import urls
from collapseguard.io.inputs import InputError, expand_inputs

pytest.importorskip("s3fs")
pytest.importorskip("aiohttp")
moto_server = pytest.importorskip("moto.server")


def nss_threshold(photos) -> float:
    from collapseguard.detectors import create
    det = create("nss")
    clean, bad = det.score(photos), det.score([degrade(p, seed=i) for i, p in enumerate(photos)])
    assert bad.min() > clean.max()
    return float((bad.min() + clean.max()) / 2)


def outputs(root: Path) -> dict[str, bytes]:
    """kept/, rejected/, scores/ of a local --out, as {relative name: bytes}."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for sub in ("kept", "rejected", "scores")
            for p in sorted((root / sub).glob("*"))}


def s3_outputs(fs, prefix: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {k[len(prefix) + 1:]: fs.cat_file(k) for k in sorted(fs.find(prefix))
            if k[len(prefix) + 1:].split("/")[0] in ("kept", "rejected", "scores")}


@pytest.fixture(scope="module")
def shards(tmp_path_factory, photos):
    d = tmp_path_factory.mktemp("shards")
    for s in range(2):
        make_shard(d / f"shard-{s}.tar", photos[:3], start=10 * s)
    return d


@pytest.fixture(scope="module")
def threshold(photos):
    return nss_threshold(photos[:3])


@pytest.fixture(scope="module")
def local_ref(tmp_path_factory, shards, threshold):
    """The shards filtered from local files: what every URL must reproduce."""
    out = tmp_path_factory.mktemp("ref")
    run_cli(["filter", shards / "shard-{0..1}.tar", "-o", out, "-d", "nss", "--threshold", threshold,
             "-w", "1", "-q"])
    got = outputs(out)
    assert got["kept/shard-0.tar"] and got["rejected/shard-0.tar"]
    return got


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_root(shards):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(QuietHandler, directory=str(shards)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def s3_server():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch, shards):
    """An S3 filesystem on the moto server (env set for this process and its children), with the
    shards uploaded to s3://data/set/."""
    import s3fs
    for k, v in (("AWS_ENDPOINT_URL", s3_server), ("AWS_ACCESS_KEY_ID", "test"),
                 ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1"),
                 ("NO_PROXY", "127.0.0.1,localhost"), ("no_proxy", "127.0.0.1,localhost")):
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    for bucket in ("data", "out"):
        if not fs.exists(bucket):
            fs.mkdir(bucket)
    for p in sorted(shards.glob("*.tar")):
        fs.put_file(str(p), f"data/set/{p.name}")
    yield fs
    fs.rm("out", recursive=True)
    fs.invalidate_cache()


def test_names_and_pipe_streams(tmp_path):
    assert urls.scheme("data/x.tar") == "" and urls.scheme("s3://b/x.tar") == "s3"
    assert urls.local_path("file:///tmp/a.tar") == "/tmp/a.tar" and urls.local_path("file:a.tar") == "a.tar"
    assert urls.local_path("https://h/a.tar") is None and urls.local_path("pipe:cat a.tar") is None
    from collapseguard.io.parse import basename_of
    assert basename_of("pipe:curl -s 'https://h/d/00007.tar.gz'") == "00007.tar.gz"
    assert basename_of("https://h/d/00007.tar?sig=abc") == "00007.tar"
    assert basename_of("pipe:curl -s https://h/d/train-00001.parquet") == "train-00001.parquet"
    with pytest.raises(urls.URLError, match="cannot be named"):
        basename_of("pipe:cat")
    assert urls.identity("pipe:cat x.tar") == {"pipe": "cat x.tar", "checked": False}
    (tmp_path / "a.bin").write_bytes(b"x" * 100_000)
    with urls.open_stream(f"pipe:cat {tmp_path}/a.bin") as f:
        assert f.read() == b"x" * 100_000
    with pytest.raises(OSError, match="status 3"):
        with urls.open_stream("pipe:printf abc; exit 3") as f:
            f.read()
    with urls.open_stream("pipe:yes") as f:  # stopped early: SIGPIPE ends the command, no error
        assert f.read(10) == b"y\ny\ny\ny\ny\n"
    with pytest.raises(urls.URLError, match="command line only"):
        urls.open_stream("pipe:cat x", allow_pipe=False)


def test_pipe_shard_filters_like_the_file(tmp_path, shards, threshold, local_ref):
    out = tmp_path / "out"
    run_cli(["filter", f"pipe:cat {shards}/shard-{{0..1}}.tar", "-o", out, "-d", "nss",
             "--threshold", threshold, "-w", "1", "-q"])
    assert outputs(out) == local_ref
    # a command that fails is a failed shard, named, with its status
    res = run_cli(["filter", f"pipe:cat {tmp_path}/missing/shard-9.tar", "-o", tmp_path / "bad",
                   "-d", "nss", "--threshold", threshold, "-w", "1", "-q"], expect=1)
    assert "shard-9.tar" in res.output and "status 1" in res.output
    # resume: a pipe: input cannot be checked; a marker from the same command is trusted
    run_cli(["filter", f"pipe:cat {shards}/shard-{{0..1}}.tar", "-o", out, "-d", "nss",
             "--threshold", threshold, "-w", "1", "-q"])
    summary = json.loads((out / "summary.json").read_text())
    assert [s["status"] for s in summary["per_shard"]] == ["resumed", "resumed"]


def test_a_pipe_command_that_fails_after_writing_is_one_line_naming_it(tmp_path, shards, threshold):
    """A ``pipe:`` command that writes half a shard, or all of it, and then exits 3 fails its shard
    with one line naming the command and its status: not a "damaged tar header", no traceback in
    summary.json or audit's failures, no output and no marker left for it."""
    src = shards / "shard-0.tar"
    for i, cmd in enumerate((f"head -c {src.stat().st_size // 2} {src}; exit 3 # shard-0.tar",
                             f"cat {src}; exit 3 # shard-0.tar")):
        want = f"PipeError: pipe:{cmd}: the command exited with status 3"
        out = tmp_path / f"out{i}"
        res = run_cli(["filter", f"pipe:{cmd}", "-o", out, "-d", "nss", "--threshold", threshold,
                       "-w", "1", "-q"], expect=1)
        assert f"FAILED pipe:{cmd}: {want}" in res.output and "damaged" not in res.output
        summary = json.loads((out / "summary.json").read_text())
        assert [s["error"] for s in summary["per_shard"]] == [want]
        assert not list(out.glob("kept/*")) and not list(out.glob(".done/*"))
        res = run_cli(["score", f"pipe:{cmd}", "-d", "nss", "-q", "-o", tmp_path / f"s{i}.csv"],
                      expect=1)
        assert f"FAILED pipe:{cmd}: {want}" in res.output and "damaged" not in res.output
        run_cli(["audit", f"pipe:{cmd}", "-d", "nss", "-q", "-o", tmp_path / f"a{i}"], expect=1)
        failures = json.loads((tmp_path / f"a{i}/summary.json").read_text())["failures"]
        assert failures == [f"pipe:{cmd}: {want}"]


def test_http_shards_filter_like_the_files(tmp_path, http_root, shards, threshold, local_ref):
    out = tmp_path / "out"
    run_cli(["filter", f"{http_root}/shard-{{0..1}}.tar", "-o", out, "-d", "nss",
             "--threshold", threshold, "-w", "1", "-q"])
    assert outputs(out) == local_ref
    marker = json.loads((out / ".done/shard-0.json").read_text())
    assert marker["input"]["size"] == (shards / "shard-0.tar").stat().st_size
    assert "last_modified" in marker["input"]
    with pytest.raises(InputError, match="no such object or folder"):
        expand_inputs([f"{http_root}/shard-7.tar"])
    # score reads a shard over http as from the file: same rows but the source
    run_cli(["score", f"{http_root}/shard-0.tar", "-d", "nss", "-q", "-o", tmp_path / "http.csv"])
    run_cli(["score", shards / "shard-0.tar", "-d", "nss", "-q", "-o", tmp_path / "file.csv"])
    web, local = (pd.read_csv(tmp_path / n, keep_default_na=False) for n in ("http.csv", "file.csv"))
    assert set(web.source) == {f"{http_root}/shard-0.tar"}
    assert web.drop(columns="source").equals(local.drop(columns="source"))


def test_s3_in_and_out_match_local_and_resume_checks_the_etag(tmp_path, s3, threshold, local_ref):
    # input from an S3 prefix (listed), output to an S3 prefix, two worker processes
    run_cli(["filter", "s3://data/set/", "-o", "s3://out/run1", "-d", "nss", "--threshold",
             threshold, "-w", "2", "-q"])
    assert s3_outputs(s3, "out/run1") == local_ref
    marker = json.loads(s3.cat_file("out/run1/.done/shard-0.json"))
    assert marker["input"]["etag"] and marker["input"]["size"] == s3.info("data/set/shard-0.tar")["size"]
    assert not s3.exists("out/run1/.lock"), "the lock object is removed at the end of the run"
    # input from S3, output local: the same bytes
    run_cli(["filter", "s3://data/set/shard-{0..1}.tar", "-o", tmp_path / "local", "-d", "nss",
             "--threshold", threshold, "-w", "1", "-q"])
    assert outputs(tmp_path / "local") == local_ref
    # resume: unchanged objects are reused; an object replaced since (new ETag) is filtered again
    s3.put_file(str(tmp_path / "local/kept/shard-1.tar"), "data/set/shard-1.tar")
    run_cli(["filter", "s3://data/set/", "-o", "s3://out/run1", "-d", "nss", "--threshold",
             threshold, "-w", "1", "-q"])
    summary = json.loads(s3.cat_file("out/run1/summary.json"))
    assert {Path(s["shard"]).name: s["status"] for s in summary["per_shard"]} == {
        "shard-0.tar": "resumed", "shard-1.tar": "done"}
    assert s3.cat_file("out/run1/kept/shard-1.tar") == local_ref["kept/shard-1.tar"]
    # an output changed after its marker was written is not vouched for: the shard is redone
    s3.pipe_file("out/run1/kept/shard-0.tar", b"tampered")
    run_cli(["filter", "s3://data/set/", "-o", "s3://out/run1", "-d", "nss", "--threshold",
             threshold, "-w", "1", "-q"])
    assert s3.cat_file("out/run1/kept/shard-0.tar") == local_ref["kept/shard-0.tar"]


def test_s3_lock_object_rule(tmp_path, s3, threshold):
    """A worker whose run no longer holds <out>/.lock commits nothing; a new run takes the lock
    over (saying so) and removes it when done."""
    from collapseguard.filter.pipeline import FilterOptions, RunLostError, process_shard
    s3.pipe_file("out/lk/.lock", b"otherrun\n")
    opts = FilterOptions(out_dir="s3://out/lk", detector="nss", threshold=threshold, run_id="mine")
    with pytest.raises(RunLostError, match="held by another run"):
        process_shard("s3://data/set/shard-0.tar", opts)
    s3.invalidate_cache()
    assert sorted(s3.find("out/lk")) == ["out/lk/.lock"], "nothing committed without the lock"
    res = run_cli(["filter", "s3://data/set/shard-0.tar", "-o", "s3://out/lk", "-d", "nss",
                   "--threshold", threshold, "-w", "1"])
    assert "held run otherrun" in res.output and "takes over" in res.output
    s3.invalidate_cache()
    assert s3.exists("out/lk/.done/shard-0.json") and not s3.exists("out/lk/.lock")


def test_s3_out_killed_and_resumed_is_identical(tmp_path, s3, threshold, local_ref, s3_server):
    from skimage import data
    big = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()] * 2
    d = tmp_path / "big"
    d.mkdir()
    for s in range(3):
        make_shard(d / f"shard-{s}.tar", big, start=s * 100)
    cmd = [sys.executable, "-m", "collapseguard.cli", "filter", str(d / "shard-{0..2}.tar"),
           "-d", "nss", "--threshold", "3.2", "-w", "1", "--batch-size", "1", "-q"]
    ref = tmp_path / "ref"
    subprocess.run(cmd + ["-o", str(ref)], check=True)
    stage = tmp_path / "stage"  # the run's local staging folder, watched for the second shard
    stage.mkdir()
    env = {**os.environ, "TMPDIR": str(stage)}
    proc = subprocess.Popen(cmd + ["-o", "s3://out/killed"], env=env, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        s3.invalidate_cache()
        if s3.exists("out/killed/.done/shard-0.json") and list(stage.glob("*/kept__shard-1.tar.*")):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    s3.invalidate_cache()
    assert not s3.exists("out/killed/.done/shard-2.json"), "run finished before it could be killed"
    assert not s3.exists("out/killed/kept/shard-1.tar"), "no output appears before it is whole"
    assert s3.exists("out/killed/.lock"), "the killed run's lock object is left behind"
    res = subprocess.run(cmd + ["-o", "s3://out/killed"], env=env, check=True, capture_output=True,
                         text=True)
    assert "takes over" in res.stderr
    assert s3_outputs(s3, "out/killed") == outputs(ref)
    summary = json.loads(s3.cat_file("out/killed/summary.json"))
    statuses = {Path(s["shard"]).name: s["status"] for s in summary["per_shard"]}
    assert statuses["shard-0.tar"] == "resumed" and statuses["shard-2.tar"] == "done"


def test_tar_gz_shards_round_trip(tmp_path, shards, threshold, local_ref):
    gz = tmp_path / "gz"
    gz.mkdir()
    for s in range(2):
        (gz / f"shard-{s}.tar.gz").write_bytes(gzip.compress((shards / f"shard-{s}.tar").read_bytes()))
    (gz / "shard-1.tar.gz").rename(gz / "shard-1.tgz")
    for run in ("a", "b"):
        run_cli(["filter", gz, "-o", tmp_path / run, "-d", "nss", "--threshold", threshold,
                 "-w", "1", "-q"])
    a, b = outputs(tmp_path / "a"), outputs(tmp_path / "b")
    assert a == b, "gzip outputs are byte-identical across runs"
    assert set(a) == {"kept/shard-0.tar.gz", "rejected/shard-0.tar.gz", "scores/shard-0.parquet",
                      "kept/shard-1.tgz", "rejected/shard-1.tgz", "scores/shard-1.parquet"}
    for name, data in a.items():
        if not name.startswith("scores"):
            assert data[:2] == b"\x1f\x8b" and data[4:8] == b"\0\0\0\0", "gzip header mtime is 0"
            plain = name.replace(".tar.gz", ".tar").replace(".tgz", ".tar")
            assert (read_members(tmp_path / "a" / name) == read_members_local(local_ref[plain]))
    assert a["scores/shard-0.parquet"] == local_ref["scores/shard-0.parquet"]
    # kept .tar.gz shards read back as input: all kept again
    run_cli(["filter", tmp_path / "a/kept", "-o", tmp_path / "again", "-d", "nss", "--threshold",
             threshold, "-w", "1", "-q"])
    assert (tmp_path / "again/kept/shard-0.tar.gz").read_bytes() == a["kept/shard-0.tar.gz"]


def test_gzip_shards_over_http_filter_like_the_files_and_log_nothing(tmp_path, shards, threshold):
    """A .tar.gz of two gzip members served over http: gzip probes past the end of the body for
    a further member, which the stream answers without reading again (aiohttp logs every probe
    past the fifth with a stack trace)."""
    import subprocess
    import sys

    gz = tmp_path / "gz"
    gz.mkdir()
    data = (shards / "shard-0.tar").read_bytes()
    (gz / "multi.tar.gz").write_bytes(gzip.compress(data[:5000]) + gzip.compress(data[5000:]))
    (gz / "one.tgz").write_bytes(gzip.compress((shards / "shard-1.tar").read_bytes()))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(gz)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        args = ["-d", "nss", "--threshold", str(threshold), "-w", "1", "-q"]
        res = subprocess.run([sys.executable, "-m", "collapseguard.cli", "filter", f"{base}/multi.tar.gz",
                              f"{base}/one.tgz", "-o", str(tmp_path / "url"), *args],
                             capture_output=True, text=True, timeout=300)
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.returncode == 0, res.stderr
    assert "Multiple access" not in res.stderr and "Traceback" not in res.stderr and "Stack" not in res.stderr
    run_cli(["filter", gz, "-o", tmp_path / "local", *args])
    assert outputs(tmp_path / "url") == outputs(tmp_path / "local")


def read_members_local(data: bytes):
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf.getmembers() if m.isfile()]


def test_audit_reads_shards_over_http_like_the_files(tmp_path, http_root, shards, threshold):
    """audit --sample lists keys by streaming the tar headers and its gallery reads the chosen
    samples back over http; each sampled row equals the row of a full audit of the files."""
    tables = {}
    for where, inputs, sample in (("web", [f"{http_root}/shard-{{0..1}}.tar"], ["--sample", "5"]),
                                  ("file", [str(shards / "shard-{0..1}.tar")], [])):
        run_cli(["audit", *inputs, "-o", tmp_path / where, "-d", "nss", "--threshold", threshold,
                 *sample, "-q"])
        df = pd.read_parquet(tmp_path / where / "scores.parquet")
        tables[where] = df.assign(source=df.source.map(lambda s: Path(s).name))
        html = (tmp_path / where / "report.html").read_text()
        assert "cannot read" not in html and "not found on second read" not in html
    web, local = tables["web"], tables["file"]
    assert len(web) == 5 and len(local) == 12
    chosen = local.set_index(["source", "key"]).loc[list(zip(web.source, web.key))].reset_index()
    assert web[chosen.columns].equals(chosen)


def test_loose_images_from_an_s3_prefix_score_like_the_files(tmp_path, s3, photos):
    from collapseguard.images import encode_png
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    for i, name in enumerate(("a.png", "sub/b.png")):
        (folder / name).write_bytes(encode_png(photos[i]))
        s3.put_file(str(folder / name), f"data/imgs/{name}")
    run_cli(["score", "s3://data/imgs", "-d", "nss", "-q", "-o", tmp_path / "s3.csv"])
    run_cli(["score", folder, "-d", "nss", "-q", "-o", tmp_path / "file.csv"])
    web, local = (pd.read_csv(tmp_path / n, keep_default_na=False) for n in ("s3.csv", "file.csv"))
    assert list(web.key) == ["a.png", "sub/b.png"] and set(web.source) == {"s3://data/imgs"}
    assert web.drop(columns="source").equals(local.drop(columns="source"))
    with pytest.raises(InputError, match="no such object or folder"):
        expand_inputs(["s3://data/nothing-here.tar"])


def test_calibrate_clean_images_from_urls_match_the_folder(tmp_path, s3, photos, shards):
    """calibrate --clean reads a URL prefix (loose images and shards) and a pipe: shard with the
    same source ids and bytes as the same files in a local folder."""
    from collapseguard.calibration.scoring import iter_clean_images
    from collapseguard.images import encode_png
    clean = tmp_path / "clean"
    (clean / "sub").mkdir(parents=True)
    for i, name in enumerate(("a__v1.png", "a__v2.png", "sub/b.png")):
        (clean / name).write_bytes(encode_png(photos[i]))
    (clean / "shard-0.tar").write_bytes((shards / "shard-0.tar").read_bytes())
    for p in sorted(q for q in clean.rglob("*") if q.is_file()):
        s3.put_file(str(p), f"data/clean/{p.relative_to(clean).as_posix()}")
    got = lambda loc: sorted((src, read()) for src, _, read in iter_clean_images([loc]))
    local = got(clean)
    assert len(local) == 3 + 6 and {s for s, _ in local} >= {"clean/a", "clean/sub/b"}
    assert got("s3://data/clean") == local
    assert got(f"pipe:cat {clean}/shard-0.tar") == got(clean / "shard-0.tar")
    res = run_cli(["calibrate", "--chains", tmp_path, "--clean", tmp_path / "missing", "--detector", "nss",
                   "--out", tmp_path / "c.json"], expect=2)
    assert "missing: no such file or folder" in res.output


def test_any_fsspec_protocol_and_file_urls(tmp_path, shards, threshold, local_ref):
    """memory:// (shipped with fsspec) stands for any installed protocol; a file: --out is the
    local folder; a protocol whose package is missing says which package to install."""
    import fsspec
    mem = fsspec.filesystem("memory")
    for s in range(2):
        mem.pipe_file(f"/set/shard-{s}.tar", (shards / f"shard-{s}.tar").read_bytes())
    run_cli(["filter", "memory://set/shard-{0..1}.tar", "-o", f"file://{tmp_path}/out", "-d", "nss",
             "--threshold", threshold, "-w", "1", "-q"])
    assert outputs(tmp_path / "out") == local_ref and (tmp_path / "out/summary.json").is_file()
    run_cli(["filter", "memory://set/", "-o", "memory://filtered", "-d", "nss", "--threshold",
             threshold, "-w", "1", "-q"])
    assert {k: mem.cat_file(f"/filtered/{k}") for k in local_ref} == local_ref
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="gcsfs"):
            expand_inputs(["gs://bucket/shard-0.tar"])


def test_an_http_folder_is_listed_whole_or_refused(tmp_path, shards):
    """A real loopback server: a symlink loop (``loop -> .``) lists each shard once and ends; a
    subfolder the index links to but that cannot be listed stops the run naming it, instead of
    leaving its shards out of an exit-0 run."""
    served = tmp_path / "served"
    (served / "d" / "sub").mkdir(parents=True)
    one = sorted(Path(shards).glob("*.tar"))[0]
    (served / "d" / "a.tar").write_bytes(one.read_bytes())
    (served / "d" / "sub" / "b.tar").write_bytes(one.read_bytes())
    (served / "d" / "loop").symlink_to(".")
    (served / "d" / "sub" / "up").symlink_to("..")

    class Gated(QuietHandler):
        def do_GET(self):
            if self.path.startswith("/d/sub/") and self.server.gated:
                self.send_error(404)
                return
            super().do_GET()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Gated, directory=str(served)))
    srv.gated = False
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/d/"
        got, _ = expand_inputs([url])
        assert sorted(g.rsplit("/d/", 1)[1] for g in got) == ["a.tar", "sub/b.tar"]
        srv.gated = True
        with pytest.raises(InputError, match="/d/sub/.*cannot be listed"):
            expand_inputs([url])
        res = run_cli(["score", url, "-d", "nss", "-w", "1", "-o", tmp_path / "s.csv"], expect=1)
        assert "/d/sub/" in res.output and not (tmp_path / "s.csv").exists()
    finally:
        srv.shutdown()
        srv.server_close()


def test_object_keys_holding_hash_question_or_semicolon_are_inputs_too(photos):
    """An object store's keys may hold ``#``, ``?`` or ``;``: a folder input lists them as the
    shards and images they are, and each reads back (the memory store takes s3's code path)."""
    import fsspec

    from collapseguard.images import decode_image, encode_png
    from collapseguard.io.urls import read_bytes

    m = fsspec.filesystem("memory")
    png = encode_png(photos[0][:64, :64])
    for key in ("img#1.png", "what?.png", "semi;colon.png"):
        m.pipe_file(f"/cgtest-keys/data/{key}", png)
    m.pipe_file("/cgtest-keys/data/shard;v2.tar", b"")
    try:
        shards, files = expand_inputs(["memory://cgtest-keys/data/"])
        assert [s.rsplit("/", 1)[1] for s in shards] == ["shard;v2.tar"]
        assert sorted(f.key for f in files) == ["img#1.png", "semi;colon.png", "what?.png"]
        for f in files:
            assert decode_image(read_bytes(f.path)).shape == (64, 64, 3)
    finally:
        m.rm("/cgtest-keys", recursive=True)


def test_shards_read_over_http_keep_their_file_names_in_the_outputs(tmp_path, shards, threshold):
    """A shard served as ``my shard ü#1.tar`` (URL ``my%20shard%20%C3%BC%231.tar``) is written to
    kept/ under that name, as a local read of the same folder writes it; a file literally named
    ``a%20b.tar`` stays ``a%20b.tar``. A name that decodes to a path keeps its encoded form."""
    from collapseguard.io.parse import basename_of

    served = tmp_path / "served"
    served.mkdir()
    one = sorted(Path(shards).glob("*.tar"))[0].read_bytes()
    for name in ("my shard ü#1.tar", "a%20b.tar"):
        (served / name).write_bytes(one)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(QuietHandler, directory=str(served)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/"
        run_cli(["filter", url, "-o", tmp_path / "web", "-d", "nss", "--threshold", threshold, "-w", "1", "-q"])
        run_cli(["filter", served, "-o", tmp_path / "local", "-d", "nss", "--threshold", threshold, "-w", "1", "-q"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert sorted(os.listdir(tmp_path / "web/kept")) == ["a%20b.tar", "my shard ü#1.tar"]
    assert outputs(tmp_path / "web") == outputs(tmp_path / "local")
    assert basename_of("http://h/a%2F..%2Fevil.tar") == "a%2F..%2Fevil.tar"
    assert basename_of("http://h/%2E%2E") == "%2E%2E" and basename_of("http://h/%FF.tar") == "%FF.tar"


def test_one_url_under_two_spellings_is_one_input(tmp_path, shards, threshold):
    """``sub dir/shard 1.tar`` and ``sub%20dir/shard%201.tar`` name one object: scored once and
    filtered once, as a local file named twice is (the escaped spelling was a second input:
    ``score`` wrote every row twice and ``filter`` refused two shards of one name). A folder URL
    without its trailing / is refused with a hint."""
    served = tmp_path / "served"
    (served / "sub dir").mkdir(parents=True)
    one = sorted(Path(shards).glob("*.tar"))[0]
    (served / "sub dir" / "shard 1.tar").write_bytes(one.read_bytes())
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(QuietHandler, directory=str(served)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        spellings = [f"{base}/sub dir/shard 1.tar", f"{base}/sub%20dir/shard%201.tar",
                     f"{base.upper().replace('HTTP://', 'http://')}/sub%20dir/shard 1.tar"]
        run_cli(["score", *spellings, "-o", tmp_path / "s.csv", "-d", "nss", "-q"])
        run_cli(["score", spellings[0], "-o", tmp_path / "once.csv", "-d", "nss", "-q"])
        run_cli(["filter", *spellings, "-o", tmp_path / "f", "-d", "nss", "--threshold", threshold,
                 "-w", "1", "-q"])
        with pytest.raises(InputError, match="a folder URL ends in /"):
            expand_inputs([f"{base}/sub%20dir"])
    finally:
        srv.shutdown()
        srv.server_close()
    once = len(pd.read_csv(tmp_path / "once.csv"))
    assert once > 0 and len(pd.read_csv(tmp_path / "s.csv")) == once
    assert sorted(os.listdir(tmp_path / "f/kept")) == ["shard 1.tar"]


@pytest.mark.parametrize("a, b, same", [
    ("http://H/sub dir/shard 1.tar", "http://h/sub%20dir/shard%201.tar", True),
    ("HTTPS://Host:8080/a.tar", "https://host:8080/a.tar", True),
    ("http://h/a+b.tar", "http://h/a%2Bb.tar", True),
    ("s3://b/a b.tar", "s3://b/a%20b.tar", False),  # two keys an object store tells apart
    ("http://h/x#1.tar", "http://h/x#2.tar", False),
    ("http://h/caf%E9.tar", "http://h/caf%E8.tar", False),  # escapes that are not UTF-8
    ("http://h/a%2Fb.tar", "http://h/a/b.tar", False),  # an escaped / is no folder
    ("http://h/a.tar?v=1", "http://h/a.tar?v=2", False),
])
def test_two_spellings_are_one_url_only_when_they_name_one_object(a, b, same):
    """Inputs compared by ``path_key`` are filtered once: two different objects must never share
    a key (the second would be dropped without a word)."""
    from collapseguard.io.inputs import path_key

    assert (path_key(a) == path_key(b)) is same


def test_an_s3_store_that_cannot_be_used_is_one_line_and_the_other_inputs_go_on(tmp_path, s3, photos, monkeypatch):
    """No credentials, or an endpoint where nothing listens: the S3 input fails with one line (no
    botocore traceback), as an http server that cannot be reached does, and a local input given
    beside it is still scored."""
    import s3fs

    from collapseguard.images import encode_png
    local = tmp_path / "local.png"
    local.write_bytes(encode_png(photos[0]))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    cases = {"no credentials": {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
                                "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                                "AWS_CONFIG_FILE": str(tmp_path / "none")},
             "the server cannot be reached": {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"}}
    for want, env in cases.items():
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.delenv(k, raising=False) if v is None else m.setenv(k, v)
            s3fs.S3FileSystem.clear_instance_cache()
            with pytest.raises(InputError, match=f"s3://data/set/: .*{want}" if want != "no credentials"
                               else "s3://data/set/: .*(Unable to locate credentials|NoCredentialsError)"):
                expand_inputs(["s3://data/set/"])
            out = tmp_path / f"{len(want)}.csv"
            res = run_cli(["score", "s3://data/set/", local, "-d", "nss", "-o", out], expect=1)
            assert "Traceback" not in res.output and "s3://data/set/" in res.output
            assert len(pd.read_csv(out)) == 1  # the local image is scored
    s3fs.S3FileSystem.clear_instance_cache()


def test_an_s3_out_that_cannot_be_reached_is_one_line(tmp_path, s3, shards, monkeypatch):
    """Writing to a store that cannot be reached (or that dies mid-run: every output call goes
    through ``urls.store_call``) is one line naming the object, not a botocore traceback."""
    import s3fs
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    s3fs.S3FileSystem.clear_instance_cache()
    res = run_cli(["filter", shards / "shard-0.tar", "-o", "s3://out/dead", "-d", "nss", "--threshold", "1",
                   "-w", "1", "-q"], expect=1)
    assert "Traceback" not in res.output
    assert "cannot write to --out s3://out/dead: s3://out/dead/.write-test: the server cannot be reached" in res.output
    s3fs.S3FileSystem.clear_instance_cache()
