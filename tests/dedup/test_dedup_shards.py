"""``collapseguard dedup`` and ``filter --groups`` on real shards: a chain made by a real replicator
and split across three shards is found and its least damaged step kept, a recompressed and
resized clean copy is kept, unrelated photos stay singles, a stopped run resumes to the same
bytes, and the filter conserves every member byte for byte."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from cg_testutil import read_members, run_cli


@pytest.fixture(scope="module")
def deduped(dedup_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("dedup_out")
    # one process (the default is 2) and onnx, which auto picks on a CPU only
    run_cli(["dedup", *dedup_shards, "--out", out, "-q", "-w", "1", "--runtime", "onnx"])
    return out


def _rows(out: Path) -> dict:
    t = pq.read_table(out / "groups.parquet").to_pylist()
    return {r["key"]: r for r in t}


def test_the_chain_across_three_shards_is_one_group_and_its_least_damaged_step_is_kept(deduped):
    rows = _rows(deduped)
    chain = {k: rows[f"chain_s{k}"] for k in (0, 1, 3, 5, 10)}
    groups = {r["group"] for r in chain.values()}
    assert len(groups) == 1 and "" not in groups, chain
    assert len({r["shard"] for r in chain.values()}) == 3
    assert chain[0]["decision"] == "keep" and chain[0]["rank"] == 0 and chain[0]["reason"] == "least_degraded"
    # the comparator orders the steps as the replicator made them, and at the calibrated level
    # the step-10 copy is a degraded copy
    assert [chain[k]["rank"] for k in (0, 1, 3, 5, 10)] == [0, 1, 2, 3, 4]
    assert all(chain[k]["p_worse"] > 0.5 for k in (1, 3, 5, 10))
    assert chain[10]["decision"] == "degraded_copy" and chain[10]["reason"] == "degraded_copy"
    assert chain[1]["decision"] == "keep" and chain[1]["reason"] == "duplicate"
    # no member of another picture joined the chain's group
    assert sum(r["group"] == chain[0]["group"] for r in rows.values()) == 5


def test_a_recompressed_resized_clean_copy_is_kept(deduped):
    rows = _rows(deduped)
    a, b = rows["clean_png"], rows["clean_copy"]
    assert a["group"] and a["group"] == b["group"]
    assert {a["decision"], b["decision"]} == {"keep"}
    assert sorted([a["reason"], b["reason"]]) == ["duplicate", "least_degraded"]


def test_unrelated_photos_stay_single(deduped):
    rows = _rows(deduped)
    for k in ("other_a", "other_b"):
        assert rows[k]["group"] == "" and rows[k]["decision"] == "single" and rows[k]["rank"] == 0


def test_the_table_has_the_documented_columns_and_the_summary_counts_it(deduped):
    import json
    t = pq.read_table(deduped / "groups.parquet")
    assert t.column_names[:7] == ["source", "key", "group", "rank", "decision", "p_worse", "reason"]
    assert t.num_rows == 9
    s = json.loads((deduped / "summary.json").read_text())
    assert s["images"] == 9 and s["groups"] == 2 and s["grouped"] == 7
    assert s["decisions"]["single"] == 2 and 0 < s["level"] < 1 and "clean-only groups" in s["level_guarantee"]
    # the table's cnn column is the comparator's own cnn, named in the summary
    from collapseguard.detectors.compare import comparator_cnn
    assert s["comparator_cnn_version"] == comparator_cnn(runtime="onnx").version


def test_resume_and_fresh_runs_write_the_same_bytes(deduped, dedup_shards, tmp_path):
    import shutil
    out = tmp_path / "out"
    shutil.copytree(deduped, out)
    parts = sorted((out / ".parts").glob("*.npz"))
    assert len(parts) == 3  # one per shard
    parts[1].unlink()
    (out / "groups.parquet").unlink()
    res = run_cli(["dedup", *dedup_shards, "--out", out, "-q"])
    assert "2 group(s)" in res.output
    for name in ("groups.parquet", "summary.json"):
        assert (out / name).read_bytes() == (deduped / name).read_bytes()
    run_cli(["dedup", *dedup_shards, "--out", out, "-q", "--fresh"])
    for name in ("groups.parquet", "summary.json"):
        assert (out / name).read_bytes() == (deduped / name).read_bytes()


def test_a_kept_part_that_names_another_source_is_described_afresh(deduped, dedup_shards, tmp_path):
    """A part file is a cache in --out, and its sources are read again by the gallery: one that
    names another source (a planted pipe: command) is never trusted, so nothing runs and the
    table is the fresh run's, byte for byte."""
    import shutil

    import numpy as np
    out = tmp_path / "out"
    shutil.copytree(deduped, out)
    marker = tmp_path / "ran"
    for part in sorted((out / ".parts").glob("*.npz")):
        with np.load(part, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["source"] = np.array([f"pipe:touch {marker}; cat {s}" for s in arrays["source"]])
        np.savez(part, **arrays)
    (out / "groups.parquet").unlink()
    run_cli(["dedup", *dedup_shards, "--out", out, "-q", "--gallery", "5"])
    assert not marker.exists()
    assert (out / "groups.parquet").read_bytes() == (deduped / "groups.parquet").read_bytes()


def test_a_killed_run_resumes_to_the_same_bytes(deduped, dedup_shards, tmp_path):
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c", "from collapseguard.cli import main; main()", "dedup",
           *map(str, dedup_shards), "--out", str(out), "-q", "-w", "1"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.time() + 240
    # killed once the grouped images are being described (every shard fingerprinted): the
    # second pass has kept a part of the three and is at work on the next
    while time.time() < deadline and proc.poll() is None:
        if list((out / ".parts" / "full").glob("*.npz")):
            break
        time.sleep(0.01)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list((out / ".parts" / "full").glob("*.npz")))
    assert done < 3 and not (out / "groups.parquet").exists(), "the run ended before it was killed"
    subprocess.run(cmd, env=env, check=True, timeout=600)
    for name in ("groups.parquet", "summary.json"):
        assert (out / name).read_bytes() == (deduped / name).read_bytes()


