"""Hostile shards: what a filter, score or audit run does with members and images built to hurt.

Each case builds a real tar and runs the real command (the nss detector, to stay fast); the
assertions are on what lands in the output folder, and on nothing landing anywhere else.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cg_testutil import add_member, read_members, run_cli

from collapseguard.detectors import create
from collapseguard.images import encode_png
from collapseguard.io.tar import ShardReader, TruncatedShardError
from collapseguard.scoring.records import score_records

FILTER = ["-d", "nss", "--threshold", "1e9", "-w", "1", "-q"]


def png(photos, i=0) -> bytes:
    return encode_png(photos[i][:96, :96])


def write_tar(path: Path, members, fmt=tarfile.PAX_FORMAT, **kw) -> Path:
    """``members``: (name, bytes) or a ready TarInfo with its bytes (None for links)."""
    with tarfile.open(path, "w", format=fmt, **kw) as tf:
        for m in members:
            if isinstance(m[0], tarfile.TarInfo):
                tf.addfile(m[0], None if m[1] is None else io.BytesIO(m[1]))
            else:
                add_member(tf, *m)
    return path


def scores_of(out: Path, stem: str) -> pd.DataFrame:
    return pd.read_parquet(out / "scores" / f"{stem}.parquet").set_index("key")


def test_image_bytes_are_never_opened_by_a_format_outside_the_list(tmp_path, photos):
    # PostScript named .png: Pillow would pick its EPS plugin from the content and run Ghostscript
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    shard = write_tar(tmp_path / "s.tar", [("e1.png", eps), ("ok.png", png(photos))])
    run_cli(["filter", shard, "--out", tmp_path / "out", *FILTER])
    s = scores_of(tmp_path / "out", "s")
    assert s.loc["e1", "reason"] == "decode_error"
    assert "cannot identify image file" in s.loc["e1", "error"]
    assert "Ghostscript" not in s.loc["e1", "error"] and "0x" not in s.loc["e1", "error"]
    assert s.loc["ok", "reason"] == "kept"


def test_links_sparse_and_oversized_members_are_refused_and_their_samples_set_aside(tmp_path, photos):
    link = tarfile.TarInfo("s3.png")
    link.type, link.linkname = tarfile.LNKTYPE, "s1.png"  # a hard link to an image already seen
    sym = tarfile.TarInfo("s4.png")
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
    sparse = tarfile.TarInfo("s5.json")
    sparse.size = 10
    sparse.pax_headers = {"GNU.sparse.map": "0,10", "GNU.sparse.size": "1500000000",
                          "GNU.sparse.numblocks": "1"}
    shard = write_tar(tmp_path / "s.tar", [
        ("s1.png", png(photos)), ("s1.txt", b"one"), (link, None), ("s3.txt", b"three"),
        (sym, None), ("s4.txt", b"four"), (sparse, b"0123456789"), ("s5.txt", b"five"),
        ("s6.png", png(photos, 1))])
    out = tmp_path / "out"
    run_cli(["filter", shard, "--out", out, *FILTER])
    s = scores_of(out, "s")
    assert s.loc["s1", "reason"] == "kept" and s.loc["s6", "reason"] == "kept"
    for key, why in (("s3", "hard link"), ("s4", "symbolic link"), ("s5", "sparse member")):
        assert s.loc[key, "decision"] == "rejected" and s.loc[key, "reason"] == "refused_member"
        assert why in s.loc[key, "error"]
    rejected = dict(read_members(out / "rejected/s.tar"))
    assert rejected == {"s3.txt": b"three", "s4.txt": b"four", "s5.txt": b"five"}
    assert (out / "rejected/s.tar").stat().st_size < 100_000  # the sparse claim was never expanded
    marker = json.loads((out / ".done/s.json").read_text())
    assert "s3.png (hard link)" in marker["skipped_members"]
    # score reports the refusal too, not only filter
    run_cli(["score", shard, "-d", "nss", "-w", "1", "-q", "--out", tmp_path / "x.csv"])
    rows = pd.read_csv(tmp_path / "x.csv").set_index("key")
    assert "hard link" in rows.loc["s3", "error"]
    # an oversized member is refused without being read
    reader = ShardReader(str(shard), max_member_bytes=100)
    samples = {smp.key: smp for smp in reader}
    assert samples["s1"].files == ["s1.txt"] and samples["s1"].refused[0][0] == "s1.png"


def test_non_utf8_member_names_are_escaped_and_set_aside(tmp_path, photos):
    shard = write_tar(tmp_path / "s.tar", [("bad\udcff.png", png(photos)), ("good.png", png(photos, 1))],
                      fmt=tarfile.GNU_FORMAT, errors="surrogateescape")
    out = tmp_path / "out"
    run_cli(["filter", shard, "--out", out, *FILTER])
    s = scores_of(out, "s")
    assert s.loc["bad\\xff", "reason"] == "unsafe_name" and s.loc["good", "reason"] == "kept"
    assert [n for n, _ in read_members(out / "rejected/s.tar")] == ["bad\\xff.png"]
    run_cli(["score", shard, "-d", "nss", "-w", "1", "-q", "--out", tmp_path / "x.parquet"])
    assert sorted(pd.read_parquet(tmp_path / "x.parquet")["key"]) == ["bad\\xff", "good"]


def test_a_tar_cut_between_two_members_fails_instead_of_passing_short(tmp_path, photos):
    whole = write_tar(tmp_path / "whole.tar", [(f"k{i}.png", png(photos, i % 2)) for i in range(4)],
                      fmt=tarfile.USTAR_FORMAT)
    with tarfile.open(whole) as tf:
        cut = tf.getmembers()[2].offset  # the header of the third member
    short = tmp_path / "short.tar"
    short.write_bytes(whole.read_bytes()[:cut])
    with pytest.raises(TruncatedShardError, match="cut short"):
        list(ShardReader(str(short)))
    assert [s.key for s in ShardReader(str(whole))] == ["k0", "k1", "k2", "k3"]
    out = tmp_path / "out"
    res = run_cli(["filter", whole, short, "--out", out, *FILTER], expect=1)
    assert "short.tar" in res.output
    assert json.loads((out / "summary.json").read_text())["shards_failed"] == [str(short)]
    assert sorted(p.name for p in out.rglob("*") if p.is_file() and p.parent.name in ("kept", "rejected")) \
        == ["whole.tar", "whole.tar"]  # no partial short.tar(.tmp) left behind


def test_unusable_mtime_does_not_fail_the_shard(tmp_path, photos):
    info = tarfile.TarInfo("a.png")
    data = png(photos)
    info.size = len(data)
    info.pax_headers = {"mtime": "nan"}
    shard = write_tar(tmp_path / "s.tar", [(info, data)])
    run_cli(["filter", shard, "--out", tmp_path / "out", *FILTER])
    assert read_members(tmp_path / "out/kept/s.tar") == [("a.png", data)]


def test_outputs_are_byte_identical_across_runs_even_with_decode_errors(tmp_path, photos):
    shard = write_tar(tmp_path / "s.tar", [("a.png", b"not an image"), ("b.png", png(photos))])
    for run in ("one", "two"):
        run_cli(["filter", shard, "--out", tmp_path / run, *FILTER])
    for rel in ("kept/s.tar", "rejected/s.tar", "scores/s.parquet"):
        assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "two" / rel).read_bytes(), rel


def test_a_sample_of_many_large_images_is_not_decoded_past_the_pixel_cap(photos):
    big = [(f"b.{i}.png", encode_png(np.tile(photos[0][:64, :64], (4, 4, 1)))) for i in range(4)]
    small = [("c.png", png(photos))]
    det = create("nss")
    out = list(score_records([big, small], det, max_record_pixels=2 * 256 * 256))
    assert out[0][1].status == "decode_error" and "b.2.png" in out[0][1].error
    assert "b.3.png" not in out[0][1].error  # decoding stopped at the cap
    assert out[1][1].status == "ok" and np.isfinite(out[1][1].score)


def test_score_csv_keys_cannot_run_as_spreadsheet_formulas(tmp_path, photos):
    shard = write_tar(tmp_path / "s.tar", [("=HYPERLINK(1).png", png(photos))])
    run_cli(["score", shard, "-d", "nss", "-w", "1", "-q", "--out", tmp_path / "x.csv"])
    assert pd.read_csv(tmp_path / "x.csv")["key"].tolist() == ["'=HYPERLINK(1)"]
    run_cli(["score", shard, "-d", "nss", "-w", "1", "-q", "--out", tmp_path / "x.parquet"])
    assert pd.read_parquet(tmp_path / "x.parquet")["key"].tolist() == ["=HYPERLINK(1)"]


def test_audit_sample_records_an_unreadable_shard_and_goes_on(tmp_path, photos):
    good = write_tar(tmp_path / "good.tar", [(f"k{i}.png", png(photos, i % 4)) for i in range(6)])
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"this is not a tar file at all\n" * 40)
    out = tmp_path / "audit"
    res = run_cli(["audit", good, garbage, "--out", out, "-d", "nss", "--sample", "3", "-w", "1"],
                  expect=1)
    assert "Traceback" not in res.output and "1 input(s) failed" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sample"]["audited"] == 3 and summary["sample"]["population"] == 6
    assert len(summary["failures"]) == 1 and "garbage.tar" in summary["failures"][0]


def test_hidden_member_names_get_a_visible_key_and_are_set_aside(tmp_path, photos):
    shard = write_tar(tmp_path / "s.tar", [(".hidden.png", png(photos)), ("d/.x.png", png(photos, 1)),
                                           ("ok.png", png(photos, 2))])
    run_cli(["filter", shard, "--out", tmp_path / "out", *FILTER])
    s = scores_of(tmp_path / "out", "s")
    assert s.loc[".hidden.png", "reason"] == "unsafe_name" and s.loc["d/.x.png", "reason"] == "unsafe_name"
    assert s.loc["ok", "reason"] == "kept" and "" not in s.index
    assert sorted(n for n, _ in read_members(tmp_path / "out/rejected/s.tar")) == [".hidden.png", "d/.x.png"]


def _png_bytes(img: np.ndarray, interlace: bool, keep: float = 1.0) -> bytes:
    """A PNG built by hand (Pillow writes no Adam7): 8-bit RGB, filter 0 rows; with ``keep`` < 1
    the zlib stream is complete but carries only that share of the rows, as a writer that stopped
    early and closed its stream leaves it."""
    import struct
    import zlib

    h, w = img.shape[:2]
    passes = ([(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2),
               (1, 0, 2, 1)] if interlace else [(0, 0, 1, 1)])
    rows = [b"\x00" + img[y0::dy, x0::dx][r].tobytes()
            for y0, x0, dy, dx in passes if img[y0::dy, x0::dx].size
            for r in range(img[y0::dy, x0::dx].shape[0])]
    raw = b"".join(rows[:int(len(rows) * keep)])

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, int(interlace))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def test_a_png_whose_image_data_ends_early_is_a_decode_error_not_black_rows(tmp_path, photos):
    from collapseguard.images import DecodeError, decode_image

    img = photos[1][:70, :90].copy()
    dark = img.copy()
    dark[-2:] = 0  # complete, but its last rows are black: the slow check runs and must pass it
    members = []
    for interlace in (False, True):
        tag = "adam7" if interlace else "plain"
        whole = _png_bytes(img, interlace)
        np.testing.assert_array_equal(decode_image(whole), img)  # the hand-built file is right
        np.testing.assert_array_equal(decode_image(_png_bytes(dark, interlace)), dark)
        short = _png_bytes(img, interlace, keep=0.9)
        with pytest.raises(DecodeError, match=r"PNG image data ends early: \d+ of \d+ bytes \(90x70\)"):
            decode_image(short)
        members += [(f"{tag}-whole.png", whole), (f"{tag}-dark.png", _png_bytes(dark, interlace)),
                    (f"{tag}-short.png", short)]
    shard = write_tar(tmp_path / "s.tar", members)
    run_cli(["filter", shard, "--out", tmp_path / "out", *FILTER])
    s = scores_of(tmp_path / "out", "s")
    for tag in ("plain", "adam7"):
        assert s.loc[f"{tag}-short", "reason"] == "decode_error"
        assert "ends early" in s.loc[f"{tag}-short", "error"]
        assert s.loc[f"{tag}-whole", "reason"] == s.loc[f"{tag}-dark", "reason"] == "kept"
    with tarfile.open(tmp_path / "out" / "rejected" / "s.tar") as tf:  # set aside, not lost
        assert {"plain-short.png", "adam7-short.png"} <= set(tf.getnames())


def _wds_samples(path):
    import webdataset as wds

    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in wds.WebDataset(str(path), shardshuffle=False, empty_check=False)]


def test_macos_appledouble_members_do_not_split_their_sample(tmp_path, photos):
    """macOS tar writes ``._NAME`` before each file. webdataset skips such members and keeps
    ``000001.jpg`` with its ``.json``; the filter must too: the sample is kept whole, and each
    ``._`` member is set aside in rejected/ (no byte lost)."""
    members = []
    for i, key in enumerate(("000001", "000002")):
        members += [(f"._{key}.jpg", b"\x00\x05\x16\x07 mac"), (f"{key}.jpg", png(photos, i)),
                    (f"._{key}.json", b"\x00\x05\x16\x07 mac"), (f"{key}.json", b'{"caption": "%d"}' % i)]
    shard = write_tar(tmp_path / "mac.tar", members)
    out = tmp_path / "out"
    run_cli(["filter", shard, "-o", out, *FILTER])
    scores = pd.read_parquet(out / "scores" / "mac.parquet")
    assert scores.loc[scores["decision"] == "kept", "key"].tolist() == ["000001", "000002"]
    assert set(scores.loc[scores["decision"] == "rejected", "reason"]) == {"unsafe_name"}
    kept = _wds_samples(out / "kept" / "mac.tar")
    assert [(s["__key__"], sorted(k for k in s if k != "__key__")) for s in kept] == [
        ("000001", ["jpg", "json"]), ("000002", ["jpg", "json"])]
    written = read_members(out / "kept" / "mac.tar") + read_members(out / "rejected" / "mac.tar")
    assert sorted(b for _, b in written) == sorted(b for _, b in members)


def test_a_refused_sample_whose_key_repeats_stays_apart_in_rejected(tmp_path, photos):
    """``k`` (rejected as degraded), ``j``, then ``k`` again with a link member (refused_member,
    and a repeated key): read back from rejected/, the two ``k`` samples stay two."""
    link = tarfile.TarInfo("k.lnk")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    shard = write_tar(tmp_path / "s.tar", [("k.png", png(photos, 0)), ("j.txt", b"j"),
                                           ("k.txt", b"caption of the second k"), (link, None)])
    out = tmp_path / "out"
    run_cli(["filter", shard, "-o", out, "-d", "nss", "--threshold", "-1e9", "-w", "1", "-q"])
    scores = pd.read_parquet(out / "scores" / "s.parquet")
    assert scores["reason"].tolist()[2] == "refused_member"
    back = [s.key for s in ShardReader(str(out / "rejected" / "s.tar"))]
    assert len(back) == 2 and len(set(back)) == 2


def test_names_tar_wrote_from_dot_keep_their_keys(tmp_path, photos):
    """``tar cf shard.tar .`` names every member ``./NAME``, and webdataset's key keeps the ``./``:
    the kept shard, the rejected one and the scores must carry the same keys and bytes, never
    ``000`` for ``./000``."""
    import webdataset as wds

    members = [("./000.png", png(photos, 0)), ("./000.txt", b"caption"),
               ("./001.png", png(photos, 1))]
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for name, data in members:
            add_member(tf, name, data)
    run_cli(["filter", tmp_path / "s.tar", "--out", tmp_path / "o", "--threshold", "0", "-d", "nss",
             "-w", "1", "-q"])
    out = {}
    for part in ("kept", "rejected"):
        with tarfile.open(tmp_path / "o" / part / "s.tar") as tf:
            out.update({m.name: tf.extractfile(m).read() for m in tf.getmembers()})
    assert out == dict(members)
    keys = {s["__key__"] for part in ("kept", "rejected")
            for s in wds.WebDataset(str(tmp_path / "o" / part / "s.tar"), shardshuffle=False, empty_check=False)}
    assert keys == {"./000", "./001"}
    assert set(pd.read_parquet(tmp_path / "o/scores/s.parquet")["key"]) == {"./000", "./001"}


def test_a_member_name_repeated_within_a_sample_is_renamed_as_reference_says(tmp_path, photos):
    """``k.txt`` twice in one sample: the second is written as ``k.txt.dup1`` in rejected/ and the
    sample set aside as ``unsafe_name``, its error naming the rename; REFERENCE.md's unsafe_name
    bullet says so."""
    shard = write_tar(tmp_path / "s.tar", [("k.png", png(photos)), ("k.txt", b"one"), ("k.txt", b"two")])
    run_cli(["filter", shard, "--out", tmp_path / "out", *FILTER])
    s = scores_of(tmp_path / "out", "s")
    assert s.loc["k", "reason"] == "unsafe_name" and "<name>.dupN" in s.loc["k", "error"]
    assert read_members(tmp_path / "out/rejected/s.tar") == [("k.png", png(photos)), ("k.txt", b"one"),
                                                             ("k.txt.dup1", b"two")]
    ref = (Path(__file__).resolve().parents[2] / "docs" / "REFERENCE.md").read_text()
    bullet = ref[ref.index("`unsafe_name`\n  (member names"):ref.index("`refused_member` (a link")]
    assert "repeated within a sample" in bullet and "`<name>.dupN`" in bullet and "k.txt.dup1" in bullet


def test_every_set_aside_reason_is_decided_told_and_labelled_alike(tmp_path, photos):
    """One tuple (``records.SET_ASIDE_REASONS``) makes filter's set-aside reasons: every reason
    ``decide`` rejects a well-scored sample for is the one ``set_aside_reason`` gives a shard
    sample that has it (what score and audit write), and has an audit label."""
    import inspect
    import itertools

    from collapseguard.audit.labels import SET_ASIDE_LABELS
    from collapseguard.filter.decisions import REASONS, decide
    from collapseguard.io.tar import Sample
    from collapseguard.scoring.records import (
        SET_ASIDE_REASONS,
        set_aside_flags,
        set_aside_reason,
    )

    link = tarfile.TarInfo("linked.png")
    link.type, link.linkname = tarfile.SYMTYPE, "fine.png"
    shard = write_tar(tmp_path / "s.tar", [("../escape.png", png(photos, 0)), ("fine.png", png(photos, 1)),
                                           ("other.png", png(photos, 2)), ("fine.png", png(photos, 3)),
                                           (link, None), ("linked.txt", b"a caption")])
    seen = {}
    for sample, scored in score_records(ShardReader(str(shard)), create("nss"),
                                        members_of=lambda s: [(m.name, m.data) for m in s.members]):
        assert scored.status == "ok" or sample.key == "linked", (sample.key, scored)
        told = set_aside_reason(sample)
        got = decide(scored, 1e9, **set_aside_flags(sample))  # as filter decides a shard sample
        assert got == (("rejected", told) if told else ("kept", "kept")), (sample.key, got, told)
        seen.setdefault(told, sample.key)
    assert seen == {"unsafe_name": "escape", "": "fine", "repeated_key": "fine", "refused_member": "linked"}
    assert set(seen) - {""} == set(SET_ASIDE_REASONS)  # a reason added to the tuple needs a sample here

    # every flag decide takes, in every combination: the reasons it sets aside a clean score for
    flags = [n for n, p in inspect.signature(decide).parameters.items()
             if p.kind is p.KEYWORD_ONLY and n != "reject_no_image"]
    clean = next(s for _, s in score_records([[("p.png", png(photos))]], create("nss")))
    decided = set()
    for values in itertools.product([False, True], repeat=len(flags)):
        given = dict(zip(flags, values))
        decision, reason = decide(clean, 1e9, **given)
        if decision == "rejected":
            decided.add(reason)
        sample = Sample(key="k", unsafe_names=["/k.png"] if given.get("unsafe") else [],
                        refused=[("k.png", "a link")] if given.get("refused") else [],
                        repeat=int(bool(given.get("repeated"))))
        assert set_aside_reason(sample) == (reason if decision == "rejected" else ""), given
    assert decided == set(SET_ASIDE_REASONS)
    assert tuple(SET_ASIDE_LABELS) == SET_ASIDE_REASONS and all(SET_ASIDE_LABELS.values())
    assert [r for r in REASONS if r in decided] == list(SET_ASIDE_REASONS)
    assert decide(clean, 1e9, **dict.fromkeys(flags, True)) == ("rejected", SET_ASIDE_REASONS[0])
