"""The filter on runs that go wrong: outputs that would overwrite inputs, two runs on one --out,
resume after the shard or the detector changed, a worker that dies, paths relative to a cwd."""

from __future__ import annotations

import fcntl
import json
import os

import pandas as pd
import pytest
from cg_testutil import echo_or_die, make_shard, run_cli

from collapseguard.engines.local import LocalEngine

ARGS = ["-d", "nss", "-w", "1", "-q"]


def test_a_shard_in_outs_kept_folder_is_refused_and_left_intact(tmp_path, photos):
    make_shard(tmp_path / "s.tar", photos[:1], degraded=False)
    run_cli(["filter", tmp_path / "s.tar", "--out", tmp_path / "data", "--threshold", "1e9", *ARGS])
    kept = tmp_path / "data/kept/s.tar"
    before = kept.read_bytes()
    # re-filtering the kept folder into the same --out would write kept/s.tar over its own input
    res = run_cli(["filter", tmp_path / "data/kept", "--out", tmp_path / "data", "--threshold", "1",
                   *ARGS], expect=1)
    assert "where this run writes its outputs" in res.output
    assert kept.read_bytes() == before


def test_one_shard_given_twice_is_filtered_once(tmp_path, photos, monkeypatch):
    make_shard(tmp_path / "s.tar", photos[:2])
    monkeypatch.chdir(tmp_path)
    run_cli(["filter", "s.tar", "./s.tar", tmp_path / "s.tar", "--out", "o", "--threshold", "1e9", *ARGS])
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert summary["shards"] == 1 and summary["samples"] == 4


def test_a_shard_changed_since_it_was_filtered_is_filtered_again(tmp_path, photos):
    shard = tmp_path / "s.tar"
    make_shard(shard, photos[:1])
    args = ["filter", shard, "--out", tmp_path / "o", "--threshold", "1e9", *ARGS]
    run_cli(args)
    make_shard(shard, photos[:3])  # same path, new contents
    os.utime(shard, ns=(1, 1))  # and an mtime that cannot match the first run's
    run_cli(args)
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert summary["per_shard"][0]["status"] == "done" and summary["samples"] == 6
    assert len(pd.read_parquet(tmp_path / "o/scores/s.parquet")) == 6
    run_cli(args)  # unchanged now: resumed
    assert json.loads((tmp_path / "o/summary.json").read_text())["per_shard"][0]["status"] == "resumed"


def test_shards_left_from_an_earlier_run_with_other_settings_are_named(tmp_path, photos):
    """--overwrite over one shard with a new threshold: the other shards of --out keep what the
    earlier threshold made; the run says so and summary.json lists them, and a resume with
    matching settings says nothing."""
    for s in range(3):
        make_shard(tmp_path / f"m-{s}.tar", photos[:1], start=10 * s)
    out = tmp_path / "o"
    run_cli(["filter", *(tmp_path / f"m-{s}.tar" for s in range(3)), "--out", out, "--threshold", "1e9", *ARGS])
    res = run_cli(["filter", tmp_path / "m-0.tar", "--out", out, "--overwrite", "--threshold", "-1e9", *ARGS])
    assert "2 other shard(s)" in res.output and "threshold 1000000000.0 there" in res.output, res.output
    assert json.loads((out / "summary.json").read_text())["other_settings_shards"] == ["m-1", "m-2"]
    res = run_cli(["filter", tmp_path / "m-1.tar", "--out", out, "--threshold", "1e9", *ARGS])
    assert json.loads((out / "summary.json").read_text())["other_settings_shards"] == ["m-0"]
    assert "1 other shard(s)" in res.output


def test_a_shard_completed_by_another_detector_version_is_refused(tmp_path, photos):
    shard = tmp_path / "s.tar"
    make_shard(shard, photos[:1])
    args = ["filter", shard, "--out", tmp_path / "o", "--threshold", "1e9", *ARGS]
    run_cli(args)
    marker = tmp_path / "o/.done/s.json"
    rec = json.loads(marker.read_text())
    assert rec["detector_version"]
    marker.write_text(json.dumps({**rec, "detector_version": "older-weights"}))
    res = run_cli(args, expect=1)
    assert "detector version older-weights" in res.output and "--overwrite" in res.output
    run_cli([*args, "--overwrite"])
    assert json.loads(marker.read_text())["detector_version"] == rec["detector_version"]


