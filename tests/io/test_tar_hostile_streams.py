"""Hostile shard streams: compressed shards cut short or damaged, extended tar header records
that claim huge sizes, and control characters in member names.

Every case is built from real tar and gzip bytes and read through ``ShardReader`` and through the
``filter`` command; the assertions are on what is read, what lands in the output folder and how
much memory reading takes.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import pandas as pd
import pytest
from cg_testutil import run_cli

from collapseguard.images import encode_png
from collapseguard.inline import _unsafe
from collapseguard.io.shard_writer import ShardWriter
from collapseguard.io.tar import (
    MAX_HEADER_BYTES,
    CorruptShardError,
    Member,
    Sample,
    ShardError,
    ShardReader,
    TruncatedShardError,
    clean_member_name,
)

FILTER = ["-d", "nss", "--threshold", "1e9", "-w", "1", "-q"]


def png(photos, i=0) -> bytes:
    return encode_png(photos[i % len(photos)][:48, :48])


def tar_bytes(members, fmt=tarfile.USTAR_FORMAT) -> tuple[bytes, list[int]]:
    """The bytes of a tar of ``(name, data)`` members, and the offset where each member ends."""
    buf, ends = io.BytesIO(), []
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
            ends.append(tf.offset)
    return buf.getvalue(), ends


def samples_of(photos, n=4) -> list[tuple[str, bytes]]:
    """``n`` samples of an image, a caption and a json each."""
    out = []
    for i in range(n):
        out += [(f"s{i:02d}.png", png(photos, i)), (f"s{i:02d}.txt", f"caption {i}".encode()),
                (f"s{i:02d}.json", b'{"i": %d}' % i)]
    return out


def gzip_flushed(raw: bytes) -> bytes:
    """What a streaming gzip writer killed after writing ``raw`` leaves behind: a gzip header and
    the deflate data flushed so far, no end of stream and no trailer."""
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    return b"\x1f\x8b\x08\x00\0\0\0\0\x00\x03" + co.compress(raw) + co.flush(zlib.Z_SYNC_FLUSH)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def shard_outputs(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.is_file() and p.parent.name in ("kept", "rejected", ".done"))


# --- a compressed shard cut short, or damaged ------------------------------------------------


def test_a_gzip_shard_cut_between_two_members_fails_instead_of_passing_short(tmp_path, photos):
    raw, ends = tar_bytes(samples_of(photos))
    short = tmp_path / "short.tar.gz"
    short.write_bytes(gzip_flushed(raw[:ends[5]]))  # the stream stops right after sample s01
    whole = tmp_path / "whole.tar.gz"
    whole.write_bytes(gzip.compress(raw, mtime=0))
    read = []
    with pytest.raises(TruncatedShardError, match="gzip stream ends before its end marker.*cut short"):
        read.extend(s.key for s in ShardReader(str(short)))
    assert read == ["s00", "s01"], "the samples before the cut are read, then it fails"
    assert [s.key for s in ShardReader(str(whole))] == ["s00", "s01", "s02", "s03"]

    out = tmp_path / "out"
    res = run_cli(["filter", whole, short, "--out", out, *FILTER], expect=1)
    assert "short.tar.gz" in res.output and "cut short" in res.output
    assert summary(out)["shards_failed"] == [str(short)]
    assert shard_outputs(out) == [".done/whole.json", "kept/whole.tar.gz", "rejected/whole.tar.gz"]


def test_every_cut_of_a_gzip_shard_is_reported_truncated(tmp_path, photos):
    raw, _ = tar_bytes([(f"k{i:02d}.{ext}", f"{ext} of sample {i}".encode() * 3)
                        for i in range(30) for ext in ("txt", "json")])
    full = gzip.compress(raw, mtime=0)
    path = tmp_path / "cut.tar.gz"
    passed, other = [], []
    for cut in range(2, len(full)):  # from just past the gzip signature to one byte short
        path.write_bytes(full[:cut])
        try:
            n = sum(1 for _ in ShardReader(str(path)))
        except TruncatedShardError:
            continue
        except ShardError as exc:
            other.append((cut, type(exc).__name__))
            continue
        passed.append((cut, n))
    assert passed == [], f"{len(passed)} cuts read as complete (cut, samples): {passed[:5]}"
    assert other == [], f"cuts not reported as cut short: {other[:5]}"
    path.write_bytes(full)
    assert sum(1 for _ in ShardReader(str(path))) == 30


@pytest.mark.parametrize("where, message", [(-8, "CRC check failed"), (-4, "Incorrect length")])
def test_a_gzip_shard_whose_trailer_does_not_match_is_corrupt(tmp_path, photos, where, message):
    raw, _ = tar_bytes(samples_of(photos, 2))
    data = bytearray(gzip.compress(raw, mtime=0))
    data[where] ^= 0x01
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match=message):
        list(ShardReader(str(bad)))
    out = tmp_path / "out"
    res = run_cli(["filter", bad, "--out", out, *FILTER], expect=1)
    assert "bad.tar.gz" in res.output and message in res.output
    assert summary(out)["shards_failed"] == [str(bad)] and shard_outputs(out) == []


def test_a_whole_gzip_stream_around_a_tar_cut_short_is_truncated(tmp_path, photos):
    raw, ends = tar_bytes(samples_of(photos, 3))
    short = tmp_path / "short.tgz"
    short.write_bytes(gzip.compress(raw[:ends[2]], mtime=0))  # valid gzip, no tar end blocks
    with pytest.raises(TruncatedShardError, match="no end-of-archive marker"):
        list(ShardReader(str(short)))
    out = tmp_path / "out"
    run_cli(["filter", short, "--out", out, *FILTER], expect=1)
    assert summary(out)["shards_failed"] == [str(short)] and shard_outputs(out) == []


def test_two_gzip_archives_one_after_the_other_are_corrupt_not_half_read(tmp_path, photos):
    a, _ = tar_bytes(samples_of(photos, 2))
    b, _ = tar_bytes([("t0.txt", b"second archive")])
    both = tmp_path / "both.tar.gz"
    both.write_bytes(gzip.compress(a, mtime=0) + gzip.compress(b, mtime=0))  # cat a.tgz b.tgz
    with pytest.raises(CorruptShardError, match="another archive appended"):
        list(ShardReader(str(both)))
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(gzip.compress(a, mtime=0) + b"not gzip")
    with pytest.raises(CorruptShardError, match="gzip stream is damaged"):
        list(ShardReader(str(junk)))


def test_bytes_after_an_xz_stream_are_padding_another_stream_or_damage(tmp_path):
    import lzma

    raw, _ = tar_bytes([(f"s{i}.txt", bytes([65 + i]) * 3000) for i in range(6)])
    for junk in (b"not xz", b"\0" * 4 + b"JUNK"):
        shard = tmp_path / "junk.tar.xz"
        shard.write_bytes(lzma.compress(raw) + junk)
        with pytest.raises(CorruptShardError, match="neither stream padding nor another xz stream"):
            list(ShardReader(str(shard)))
    # every cut of two padded streams is reported as cut short, never read as complete
    two = lzma.compress(raw[:len(raw) // 2]) + b"\0" * 4 + lzma.compress(raw[len(raw) // 2:])
    for cut in range(64, len(two), 7):  # (a cut inside the first header is "not a readable tar")
        shard.write_bytes(two[:cut])
        with pytest.raises(TruncatedShardError):
            list(ShardReader(str(shard)))


def _well_formed(tmp_path: Path, raw: bytes, samples) -> list[Path]:
    """The same tar as written by tarfile, gzip, our ShardWriter, in several gzip members, with
    zero padding after the gzip stream, and with bzip2 and xz."""
    made = []
    with tarfile.open(tmp_path / "tarfile.tar.gz", "w:gz") as tf, \
            tarfile.open(fileobj=io.BytesIO(raw)) as src:
        for m in src:
            tf.addfile(m, src.extractfile(m))
    made.append(tmp_path / "tarfile.tar.gz")
    if shutil.which("gzip"):
        (tmp_path / "plain.tar").write_bytes(raw)
        with open(tmp_path / "gzipc.tar.gz", "wb") as f:
            subprocess.run(["gzip", "-c", str(tmp_path / "plain.tar")], stdout=f, check=True)
        (tmp_path / "plain.tar").unlink()
        made.append(tmp_path / "gzipc.tar.gz")
    with ShardWriter(str(tmp_path / "ours.tar.gz")) as w:
        for i in range(0, len(samples), 3):
            w.write(Sample(key=samples[i][0].split(".")[0],
                           members=[Member(n, d) for n, d in samples[i:i + 3]]))
    made.append(tmp_path / "ours.tar.gz")
    third = len(raw) // 3
    (tmp_path / "members.tar.gz").write_bytes(b"".join(
        gzip.compress(p, mtime=0) for p in (raw[:third], raw[third:2 * third], raw[2 * third:])))
    (tmp_path / "padded.tar.gz").write_bytes(gzip.compress(raw, mtime=0) + b"\0" * 1000)
    (tmp_path / "bz.tar.bz2").write_bytes(bz2.compress(raw))
    (tmp_path / "xz.tar.xz").write_bytes(lzma.compress(raw))
    (tmp_path / "xzpad.tar.xz").write_bytes(lzma.compress(raw) + b"\0" * 4)  # xz stream padding
    # two xz streams with stream padding between them (cat a.xz pad b.xz), the tar cut across them
    (tmp_path / "xzstreams.tar.xz").write_bytes(
        lzma.compress(raw[:third]) + b"\0" * 8 + lzma.compress(raw[third:]) + b"\0" * 4)
    (tmp_path / "alone.tar.lzma").write_bytes(lzma.compress(raw, format=lzma.FORMAT_ALONE))
    return made + [tmp_path / n for n in ("members.tar.gz", "padded.tar.gz", "bz.tar.bz2",
                                          "xz.tar.xz", "xzpad.tar.xz", "xzstreams.tar.xz",
                                          "alone.tar.lzma")]


def test_well_formed_compressed_shards_still_read_whole(tmp_path, photos):
    samples = samples_of(photos, 3)
    raw, _ = tar_bytes(samples)
    shards = tmp_path / "in"
    shards.mkdir()
    made = _well_formed(shards, raw, samples)
    assert len(made) >= 6
    for shard in made:
        got = [(m.name, m.data) for s in ShardReader(str(shard)) for m in s.members]
        assert got == samples, shard.name
    out = tmp_path / "out"
    run_cli(["filter", *[p for p in made if p.name.endswith((".tar.gz", ".tgz"))], "--out", out,
             *FILTER])
    assert summary(out)["shards_failed"] == []
    for shard in made:
        if shard.name.endswith(".tar.gz"):
            kept = out / "kept" / shard.name
            assert [s.key for s in ShardReader(str(kept))] == ["s00", "s01", "s02"], shard.name


def test_a_plain_tar_whose_first_name_looks_like_a_compression_signature_is_a_plain_tar(tmp_path, photos):
    """A tar starts with its first member's name: ``BZh...`` there is a name, not a bzip2 stream
    (the signatures checked are the formats' full magic numbers)."""
    for first in ("BZh001", "BZh91AY"):
        samples = [(f"{first}.png", png(photos)), (f"{first}.txt", b"caption"), ("k.png", png(photos, 1))]
        raw, _ = tar_bytes(samples, fmt=tarfile.PAX_FORMAT)
        (tmp_path / "s.tar").write_bytes(raw)
        got = [(m.name, m.data) for s in ShardReader(str(tmp_path / "s.tar")) for m in s.members]
        assert got == samples, first


# --- extended header records claiming huge sizes ---------------------------------------------

BOMB_KINDS = [(tarfile.XHDTYPE, "PAX extended header"), (tarfile.XGLTYPE, "PAX global header"),
              (tarfile.GNUTYPE_LONGNAME, "GNU long-name header"),
              (tarfile.GNUTYPE_LONGLINK, "GNU long-link header")]


def header_bomb(path: Path, typ: bytes, claim: int, level: int = 6) -> Path:
    """A .tar.gz whose first header is of type ``typ`` and claims ``claim`` bytes of zeros (which
    follow, compressed to next to nothing), then one ordinary member and the end of archive."""
    head = tarfile.TarInfo("././@LongLink" if typ in tarfile.GNU_TYPES else "././@PaxHeader")
    head.type, head.size = typ, claim
    after = tarfile.TarInfo("after.txt")
    after.size = 5
    co = zlib.compressobj(level, zlib.DEFLATED, 31)  # gzip framing
    with open(path, "wb") as f:
        f.write(co.compress(head.tobuf(format=tarfile.GNU_FORMAT)))
        zeros, left = bytes(1 << 20), claim + (-claim % 512)
        while left:
            f.write(co.compress(zeros[:min(left, len(zeros))]))
            left -= min(left, len(zeros))
        f.write(co.compress(after.tobuf(format=tarfile.GNU_FORMAT) + b"after" + bytes(507 + 1024)))
        f.write(co.flush())
    return path


@pytest.mark.parametrize("typ, kind", BOMB_KINDS)
def test_an_extended_header_claiming_a_huge_size_is_refused_before_it_is_read(tmp_path, typ, kind):
    claim = 64 << 20
    bomb = header_bomb(tmp_path / "bomb.tar.gz", typ, claim)
    assert bomb.stat().st_size < claim // 200
    tracemalloc.start()
    try:
        with pytest.raises(CorruptShardError, match=f"a {kind} at byte 0 claims {claim} bytes, "
                                                    f"over the {MAX_HEADER_BYTES}-byte limit"):
            list(ShardReader(str(bomb)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"reading the header took {peak} bytes"
    out = tmp_path / "out"
    res = run_cli(["filter", bomb, "--out", out, *FILTER], expect=1)
    assert f"{kind} at byte 0 claims {claim} bytes" in res.output
    assert summary(out)["shards_failed"] == [str(bomb)] and shard_outputs(out) == []


def test_small_extended_headers_are_read_as_before(tmp_path, photos):
    long_name = "d" * 300 + "/k.png"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        raw, _ = tar_bytes([(long_name, png(photos)), ("k.txt", ("é" * 2000).encode())], fmt=fmt)
        (tmp_path / "s.tar").write_bytes(raw)
        got = [(m.name, len(m.data)) for s in ShardReader(str(tmp_path / "s.tar")) for m in s.members]
        assert got == [(long_name, len(png(photos))), ("k.txt", 4000)]
    info = tarfile.TarInfo("p.txt")
    info.size, info.pax_headers = 2, {"comment": "x" * (MAX_HEADER_BYTES // 2)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(b"ok"))
    (tmp_path / "p.tar.gz").write_bytes(gzip.compress(buf.getvalue()))
    assert [s.files for s in ShardReader(str(tmp_path / "p.tar.gz"))] == [["p.txt"]]


def _checksummed(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def test_a_gnu_sparse_header_with_endless_extension_blocks_is_refused(tmp_path):
    head = tarfile.TarInfo("sp.bin")
    head.type = tarfile.GNUTYPE_SPARSE
    first = bytearray(head.tobuf(format=tarfile.GNU_FORMAT))
    first[482] = 1  # extension blocks follow
    ext = bytearray(512)
    for i in range(21):
        ext[i * 24:i * 24 + 24] = b"%011o\0%011o\0" % (i + 1, 1)
    ext[504] = 1  # and another one after this
    n = 2 * MAX_HEADER_BYTES // 512
    shard = tmp_path / "sparse.tar.gz"
    shard.write_bytes(gzip.compress(_checksummed(first) + bytes(ext) * n + bytes(1024)))
    with pytest.raises(CorruptShardError, match="GNU sparse header at byte 0 claims at least"):
        list(ShardReader(str(shard)))
    out = tmp_path / "out"
    run_cli(["filter", shard, "--out", out, *FILTER], expect=1)
    assert summary(out)["shards_failed"] == [str(shard)]


def test_a_pax_sparse_map_that_never_ends_is_refused(tmp_path):
    info = tarfile.TarInfo("sp.bin")
    info.size = 4 * MAX_HEADER_BYTES
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                        "GNU.sparse.name": "sp.bin", "GNU.sparse.realsize": "10"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO((b"1000000000\n" + b"1\n" * (info.size // 2))[:info.size]))
    shard = tmp_path / "sparse.tar.gz"
    shard.write_bytes(gzip.compress(buf.getvalue()))
    with pytest.raises(CorruptShardError, match="PAX sparse map at byte 0 claims at least"):
        list(ShardReader(str(shard)))


PEAK_SCRIPT = textwrap.dedent("""
    import resource, sys
    from collapseguard.cli import main
    try:
        main(sys.argv[1:], standalone_mode=True)
    except SystemExit:
        pass
    kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
             resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print("PEAK_KB", kb)
""")


def _filter_peak_kb(shard: Path, out: Path) -> int:
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, "filter", str(shard), "--out",
                           str(out), *FILTER], capture_output=True, text=True, timeout=300,
                          check=False)
    line = [x for x in proc.stdout.splitlines() if x.startswith("PEAK_KB")]
    assert line, proc.stdout + proc.stderr
    return int(line[0].split()[1])


def test_filter_on_a_header_bomb_keeps_its_peak_memory_small(tmp_path, photos):
    claim = 256 << 20
    bomb = header_bomb(tmp_path / "bomb.tar.gz", tarfile.XHDTYPE, claim, level=1)
    small = tmp_path / "small.tar.gz"
    small.write_bytes(gzip.compress(tar_bytes(samples_of(photos, 2))[0]))
    base = _filter_peak_kb(small, tmp_path / "out_small")
    peak = _filter_peak_kb(bomb, tmp_path / "out_bomb")
    print(f"peak RSS: {peak} KB for a {claim}-byte PAX header bomb, {base} KB for a small shard")
    assert peak - base < 64 * 1024, f"peak RSS {peak} KB against {base} KB for a small shard"
    assert summary(tmp_path / "out_bomb")["shards_failed"] == [str(bomb)]


# --- control characters in member names ------------------------------------------------------


def test_control_characters_in_member_names_are_escaped_and_set_aside(tmp_path, photos):
    names = ["a.png", "b\x00../../../etc/evil.png", "c\x00.png", "e\n\x1b[2J.png", "d.png"]
    shard = tmp_path / "nul.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for i, name in enumerate(names):  # a PAX path record carries any character, NUL too
            data = png(photos, i)
            info = tarfile.TarInfo("placeholder")
            info.size, info.pax_headers = len(data), {"path": name}
            tf.addfile(info, io.BytesIO(data))
    escaped = ["a.png", "b\\x00../etc/evil.png", "c\\x00.png", "e\\x0a\\x1b[2J.png", "d.png"]
    assert [clean_member_name(n) for n in names] == escaped
    samples = list(ShardReader(str(shard)))
    assert [s.files for s in samples] == [[n] for n in escaped]
    assert [bool(s.unsafe_names) for s in samples] == [False, True, True, True, False]

    out = tmp_path / "out"
    run_cli(["filter", shard, "--out", out, *FILTER])
    scores = pd.read_parquet(out / "scores/nul.parquet").set_index("key")
    assert scores["reason"].to_dict() == {"a": "kept", "b\\x00../etc/evil": "unsafe_name",
                                          "c\\x00": "unsafe_name", "e\\x0a\\x1b[2J": "unsafe_name",
                                          "d": "kept"}
    with tarfile.open(out / "kept/nul.tar") as tf:
        assert tf.getnames() == ["a.png", "d.png"]
    with tarfile.open(out / "rejected/nul.tar") as tf:
        assert tf.getnames() == escaped[1:4], "written under the escaped names, not cut at NUL"


def test_the_inline_stage_sets_aside_control_character_names_as_filter_does():
    assert _unsafe({"__key__": "c\x00", "png": b""})
    assert _unsafe({"__key__": "e\x1b[2J", "png": b""})
    assert _unsafe({"__key__": "k", "pn\x00g": b""})
    assert not _unsafe({"__key__": "a/b", "png": b"", "json": b""})


def test_the_header_only_readers_refuse_a_header_bomb_too(tmp_path):
    """audit's key listing and the progress count read headers with tarfile directly: the same
    cap applies, so a bomb costs them no memory either."""
    from collapseguard.audit.sampling import shard_keys
    from collapseguard.scoring.progress import count_samples

    claim = 64 << 20
    bomb = header_bomb(tmp_path / "bomb.tar.gz", tarfile.GNUTYPE_LONGNAME, claim)
    plain = tmp_path / "bomb.tar"
    plain.write_bytes(gzip.decompress(bomb.read_bytes()))
    tracemalloc.start()
    try:
        assert list(shard_keys(str(bomb))) == [] and list(shard_keys(str(plain))) == []
        assert count_samples(str(plain)) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"listing the keys took {peak} bytes"


def test_a_header_bomb_read_by_a_chain_source_is_one_readable_error(tmp_path):
    """``chains make --sources shards:...`` reads training shards with tarfile directly: the cap's
    error says what it refused, not a tuple."""
    from collapseguard.errors import CollapseguardError
    from collapseguard.training_data_tools.sources import shard_images

    bomb = header_bomb(tmp_path / "bomb.tar.gz", tarfile.XHDTYPE, 8 << 20)
    with pytest.raises(CollapseguardError, match=r"a PAX extended header at byte 0 claims 8388608 bytes, "
                                                 rf"over the {MAX_HEADER_BYTES}-byte limit"):
        list(shard_images([str(bomb)]))



def test_a_sample_whose_members_spell_dot_slash_differently_keeps_one_key(tmp_path):
    """``./000.png`` then ``.//000.txt``: one sample for webdataset (key ``./000``), so one sample
    here, every member under ``./000`` (the second set aside for its cleaned name)."""
    from collapseguard.io.tar import ShardReader

    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for name in ("./000.png", ".//000.txt"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tf.addfile(info, io.BytesIO(b"abc"))
    (sample,) = list(ShardReader(str(tmp_path / "s.tar")))
    assert sample.key == "./000" and [m.name for m in sample.members] == ["./000.png", "./000.txt"]
    assert sample.unsafe_names == [".//000.txt"]


def test_a_zstd_stream_named_tar_is_refused_with_what_a_shard_may_be(tmp_path):
    """The refusal says what a folder's name check says: .tar, .tar.gz or .tgz, and how to fix it."""
    raw, _ = tar_bytes([("k.txt", b"abc")])
    shard = tmp_path / "s.tar"
    shard.write_bytes(b"\x28\xb5\x2f\xfd" + raw)  # a zstd frame's magic number before the data
    with pytest.raises(ShardError, match=r"zstd-compressed stream: shards are \.tar, \.tar\.gz or "
                                         r"\.tgz \(decompress it, or recompress it with gzip\)"):
        list(ShardReader(str(shard)))