@pytest.mark.parametrize("sig, workers", [(signal.SIGINT, 1), (signal.SIGTERM, 1), (signal.SIGTERM, 2)])
def test_ctrl_c_says_how_to_resume(dedup_shards, tmp_path, sig, workers):
    """Interrupted (SIGINT, as Ctrl-C sends, or SIGTERM, as a job scheduler sends), dedup says
    where its work is kept and how to resume, as filter does, instead of click's bare "Aborted!"
    or (SIGTERM) dying without a word; SIGTERM's exit status is 143, as a process it ended."""
    out = tmp_path / "interrupted"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c", "from collapseguard.cli import main; main()", "dedup",
           *map(str, dedup_shards), "--out", str(out), "-q", "-w", str(workers)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if list((out / ".parts").glob("*.npz")):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it was interrupted"
    proc.send_signal(sig)
    sent = time.time()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and not (out / "groups.parquet").exists()
    assert "interrupted:" in err and "run the same command again to resume" in err, err
    if sig == signal.SIGTERM:  # sent to the parent alone (kill PID), its workers too stop at once
        assert proc.returncode == 143 and "Traceback" not in err, err
        assert time.time() - sent < 30


def _members(folder: Path) -> Counter:
    return Counter(m for p in sorted(folder.glob("*.tar")) for m in read_members(p))


