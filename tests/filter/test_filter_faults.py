"""Fault injection for ``filter`` and ``audit``: killed and interrupted runs, crafted shards
(repeated and colliding keys, many same-named members, damaged headers, FIFOs and devices given as
shards, names holding terminal escapes), full and read-only output filesystems, hostile
calibration files, and a fuzz of the shard reader over random and mutated tar bytes.
RELIABILITY.md tables every case with the test that checks it.

Each case builds real tars and runs the real command (the nss detector, to stay fast); the
assertions are on what lands in --out and on what is printed.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import time
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from cg_testutil import add_member, make_shard, read_members
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from collapseguard.cli import main
from collapseguard.images import encode_png
from collapseguard.io.tar import (
    CorruptShardError,
    NotRegularFileError,
    ShardError,
    ShardReader,
    TruncatedShardError,
    visible_key,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (read from /proc)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def outputs(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for sub in ("kept", "rejected", "scores")
            for p in sorted((out / sub).glob("*")) if not p.name.endswith("tmp")}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from skimage import data
    big = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()] * 3
    d = tmp_path_factory.mktemp("data")
    for s in range(2):
        make_shard(d / f"race-{s}.tar", big, start=s * 100)
    return d


def filter_cmd(d: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "collapseguard.cli", "filter", str(d / "race-{0..1}.tar"), "-d",
            "nss", "--threshold", "3.2", "--workers", "2", "--batch-size", "1", "-q",
            "--out", str(out)]


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory) -> dict[str, bytes]:
    """The outputs of an uninterrupted run over ``shards``."""
    ref = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run(filter_cmd(shards, ref), check=True)
    return outputs(ref)


def test_workers_die_with_a_killed_parent_and_the_resume_is_identical(tmp_path, shards, reference):
    out = tmp_path / "out"
    proc = subprocess.Popen(filter_cmd(shards, out))
    deadline = time.time() + 180
    while time.time() < deadline and not list((out / "kept").glob("*.tmp")):
        time.sleep(0.05)
    workers = descendants(proc.pid)
    assert workers, "no worker processes seen"
    os.kill(proc.pid, signal.SIGKILL)  # the parent alone, as a user's kill -9 would
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if alive(w)], "workers outlived their parent"
    subprocess.run(filter_cmd(shards, out), check=True)
    assert outputs(out) == reference
    assert not [p for p in out.rglob("*tmp")], "temporary files left behind"


def test_a_marker_whose_output_was_cut_short_is_not_trusted(tmp_path, shards, reference):
    out = tmp_path / "out"
    subprocess.run(filter_cmd(shards, out), check=True)
    ref = outputs(out)
    assert ref == reference
    kept = out / "kept" / "race-0.tar"
    kept.write_bytes(kept.read_bytes()[: kept.stat().st_size // 2])  # as a stale writer would leave it
    subprocess.run(filter_cmd(shards, out), check=True)
    assert outputs(out) == ref
    summary = json.loads((out / "summary.json").read_text())
    status = {Path(s["shard"]).name: s["status"] for s in summary["per_shard"]}
    assert status == {"race-0.tar": "done", "race-1.tar": "resumed"}


def test_a_worker_of_a_run_that_lost_the_lock_commits_nothing(tmp_path, shards):
    """The commit check: a task whose run id is no longer in ``<out>/.lock`` leaves no outputs."""
    from collapseguard.detectors import create
    from collapseguard.filter.pipeline import FilterOptions, RunLostError, process_shard
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text("another-run\n")
    opts = FilterOptions(out_dir=str(out), detector="nss", threshold=3.2, run_id="this-run")
    with pytest.raises(RunLostError):
        process_shard(str(shards / "race-0.tar"), opts, create("nss"))
    assert not [p for p in out.rglob("*") if p.is_file() and p.name != ".lock"]


# ---------------------------------------------------------------------------------------------
# crafted shards, read by the real command

FILTER = ["-d", "nss", "--threshold", "1e9", "-w", "1", "-q"]
BAD = b"\x89PNG\r\n\x1a\n but not an image"  # decode_error: a rejected sample


def cli(args, expect=0):
    """Run the command in-process; an unexpected exception (a traceback) fails the test."""
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, res.output
    return res


def cli_process(args, timeout=240) -> subprocess.CompletedProcess:
    """Run the command in a process of its own (for cases that could hang, or print to a tty)."""
    return subprocess.run([sys.executable, "-m", "collapseguard.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False)


def png(photos, i=0) -> bytes:
    return encode_png(photos[i % len(photos)][:48, :48])


def tar_of(path: Path, members, fmt=tarfile.PAX_FORMAT, **kw) -> Path:
    """``members``: (name, bytes), or a ready TarInfo with its bytes (None: no data)."""
    with tarfile.open(path, "w", format=fmt, **kw) as tf:
        for name, data in members:
            if isinstance(name, tarfile.TarInfo):
                tf.addfile(name, None if data is None else io.BytesIO(data))
            else:
                add_member(tf, name, data)
    return path


def wds_keys(path: Path) -> list[str]:
    """The sample keys webdataset reads from a shard (it raises on a duplicate file name)."""
    import webdataset as wds
    return [s["__key__"] for s in wds.WebDataset(str(path), shardshuffle=False, empty_check=False)]


def rows(out: Path, stem: str) -> list[tuple[str, str]]:
    s = pd.read_parquet(out / "scores" / f"{stem}.parquet")
    return list(zip(s["key"], s["reason"]))


def no_tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith("tmp")]


def test_a_key_repeated_after_a_rejected_sample_is_set_aside_not_merged(tmp_path, photos):
    shard = tar_of(tmp_path / "s.tar", [
        ("k.png", png(photos, 0)), ("k.txt", b"first"), ("j.png", BAD),
        ("k.png", png(photos, 1)), ("k.txt", b"second"), ("m.png", png(photos, 2))])
    out = tmp_path / "out"
    cli(["filter", shard, "--out", out, *FILTER])
    assert rows(out, "s") == [("k", "kept"), ("j", "decode_error"), ("k", "repeated_key"),
                              ("m", "kept")]
    assert read_members(out / "kept/s.tar") == [("k.png", png(photos, 0)), ("k.txt", b"first"),
                                                ("m.png", png(photos, 2))]
    assert read_members(out / "rejected/s.tar") == [("j.png", BAD), ("k.png", png(photos, 1)),
                                                    ("k.txt", b"second")]
    assert wds_keys(out / "kept/s.tar") == ["k", "m"] and wds_keys(out / "rejected/s.tar") == ["j", "k"]
    assert sum(1 for _ in ShardReader(str(out / "kept/s.tar"))) == 2


def test_two_rejected_samples_of_one_key_are_never_neighbours_in_rejected(tmp_path, photos):
    # k (rejected: bad image), j (kept), k again (a repeat): rejected/ would hold k, k side by side
    shard = tar_of(tmp_path / "s.tar", [("k.png", BAD), ("k.txt", b"one"), ("j.png", png(photos)),
                                        ("k.png", png(photos, 1)), ("k.txt", b"two")])
    out = tmp_path / "out"
    cli(["filter", shard, "--out", out, *FILTER])
    assert rows(out, "s") == [("k", "decode_error"), ("j", "kept"), ("k", "repeated_key")]
    assert wds_keys(out / "rejected/s.tar") == ["k", "k\\#1"]
    assert read_members(out / "rejected/s.tar") == [("k.png", BAD), ("k.txt", b"one"),
                                                    ("k\\#1.png", png(photos, 1)), ("k\\#1.txt", b"two")]
    err = pd.read_parquet(out / "scores/s.parquet")["error"][2]
    assert repr("k\\#1") in err


def test_a_legit_sample_after_an_unsafe_one_of_its_name_is_neither_merged_nor_renamed(tmp_path, photos):
    shard = tar_of(tmp_path / "s.tar", [
        ("a.png", png(photos, 0)), ("../k.png", png(photos, 1)), ("../k.txt", b"evil"),
        ("k.png", png(photos, 2)), ("k.txt", b"legit"), ("b.png", png(photos, 3))])
    out = tmp_path / "out"
    cli(["filter", shard, "--out", out, *FILTER])
    assert rows(out, "s") == [("a", "kept"), ("k", "unsafe_name"), ("k", "kept"), ("b", "kept")]
    assert read_members(out / "kept/s.tar") == [("a.png", png(photos, 0)), ("k.png", png(photos, 2)),
                                                ("k.txt", b"legit"), ("b.png", png(photos, 3))]
    assert read_members(out / "rejected/s.tar") == [("k.png", png(photos, 1)), ("k.txt", b"evil")]


def test_names_differing_only_in_the_case_of_their_extension_stay_readable_by_webdataset(tmp_path, photos):
    shard = tar_of(tmp_path / "s.tar", [("k.png", png(photos)), ("k.PNG", png(photos, 1)),
                                        ("m.png", png(photos, 2))])
    out = tmp_path / "out"
    cli(["filter", shard, "--out", out, *FILTER])
    assert rows(out, "s") == [("k", "unsafe_name"), ("m", "kept")]
    assert [n for n, _ in read_members(out / "rejected/s.tar")] == ["k.png", "k.PNG.dup1"]
    assert wds_keys(out / "rejected/s.tar") == ["k"]
    error = pd.read_parquet(out / "scores/s.parquet").set_index("key").loc["k", "error"]
    assert "unsafe member names: 'k.PNG' (repeated within the sample" in error


KEYS = ["a", "b", "../a", "./b", "/b", "x/../a", "c/a", ".h"]


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(["png", "txt", "PNG", ""]),
                               st.booleans()), min_size=1, max_size=10))
def test_whatever_the_key_order_outputs_read_back_whole_and_legit_samples_are_untouched(
        tmp_path_factory, photos, nss, spec):
    from collapseguard.filter.pipeline import FilterOptions, process_shard
    d = tmp_path_factory.mktemp("order")
    members = [(f"{key}.{ext}" if ext else key,  # no extension: a name webdataset skips
                (png(photos, i) if good else BAD) if ext == "png" else f"{i}".encode())
               for i, (key, ext, good) in enumerate(spec)]
    shard = tar_of(d / "s.tar", members)
    samples = list(ShardReader(str(shard)))
    process_shard(str(shard), FilterOptions(out_dir=str(d / "out"), detector="nss", threshold=1e9), nss)
    written = [(s.key, [(m.name, m.data) for m in s.members])
               for sub in ("kept", "rejected") for s in ShardReader(str(d / "out" / sub / "s.tar"))]
    assert len(samples) == len(written) == len(pd.read_parquet(d / "out/scores/s.parquet"))
    # webdataset reads every output without a duplicate name, and merges no two samples (it skips
    # names without an extension or with a leading dot)
    assert sum(len(wds_keys(d / "out" / sub / "s.tar")) for sub in ("kept", "rejected")) \
        == sum(1 for _, ms in written if any(visible_key(n) for n, _ in ms))
    assert sorted(data for _, ms in written for _, data in ms) == sorted(data for _, data in members)
    for s in samples:  # a sample with safe names, first of its key: written exactly as it came
        if not s.unsafe_names and not s.repeat:
            assert (s.key, [(m.name, m.data) for m in s.members]) in written


@pytest.fixture(scope="module")
def nss():
    from collapseguard.detectors import create
    return create("nss")


def _reader_seconds(path: Path) -> tuple[float, list]:
    """CPU seconds of this process to read ``path`` (other processes' load does not count)."""
    t = time.process_time()
    samples = list(ShardReader(str(path)))
    return time.process_time() - t, samples


def test_many_members_with_one_name_are_read_in_linear_time(tmp_path):
    small, large = tmp_path / "5k.tar", tmp_path / "20k.tar"
    tar_of(small, [("k.txt", b"x" * 64)] * 5000)
    tar_of(large, [("k.txt", b"x" * 64)] * 20000)
    t_small = t_large = float("inf")
    for _ in range(2):  # interleaved, best of two each
        t_small = min(t_small, _reader_seconds(small)[0])
        t, samples = _reader_seconds(large)
        t_large = min(t_large, t)
    assert len(samples) == 1 and len(set(samples[0].files)) == 20000 and samples[0].unsafe_names
    # linear: about 4x; the quadratic renaming took 15x (9 s against 136 s)
    assert t_large < 8 * t_small, f"5,000 members {t_small:.2f} s, 20,000 members {t_large:.2f} s"


def test_only_regular_files_are_opened_as_shards(tmp_path):
    fifo = tmp_path / "f.tar"
    os.mkfifo(fifo)
    sock_path = tmp_path / "s.tar"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    dev = tmp_path / "zero.tar"
    dev.symlink_to("/dev/zero")
    folder = tmp_path / "d.tar"
    folder.mkdir()
    try:
        for path, kind in ((fifo, "a FIFO"), (sock_path, "a socket"), (dev, "a character device"),
                           (folder, "a folder")):
            t = time.perf_counter()
            with pytest.raises(NotRegularFileError, match=kind):
                list(ShardReader(str(path)))
            assert time.perf_counter() - t < 5
    finally:
        sock.close()


def test_a_fifo_named_tar_in_an_input_folder_is_refused_and_the_real_shard_is_filtered(tmp_path, photos):
    d = tmp_path / "in"
    d.mkdir()
    tar_of(d / "real.tar", [("a.png", png(photos)), ("b.png", png(photos, 1))])
    os.mkfifo(d / "fifo.tar")
    (d / "null.tar").symlink_to("/dev/null")
    out = tmp_path / "out"
    proc = cli_process(["filter", d, "--out", out, *FILTER], timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert "fifo.tar: a FIFO, not a regular file" in proc.stderr
    assert "null.tar: a character device, not a regular file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert [n for n, _ in read_members(out / "kept/real.tar")] == ["a.png", "b.png"]
    assert (out / ".done/real.json").is_file() and not no_tmp_files(out)


def test_damaged_headers_and_appended_archives_fail_the_shard_instead_of_passing_short(tmp_path):
    whole = tar_of(tmp_path / "w.tar", [(f"k{i}.txt", b"y" * 600) for i in range(4)],
                   fmt=tarfile.USTAR_FORMAT)
    data = whole.read_bytes()
    assert len(list(ShardReader(str(whole)))) == 4
    damaged = bytearray(data)
    damaged[2 * 1536 + 148] ^= 0x55  # the checksum field of the third member's header
    (tmp_path / "damaged.tar").write_bytes(damaged)
    (tmp_path / "joined.tar").write_bytes(data + data)  # webdataset would stop after the first
    (tmp_path / "cut.tar").write_bytes(data[:1536 + 700])  # inside the second member's data
    (tmp_path / "garbage.tar").write_bytes(random.Random(0).randbytes(5000))
    with pytest.raises(CorruptShardError, match="byte 3072"):
        list(ShardReader(str(tmp_path / "damaged.tar")))
    with pytest.raises(CorruptShardError, match="another archive appended"):
        list(ShardReader(str(tmp_path / "joined.tar")))
    with pytest.raises(TruncatedShardError, match="cut short"):
        list(ShardReader(str(tmp_path / "cut.tar")))
    with pytest.raises(ShardError, match="garbage.tar"):
        list(ShardReader(str(tmp_path / "garbage.tar")))


def test_a_crafted_pax_sparse_header_is_a_clear_shard_failure(tmp_path, photos):
    sparse = tarfile.TarInfo("s1.json")
    sparse.size = 3
    sparse.pax_headers = {"GNU.sparse.map": "0,zz"}
    bad = tar_of(tmp_path / "sparse.tar", [("s0.png", png(photos)), (sparse, b"abc")])
    good = tar_of(tmp_path / "good.tar", [("g.png", png(photos))])
    with pytest.raises(CorruptShardError, match="damaged tar header"):
        list(ShardReader(str(bad)))
    out = tmp_path / "out"
    res = cli(["filter", bad, good, "--out", out, *FILTER], expect=1)
    assert "FAILED" in res.output and "sparse.tar: a damaged tar header" in res.output
    assert "Traceback" not in res.output
    assert json.loads((out / "summary.json").read_text())["shards_failed"] == [str(bad)]
    assert (out / "kept/good.tar").is_file() and not (out / "kept/sparse.tar").exists()
    assert not no_tmp_files(out)


def test_device_and_oversized_members_are_refused_unread_with_bounded_memory(tmp_path, photos):
    dev = tarfile.TarInfo("d.png")
    dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 5
    shard = tar_of(tmp_path / "s.tar", [("a.png", png(photos)), (dev, None), ("d.txt", b"dev")])
    samples = {s.key: s for s in ShardReader(str(shard))}
    assert samples["d"].refused == [("d.png", "not a regular file")]
    # three 600-byte members against a 1,000-byte sample limit: the later ones are refused unread
    many = tar_of(tmp_path / "m.tar", [(f"k.{i}", b"z" * 600) for i in range(3)])
    (s,) = list(ShardReader(str(many), max_sample_bytes=1000))
    assert s.files == ["k.0"] and len(s.refused) == 2
    # a header claiming 300 MB over 1 KB of data: refused by the member limit, then a clear error
    claim = tarfile.TarInfo("big.png")
    claim.size = 300 * 2**20
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        tf.addfile(claim)  # the header only
    (tmp_path / "claim.tar").write_bytes(buf.getvalue()[:512] + b"q" * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(TruncatedShardError):
            list(ShardReader(str(tmp_path / "claim.tar"), max_member_bytes=2**20))
        with pytest.raises(TruncatedShardError):
            list(ShardReader(str(tmp_path / "claim.tar")))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20


def test_names_holding_terminal_escapes_are_printed_escaped(tmp_path, photos):
    d = tmp_path / "in"
    d.mkdir()
    evil = "evil\x1b]0;pwned\x07\x1b[2J"
    (d / f"{evil}.tar").write_bytes(b"not a tar at all" * 64)
    tar_of(d / "fine.tar", [("a.png", png(photos))])
    proc = cli_process(["filter", d, "--out", tmp_path / "out", *FILTER])
    assert proc.returncode == 1
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J.tar" in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("FAILED")]) == 1


# ---------------------------------------------------------------------------------------------
# the output filesystem: full, read-only


def mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode})")


@pytest.fixture
def tmpfs(tmp_path):
    """``make(name, options)`` mounts a small tmpfs under tmp_path; all are unmounted after."""
    mounted = []

    def make(name: str, options: str) -> Path:
        p = tmp_path / name
        mount_tmpfs(p, options)
        mounted.append(p)
        return p
    yield make
    for p in reversed(mounted):
        subprocess.run(["umount", "-l", str(p)], capture_output=True, check=False)


def random_shard(path: Path, n: int, size: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    return tar_of(path, [(f"r{i:04d}.bin", rng.randbytes(size)) for i in range(n)])


def test_a_full_disk_fails_only_the_shards_that_do_not_fit_and_leaves_no_tmp_files(tmp_path, tmpfs):
    disk = tmpfs("disk", "size=2m")
    small = random_shard(tmp_path / "small.tar", 4, 20_000)
    big = random_shard(tmp_path / "big.tar", 30, 100_000, seed=1)  # 3 MB kept: cannot fit
    out = disk / "out"
    res = cli(["filter", small, big, "--out", out, *FILTER], expect=1)
    failed = [line for line in res.output.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "big.tar" in failed[0] and "No space left on device" in failed[0]
    assert "Traceback" not in res.output
    assert not no_tmp_files(disk)
    from collapseguard.filter.pipeline import outputs_match
    marker = json.loads((out / ".done/small.json").read_text())
    assert outputs_match(marker, str(out)) and not (out / ".done/big.json").exists()
    assert json.loads((out / "summary.json").read_text())["shards_failed"] == [str(big)]


def test_a_full_disk_at_summary_time_is_one_line_and_leaves_no_tmp_file(tmpfs):
    from collapseguard.filter.run import FilterError, write_summary
    disk = tmpfs("disk", "size=1m")
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to its last block
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    with pytest.raises(FilterError, match="cannot write summary.json .* No space left on device"):
        write_summary(str(disk), {"shards_failed": [], "per_shard": ["x" * 100_000]})
    assert not no_tmp_files(disk) and not (disk / "summary.json").exists()
    gone = disk / "gone"  # an --out removed under the run: its lock with this run's id went too
    with pytest.raises(FilterError, match="removed or replaced during the run"):
        write_summary(str(gone), {"shards_failed": []}, run_id="this-run")
    assert not gone.exists()


def test_an_out_removed_during_the_run_is_one_line_and_not_written_into_again(tmp_path, photos):
    from collapseguard.detectors import create
    from collapseguard.filter.pipeline import FilterOptions, RunLostError, process_shard
    out = tmp_path / "out"
    out.mkdir()  # no .lock: as after the folder was removed and made again by someone else
    opts = FilterOptions(out_dir=str(out), detector="nss", threshold=1e9, run_id="this-run")
    shard = tar_of(tmp_path / "s.tar", [("a.png", png(photos))])
    with pytest.raises(RunLostError, match="removed or replaced during the run"):
        process_shard(str(shard), opts, create("nss"))
    assert not [p for p in out.rglob("*") if p.is_file()]


def test_a_read_only_out_is_one_line_before_any_scoring(tmp_path, tmpfs, photos):
    ro = tmpfs("ro", "size=1m,ro")
    shard = tar_of(tmp_path / "s.tar", [("a.png", png(photos))])
    res = cli(["audit", shard, "--out", ro / "audit", "-d", "nss", "--threshold", "1e9"], expect=1)
    assert "cannot write to --out" in res.output and "Read-only file system" in res.output
    assert "scoring with" not in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = cli(["filter", shard, "--out", ro / "filter", *FILTER], expect=1)
    assert "cannot write to --out" in res.output and len(res.output.strip().splitlines()) == 1


def test_a_hostile_calibration_file_is_one_line_and_nothing_is_written(tmp_path, photos):
    shard = tar_of(tmp_path / "s.tar", [("a.png", png(photos))])
    for i, text in enumerate(["[" * 100000 + "]" * 100000,
                              '{"detector": "nss", "detector_version": "v", "threshold": NaN}',
                              '{"detector": "nss", "detector_version": "v", "threshold": "4.2"}']):
        cal = tmp_path / f"cal{i}.json"
        cal.write_text(text)
        out = tmp_path / f"out{i}"
        res = cli(["filter", shard, "--out", out, "-d", "nss", "--calibration", cal, "-w", "1", "-q"],
                  expect=1)
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
        assert not (out / "kept").exists()


# ---------------------------------------------------------------------------------------------
# interrupted runs


def test_sigint_stops_the_run_and_its_workers_and_the_resume_is_identical(tmp_path, shards, reference):
    out = tmp_path / "out"
    # as started from a terminal: SIGINT at its default action, even when this test runs in a
    # background job or under nohup, whose children inherit SIGINT ignored
    proc = subprocess.Popen(filter_cmd(shards, out), start_new_session=True,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 180
    while time.time() < deadline and not list((out / "kept").glob("*.tmp")):
        time.sleep(0.05)
    workers = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "run the same command again to resume" in err, err  # says what to do, not only "Aborted!"
    deadline = time.time() + 20
    while time.time() < deadline and any(alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if alive(w)], "workers outlived the interrupted run"
    assert not no_tmp_files(out), "an interrupted shard left temporary files"
    subprocess.run(filter_cmd(shards, out), check=True)
    assert outputs(out) == reference


def test_an_interrupted_run_counts_the_shards_its_workers_completed(tmp_path):
    """SIGINT to the parent alone once a worker has committed a shard: the message counts the
    completed shards a resume will skip (their markers), not only the results that reached the
    parent before the signal."""
    from skimage import data
    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    d = tmp_path / "data"
    d.mkdir()
    for s in range(6):
        make_shard(d / f"race-{s}.tar", photos * (1 if s < 4 else 6), start=s * 100)
    out = tmp_path / "out"
    cmd = filter_cmd(d, out)
    cmd[cmd.index(str(d / "race-{0..1}.tar"))] = str(d / "race-{0..5}.tar")
    proc = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 180
    while time.time() < deadline and len(list((out / ".done").glob("*.json"))) < 2:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGINT)  # the parent alone, as `kill -INT` does
    _, err = proc.communicate(timeout=60)
    line = next(x for x in err.splitlines() if x.startswith("interrupted:"))
    done = len(list((out / ".done").glob("*.json")))
    assert done >= 2 and line.startswith(f"interrupted: {done} of 6 shard(s) complete"), (line, done)


def open_files_under(pid: int, folder: Path) -> list[str]:
    """The files under ``folder`` that process ``pid`` holds open (read from /proc)."""
    try:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return []
    return [link for link in links if link.startswith(str(folder) + os.sep)]


def test_a_worker_terminated_mid_shard_deletes_its_staged_files_and_the_shard_is_redone(
        tmp_path, shards, reference):
    out = tmp_path / "out"
    proc = subprocess.Popen(filter_cmd(shards, out), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    writer, staged = None, []
    while time.time() < deadline and not staged:
        for pid in descendants(proc.pid):
            staged = open_files_under(pid, out / "kept")
            if staged:
                writer = pid
                break
        time.sleep(0.01)
    assert staged, "no worker seen writing a shard"
    os.kill(writer, signal.SIGTERM)  # as a system stopping one process would
    while alive(writer):
        time.sleep(0.005)
    # before the engine's fresh worker (a spawned process) starts the shard again
    assert not [p for p in staged if Path(p).exists()], "the terminated worker left its staged files"
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert outputs(out) == reference
    assert not no_tmp_files(out)


@pytest.mark.slow
def test_kill_minus_9_at_random_points_then_resume_is_byte_identical(benchmark_script, tmp_path):
    """The benchmark behind RELIABILITY.md's count, with a few kills (20 there)."""
    bench = benchmark_script("kill_resume.py")
    result = bench.run(runs=3, work=tmp_path, seed=1)
    assert result["identical"] == result["runs"] == 3
    assert result["orphans"] == result["tmp_left"] == 0


# ---------------------------------------------------------------------------------------------
# fuzzing the shard reader

def _base_tar(members, fmt) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in members:
            try:
                add_member(tf, name, data)
            except (ValueError, UnicodeError):  # a name this tar format cannot hold
                pass
    return buf.getvalue()


FUZZ_NAMES = st.sampled_from(["a.png", "a.txt", "b.json", "../c.png", "d/e.txt", ".h.png",
                              "f\udcff.txt", "g", "a.PNG", "x" * 120 + ".txt",
                              "y" * 60 + "/" + "z" * 80 + ".png"])
TARS = st.builds(_base_tar, st.lists(st.tuples(FUZZ_NAMES, st.binary(max_size=700)), max_size=6),
                 st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))


@st.composite
def fuzzed_tars(draw) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=3000))  # random bytes
    data = bytearray(draw(TARS))
    for _ in range(draw(st.integers(0, 8))):  # flipped bytes, mostly in the headers
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=fuzzed_tars())
def test_fuzzed_shards_are_read_whole_or_refused_clearly_and_conservation_holds(
        tmp_path_factory, nss, data):
    from collapseguard.filter.pipeline import FilterOptions, process_shard
    d = tmp_path_factory.mktemp("fuzz")
    shard = d / "s.tar"
    shard.write_bytes(data)
    tracemalloc.start()
    try:
        samples = list(ShardReader(str(shard)))
    except ShardError as exc:
        samples = None
        assert str(shard) in str(exc) and "\n" not in str(exc)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 32 * 2**20  # inputs are a few KB: no header makes the reader allocate more
    out = d / "out"
    options = FilterOptions(out_dir=str(out), detector="nss", threshold=1e9)
    event("refused" if samples is None else "read")  # shown by --hypothesis-show-statistics
    if samples is None:
        with pytest.raises(ShardError):
            process_shard(str(shard), options, nss)
        assert not [p for p in out.rglob("*") if p.is_file()], "a failed shard left files"
        return
    record = process_shard(str(shard), options, nss)
    assert record["samples"] == len(samples) == record["kept"] + record["rejected"]
    written = [m.data for sub in ("kept", "rejected")
               for s in ShardReader(str(out / sub / "s.tar")) for m in s.members]
    assert sorted(written) == sorted(m.data for s in samples for m in s.members)
    for sub in ("kept", "rejected"):
        wds_keys(out / sub / "s.tar")  # webdataset reads every output without a duplicate name



