"""The shard filter on real tar shards: conservation, byte-identical passthrough, bad input,
resume after a kill, brace patterns, samples without images, unsafe names."""

from __future__ import annotations

import collections
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cg_testutil import degrade, make_shard, read_members, run_cli

from collapseguard.images import encode_jpeg, encode_png
from collapseguard.io.inputs import InputError, expand_inputs, expand_pattern


def threshold_between(photos):
    """A threshold for nss that separates these clean photos from their degraded copies."""
    from collapseguard.detectors import create
    det = create("nss")
    clean = det.score(photos)
    bad = det.score([degrade(p, seed=i) for i, p in enumerate(photos)])
    assert bad.min() > clean.max(), "fixture degradation must be visible to nss"
    return float((bad.min() + clean.max()) / 2)


def test_conservation_and_ordered_passthrough(tmp_path, photos):
    shard = tmp_path / "in" / "shard-000.tar"
    shard.parent.mkdir()
    members = make_shard(shard, photos, extra=[("notes.cls", b"7"), ("odd.seg.png", encode_png(photos[0]))])
    t = threshold_between(photos)
    run_cli(["filter", shard, "--out", tmp_path / "out", "--detector", "nss", "--threshold", t,
             "--workers", "1", "--quiet"])
    kept = read_members(tmp_path / "out/kept/shard-000.tar")
    rej = read_members(tmp_path / "out/rejected/shard-000.tar")
    # conservation: the multiset of (name, bytes) in == kept + rejected
    assert collections.Counter(members) == collections.Counter(kept + rej)
    # order: each output is the input restricted to its members, in input order
    kept_set, rej_set = set(kept), set(rej)
    assert kept == [m for m in members if m in kept_set]
    assert rej == [m for m in members if m in rej_set]
    scores = pd.read_parquet(tmp_path / "out/scores/shard-000.parquet")
    assert list(scores.columns[:6]) == ["key", "score", "decision", "reason", "detector", "detector_version"]
    by_key = scores.set_index("key")
    for i in range(len(photos)):
        assert by_key.loc[f"shard-000_{i:04d}_0", "reason"] == "kept"
        assert by_key.loc[f"shard-000_{i:04d}_1", "reason"] == "degraded"
    assert by_key.loc["notes", "reason"] == "no_image"
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["samples"] == len(scores) == 2 * len(photos) + 2
    assert summary["reasons"]["degraded"] == len(photos)
    assert summary["threshold"] == pytest.approx(t)


