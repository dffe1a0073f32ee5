"""img2dataset / DataComp layouts: a shard's parquet and stats sidecars follow its samples into
kept/ and rejected/, and --reshard rewrites the kept samples into even shards."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from cg_testutil import degrade, make_shard, read_members, run_cli

from collapseguard.detectors import create


def img2dataset_shard(folder, index: int, photos, failed: int = 2):
    """An img2dataset-style shard: NNNNN.tar, NNNNN.parquet (one row per URL tried, failed
    downloads included, a key column), NNNNN_stats.json with img2dataset's fields."""
    stem = f"{index:05d}"
    members = make_shard(folder / f"{stem}.tar", photos)
    keys = list(dict.fromkeys(n.split(".")[0] for n, _ in members))
    rows = [{"url": f"https://example.com/{k}.jpg", "caption": f"caption of {k}", "key": k,
             "status": "success", "error_message": None, "width": 320, "height": 240}
            for k in keys]
    rows += [{"url": f"https://example.com/gone{i}.jpg", "caption": "gone", "key": f"{stem}9{i:03d}",
              "status": "failed_to_download", "error_message": "404", "width": None, "height": None}
             for i in range(failed)]
    pd.DataFrame(rows).to_parquet(folder / f"{stem}.parquet", index=False)
    stats = {"count": len(rows), "successes": len(keys), "failed_to_download": failed,
             "failed_to_resize": 0, "duration": 12.5, "start_time": 1.0, "end_time": 13.5,
             "status_dict": {"success": len(keys), "404": failed}}
    (folder / f"{stem}_stats.json").write_text(json.dumps(stats, indent=4))
    (folder / f"{stem}.txt").write_text("a note beside the shard\n")
    return members, keys


@pytest.fixture()
def shard_set(tmp_path, photos):
    d = tmp_path / "img2dataset"
    d.mkdir()
    sets = [img2dataset_shard(d, 0, photos[:2]), img2dataset_shard(d, 1, photos[2:])]
    det = create("nss")
    clean = det.score(photos)
    bad = det.score([degrade(p, seed=i) for i, p in enumerate(photos)])
    assert bad.min() > clean.max()
    return d, sets, float((bad.min() + clean.max()) / 2)


def test_sidecars_follow_their_samples(shard_set, tmp_path):
    d, sets, t = shard_set
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    for i, (members, keys) in enumerate(sets):
        stem = f"{i:05d}"
        scores = pd.read_parquet(out / "scores" / f"{stem}.parquet")
        for output in ("kept", "rejected"):
            held = list(dict.fromkeys(n.split(".")[0] for n, _ in read_members(out / output / f"{stem}.tar")))
            assert held == scores.loc[scores["decision"] == output, "key"].tolist() and held
            meta = pd.read_parquet(out / output / f"{stem}.parquet")
            assert meta["key"].tolist() == held  # exactly the rows of the samples it holds
            original = pd.read_parquet(d / f"{stem}.parquet").set_index("key")
            pd.testing.assert_frame_equal(meta.set_index("key"), original.loc[held])
            stats = json.loads((out / output / f"{stem}_stats.json").read_text())
            assert stats["successes"] == len(held)
            assert stats["count"] == len(keys) + 2 and stats["failed_to_download"] == 2
            assert sum(stats["status_dict"].values()) == stats["count"]
            other = "rejected" if output == "kept" else "kept"
            assert stats["collapseguard"]["output"] == output
            assert stats["collapseguard"][other] == len(keys) - len(held)
            assert stats["collapseguard"]["threshold"] == pytest.approx(t)
            assert (out / output / f"{stem}.txt").read_bytes() == (d / f"{stem}.txt").read_bytes()
        rej = json.loads((out / "rejected" / f"{stem}_stats.json").read_text())
        assert rej["status_dict"]["collapseguard: kept"] == len(keys) // 2
    # resumed: nothing redone, the same bytes; a changed sidecar redoes its shard
    before = {p.name: p.read_bytes() for p in (out / "kept").iterdir()}
    res = run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1"])
    assert json.loads((out / "summary.json").read_text())["per_shard"][0]["status"] == "resumed"
    assert "resuming: 2 of 2 shard(s) already complete" in res.output
    assert {p.name: p.read_bytes() for p in (out / "kept").iterdir()} == before
    (d / "00001.txt").write_text("changed\n")
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    statuses = [s["status"] for s in json.loads((out / "summary.json").read_text())["per_shard"]]
    assert statuses == ["resumed", "done"], res.output
    assert (out / "kept" / "00001.txt").read_text() == "changed\n"


