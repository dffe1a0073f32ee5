"""Hostile loose inputs, read for real: a FIFO and a link to /dev/zero named like images in a folder
that ``score`` and ``audit`` read, a FIFO given as ``--calibration``, image files and URL bodies over
the size cap, and http servers on loopback that trickle, stall, cut a body short, answer 500/403 or
link out of a listed folder with ``%2e%2e``.

Commands that could block run in a subprocess with a timeout (and an address-space limit, so that
an unbounded read fails fast instead of filling the machine's memory)."""

from __future__ import annotations

import http.server
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import pandas as pd
import pytest
from cg_testutil import make_shard, read_members, run_cli

from collapseguard.images import encode_png
from collapseguard.io import tar, urls
from collapseguard.io.inputs import InputError, expand_inputs

pytest.importorskip("aiohttp")

CLI_TIMEOUT = 180  # seconds; a command that blocks on a FIFO fails the test instead of hanging it


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_cli_process(args, cwd) -> subprocess.CompletedProcess:
    """The real command line in a child process, killed (failing the test) after CLI_TIMEOUT s."""
    try:
        return subprocess.run([sys.executable, "-m", "collapseguard.cli", *map(str, args)], cwd=cwd,
                              check=False, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                              preexec_fn=_limit_memory, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[0]} did not finish within {CLI_TIMEOUT} s (blocked on an input?)")


HOSTILE = {"fifo": "a FIFO, not a regular file", "zero": "a character device, not a regular file"}


def hostile_folder(tmp_path, photos, kind: str) -> Path:
    """ok.png (a real image) and bad.png: a FIFO, or a link to /dev/zero."""
    d = tmp_path / "fold"
    d.mkdir()
    (d / "ok.png").write_bytes(encode_png(photos[0][:64, :64]))
    if kind == "fifo":
        os.mkfifo(d / "bad.png")
    else:
        (d / "bad.png").symlink_to("/dev/zero")
    return d


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_score_records_a_fifo_or_a_device_link_per_file_and_scores_the_rest(tmp_path, photos, kind):
    folder = hostile_folder(tmp_path, photos, kind)
    res = run_cli_process(["score", folder, "-o", tmp_path / "s.csv", "-d", "nss", "-q"], tmp_path)
    assert res.returncode == 0, res.stderr
    rows = pd.read_csv(tmp_path / "s.csv", keep_default_na=False).set_index("key")
    assert sorted(rows.index) == ["bad.png", "ok.png"]
    assert rows.loc["ok.png", "error"] == "" and rows.loc["ok.png", "score"] != ""
    assert HOSTILE[kind] in rows.loc["bad.png", "error"] and "bad.png" in rows.loc["bad.png", "error"]
    assert rows.loc["bad.png", "score"] == ""


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_audit_records_a_fifo_or_a_device_link_as_unscored(tmp_path, photos, kind):
    folder = hostile_folder(tmp_path, photos, kind)
    res = run_cli_process(["audit", folder, "-o", tmp_path / "aud", "-d", "nss", "-q"], tmp_path)
    assert res.returncode == 0, res.stderr
    rows = pd.read_parquet(tmp_path / "aud/scores.parquet").set_index("key")
    assert sorted(rows.index) == ["bad.png", "ok.png"]
    assert rows.loc["ok.png", "error"] == "" and pd.notna(rows.loc["ok.png", "score"])
    assert HOSTILE[kind] in rows.loc["bad.png", "error"] and pd.isna(rows.loc["bad.png", "score"])


@pytest.mark.parametrize("command", ["score", "audit"])
def test_a_fifo_named_tar_in_a_folder_is_refused_not_waited_on(tmp_path, photos, command):
    """The progress count opens every ``.tar`` of a folder before scoring: a FIFO among them is
    refused there as it is by the shard reader, instead of blocking the command for ever."""
    folder = hostile_folder(tmp_path, photos, "fifo")
    (folder / "bad.png").unlink()
    os.mkfifo(folder / "pipe.tar")
    out = tmp_path / ("s.csv" if command == "score" else "aud")
    res = run_cli_process([command, folder, "-o", out, "-d", "nss", "-q"], tmp_path)
    if command == "score":
        rows, said = pd.read_csv(out, keep_default_na=False), res.stderr
    else:  # audit lists a failed input in its summary
        rows, said = pd.read_parquet(out / "scores.parquet"), (out / "summary.json").read_text()
    assert "ok.png" in set(rows["key"])
    assert "pipe.tar: a FIFO, not a regular file" in said + rows.to_csv()
    assert "Traceback" not in said  # a refused input is the whole story, not a bug report