def test_drop_fraction_reads_only_this_runs_scores(tmp_path, photos):
    for name in ("a", "b"):
        make_shard(tmp_path / f"{name}.tar", photos)  # 8 samples each
    out = tmp_path / "o"
    run_cli(["filter", tmp_path / "a.tar", "--out", out, "--drop-fraction", "0.5", *ARGS])
    # a.tar's scores stay in o/.prepass; a run on b.tar alone must cut at b's own median
    run_cli(["filter", tmp_path / "b.tar", "--out", out, "--drop-fraction", "0.25", *ARGS])
    summary = json.loads((out / "summary.json").read_text())
    assert "from 8 scores" in summary["threshold_source"]
    assert summary["rejected"] == 2


def test_a_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path, photos):
    make_shard(tmp_path / "s.tar", photos[:1])
    out = tmp_path / "o"
    out.mkdir()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running filter holds it
        res = run_cli(["filter", tmp_path / "s.tar", "--out", out, "--threshold", "1", *ARGS], expect=1)
        assert "another filter run is writing to" in res.output
        assert not (out / "kept").exists()
    finally:
        os.close(fd)
    run_cli(["filter", tmp_path / "s.tar", "--out", out, "--threshold", "1", *ARGS])


def test_an_out_that_cannot_be_created_is_a_one_line_error(tmp_path, photos):
    make_shard(tmp_path / "s.tar", photos[:1])
    (tmp_path / "file").write_text("x")
    res = run_cli(["filter", tmp_path / "s.tar", "--out", tmp_path / "file/sub", "--threshold", "1",
                   *ARGS], expect=1)
    assert "cannot write to --out" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("entry", ["kept", "rejected", ".done", "summary.json", "orphan_rows"])
def test_out_entries_of_the_wrong_type_are_one_line_before_any_work(tmp_path, photos, entry):
    """``kept`` a regular file inside --out (or ``.done`` a broken link, ``summary.json`` a folder):
    one line naming it and what it is, before any shard is read; the entry is left as it was."""
    make_shard(tmp_path / "s.tar", photos[:1])
    out = tmp_path / "out"
    out.mkdir()
    if entry == "summary.json":
        (out / entry).mkdir()
        what = "is a folder"
    elif entry == ".done":
        (out / entry).symlink_to(tmp_path / "gone")
        what = "is a broken link"
    else:
        (out / entry).write_text("a file the user keeps here\n")
        what = "is a regular file"
    res = run_cli(["filter", tmp_path / "s.tar", "--out", out, "--threshold", "1", *ARGS], expect=1)
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and f"{entry} {what}" in lines[0], res.output
    assert "Traceback" not in res.output and "NotADirectoryError" not in res.output
    assert not (out / "scores").exists() and not (out / "summary.json").is_file()
    if what == "is a regular file":
        assert (out / entry).read_text() == "a file the user keeps here\n"


@pytest.mark.parametrize("tasks", [["a", "die", "b", "c", "d"], ["die", "die", "a"]])
def test_a_dead_worker_fails_only_its_own_task(tasks):
    got = {}
    LocalEngine(workers=2).run(echo_or_die, tasks, "nss", (), None,
                               lambda i, res, err: got.setdefault(i, (res, err)))
    assert sorted(got) == list(range(len(tasks)))
    for i, t in enumerate(tasks):
        res, err = got[i]
        if t == "die":
            assert res is None and "worker process died" in err
        else:
            assert (res, err) == (t, None)