def test_a_success_missing_from_the_tar_is_counted_so_the_statuses_still_add_up(shard_set, tmp_path):
    """img2dataset counted a download the tar does not hold (a row with status success, no
    sample): its row is an orphan row, and each output's status_dict names it, adding up to count."""
    d, sets, t = shard_set
    table = pd.read_parquet(d / "00000.parquet")
    lost = {**table.iloc[0].to_dict(), "key": "00000555", "url": "https://example.com/lost.jpg"}
    pd.concat([table, pd.DataFrame([lost])], ignore_index=True).to_parquet(d / "00000.parquet", index=False)
    stats = json.loads((d / "00000_stats.json").read_text())
    stats["count"] += 1
    stats["successes"] += 1
    stats["status_dict"]["success"] += 1
    (d / "00000_stats.json").write_text(json.dumps(stats))
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    for output in ("kept", "rejected"):
        got = json.loads((out / output / "00000_stats.json").read_text())
        assert got["status_dict"]["collapseguard: missing_from_tar"] == 1
        assert sum(got["status_dict"].values()) == got["count"] == len(sets[0][1]) + 3
        assert "collapseguard: missing_from_tar" not in json.loads(
            (out / output / "00001_stats.json").read_text())["status_dict"]
    assert pd.read_parquet(out / "orphan_rows/00000.parquet")["key"].tolist()[-1] == "00000555"


def test_parquet_without_key_column_fails_that_shard_by_name(shard_set, tmp_path):
    d, _, t = shard_set
    pd.DataFrame({"url": ["x"]}).to_parquet(d / "00001.parquet")
    res = run_cli(["filter", d, "-o", tmp_path / "out", "-d", "nss", "--threshold", t, "-w", "1",
                   "-q"], expect=1)
    assert "00001" in res.output
    assert (tmp_path / "out/kept/00000.parquet").is_file()
    assert not (tmp_path / "out/kept/00001.parquet").exists()