@pytest.mark.parametrize("drop_duplicates", [False, True])
def test_filter_groups_rejects_degraded_copies_and_conserves_every_member(
        deduped, dedup_shards, tmp_path, drop_duplicates):
    out = tmp_path / "filtered"
    args = ["filter", *dedup_shards, "--out", out, "--groups", deduped / "groups.parquet",
            "--threshold", "1e9", "-w", "1", "-q"]
    run_cli(args + (["--drop-duplicates"] if drop_duplicates else []))
    scores = pq.read_table(sorted((out / "scores").glob("*.parquet"))).to_pylist()
    by_key = {r["key"]: r for r in scores}
    groups = _rows(deduped)
    for key, g in groups.items():
        assert by_key[key]["group"] == g["group"]
        if g["decision"] == "degraded_copy":
            assert (by_key[key]["decision"], by_key[key]["reason"]) == ("rejected", "degraded_copy")
        elif g["rank"] > 0 and drop_duplicates:
            assert (by_key[key]["decision"], by_key[key]["reason"]) == ("rejected", "duplicate")
        else:
            assert by_key[key]["decision"] == "kept", by_key[key]
    assert by_key["chain_s10"]["reason"] == "degraded_copy"
    assert (by_key["clean_copy"]["decision"] == "rejected") is drop_duplicates or \
        (by_key["clean_png"]["decision"] == "rejected") is drop_duplicates
    # conservation: kept + rejected hold every input member, byte for byte
    inputs = Counter(m for p in dedup_shards for m in read_members(p))
    assert _members(out / "kept") + _members(out / "rejected") == inputs


def test_filter_groups_resumes_to_the_same_bytes_and_plain_runs_have_no_group_column(deduped, dedup_shards, tmp_path):
    out = tmp_path / "filtered"
    base = ["filter", *dedup_shards, "--out", out, "--threshold", "1e9", "-w", "1", "-q"]
    run_cli(base + ["--groups", deduped / "groups.parquet"])
    kept = {p.name: p.read_bytes() for p in (out / "kept").glob("*.tar")}
    run_cli(base + ["--groups", deduped / "groups.parquet"])  # resumed: nothing changes
    assert {p.name: p.read_bytes() for p in (out / "kept").glob("*.tar")} == kept
    plain = tmp_path / "plain"
    run_cli(["filter", *dedup_shards, "--out", plain, "--threshold", "1e9", "-w", "1", "-q"])
    assert "group" not in pq.read_table(sorted((plain / "scores").glob("*.parquet"))[0]).column_names


def test_a_groups_table_of_other_inputs_is_named_and_the_summary_says_what_it_matched(
        deduped, dedup_shards, photos, tmp_path):
    """A groups table with no rows for an input changes nothing for it: ``filter`` says so (with
    ``-q`` too) and summary.json records the table and the inputs it had rows for."""
    import json
    import tarfile

    from cg_testutil import add_member

    from collapseguard.images import encode_png

    other = tmp_path / "other-0.tar"
    with tarfile.open(other, "w") as tf:
        add_member(tf, "x.png", encode_png(photos[-1][:200, :200]))
    table = deduped / "groups.parquet"
    res = run_cli(["filter", other, "--out", tmp_path / "f1", "--groups", table, "--threshold", "1e9",
                   "-w", "1", "-q"])
    assert "holds no rows for any of these 1 input(s)" in res.output, res.output
    s1 = json.loads((tmp_path / "f1" / "summary.json").read_text())
    assert s1["groups"]["inputs_with_rows"] == 0 and s1["groups"]["inputs_without_rows"] == [str(other)]
    res = run_cli(["filter", *dedup_shards, other, "--out", tmp_path / "f2", "--groups", table,
                   "--threshold", "1e9", "-w", "1", "-q"])
    assert f"holds no rows for 1 of {len(dedup_shards) + 1} input(s)" in res.output, res.output
    s2 = json.loads((tmp_path / "f2" / "summary.json").read_text())
    assert s2["groups"]["inputs_with_rows"] == len(dedup_shards)
    assert s2["groups"]["table"] == str(table) and not s2["groups"]["drop_duplicates"]
    res = run_cli(["filter", *dedup_shards, "--out", tmp_path / "f3", "--groups", table,
                   "--threshold", "1e9", "-w", "1", "-q"])
    assert "holds no rows" not in res.output


def test_drop_duplicates_needs_groups(dedup_shards, tmp_path):
    res = run_cli(["filter", *dedup_shards, "--out", tmp_path / "o", "--drop-duplicates"], expect=2)
    assert "--groups" in res.output