@pytest.mark.parametrize("kind", ["tar", "parquet"])
def test_an_interrupt_while_the_scores_are_tabled_leaves_no_staged_file(tmp_path, photos, monkeypatch, kind):
    """Ctrl-C or SIGTERM (a worker's ``WorkerStopped``) that lands after kept/ and rejected/ are
    written and before they are committed, while the scores table is built: what was staged
    goes: no ``*.tmp`` is left in kept/ or rejected/, and no marker."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from collapseguard.filter import parquet as parquet_filter
    from collapseguard.filter import pipeline

    if kind == "tar":
        src = tmp_path / "s.tar"
        make_shard(src, photos)
    else:
        src = tmp_path / "s.parquet"
        pq.write_table(pa.table({"image": [encode_png(p) for p in photos]}), src)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "scores_table", interrupted)
    monkeypatch.setattr(parquet_filter, "scores_table", interrupted)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["filter", str(src), "-o", str(out), "-d", "nss", "--threshold",
                                    "0", "-w", "1", "-q"])
    assert isinstance(res.exception, KeyboardInterrupt) or res.exit_code == 1, res.output
    assert (out / "kept").is_dir() and sorted(p.name for p in out.rglob("*.tmp")) == []
    assert not list((out / "kept").iterdir()) and not (out / ".done" / "s.json").exists()