@pytest.mark.parametrize("n", [1, 3, 100])
def test_reshard_round_trips_every_kept_sample_once(shard_set, tmp_path, n):
    d, _, t = shard_set
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q",
             "--reshard", n])
    kept = read_members(out / "kept/00000.tar") + read_members(out / "kept/00001.tar")
    shards = sorted((out / "resharded").glob("*.tar"))
    resharded = [m for s in shards for m in read_members(s)]
    assert resharded == kept  # every member once, byte for byte, in order
    sizes = [len({name.split(".")[0] for name, _ in read_members(s)}) for s in shards]
    total = len({name.split(".")[0] for name, _ in kept})
    assert sizes == [n] * (total // n) + ([total % n] if total % n else [])
    key_map = pd.read_parquet(out / "resharded/key_map.parquet")
    assert key_map["key"].is_unique and len(key_map) == total
    for s in shards:
        keys = list(dict.fromkeys(name.split(".")[0] for name, _ in read_members(s)))
        assert key_map.loc[key_map["shard"] == s.name, "key"].tolist() == keys
        assert pd.read_parquet(s.with_suffix(".parquet"))["key"].tolist() == keys


def test_reshard_refuses_a_key_in_two_shards(tmp_path, photos):
    d = tmp_path / "in"
    d.mkdir()
    make_shard(d / "a.tar", photos[:1], degraded=False)
    (d / "b.tar").write_bytes((d / "a.tar").read_bytes())  # the same keys again
    res = run_cli(["filter", d, "-o", tmp_path / "out", "-d", "nss", "--threshold", "1e9", "-w", "1",
                   "-q", "--reshard", "2"], expect=1)
    assert "is in both kept/a.tar and kept/b.tar" in res.output
    assert not (tmp_path / "out/resharded").exists()
    assert read_members(tmp_path / "out/kept/a.tar") == read_members(d / "a.tar")  # filtered, untouched


def test_a_repeated_key_sends_each_parquet_row_to_one_output(tmp_path, photos):
    """Keys ``k, j, k``: the second ``k`` is rejected as repeated_key; of the parquet's two ``k``
    rows, the first follows the first sample and the second the repeat, so no row is copied
    into both outputs and none is lost."""
    import tarfile

    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg

    d = tmp_path / "in"
    d.mkdir()
    order = ["k", "j", "k"]
    with tarfile.open(d / "00000.tar", "w") as tf:
        for i, key in enumerate(order):
            add_member(tf, f"{key}.jpg", encode_jpeg(photos[i], 92))
            add_member(tf, f"{key}.txt", f"caption {i}".encode())
    rows = pd.DataFrame({"key": order + ["gone"], "url": [f"u{i}" for i in range(4)],
                         "status": ["success"] * 3 + ["failed_to_download"]})
    rows.to_parquet(d / "00000.parquet", index=False)
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    scores = pd.read_parquet(out / "scores" / "00000.parquet")
    assert scores["reason"].tolist()[2] == "repeated_key"
    kept, rejected = (pd.read_parquet(out / o / "00000.parquet") for o in ("kept", "rejected"))
    assert kept["url"].tolist() == ["u0", "u1"] and rejected["url"].tolist() == ["u2"]


def test_a_sidecar_linking_outside_the_shard_folder_is_not_copied(shard_set, tmp_path):
    d, _, t = shard_set
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the dataset\n")
    (d / "00001.notes").symlink_to(secret)
    (d / "00000.notes").symlink_to(d / "00000.txt")  # a link inside the folder is an ordinary sidecar
    out = tmp_path / "out"
    res = run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"], expect=1)
    assert "00001.notes" in res.output and "links outside" in res.output
    assert not any("not for the dataset" in p.read_text(errors="replace")
                   for p in out.rglob("*") if p.is_file() and p.suffix in (".notes", ".txt"))
    assert (out / "kept" / "00000.notes").read_bytes() == (d / "00000.txt").read_bytes()
    assert not (out / "kept" / "00001.tar").exists()


@pytest.mark.parametrize("bad", ["[" * 100000 + "]" * 100000, '{"count": 6', "[1, 2]", "\udcff",
                                 '{"count": 1e999999, "status_dict": {"success": 2}}',
                                 '{"count": 2, "status_dict": [1, 2]}'])
def test_an_unreadable_stats_file_is_copied_unchanged_and_its_shard_filtered(shard_set, tmp_path, bad):
    """A downloaded dataset's stats file is data from elsewhere, and optional bookkeeping: nested
    deeper than the parser goes, cut short, not an object or not UTF-8, it is copied to both
    outputs as it is, the shard is filtered as usual, and summary.json says why the file was not
    updated (no RecursionError, no failed shard)."""
    d, _, t = shard_set
    raw = bad.encode("utf-8", "surrogateescape")
    (d / "00001_stats.json").write_bytes(raw)
    res = run_cli(["filter", d, "-o", tmp_path / "out", "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    assert "Traceback" not in res.output and "RecursionError" not in res.output
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["shards_failed"] == []
    rec = next(r for r in summary["per_shard"] if r["shard"].endswith("00001.tar"))
    assert len(rec["sidecar_notes"]) == 1
    assert rec["sidecar_notes"][0].startswith("00001_stats.json: not a readable stats file")
    for output in ("kept", "rejected"):
        assert (tmp_path / "out" / output / "00001_stats.json").read_bytes() == raw
        assert (tmp_path / "out" / output / "00001.tar").is_file()
    assert "successes" in json.loads((tmp_path / "out/kept/00000_stats.json").read_text())


def test_an_upper_case_shard_suffix_keeps_its_sidecars(shard_set, tmp_path):
    """``00000.TAR`` is read as a shard whatever the case of its suffix; its ``00000.parquet`` and
    ``00000_stats.json`` follow its samples as they do for ``00000.tar``."""
    d, sets, t = shard_set
    (d / "00000.tar").rename(d / "00000.TAR")
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    _, keys = sets[0]
    held = {o: list(dict.fromkeys(n.split(".")[0] for n, _ in read_members(out / o / "00000.TAR")))
            for o in ("kept", "rejected")}
    assert sorted(held["kept"] + held["rejected"]) == sorted(keys)
    for o in ("kept", "rejected"):
        assert pd.read_parquet(out / o / "00000.parquet")["key"].tolist() == held[o]
        assert json.loads((out / o / "00000_stats.json").read_text())["successes"] == len(held[o])
        assert not (out / o / "00000.TAR.parquet").exists()


def test_the_row_of_a_key_goes_to_its_safely_named_sample_not_an_unsafe_one(tmp_path, photos):
    """``/000001.jpg`` (set aside, cleaned to key 000001) before the real ``000001``: the key's one
    parquet row follows the real sample into kept/, not the unsafe one into rejected/."""
    import tarfile

    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg

    d = tmp_path / "in"
    d.mkdir()
    with tarfile.open(d / "00000.tar", "w") as tf:
        add_member(tf, "/000001.jpg", encode_jpeg(photos[0], 92))
        add_member(tf, "000002.jpg", encode_jpeg(photos[1], 92))
        add_member(tf, "000001.jpg", encode_jpeg(photos[2], 92))
    pd.DataFrame({"key": ["000001", "000002"], "url": ["u1", "u2"]}).to_parquet(d / "00000.parquet", index=False)
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    scores = pd.read_parquet(out / "scores" / "00000.parquet")
    assert scores["reason"].tolist() == ["unsafe_name", "kept", "kept"]
    kept, rejected = (pd.read_parquet(out / o / "00000.parquet") for o in ("kept", "rejected"))
    assert sorted(kept["url"]) == ["u1", "u2"] and rejected.empty


def test_a_shard_repacked_from_dot_keeps_its_parquet_rows(tmp_path, photos):
    """img2dataset's 00000.tar repacked with ``tar cf 00000.tar .`` names its samples ``./000001``;
    the parquet beside it says ``000001``: the rows follow their samples, none is dropped."""
    import tarfile

    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg

    d = tmp_path / "in"
    d.mkdir()
    with tarfile.open(d / "00000.tar", "w") as tf:
        add_member(tf, "./000001.jpg", encode_jpeg(photos[0], 92))
        add_member(tf, "./000002.jpg", encode_jpeg(photos[1], 92))
    pd.DataFrame({"key": ["000001", "000002", "000003"], "url": ["u1", "u2", "u3"]}).to_parquet(
        d / "00000.parquet", index=False)
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    assert pd.read_parquet(out / "scores" / "00000.parquet")["key"].tolist() == ["./000001", "./000002"]
    assert pd.read_parquet(out / "kept" / "00000.parquet")["url"].tolist() == ["u1", "u2"]


def test_every_parquet_row_lands_in_one_output_orphans_included(shard_set, tmp_path):
    """Rows whose key names no sample (img2dataset's failed downloads, and rows whose samples are
    missing from the tar) go to orphan_rows/, so kept + rejected + orphan_rows hold every row of
    the input parquet exactly once; summary.json counts them and names the unexpected ones."""
    d, _, t = shard_set
    src = pd.read_parquet(d / "00001.parquet")
    extra = pd.DataFrame([{**src.iloc[0].to_dict(), "key": f"lost{i}", "url": f"https://e/{i}"}
                          for i in range(3)])  # status "success", but no such sample in the tar
    pd.concat([src, extra], ignore_index=True).to_parquet(d / "00001.parquet", index=False)
    out = tmp_path / "out"
    res = run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    assert "3 sidecar parquet row(s)" in res.output and "lost0" in res.output
    for stem in ("00000", "00001"):
        original = pd.read_parquet(d / f"{stem}.parquet")
        parts = [pd.read_parquet(p) for p in (out / "kept" / f"{stem}.parquet",
                                              out / "rejected" / f"{stem}.parquet",
                                              out / "orphan_rows" / f"{stem}.parquet")]
        together = pd.concat(parts, ignore_index=True)
        assert len(together) == len(original)  # none lost, none twice
        assert sorted(together["url"]) == sorted(original["url"])
        orphans = parts[2]
        assert (orphans["status"] == "failed_to_download").sum() == 2
        pd.testing.assert_frame_equal(  # the input's rows, schema and order
            orphans.reset_index(drop=True),
            original[~original["key"].isin(pd.concat(parts[:2])["key"])].reset_index(drop=True))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["orphan_rows"] == 2 + 5 and summary["orphan_rows_not_failed"] == 3
    rec = {r["shard"].rsplit("/", 1)[-1]: r for r in summary["per_shard"]}
    (o1,) = rec["00001.tar"]["orphan_rows"]
    assert o1 == {"file": "orphan_rows/00001.parquet", "rows": 5,
                  "by_status": {"failed_to_download": 2, "success": 3},
                  "not_failed": 3, "not_failed_keys": ["lost0", "lost1", "lost2"]}
    # a resume reuses them; a changed parquet redoes its shard and its orphan file
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    assert [r["status"] for r in json.loads((out / "summary.json").read_text())["per_shard"]] == [
        "resumed", "resumed"]
    src.to_parquet(d / "00001.parquet", index=False)
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    assert len(pd.read_parquet(out / "orphan_rows" / "00001.parquet")) == 2


def test_the_temporary_folders_of_a_killed_reshard_are_removed_by_the_next_run(shard_set, tmp_path):
    """A reshard killed while writing leaves ``.resharded.<id>.tmp/`` (cut-short tars) or, killed
    while replacing, ``.resharded.old.<id>/``: the next run removes them."""
    import os
    import signal
    import subprocess
    import sys
    import time

    d, _, t = shard_set
    out = tmp_path / "out"
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q", "--reshard", 1])
    # a reshard killed (SIGKILL) while it writes its temporary folder, held there by a
    # sitecustomize that sleeps after each shard it writes
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import time\nimport collapseguard.io.shard_writer as t\n_c = t.ShardWriter.close\n"
        "def close(self):\n    _c(self)\n    time.sleep(30)\nt.ShardWriter.close = close\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys; from collapseguard.filter.reshard import reshard; "
            "reshard(sys.argv[1], ['00000.tar', '00001.tar'], 1)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob(".resharded.*.tmp/00000.tar")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(out.glob(".resharded.*.tmp/00000.tar"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (out / ".resharded.old.0123abcd").mkdir()  # killed between its two renames
    (out / ".resharded.old.0123abcd" / "00000.tar").write_bytes(b"old")
    before = sorted(p.name for p in (out / "resharded").iterdir())
    run_cli(["filter", d, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q", "--reshard", 1])
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".resharded")) == []
    assert sorted(p.name for p in (out / "resharded").iterdir()) == before


def _serve(folder):
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _tree(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.parts[len(out.parts)] in ("kept", "rejected", "orphan_rows")}


@pytest.mark.parametrize("how", ["folder", "shard"])
def test_sidecars_of_shards_read_by_url_travel_as_local_ones_do(shard_set, tmp_path, how):
    """img2dataset's output served over http (a loopback server's index pages, as a store lists a
    prefix): the sidecars are found beside each shard and written as for the local folder, byte
    for byte, and a resumed run redoes nothing."""
    d, _, t = shard_set
    local = tmp_path / "local"
    run_cli(["filter", d, "-o", local, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
    srv = _serve(d)
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}/"
        args = [base] if how == "folder" else [base + "00000.tar", base + "00001.tar"]
        out = tmp_path / "url"
        run_cli(["filter", *args, "-o", out, "-d", "nss", "--threshold", t, "-w", "1", "-q"])
        want = _tree(local)
        assert "kept/00000_stats.json" in want and "orphan_rows/00001.parquet" in want
        assert _tree(out) == want
        res = run_cli(["filter", *args, "-o", out, "-d", "nss", "--threshold", t, "-w", "1"])
        assert "resuming: 2 of 2 shard(s) already complete" in res.output
    finally:
        srv.shutdown()
        srv.server_close()