def test_a_ray_run_gives_the_same_groups_as_the_local_engine(deduped, dedup_shards, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray engine needs the [ray] extra")
    out = tmp_path / "ray"
    try:
        run_cli(["dedup", *dedup_shards, "--out", out, "-q", "--engine", "ray", "-w", "2"])
    finally:
        ray.shutdown()
    for name in ("groups.parquet", "summary.json"):
        assert (out / name).read_bytes() == (deduped / name).read_bytes()


def test_ray_actors_run_the_cnn_on_the_runtime_asked_for(deduped, dedup_shards, tmp_path):
    """The driver's --runtime reaches the actors, also in a Ray instance started under another
    one: runs on onnx then on torch in one instance write the bytes of local runs on each (their
    cnn scores differ in the last digits, so a wrong runtime shows)."""
    ray = pytest.importorskip("ray", reason="Ray engine needs the [ray] extra")
    pytest.importorskip("onnxruntime")
    local = tmp_path / "local"
    run_cli(["dedup", *dedup_shards, "--out", local, "-q", "-w", "1", "--runtime", "torch"])
    assert (local / "groups.parquet").read_bytes() != (deduped / "groups.parquet").read_bytes()
    try:
        for runtime, want in (("onnx", deduped), ("torch", local)):
            out = tmp_path / f"ray-{runtime}"
            run_cli(["dedup", *dedup_shards, "--out", out, "-q", "--engine", "ray", "-w", "2",
                     "--runtime", runtime])
            assert (out / "groups.parquet").read_bytes() == (want / "groups.parquet").read_bytes(), runtime
    finally:
        ray.shutdown()


def test_worker_processes_give_the_same_groups(deduped, dedup_shards, tmp_path):
    out = tmp_path / "w2"
    res = run_cli(["dedup", *dedup_shards, "--out", out, "-q", "-w", "2"])
    assert "FAILED" not in res.output
    for name in ("groups.parquet", "summary.json"):
        assert (out / name).read_bytes() == (deduped / name).read_bytes()


def test_the_torch_runtime_gives_the_same_decisions_as_onnx(deduped, dedup_shards, tmp_path):
    """`dedup` runs the comparator's cnn on onnxruntime by default (--runtime auto); with torch
    the cnn scores differ by under 1e-4, and the groups, ranks and decisions are the same."""
    pytest.importorskip("onnxruntime")
    from collapseguard.detectors.cnn_family import RUNTIME_ENV

    before = os.environ.get(RUNTIME_ENV)
    out = tmp_path / "torch"
    run_cli(["dedup", *dedup_shards, "--out", out, "-q", "--runtime", "torch"])
    assert os.environ.get(RUNTIME_ENV) == before  # the command put the process's default back
    got, want = _rows(out), _rows(deduped)
    assert got.keys() == want.keys()
    for k, r in want.items():
        assert (got[k]["group"], got[k]["rank"], got[k]["decision"]) == (r["group"], r["rank"], r["decision"]), k
        if r["group"]:
            assert abs(got[k]["cnn"] - r["cnn"]) < 1e-4, k
            assert got[k]["p_worse"] == pytest.approx(r["p_worse"], abs=1e-3, nan_ok=True), k
    assert any(r["group"] for r in want.values())  # the comparison covers grouped images


def test_inputs_without_one_decodable_image_give_a_table_of_singles(tmp_path):
    import tarfile

    from cg_testutil import add_member
    shard = tmp_path / "bad.tar"
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "a.jpg", b"not a jpeg")
        add_member(tf, "b.txt", b"caption only")
    out = tmp_path / "out"
    res = run_cli(["dedup", shard, "--out", out, "-q"])
    assert "2 singles (2 not decodable: reason not_fingerprinted" in res.output  # not silent
    rows = pq.read_table(out / "groups.parquet").to_pylist()
    assert [(r["key"], r["decision"], r["reason"]) for r in rows] == [
        ("a", "single", "not_fingerprinted"), ("b", "single", "not_fingerprinted")]
    assert rows[0]["error"] and rows[1]["error"]