def test_corrupt_image_is_decode_error_and_nothing_lost(tmp_path, photos):
    shard = tmp_path / "s.tar"
    good = encode_jpeg(photos[0])
    truncated = good[: len(good) // 3]
    extra = [("broken.jpg", truncated), ("broken.txt", b"still here"), ("garbage.png", b"\x89PNG nope")]
    members = make_shard(shard, photos[:1], degraded=False, extra=extra)
    run_cli(["filter", shard, "--out", tmp_path / "out", "-d", "nss", "--threshold", "1e9",
             "--workers", "1", "-q"])
    scores = pd.read_parquet(tmp_path / "out/scores/s.parquet").set_index("key")
    assert scores.loc["broken", "reason"] == "decode_error"
    assert scores.loc["garbage", "reason"] == "decode_error"
    assert np.isnan(scores.loc["broken", "score"]) and "broken.jpg" in scores.loc["broken", "error"]
    rej = read_members(tmp_path / "out/rejected/s.tar")
    assert ("broken.jpg", truncated) in rej and ("broken.txt", b"still here") in rej
    kept = read_members(tmp_path / "out/kept/s.tar")
    assert collections.Counter(members) == collections.Counter(kept + rej)


def test_samples_without_images_kept_or_rejected_by_flag(tmp_path, photos):
    shard = tmp_path / "s.tar"
    make_shard(shard, photos[:1], degraded=False, extra=[("cap.txt", b"a caption"), ("meta.json", b"{}")])
    run_cli(["filter", shard, "--out", tmp_path / "a", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    a = pd.read_parquet(tmp_path / "a/scores/s.parquet").set_index("key")
    assert (a.loc[["cap", "meta"], "decision"] == "kept").all()
    assert (a.loc[["cap", "meta"], "reason"] == "no_image").all()
    run_cli(["filter", shard, "--out", tmp_path / "b", "-d", "nss", "--threshold", "1e9", "-w", "1",
             "-q", "--reject-no-image"])
    b = pd.read_parquet(tmp_path / "b/scores/s.parquet").set_index("key")
    assert (b.loc[["cap", "meta"], "decision"] == "rejected").all()
    assert ("cap.txt", b"a caption") in read_members(tmp_path / "b/rejected/s.tar")


def test_unsafe_member_names_are_cleaned_and_set_aside(tmp_path, photos):
    shard = tmp_path / "s.tar"
    img = encode_jpeg(photos[1])
    make_shard(shard, photos[:1], degraded=False,
               extra=[("../../etc/evil.jpg", img), ("/abs/path.txt", b"abs"), ("a/./b/../c.txt", b"c")])
    run_cli(["filter", shard, "--out", tmp_path / "out", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    names = [n for n, _ in read_members(tmp_path / "out/kept/s.tar") + read_members(tmp_path / "out/rejected/s.tar")]
    assert all(not n.startswith("/") and ".." not in n.split("/") and "." not in n.split("/") for n in names)
    assert "etc/evil.jpg" in names and "abs/path.txt" in names
    scores = pd.read_parquet(tmp_path / "out/scores/s.parquet").set_index("key")
    assert scores.loc["etc/evil", "reason"] == "unsafe_name"
    assert "../../etc/evil.jpg" in scores.loc["etc/evil", "error"]
    # nothing was written outside the output folder
    assert not (tmp_path / "etc").exists() and not Path("/abs/path.txt").exists()


def test_brace_patterns_expand_and_filter_many_shards(tmp_path, photos):
    d = tmp_path / "data"
    d.mkdir()
    for s in range(3):
        make_shard(d / f"shard-{s:03d}.tar", photos[:1], start=s * 10)
    assert expand_pattern(str(d / "shard-{000..002}.tar")) == [str(d / f"shard-{s:03d}.tar") for s in range(3)]
    assert expand_pattern("x-{a,b}-{1..2}") == ["x-a-1", "x-a-2", "x-b-1", "x-b-2"]
    with pytest.raises(InputError):
        expand_inputs([str(d / "missing-{0..1}.tar")])
    t = threshold_between(photos[:1])
    run_cli(["filter", str(d / "shard-{000..002}.tar"), "--out", tmp_path / "out", "-d", "nss",
             "--threshold", t, "--workers", "2", "-q"])
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["shards"] == 3 and summary["samples"] == 6 and summary["rejected"] == 3
    assert sorted(p.name for p in (tmp_path / "out/kept").iterdir()) == [f"shard-{s:03d}.tar" for s in range(3)]


def test_failed_shard_is_named_and_others_complete(tmp_path, photos):
    good = tmp_path / "good.tar"
    make_shard(good, photos[:1], degraded=False)
    bad = tmp_path / "bad.tar"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # truncated mid-member
    res = run_cli(["filter", good, bad, "--out", tmp_path / "out", "-d", "nss", "--threshold", "1e9",
                   "-w", "1", "-q"], expect=1)
    assert "bad.tar" in res.output
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["shards_failed"] == [str(bad)]
    assert (tmp_path / "out/kept/good.tar").exists() and not (tmp_path / "out/kept/bad.tar").exists()


def test_shard_name_clash_and_changed_settings_are_refused(tmp_path, photos):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        make_shard(tmp_path / sub / "s.tar", photos[:1], degraded=False)
    res = run_cli(["filter", tmp_path / "a/s.tar", tmp_path / "b/s.tar", "--out", tmp_path / "o",
                   "-d", "nss", "--threshold", "1", "-q"], expect=1)
    assert "share the name" in res.output
    # the same stem: the same scores/ and .done/ names
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "s.tar").write_bytes((tmp_path / "a" / "s.tar").read_bytes())
    (tmp_path / "c" / "s.tgz").write_bytes(gzip.compress((tmp_path / "b" / "s.tar").read_bytes()))
    res = run_cli(["filter", tmp_path / "c", "--out", tmp_path / "o2", "-d", "nss", "--threshold", "1", "-q"],
                  expect=1)
    assert "share the stem 's'" in res.output and not (tmp_path / "o2" / "scores").exists()
    run_cli(["filter", tmp_path / "a/s.tar", "--out", tmp_path / "o", "-d", "nss", "--threshold", "1",
             "-w", "1", "-q"])
    res = run_cli(["filter", tmp_path / "a/s.tar", "--out", tmp_path / "o", "-d", "nss",
                   "--threshold", "2", "-w", "1", "-q"], expect=1)
    assert "--overwrite" in res.output
    run_cli(["filter", tmp_path / "a/s.tar", "--out", tmp_path / "o", "-d", "nss", "--threshold", "2",
             "-w", "1", "-q", "--overwrite"])
    # another shard of the same name is not silently written over the first one's outputs
    res = run_cli(["filter", tmp_path / "b/s.tar", "--out", tmp_path / "o", "-d", "nss",
                   "--threshold", "2", "-w", "1", "-q"], expect=1)
    assert "from another shard" in res.output


def test_resume_does_not_depend_on_how_the_shard_path_is_spelled(tmp_path, photos, monkeypatch):
    make_shard(tmp_path / "s.tar", photos[:1], degraded=False)
    args = ["--out", tmp_path / "o", "-d", "nss", "--threshold", "1", "-w", "1", "-q"]
    run_cli(["filter", tmp_path / "s.tar", *args])
    first = (tmp_path / "o/kept/s.tar").stat().st_mtime_ns
    monkeypatch.chdir(tmp_path)
    run_cli(["filter", "./s.tar", *args])
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert summary["per_shard"][0]["status"] == "resumed" and summary["per_shard"][0]["shard"] == "./s.tar"
    assert (tmp_path / "o/kept/s.tar").stat().st_mtime_ns == first
    res = run_cli(["filter", "s.tar", *args[:-5], "--threshold", "2", "-w", "1", "-q"], expect=1)
    assert "other settings" in res.output


def test_out_inside_an_input_folder_is_refused(tmp_path, photos):
    d = tmp_path / "data"
    d.mkdir()
    make_shard(d / "s.tar", photos[:1], degraded=False)
    res = run_cli(["filter", d, "--out", d / "filtered", "-d", "nss", "--threshold", "1", "-q"], expect=1)
    assert "inside the input folder" in res.output and not (d / "filtered").exists()


def test_drop_fraction_drops_the_top_scores(tmp_path, photos):
    shard = tmp_path / "s.tar"
    good = encode_jpeg(photos[0])
    make_shard(shard, photos, extra=[("broken.jpg", good[: len(good) // 3])])  # 8 images + 1 undecodable
    run_cli(["filter", shard, "--out", tmp_path / "out", "-d", "nss", "--drop-fraction", "0.25",
             "-w", "1", "-q"])
    scores = pd.read_parquet(tmp_path / "out/scores/s.parquet")
    rejected = scores[scores.decision == "rejected"]
    assert rejected["reason"].tolist().count("decode_error") == 1
    by_score = rejected[rejected.reason != "decode_error"]
    assert len(by_score) == 2
    assert by_score.score.min() > scores[scores.decision == "kept"].score.max()
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["threshold_source"].startswith("uncalibrated")
    # the label counts the scores the cut was taken from, not the undecodable sample
    assert "from 8 scores, 1 sample(s) without a score left out" in summary["threshold_source"]
    # every bookkeeping entry the run leaves in --out (.prepass/ among them) is in the reference
    reference = (Path(__file__).resolve().parents[2] / "docs" / "REFERENCE.md").read_text(encoding="utf-8")
    hidden = sorted(p.name + ("/" if p.is_dir() else "") for p in (tmp_path / "out").glob(".*"))
    assert ".prepass/" in hidden
    assert [h for h in hidden if f"`filtered/{h}`" not in reference] == []


def test_drop_fraction_cuts_again_only_its_own_splits(tmp_path, photos):
    """A repeated ``--drop-fraction`` run with another fraction splits its shards again from the
    kept scores; a shard a plain ``--threshold`` run split in that ``--out`` is still refused,
    naming the difference, and so is a scoring pass whose record is gone."""
    from collapseguard.filter.pipeline import FilterOptions, ShardChangedError, process_shard

    shard = tmp_path / "s.tar"
    make_shard(shard, photos)
    args = [shard, "-d", "nss", "-w", "1", "-q"]
    run_cli(["filter", *args, "--out", tmp_path / "a", "--drop-fraction", "0.25"])
    run_cli(["filter", *args, "--out", tmp_path / "a", "--drop-fraction", "0.5"])
    scores = pd.read_parquet(tmp_path / "a/scores/s.parquet")
    assert (scores.decision == "rejected").sum() == len(scores) // 2  # split by the new cut
    run_cli(["filter", *args, "--out", tmp_path / "b", "--threshold", "0"])
    res = run_cli(["filter", *args, "--out", tmp_path / "b", "--drop-fraction", "0.25"], expect=1)
    assert "with other settings (threshold" in res.output
    (tmp_path / "a/.prepass/.done/s.json").unlink()
    opts = FilterOptions(out_dir=str(tmp_path / "c"), detector="nss", threshold=1.0,
                         scores_from=str(tmp_path / "a/.prepass"))
    with pytest.raises(ShardChangedError, match="the scoring pass left no record of it"):
        process_shard(str(shard), opts)


def _all_outputs(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for sub in ("kept", "rejected", "scores")
            for p in sorted((out / sub).glob("*")) if not p.name.endswith(".tmp")}


def test_killed_run_resumes_to_identical_outputs(tmp_path):
    from skimage import data
    big = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()] * 2
    d = tmp_path / "data"
    d.mkdir()
    for s in range(3):
        make_shard(d / f"shard-{s}.tar", big, start=s * 100)
    cmd = [sys.executable, "-m", "collapseguard.cli", "filter", str(d / "shard-{0..2}.tar"),
           "-d", "nss", "--threshold", "3.2", "--workers", "1", "--batch-size", "1", "-q"]
    ref = tmp_path / "ref"
    subprocess.run(cmd + ["--out", str(ref)], check=True)
    out = tmp_path / "out"
    proc = subprocess.Popen(cmd + ["--out", str(out)], start_new_session=True)
    deadline = time.time() + 120
    # kill once the second shard is being written: one shard complete, one mid-way
    while time.time() < deadline:
        if (out / ".done/shard-0.json").exists() and list((out / "kept").glob("shard-1.tar*.tmp")):
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / ".done/shard-2.json").exists(), "run finished before it could be killed"
    assert list((out / "kept").glob("*.tmp")), "expected a partial shard at the kill"
    subprocess.run(cmd + ["--out", str(out)], check=True)
    assert _all_outputs(out) == _all_outputs(ref)
    summary = json.loads((out / "summary.json").read_text())
    statuses = {Path(s["shard"]).name: s["status"] for s in summary["per_shard"]}
    assert statuses["shard-0.tar"] == "resumed" and statuses["shard-2.tar"] == "done"


def test_score_command_files_folders_shards(tmp_path, photos):
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.png").write_bytes(encode_png(photos[0]))
    (folder / "sub" / "b.jpg").write_bytes(encode_jpeg(photos[1]))
    (folder / "sub" / "broken.jpg").write_bytes(b"not a jpeg")
    single = tmp_path / "single.jpg"
    single.write_bytes(encode_jpeg(photos[2]))
    # a sample of two images, one undecodable: a decode error for the sample
    make_shard(tmp_path / "s-0.tar", photos[:1], extra=[("pair.jpg", encode_jpeg(photos[3])),
                                                        ("pair.png", b"not a png")])
    for out in ("scores.csv", "scores.parquet"):
        res = run_cli(["score", folder, single, str(tmp_path / "s-{0..0}.tar"), "-d", "nss", "--out",
                       tmp_path / out, "-q"])
    assert "scored 5 row(s), 2 without a score" in res.output  # rows: 4 files and 3 samples
    from collapseguard.commands.score import count_line
    partial = pd.DataFrame({"score": [1.0, np.nan, 2.0, np.inf], "error": ["", "x", "y", ""]})
    assert count_line(partial) == "scored 3 row(s) (1 with an error beside the score), 1 without a score"
    csv = pd.read_csv(tmp_path / "scores.csv", keep_default_na=False)
    pq = pd.read_parquet(tmp_path / "scores.parquet")
    assert list(csv.key) == list(pq.key)
    for col in ("source", "key", "score", "detector", "detector_version", "error"):
        assert col in csv.columns
    keys = set(csv.key)
    assert {"a.png", "sub/b.jpg", "sub/broken.jpg", "single.jpg", "s-0_0000_0", "s-0_0000_1"} <= keys
    broken = pq.set_index("key").loc["sub/broken.jpg"]
    assert np.isnan(broken.score) and broken.error
    ok = pq[pq.error == ""]
    assert len(ok) == 5 and np.isfinite(ok.score).all()
    assert (pq.detector == "nss").all()
    # how each scored image is stored, read from its header (make_shard writes 4:2:0 JPEG members)
    storage = dict(zip(csv.key, csv.storage))
    assert storage["a.png"] == "png" and storage["sub/b.jpg"] == storage["single.jpg"] == "jpeg 4:2:0"
    assert storage["s-0_0000_0"] == "jpeg 4:2:0" and storage["sub/broken.jpg"] == ""


def test_image_storage_reads_format_and_chroma_subsampling(photos):
    import io

    from PIL import Image

    from collapseguard.images import image_storage

    def encoded(fmt, mode="RGB", **kw):
        buf = io.BytesIO()
        Image.fromarray(photos[0]).convert(mode).save(buf, format=fmt, **kw)
        return buf.getvalue()

    assert image_storage(encode_png(photos[0])) == "png"
    assert image_storage(encode_jpeg(photos[0], 95)) == "jpeg 4:2:0"  # Pillow's default
    assert image_storage(encoded("JPEG", quality=95, subsampling=0)) == "jpeg 4:4:4"
    assert image_storage(encoded("JPEG", quality=95, subsampling=1)) == "jpeg 4:2:2"
    assert image_storage(encoded("JPEG", mode="L")) == "jpeg gray"
    assert image_storage(encoded("WEBP")) == "webp"
    good = encode_jpeg(photos[0])
    # the header alone decides: a truncated JPEG still reads as one (decoding reports the damage)
    assert image_storage(good[: len(good) // 3]) == "jpeg 4:2:0"
    assert image_storage(b"not an image") == image_storage(b"") == ""


def test_filter_scores_record_storage(tmp_path, photos):
    shard = tmp_path / "s.tar"
    make_shard(shard, photos[:1], degraded=False, extra=[("p.png", encode_png(photos[1])),
                                                        ("cap.txt", b"no image here")])
    run_cli(["filter", shard, "--out", tmp_path / "out", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    scores = pd.read_parquet(tmp_path / "out/scores/s.parquet").set_index("key")
    assert scores.loc["p", "storage"] == "png" and scores.loc["s_0000_0", "storage"] == "jpeg 4:2:0"
    assert scores.loc["cap", "storage"] == ""
    assert set(scores["storage"]) == {"png", "jpeg 4:2:0", ""}


def test_no_rejected_and_dry_run_write_only_what_they_say(tmp_path, photos):
    make_shard(tmp_path / "s.tar", photos[:1])
    t = threshold_between(photos[:1])
    res = run_cli(["filter", tmp_path / "s.tar", "--out", tmp_path / "a", "-d", "nss", "--threshold", t,
                   "-w", "1", "--no-rejected"])
    assert "outputs:" in res.output and "/kept" in res.output  # the summary is printed
    assert not (tmp_path / "a/rejected").exists() and "/rejected" not in res.output
    assert len(read_members(tmp_path / "a/kept/s.tar")) == 3  # the clean sample's three files
    assert pd.read_parquet(tmp_path / "a/scores/s.parquet")["decision"].tolist() == ["kept", "rejected"]
    res = run_cli(["filter", tmp_path / "s.tar", "--out", tmp_path / "b", "-d", "nss", "--threshold", t,
                   "-w", "1", "--dry-run"])
    assert not (tmp_path / "b/kept").exists() and not (tmp_path / "b/rejected").exists()
    assert "/kept" not in res.output and (tmp_path / "b/scores/s.parquet").exists()


def test_score_refuses_nothing_to_score_and_an_unwritable_out_before_scoring(tmp_path, photos):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    res = run_cli(["score", tmp_path / "empty", "-d", "nss", "-q", "--out", tmp_path / "s.csv"], expect=1)
    assert "no image files or .tar shards" in res.output and ".tar.gz" in res.output
    make_shard(tmp_path / "s.tar", photos[:1])
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "sub").write_text("a file where a folder is needed")
    res = run_cli(["score", tmp_path / "s.tar", "-d", "nss", "-q", "--out", tmp_path / "ro/sub/x.csv"], expect=1)
    assert "cannot write" in res.output or "Not a directory" in res.output
    assert "Traceback" not in res.output
    for workers in ("1", "2"):  # a bad spec is one line before any worker starts, and writes nothing
        res = run_cli(["score", tmp_path / "s.tar", "-d", f"cnn:{tmp_path}/none.safetensors", "-w", workers,
                       "-q", "--out", tmp_path / f"bad{workers}.csv"], expect=1)
        assert "Traceback" not in res.output and "BrokenProcessPool" not in res.output
        assert "none.safetensors" in res.output and not (tmp_path / f"bad{workers}.csv").exists()


def test_an_image_the_detector_cannot_score_is_named_in_its_samples_error(photos):
    # a user's plugin detector (any Detector subclass) that cannot score images under 32 px
    from collapseguard.detectors import Detector
    from collapseguard.images import encode_png
    from collapseguard.scoring.records import score_records

    class MinSide(Detector):
        name, version = "minside", "1"

        def score(self, images):
            return np.array([np.nan if min(a.shape[:2]) < 32 else float(a.mean()) for a in images], np.float32)

    big, tiny = encode_png(photos[0][:64, :64]), encode_png(photos[0][:8, :8])
    records = [[("a.png", big), ("b.png", tiny)], [("c.png", tiny)], [("d.png", big)]]
    out = [s for _, s in score_records(records, MinSide())]
    assert out[0].status == "ok" and out[0].image == "a.png" and np.isfinite(out[0].score)
    assert out[0].error == "b.png: minside could not score it"  # scored by a.png alone, and says so
    assert out[1].status == "score_error" and "could not score" in out[1].error
    assert out[2].status == "ok" and out[2].error == ""


def test_score_an_image_named_twice_is_one_row(tmp_path, photos, monkeypatch):
    # the same file (repeated, respelled, or also inside a folder given) and a shard given twice
    # are scored once, under their first name: no repeated (source, key) rows
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "a.png").write_bytes(encode_png(photos[0]))
    (folder / "b.png").write_bytes(encode_png(photos[1]))
    make_shard(tmp_path / "s.tar", photos[:1])
    monkeypatch.chdir(tmp_path)
    run_cli(["score", "imgs/a.png", "imgs/./a.png", tmp_path / "imgs/a.png", "imgs", "imgs",
             "s.tar", "./s.tar", "-d", "nss", "--out", "scores.csv", "-q"])
    df = pd.read_csv(tmp_path / "scores.csv", keep_default_na=False)
    assert not df.duplicated(["source", "key"]).any()
    assert sorted(df.key) == ["a.png", "b.png", "s_0000_0", "s_0000_1"]
    assert df.set_index("key").loc["a.png", "source"] == "imgs/a.png"  # its first name


def test_score_names_the_os_error_of_a_file_it_cannot_read(tmp_path, photos):
    d = tmp_path / "imgs"
    d.mkdir()
    (d / "ok.png").write_bytes(encode_png(photos[0]))
    (d / "gone.png").symlink_to(tmp_path / "missing.png")  # a broken link
    run_cli(["score", d, "--out", tmp_path / "s.csv", "-d", "nss", "-q"])
    rows = pd.read_csv(tmp_path / "s.csv").set_index("key")
    assert np.isfinite(rows.loc["ok.png", "score"]) and np.isnan(rows.loc["gone.png", "score"])
    assert f"cannot read the file: a broken link (to {tmp_path / 'missing.png'})" in rows.loc["gone.png", "error"]


def test_files_named_like_urls_in_the_current_folder_are_read_as_files(tmp_path, photos, monkeypatch):
    """``score .``, ``filter .`` and ``calibrate --clean .`` where the folder holds ``pipe:x.png``,
    ``file:y.png`` and ``pipe:s.tar``: files found in a folder are files, never commands or URLs."""
    for name in ("pipe:x.png", "file:y.png", "ok.png"):
        (tmp_path / name).write_bytes(encode_png(photos[0][:64, :64]))
    make_shard(tmp_path / "pipe:s.tar", photos[:1], degraded=False)
    monkeypatch.chdir(tmp_path)
    run_cli(["score", ".", "-d", "nss", "-o", tmp_path.parent / "s.csv", "-q"])
    t = pd.read_csv(tmp_path.parent / "s.csv", keep_default_na=False)
    assert sorted(t["key"]) == ["file:y.png", "ok.png", "pipe:s_0000_0", "pipe:x.png"]
    assert (t["error"] == "").all() and t["score"].nunique() == 2
    run_cli(["filter", ".", "-o", tmp_path.parent / "f", "-d", "nss", "--threshold", "1e9", "-q", "-w", "1"])
    assert read_members(tmp_path.parent / "f" / "kept" / "pipe:s.tar") == read_members(tmp_path / "pipe:s.tar")
    res = run_cli(["calibrate", "--clean", ".", "-d", "nss", "--max-false-drop", "0.5", "--confidence", "0.5",
                   "--holdout", "0", "--no-plot", "-o", tmp_path.parent / "c.json",
                   "--scores-out", tmp_path.parent / "c.csv"])
    c = pd.read_csv(tmp_path.parent / "c.csv")
    assert len(c) == 4 and c["score"].notna().all(), res.output


#: seconds ``_slow_brightness`` takes per image: it cannot score faster than 1 / SLOW images/s
SLOW = 0.05


def _slow_brightness():
    """Mean brightness, taking at least ``SLOW`` seconds per image."""
    from collapseguard.detectors.base import Detector

    class SlowBrightness(Detector):
        name = "test-slow-brightness"
        version = "1"

        def score(self, images):
            time.sleep(SLOW * len(images))
            return np.array([im.mean() for im in images], dtype=np.float32)
    return SlowBrightness()


def test_drop_fraction_reports_a_speed_only_for_images_scored_in_the_run(tmp_path, photos):
    from collapseguard.detectors.base import register

    register("test-slow-brightness", _slow_brightness)
    shard, out = tmp_path / "s.tar", tmp_path / "out"
    make_shard(shard, photos)  # 8 images
    args = ["filter", shard, "--out", out, "-d", "test-slow-brightness", "--drop-fraction", "0.25",
            "-w", "1"]
    res = run_cli(args)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejected"] == 2 and summary["images_this_run"] == 8
    # the images were scored in the first pass, at no more than 1 / SLOW images/s: the deciding
    # pass, which only copies bytes, must not make the run look faster than that
    assert 0 < summary["images_per_second"] <= 1 / SLOW
    assert f"speed: {summary['images_per_second']:.1f} images/s" in res.output
    # a run stopped between the passes, resumed: the scores are reused, no image is scored, and
    # no speed is claimed
    (out / ".done" / "s.json").unlink()
    res = run_cli(args)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["per_shard"][0]["status"] == "done" and summary["rejected"] == 2
    assert summary["images_this_run"] == 0 and summary["images_per_second"] is None
    assert "speed:" not in res.output


def test_a_shard_replaced_with_the_same_size_and_mtime_is_filtered_again_and_a_copy_is_not(tmp_path, photos):
    """Resume compares more than size and mtime: another shard of the same size written with the
    first one's mtime (``cp -p`` of a regenerated shard) is filtered anew; a copy of the same
    bytes (another inode) resumes, its bytes checked against the marker's SHA-256."""
    shard = tmp_path / "s.tar"
    make_shard(shard, photos[:2], degraded=False)
    args = ["--out", tmp_path / "o", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"]
    run_cli(["filter", shard, *args])
    st = shard.stat()
    (tmp_path / "new").mkdir()
    other = tmp_path / "new" / "s.tar"
    members = make_shard(other, photos[:2], degraded=False, start=5)  # other keys, same lengths
    assert other.stat().st_size == st.st_size  # tar sizes come in 10 KiB steps
    os.replace(other, shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    run_cli(["filter", shard, *args])
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert summary["per_shard"][0]["status"] == "done"
    assert sorted(read_members(tmp_path / "o/kept/s.tar")) == sorted(members)
    copy = tmp_path / "copy.tar"
    copy.write_bytes(shard.read_bytes())
    os.replace(copy, shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    run_cli(["filter", shard, *args])
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert summary["per_shard"][0]["status"] == "resumed"


def test_drop_fraction_counts_every_image_of_a_sample(tmp_path, photos):
    import tarfile

    from cg_testutil import add_member

    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for s in range(4):
            for j in range(3):
                add_member(tf, f"k{s}.{j}.png", encode_png(photos[(s + j) % len(photos)][:64, :64]))
    for how in (["--threshold", "1e9"], ["--drop-fraction", "0.25"]):
        out = tmp_path / ("o" + how[0])
        run_cli(["filter", tmp_path / "s.tar", "--out", out, "-d", "nss", *how, "-w", "1", "-q"])
        summary = json.loads((out / "summary.json").read_text())
        assert summary["per_shard"][0]["images"] == 12, how


def test_a_shard_whose_name_looks_like_a_pattern_is_that_shard(tmp_path, photos):
    """``part[1].tar`` exists: it is filtered, not ``part1.tar`` (which the glob would match)."""
    a = make_shard(tmp_path / "part[1].tar", photos[:1], degraded=False)
    make_shard(tmp_path / "part1.tar", photos[1:2], degraded=False)
    assert expand_pattern(str(tmp_path / "part[1].tar")) == [str(tmp_path / "part[1].tar")]
    run_cli(["filter", tmp_path / "part[1].tar", "--out", tmp_path / "o", "-d", "nss", "--threshold", "1e9",
             "-w", "1", "-q"])
    assert sorted(read_members(next((tmp_path / "o/kept").glob("*.tar")))) == sorted(a)