@pytest.mark.parametrize("entry", ["kept", "rejected", "scores", "orphan_rows"])
def test_an_out_folder_that_links_to_the_inputs_folder_is_refused_before_anything_is_removed(
        tmp_path, photos, entry):
    """--out/kept (or any folder the run writes) a link to the inputs' own folder: the run would
    remove the shard's earlier outputs there, which are the input and its sidecars, then fail
    with every sample in no output. Refused in one line, and every input file is untouched."""
    data = tmp_path / "data"
    data.mkdir()
    make_shard(data / "s0.tar", photos[:2])
    (data / "s0_stats.json").write_text('{"count": 2}')
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    out = tmp_path / "out"
    out.mkdir()
    (out / entry).symlink_to(data, target_is_directory=True)
    res = run_cli(["filter", data / "s0.tar", "--out", out, "--threshold", "1e9", *ARGS], expect=1)
    assert f"lies in {out}/{entry} (a link to {data})" in res.output and "Traceback" not in res.output
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before
    # a link to a folder elsewhere (another disk) is a place to write, as before
    (out / entry).unlink()
    (tmp_path / "elsewhere").mkdir()
    (out / entry).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    run_cli(["filter", data / "s0.tar", "--out", out, "--threshold", "1e9", *ARGS])
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before


@pytest.mark.parametrize("link", ["part2", "part2.tar"])
def test_a_folder_the_input_holds_and_cannot_be_read_is_refused_not_skipped(tmp_path, photos, link):
    # data/part2 links to a folder (or part2.tar to a shard) that moved away (an unmounted disk):
    # its shards cannot be read, and a run that went on would filter the others first and fail
    # late, or report every sample filtered while part2's are in no output
    data = tmp_path / "data"
    data.mkdir()
    make_shard(data / "s.tar", photos[:1])
    (tmp_path / "disk").mkdir()
    make_shard(tmp_path / "disk/t.tar", photos[1:2])
    (data / link).symlink_to(tmp_path / "disk" / ("t.tar" if link.endswith(".tar") else ""))
    (tmp_path / "disk").rename(tmp_path / "unmounted")
    res = run_cli(["filter", data, "--out", tmp_path / "o", "--threshold", "1e9", *ARGS], expect=1)
    assert link in res.output and "broken link" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o/summary.json").exists() and not (tmp_path / "o/kept").exists()


def test_loose_images_beside_the_shards_are_counted_and_named_not_skipped_silently(tmp_path, photos):
    """filter reads shards: a loose image in the input folder is in no output, so the summary
    counts it and the run says so, even with -q."""
    from PIL import Image

    (tmp_path / "in").mkdir()
    make_shard(tmp_path / "in/s.tar", photos[:1], degraded=False)
    Image.fromarray(photos[1]).save(tmp_path / "in/photo.jpg")
    res = run_cli(["filter", tmp_path / "in", "--out", tmp_path / "o", "--threshold", "1e9", *ARGS])
    assert "1 loose image file(s)" in res.output and "photo.jpg" in res.output
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert summary["loose_files_not_filtered"] == 1 and summary["loose_file_example"].endswith("photo.jpg")
    assert summary["samples"] == 1


def test_a_loose_image_named_twice_is_counted_once(tmp_path, photos):
    from PIL import Image

    (tmp_path / "in").mkdir()
    make_shard(tmp_path / "in/s.tar", photos[:1], degraded=False)
    Image.fromarray(photos[1]).save(tmp_path / "in/photo.jpg")
    run_cli(["filter", tmp_path / "in", tmp_path / "in/photo.jpg", "--out", tmp_path / "o",
             "--threshold", "1e9", *ARGS])
    assert json.loads((tmp_path / "o/summary.json").read_text())["loose_files_not_filtered"] == 1


def test_a_settings_diff_names_a_left_out_setting_by_its_default():
    """A fingerprint leaves --drop-duplicates out when it is off: a resume refused over it says
    False there, not '(unset)'."""
    from collapseguard.filter.run import settings_diff

    said = settings_diff({"threshold": 1.0, "groups_digest": "ab"},
                         {"threshold": 1.0, "groups_digest": "ab", "drop_duplicates": True})
    assert said == "drop_duplicates False there, True now"
    assert "'(found)' there" in settings_diff({"threshold": 1.0}, {"threshold": 1.0, "image_column": "png"})