def test_the_gallery_shows_the_chain_kept_copy_first_and_escapes_keys(dedup_shards, tmp_path):
    import tarfile

    from cg_testutil import add_member
    # a key that is markup: it must arrive as text
    hostile = tmp_path / "hostile.tar"
    with tarfile.open(dedup_shards[1]) as src, tarfile.open(hostile, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            add_member(dst, m.name.replace("chain_s5", "<b>s5</b>"), data)
    out = tmp_path / "out"
    run_cli(["dedup", dedup_shards[0], hostile, dedup_shards[2], "--out", out, "-q", "--gallery", "5"])
    page = (out / "groups.html").read_text()
    assert "<b>s5</b>" not in page and "&lt;b&gt;s5&lt;/b&gt;" in page
    # and no script could run if one got through: the page forbids it
    assert '<meta http-equiv="Content-Security-Policy" content="default-src &#x27;none&#x27;' in page
    first = page.index("<h2>")
    chain = page[first: page.index("<h2>", first + 1)]  # groups with a degraded copy come first
    assert chain.index("chain_s0") < chain.index("chain_s10")
    assert chain.count("data:image/png;base64,") == 5 and "degraded_copy" in chain


def test_filter_into_an_out_made_with_another_groups_table_is_refused(deduped, dedup_shards, tmp_path):
    import pandas as pd
    out = tmp_path / "filtered"
    base = ["filter", *dedup_shards, "--out", out, "--threshold", "1e9", "-w", "1", "-q"]
    run_cli(base + ["--groups", deduped / "groups.parquet"])
    other = tmp_path / "other.parquet"
    t = pd.read_parquet(deduped / "groups.parquet")
    t.loc[t["key"] == "chain_s5", "decision"] = "degraded_copy"
    t.to_parquet(other)
    res = run_cli(base + ["--groups", other], expect=1)
    assert "groups_digest" in res.output


def _filter_outputs(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for sub in ("kept", "rejected", "scores")
            for p in sorted((out / sub).glob("*")) if not p.name.endswith(".tmp")}


def test_a_killed_filter_groups_run_resumes_to_the_same_bytes(deduped, dedup_shards, tmp_path):
    args = [*map(str, dedup_shards), "--groups", str(deduped / "groups.parquet"),
            "--threshold", "1e9", "-w", "1", "--batch-size", "1", "-q"]  # singles kept: the table decides
    ref = tmp_path / "ref"
    run_cli(["filter", *args, "--out", ref])
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c", "from collapseguard.cli import main; main()", "filter", *args,
           "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.time() + 240
    # killed as soon as the first shard's output is being written or done
    while time.time() < deadline and proc.poll() is None:
        if list((out / "kept").glob("*.tmp")) or list((out / ".done").glob("*.json")):
            break
        time.sleep(0.005)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list((out / ".done").glob("*.json")))
    assert done < 3 and not (out / "summary.json").exists(), "the run ended before it was killed"
    subprocess.run(cmd, env=env, check=True, timeout=600)
    assert _filter_outputs(out) == _filter_outputs(ref)
    # the degraded copy was rejected, its original kept
    assert "chain_s10.png" in [n for n, _ in read_members(out / "rejected" / "shard-a.tar")]
    assert "chain_s0.jpg" in [n for n, _ in read_members(out / "kept" / "shard-b.tar")]


def test_only_grouped_images_are_described_by_the_comparator(deduped):
    import json
    rows = _rows(deduped)
    for r in rows.values():
        assert (r["group"] != "") == (r["cnn"] == r["cnn"]), r  # NaN for singles
    s = json.loads((deduped / "summary.json").read_text())
    assert s["described"] == s["grouped"] == 7
    assert len(list((deduped / ".parts" / "full").glob("*.npz"))) == 3  # each shard holds a grouped image