@pytest.mark.parametrize("command", ["score", "audit"])
def test_what_a_folder_holds_and_cannot_be_read_is_reported_not_dropped(tmp_path, photos, command):
    """A broken link to a folder (``family_b`` whose target was moved) is named as not read and the
    command exits 1; a link loop loses nothing (the folder is read once) and is not an error."""
    folder = hostile_folder(tmp_path, photos, "fifo")
    (folder / "bad.png").unlink()
    (folder / "family_b").symlink_to(tmp_path / "moved_away")
    (folder / "loop").symlink_to(folder)
    out = tmp_path / ("s.csv" if command == "score" else "aud")
    res = run_cli_process([command, folder, "-o", out, "-d", "nss", "-q"], tmp_path)
    assert res.returncode == 1, res.stderr
    if command == "score":
        rows, said = pd.read_csv(out, keep_default_na=False), res.stderr
    else:
        rows, said = pd.read_parquet(out / "scores.parquet"), (out / "summary.json").read_text()
    assert list(rows["key"]) == ["ok.png"]
    assert "family_b: not read: a broken link" in said
    assert "loop: not read" not in said
    (folder / "family_b").unlink()  # only the loop left: a clean run
    res = run_cli_process([command, folder, "-o", out, "-d", "nss", "-q"], tmp_path)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("command", ["score", "filter"])
def test_an_xz_tar_in_a_folder_is_named_not_passed_over(tmp_path, photos, command):
    """Shards are .tar, .tar.gz and .tgz: an ``.tar.xz`` among them is named as not read (score
    exits 1 with the rest scored; filter refuses before any work), never silently left out."""
    import lzma

    folder = tmp_path / "shards"
    folder.mkdir()
    make_shard(folder / "a.tar", photos[:2], degraded=False)
    make_shard(tmp_path / "b.tar", photos[2:4], degraded=False)
    (folder / "b.tar.xz").write_bytes(lzma.compress((tmp_path / "b.tar").read_bytes()))
    out = tmp_path / ("s.csv" if command == "score" else "out")
    extra = ["--threshold", "99"] if command == "filter" else []
    res = run_cli_process([command, folder, "-o", out, "-d", "nss", "-q", *extra], tmp_path)
    assert res.returncode == 1, res.stderr
    assert "b.tar.xz" in res.stderr and "a tar compressed other than with gzip" in res.stderr
    if command == "score":
        assert len(pd.read_csv(out)) == 2  # a.tar's samples scored
    else:
        assert not (out / "kept").exists()  # refused before any work
    named = run_cli_process(["score", folder / "b.tar.xz", "-o", tmp_path / "t.csv", "-d", "nss"], tmp_path)
    assert named.returncode != 0 and "a tar compressed other than with gzip" in named.stderr


def test_a_fifo_named_on_the_command_line_is_refused_by_what_it_is(tmp_path, photos):
    os.mkfifo(tmp_path / "pipe.png")
    res = run_cli_process(["score", tmp_path / "pipe.png", "-o", tmp_path / "s.csv", "-d", "nss", "-q"],
                          tmp_path)
    assert res.returncode != 0
    assert "pipe.png: not a regular file or folder (a FIFO, socket or device)" in res.stderr


def test_a_fifo_given_as_calibration_is_refused(tmp_path, photos):
    make_shard(tmp_path / "s.tar", photos[:1], degraded=False)
    os.mkfifo(tmp_path / "cal.json")
    res = run_cli_process(["filter", tmp_path / "s.tar", "-o", tmp_path / "out", "-d", "nss",
                           "--calibration", tmp_path / "cal.json", "-w", "1", "-q"], tmp_path)
    assert res.returncode == 1, res.stderr
    assert "cannot read calibration" in res.stderr and "not a regular file" in res.stderr


def test_image_files_over_the_cap_are_refused_per_file(tmp_path, photos, monkeypatch):
    """The cap is io.tar's member cap, made small here: a file (and a link to one) over it is an
    error row, read no further; the other files are scored."""
    d = tmp_path / "fold"
    d.mkdir()
    ok = encode_png(photos[0][:64, :64])
    (d / "ok.png").write_bytes(ok)
    (d / "big.png").write_bytes(ok + b"\0" * 3 * len(ok))  # decodes, but is over the cap
    (tmp_path / "elsewhere.png").write_bytes(ok + b"\0" * 3 * len(ok))
    (d / "link.png").symlink_to(tmp_path / "elsewhere.png")
    monkeypatch.setattr(tar, "MAX_MEMBER_BYTES", 2 * len(ok))
    run_cli(["score", d, "-o", tmp_path / "s.csv", "-d", "nss", "-q"])
    rows = pd.read_csv(tmp_path / "s.csv", keep_default_na=False).set_index("key")
    assert rows.loc["ok.png", "error"] == "" and rows.loc["ok.png", "score"] != ""
    for name in ("big.png", "link.png"):
        assert f"{4 * len(ok)} bytes, over the {2 * len(ok)}-byte limit" in rows.loc[name, "error"]
        assert rows.loc[name, "score"] == ""