def test_a_sample_of_several_images_is_described_by_its_most_degraded_image(chain_steps, photos, tmp_path):
    import tarfile

    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg, encode_png
    shard = tmp_path / "multi.tar"
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "pair.a.jpg", encode_jpeg(chain_steps[0], 90))  # the clean step first
        add_member(tf, "pair.b.png", encode_png(chain_steps[10]))
        add_member(tf, "s1.png", encode_png(chain_steps[1]))
        add_member(tf, "s3.png", encode_png(chain_steps[3]))
        add_member(tf, "other.jpg", encode_jpeg(photos[2], 90))
    out = tmp_path / "out"
    run_cli(["dedup", shard, "--out", out, "-q"])
    rows = _rows(out)
    assert rows["pair"]["image"] == "pair.b.png" and rows["pair"]["cnn"] == rows["pair"]["cnn"]
    assert rows["pair"]["group"] and rows["pair"]["group"] == rows["s1"]["group"] == rows["s3"]["group"]
    assert rows["pair"]["decision"] != "keep" or rows["pair"]["reason"] != "least_degraded"
    assert rows["other"]["group"] == ""


def test_the_gallery_shows_each_repeat_of_a_key_as_its_own_image(photos, tmp_path):
    """A key that repeats in a shard (``x, y, x``: one picture at 128 and at 256 px) is two rows of
    the table, each shown with its own image in the gallery, not the first ``x`` twice."""
    import tarfile

    from cg_testutil import add_member
    from PIL import Image

    from collapseguard.images import encode_png
    shard = tmp_path / "rep.tar"
    big = np.asarray(Image.fromarray(photos[1]).resize((256, 256)))
    with tarfile.open(shard, "w") as tf:
        add_member(tf, "x.png", encode_png(np.asarray(Image.fromarray(big).resize((128, 128)))))
        add_member(tf, "y.png", encode_png(np.asarray(Image.fromarray(photos[2]).resize((200, 150)))))
        add_member(tf, "x.png", encode_png(big))
    out = tmp_path / "out"
    run_cli(["dedup", shard, "--out", out, "-q", "--gallery", "5"])
    rows = [r for r in pq.read_table(out / "groups.parquet").to_pylist() if r["key"] == "x"]
    assert [(r["width"], r["height"]) for r in rows] == [(128, 128), (256, 256)]
    assert rows[0]["group"] == rows[1]["group"] != ""
    page = (out / "groups.html").read_text()
    assert page.count("<div>128x128</div>") == 1 and page.count("<div>256x256</div>") == 1


def test_a_failed_input_is_named_and_the_last_line_says_so(dedup_shards, tmp_path):
    """An input that cannot be read fails by name, the table holds the others, and the summary
    line (the last one printed) says that an input failed: it does not read like success."""
    bad = tmp_path / "zeros.parquet"
    bad.write_bytes(b"PAR1" + bytes(64) + b"PAR1")
    res = run_cli(["dedup", dedup_shards[0], bad, "--out", tmp_path / "out", "-q"], expect=1)
    lines = res.output.strip().splitlines()
    assert any(x.startswith("FAILED") and "zeros.parquet: not a readable Parquet file" in x for x in lines)
    assert lines[-1].endswith("1 input(s) FAILED above, not in the table"), lines[-1]
    rows = pq.read_table(tmp_path / "out" / "groups.parquet").to_pylist()
    assert {r["shard"] for r in rows} == {"shard-a"}


def test_inputs_that_share_a_stem_are_warned_about(dedup_shards, tmp_path):
    """Two shards of one name in two folders: ``filter --groups`` matches rows by stem and cannot
    take both in one run, so ``dedup`` says so (the table is still written)."""
    import shutil
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(dedup_shards[1], other / dedup_shards[0].name)
    res = run_cli(["dedup", dedup_shards[0], other / dedup_shards[0].name, "--out", tmp_path / "out", "-q"])
    assert "warning: 1 stem(s) name more than one input (e.g. shard-a" in res.output, res.output
    res = run_cli(["dedup", *dedup_shards, "--out", tmp_path / "out2", "-q"])
    assert "stem(s) name more than one input" not in res.output


def test_a_shard_rewritten_in_place_with_its_size_and_time_kept_is_read_again(photos, tmp_path):
    """A kept part is named by its shard's bytes, not only its size and modification time: a shard
    whose image was garbled in place, with the time put back, is fingerprinted again, so the
    resumed table is a fresh run's (the garbled copy no longer grouped with its JPEG) and its
    source_sha256 is the bytes the decisions were made from."""
    import hashlib
    import tarfile

    from cg_testutil import add_member

    from collapseguard.images import encode_jpeg

    shard = tmp_path / "in" / "m-000.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w") as tf:
        for i, p in enumerate(photos[:2]):
            add_member(tf, f"p{i}_q95.jpg", encode_jpeg(p, 95))
            add_member(tf, f"p{i}_q80.jpg", encode_jpeg(p, 80))
    run_cli(["dedup", shard.parent, "--out", tmp_path / "dd", "-w", "1", "-q"])
    before = pq.read_table(tmp_path / "dd" / "groups.parquet").to_pandas().set_index("key")
    assert before.loc["p0_q95", "group"] and before.loc["p0_q95", "group"] == before.loc["p0_q80", "group"]
    st = os.stat(shard)
    with tarfile.open(shard) as tf:
        m = tf.getmember("p0_q95.jpg")
        offset, size = m.offset_data, m.size
    with open(shard, "r+b") as fh:  # the middle third of one JPEG's bytes overwritten
        fh.seek(offset + size // 3)
        fh.write(b"\x55" * (size // 3))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    run_cli(["dedup", shard.parent, "--out", tmp_path / "dd", "-w", "1", "-q"])
    run_cli(["dedup", shard.parent, "--out", tmp_path / "fresh", "-w", "1", "-q"])
    resumed = pq.read_table(tmp_path / "dd" / "groups.parquet").to_pandas()
    fresh = pq.read_table(tmp_path / "fresh" / "groups.parquet").to_pandas()
    cols = ["key", "group", "rank", "decision", "reason", "source_sha256"]
    assert resumed[cols].equals(fresh[cols])
    assert set(resumed["source_sha256"]) == {hashlib.sha256(shard.read_bytes()).hexdigest()}
    after = resumed.set_index("key")
    assert not (after.loc["p0_q95", "group"] and after.loc["p0_q95", "group"] == after.loc["p0_q80", "group"])


def test_a_second_run_on_a_held_out_folder_is_refused_and_a_run_leaves_no_earlier_outputs(dedup_shards, tmp_path):
    """While a run holds OUT/.lock another dedup into OUT is refused at once, touching nothing (two
    runs used to both report success, the table of one beside the summary of the other); a run
    that goes ahead first removes the earlier run's table, summary and gallery, so a gallery of
    another table never stays beside a new one."""
    import fcntl

    out = tmp_path / "dd"
    run_cli(["dedup", *dedup_shards, "--out", out, "--gallery", "2", "-w", "1", "-q"])
    before = {n: (out / n).read_bytes() for n in ("groups.parquet", "summary.json", "groups.html")}
    with open(out / ".lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = run_cli(["dedup", dedup_shards[0], "--out", out, "-w", "1", "-q"], expect=1)
        assert "another dedup run is writing" in res.output
        assert {n: (out / n).read_bytes() for n in before} == before
    run_cli(["dedup", dedup_shards[0], "--out", out, "-w", "1", "-q"])
    assert not (out / "groups.html").exists()
    assert set(pq.read_table(out / "groups.parquet").column("shard").to_pylist()) == {"shard-a"}


def test_an_out_that_is_a_broken_link_is_named_so(dedup_shards, tmp_path):
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "no" / "such" / "folder")
    res = run_cli(["dedup", dedup_shards[0], "--out", link, "-w", "1", "-q"], expect=1)
    assert f"cannot write {link}: it is a broken link (to {tmp_path / 'no' / 'such' / 'folder'})" in res.output