# --- http(s) on loopback ----------------------------------------------------------------------

class Hostile(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` (name -> bytes) and a few misbehaving paths."""

    protocol_version = "HTTP/1.1"
    files: ClassVar[dict[str, bytes]] = {}
    gets: ClassVar[dict[str, int]] = {}  # GET requests per path, for bodies that change
    trickle = (8, 0.4)  # chunks, seconds between them
    stall_s = 30.0

    def log_message(self, *args):
        pass

    def _head(self, code, length=None, ctype="application/octet-stream", close=False):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if length is not None:
            self.send_header("Content-Length", str(length))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        return self.command != "HEAD"

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = self.path.split("?")[0]
        name = path.rsplit("/", 1)[-1]
        body = self.files.get(name.split("-", 1)[-1], b"")
        if path == "/dir/":
            page = (b'<a href="good.tar">g</a><a href="sub/%2e%2e/%2e%2e/up.tar">u</a>'
                    b'<a href="sub/..%2f..%2fup2.tar">v</a><a href="ok.png">p</a>')
            if self._head(200, len(page), "text/html"):
                self.wfile.write(page)
        elif path in ("/dir/good.tar", "/up.tar", "/up2.tar", "/good.tar", "/dir/ok.png", "/ok.png"):
            if self._head(200, len(body)):
                self.wfile.write(body)
        elif path in ("/err500.tar", "/err403.tar"):
            if self._head(int(path[4:7]), 4, "text/plain"):
                self.wfile.write(b"nope")
        elif path == "/flip-good.tar":  # good.tar, then other.tar (same keys, other images), ...
            if self.command == "GET":
                type(self).gets[path] = type(self).gets.get(path, 0) + 1
            body = self.files["other.tar" if type(self).gets.get(path, 0) % 2 == 0 else "good.tar"]
            if self._head(200, len(body)):  # the same headers each time: nothing says it changed
                self.wfile.write(body)
        elif path == "/once-good.tar":  # good.tar on the first GET, other.tar from then on
            if self.command == "GET":
                type(self).gets[path] = type(self).gets.get(path, 0) + 1
            body = self.files["good.tar" if type(self).gets.get(path, 0) <= 1 else "other.tar"]
            if self._head(200, len(body)):
                self.wfile.write(body)
        elif path == "/short-good.tar":  # announces the whole shard, sends half, closes
            if self._head(200, len(body), close=True):
                self.wfile.write(body[: len(body) // 2])
        elif path == "/trickle-good.tar":  # the whole shard, steadily, slowly
            if self._head(200, len(body)):
                n, pause = self.trickle
                step = -(-len(body) // n)
                for i in range(0, len(body), step):
                    self.wfile.write(body[i: i + step])
                    self.wfile.flush()
                    time.sleep(pause)
        elif path == "/stall-good.tar":  # part of the shard, then nothing for stall_s
            if self._head(200, len(body), close=True):
                self.wfile.write(body[:4096])
                self.wfile.flush()
                time.sleep(self.stall_s)
        elif path == "/silent.tar":  # no answer at all for stall_s
            time.sleep(self.stall_s)
            if self._head(200, 0):
                pass
        elif path == "/endless-ok.png":  # an image followed by zeros, no length announced
            if self._head(200, None, "image/png", close=True):
                self.wfile.write(body)
                try:
                    for _ in range(64):
                        self.wfile.write(b"\0" * (1 << 16))
                except OSError:
                    pass
        elif path == "/long-ok.png":  # announces (and sends) more than the cap
            padded = body + b"\0" * (4 * len(body))
            if self._head(200, len(padded), "image/png"):
                self.wfile.write(padded)
        else:
            if self._head(404, 4, "text/plain"):
                self.wfile.write(b"none")


@pytest.fixture(scope="module")
def shard_bytes(tmp_path_factory, photos):
    p = tmp_path_factory.mktemp("sh") / "good.tar"
    make_shard(p, photos[:2])
    return p.read_bytes()


@pytest.fixture(scope="module")
def other_bytes(tmp_path_factory, photos):
    """A shard with good.tar's keys and other images (what good.tar could be rewritten to)."""
    p = tmp_path_factory.mktemp("other") / "good.tar"
    make_shard(p, photos[2:4])
    return p.read_bytes()


@pytest.fixture
def server(shard_bytes, other_bytes, photos):
    handler = type("H", (Hostile,), {"files": {"good.tar": shard_bytes, "other.tar": other_bytes,
                                               "ok.png": encode_png(photos[1][:64, :64])},
                                     "gets": {}})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()
    srv.server_close()


def test_a_slow_but_steady_http_shard_is_read_whole(tmp_path, server, shard_bytes, monkeypatch):
    """No limit on the whole transfer: a shard trickled over ~3 s reads whole when the read
    inactivity timeout is 1 s (a total timeout of that size would cut it off)."""
    root, handler = server
    handler.trickle = (8, 0.4)
    monkeypatch.setattr(urls, "HTTP_READ_TIMEOUT", 1.0)
    t0 = time.monotonic()
    run_cli(["filter", f"{root}/trickle-good.tar", "-o", tmp_path / "web", "-d", "nss",
             "--threshold", "1000", "-w", "1", "-q"])
    assert time.monotonic() - t0 > 2.5, "the body was trickled over more than the read timeout"
    (tmp_path / "good.tar").write_bytes(shard_bytes)
    run_cli(["filter", tmp_path / "good.tar", "-o", tmp_path / "file", "-d", "nss",
             "--threshold", "1000", "-w", "1", "-q"])
    assert read_members(tmp_path / "web/kept/trickle-good.tar") == read_members(
        tmp_path / "file/kept/good.tar")


def test_a_stalled_http_shard_fails_as_a_network_timeout(tmp_path, server, monkeypatch):
    root, handler = server
    handler.stall_s = 30.0
    monkeypatch.setattr(urls, "HTTP_READ_TIMEOUT", 1.0)
    t0 = time.monotonic()
    res = run_cli(["filter", f"{root}/stall-good.tar", "-o", tmp_path / "out", "-d", "nss",
                   "--threshold", "1000", "-w", "1", "-q"], expect=1)
    assert time.monotonic() - t0 < 20
    assert f"{root}/stall-good.tar: network timeout: the server sent nothing for 1 s" in res.output
    assert "damaged tar header" not in res.output
    # a server that never answers the request
    t0 = time.monotonic()
    with pytest.raises(InputError, match="silent.tar: network timeout: no answer from the server"):
        expand_inputs([f"{root}/silent.tar"])
    assert time.monotonic() - t0 < 20


def test_http_failures_say_what_happened(tmp_path, server, shard_bytes):
    root, _ = server
    for code, reason in ((500, "Internal Server Error"), (403, "Forbidden")):
        with pytest.raises(InputError, match=f"err{code}.tar: HTTP {code} \\({reason}\\)"):
            expand_inputs([f"{root}/err{code}.tar"])
        res = run_cli(["filter", f"{root}/err{code}.tar", "-o", tmp_path / "o", "-d", "nss",
                       "--threshold", "1000", "-w", "1", "-q"], expect=1)
        assert f"HTTP {code}" in res.output and "no such object" not in res.output
    with pytest.raises(InputError, match="missing.tar: no such object or folder$"):
        expand_inputs([f"{root}/missing.tar"])
    for name in ("x.tar", "folder/"):  # nothing listens on port 1
        with pytest.raises(InputError, match="the server cannot be reached"):
            expand_inputs([f"http://127.0.0.1:1/{name}"])
    res = run_cli(["filter", f"{root}/short-good.tar", "-o", tmp_path / "o", "-d", "nss",
                   "--threshold", "1000", "-w", "1", "-q"], expect=1)
    half = len(shard_bytes) // 2
    assert (f"short-good.tar: the connection closed after {half} bytes of the "
            f"{len(shard_bytes)} announced") in res.output
    assert "damaged tar header" not in res.output
    # the error that carries them crosses worker processes intact
    import pickle
    exc = urls.NetworkError(104, "http://h/x.tar: the connection closed after 5 bytes")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is urls.NetworkError and str(back) == str(exc) and back.errno == 104


def test_an_http_index_link_cannot_leave_the_listed_folder(server):
    root, _ = server
    shards, files = expand_inputs([f"{root}/dir/"])
    assert shards == [f"{root}/dir/good.tar"]
    assert [f.path for f in files] == [f"{root}/dir/ok.png"]


def test_image_url_bodies_over_the_cap_are_refused_per_file(tmp_path, server, photos, monkeypatch):
    root, _ = server
    ok = encode_png(photos[1][:64, :64])
    monkeypatch.setattr(tar, "MAX_MEMBER_BYTES", 2 * len(ok))
    run_cli(["score", f"{root}/ok.png", f"{root}/endless-ok.png", f"{root}/long-ok.png",
             "-o", tmp_path / "s.csv", "-d", "nss", "-q"])
    rows = pd.read_csv(tmp_path / "s.csv", keep_default_na=False).set_index("key")
    assert rows.loc["ok.png", "error"] == "" and rows.loc["ok.png", "score"] != ""
    assert (f"endless-ok.png: more than {2 * len(ok)} bytes, over the {2 * len(ok)}-byte limit"
            in rows.loc["endless-ok.png", "error"])
    assert (f"long-ok.png: {5 * len(ok)} bytes, over the {2 * len(ok)}-byte limit"
            in rows.loc["long-ok.png", "error"])
    assert rows.loc["endless-ok.png", "score"] == rows.loc["long-ok.png", "score"] == ""


def test_summary_of_a_good_http_shard_is_unchanged(tmp_path, server, shard_bytes):
    """The timeouts change nothing for a server that answers promptly."""
    root, _ = server
    run_cli(["filter", f"{root}/good.tar", "-o", tmp_path / "o", "-d", "nss", "--threshold",
             "1000", "-w", "1", "-q"])
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert [s["status"] for s in summary["per_shard"]] == ["done"]
    (tmp_path / "good.tar").write_bytes(shard_bytes)
    got = read_members(tmp_path / "o/kept/good.tar")
    assert got and got == read_members(tmp_path / "good.tar")  # every member, byte for byte


def test_a_shard_that_changes_between_the_two_passes_of_drop_fraction_fails(tmp_path, server,
                                                                            shard_bytes):
    """``filter --drop-fraction`` reads each shard twice: scores first, then the split. A server
    that sends other bytes the second time (same keys, other images, the same headers) fails
    that shard, named, instead of splitting the new images by the old images' scores; the shard
    that did not change is split as usual."""
    root, _ = server
    out = tmp_path / "out"
    res = run_cli(["filter", f"{root}/flip-good.tar", f"{root}/good.tar", "-o", out, "-d", "nss",
                   "--drop-fraction", "0.25", "-w", "1", "-q"], expect=1)
    assert (f"FAILED {root}/flip-good.tar: ShardChangedError: {root}/flip-good.tar: its bytes "
            "differ from those the scoring pass read") in res.output
    assert "Traceback" not in (out / "summary.json").read_text()
    assert not (out / "kept/flip-good.tar").exists() and not (out / ".done/flip-good.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert [s["status"] for s in summary["per_shard"]] == ["failed", "done"]
    members = read_members(out / "kept/good.tar") + read_members(out / "rejected/good.tar")
    (tmp_path / "good.tar").write_bytes(shard_bytes)
    assert sorted(members) == sorted(read_members(tmp_path / "good.tar"))


def test_the_same_command_again_after_a_shard_changed_scores_it_anew_and_splits_every_shard_by_the_new_cut(
        tmp_path, server, other_bytes):
    """After ``ShardChangedError`` the advice is to run the same command again, and that works:
    the changed shard is scored anew (its stale scores are not reused, though its headers are
    the same), the threshold is cut again from all scores, and a shard split by the old cut is
    split again from its kept scores, so every shard's decisions follow the one final cut."""
    root, _ = server
    out = tmp_path / "out"
    args = ["filter", f"{root}/once-good.tar", f"{root}/good.tar", "-o", out, "-d", "nss",
            "--drop-fraction", "0.25", "-w", "1", "-q"]
    res = run_cli(args, expect=1)
    assert "ShardChangedError" in res.output and "run the same command again" in res.output
    first = json.loads((out / "summary.json").read_text())["threshold"]
    run_cli(args)
    summary = json.loads((out / "summary.json").read_text())
    assert [s["status"] for s in summary["per_shard"]] == ["done", "done"]
    assert summary["threshold"] != first  # the cut moved with the new shard's scores
    (tmp_path / "other.tar").write_bytes(other_bytes)
    members = read_members(out / "kept/once-good.tar") + read_members(out / "rejected/once-good.tar")
    assert sorted(members) == sorted(read_members(tmp_path / "other.tar"))
    for stem in ("once-good", "good"):
        rows = pd.read_parquet(out / "scores" / f"{stem}.parquet")
        assert list(rows["decision"]) == ["rejected" if v > summary["threshold"] else "kept"
                                          for v in rows["score"]], stem
