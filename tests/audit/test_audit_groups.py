"""``audit --groups``: the report shows dedup's groups, the kept copy beside its degraded
re-renderings, on real shards (a real replicator's chain) grouped by a real ``dedup`` run."""

from __future__ import annotations

import tarfile

import pytest
from cg_testutil import add_member, run_cli

from collapseguard.images import encode_jpeg, encode_png

HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def grouped(tmp_path_factory, photos):
    """Two shards: a clean photo (step 0) and its steps 5 and 10 of a real replication chain, one
    of them under a key that is markup, beside an unrelated photo; and dedup's groups.parquet."""
    from collapseguard.training_data_tools.chains import run_chain

    _, steps = run_chain(photos[0], "noise_tint", steps=10, keep=(0, 5, 10), seed=5)
    chain = {k: img for k, img, _ in steps}
    root = tmp_path_factory.mktemp("audit_groups")
    shards = []
    for name, samples in (("a", [("chain_s0", "jpg", encode_jpeg(chain[0], 90)),
                                 ("unrelated_photo", "jpg", encode_jpeg(photos[2], 90))]),
                          ("b", [(HOSTILE, "png", encode_png(chain[5])),
                                 ("chain_s10", "png", encode_png(chain[10]))])):
        path = root / f"shard-{name}.tar"
        with tarfile.open(path, "w") as tf:
            for key, ext, data in samples:
                add_member(tf, f"{key}.{ext}", data)
        shards.append(path)
    run_cli(["dedup", *shards, "--out", root / "dedup", "-q"])
    return shards, root / "dedup" / "groups.parquet"


def test_the_report_shows_the_kept_copy_beside_its_degraded_copies(grouped, tmp_path):
    import pandas as pd
    shards, table = grouped
    decisions = dict(pd.read_parquet(table, columns=["key", "decision"]).itertuples(index=False))
    assert decisions["chain_s0"] == "keep" and decisions["chain_s10"] == "degraded_copy"
    out = tmp_path / "audit"
    run_cli(["audit", *shards, "--out", out, "--threshold", "1e9", "-q", "--groups", table])
    page = (out / "report.html").read_text()
    section = page[page.index('<section id="groups">'):]
    section = section[: section.index("</section>")]
    assert "<h2>Near-duplicate groups</h2>" in section
    tiles = section.split("<div class='tile ")[1:]
    assert len(tiles) == 3  # one group: the kept copy and both re-renderings, the photo apart
    assert tiles[0].startswith("keep'") and "chain_s0" in tiles[0]
    assert any(t.startswith("degraded_copy'") and "chain_s10" in t for t in tiles)
    for t in tiles:  # each copy as a thumbnail and a 1:1 crop
        assert "data:image/jpeg;base64," in t and "class=crop src='data:image/png;base64," in t
    assert "unrelated_photo" not in section
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in section


def test_a_file_that_is_not_a_groups_table_is_one_line(grouped, tmp_path):
    shards, _ = grouped
    scores = tmp_path / "scores.parquet"
    run_cli(["score", shards[0], "--out", scores, "-q"])
    for bad, says in ((scores, "is not a dedup groups.parquet"), (tmp_path / "none.parquet", "cannot read")):
        res = run_cli(["audit", *shards, "--out", tmp_path / "audit", "--threshold", "1e9", "-q",
                       "--groups", bad], expect=1)
        assert says in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "audit" / "report.html").exists()


def _with_sources(table, out, rename):
    """A copy of the groups table at ``out`` with every source renamed by ``rename``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    t = pq.read_table(table)
    sources = [rename(s) for s in t.column("source").to_pylist()]
    pq.write_table(t.set_column(t.schema.get_field_index("source"), "source", pa.array(sources)), out)
    return out


def test_a_source_named_only_by_the_groups_table_is_never_read(grouped, tmp_path):
    """The table is data: only copies in the audit's own inputs are read back. A planted
    ``pipe:`` command is never run, and a private folder named by the table is never opened (its
    image would land in a report the user may share); their copies are error tiles."""
    import numpy as np

    from collapseguard.images import encode_png
    shards, table = grouped
    marker = tmp_path / "ran"
    private = tmp_path / "private"
    private.mkdir()
    (private / "id_card.png").write_bytes(encode_png(np.full((64, 64, 3), 200, np.uint8)))
    planted = _with_sources(table, tmp_path / "planted.parquet",
                            lambda s: f"pipe:touch {marker}; cat {s}" if s.endswith("a.tar") else str(private))
    import pyarrow as pa
    import pyarrow.parquet as pq
    t = pq.read_table(planted)
    keys = ["id_card.png" if s == str(private) else k
            for s, k in zip(t.column("source").to_pylist(), t.column("key").to_pylist())]
    pq.write_table(t.set_column(t.schema.get_field_index("key"), "key", pa.array(keys)), planted)
    out = tmp_path / "audit"
    run_cli(["audit", *shards, "--out", out, "--threshold", "1e9", "-q", "--groups", planted])
    assert not marker.exists()
    section = (out / "report.html").read_text().split('<section id="groups">')[1]
    assert section.count("not read: not a source this command read") == 3
    assert "data:image" not in section.split("</section>")[0]

    # the same pipe: commands given as the audit's inputs are read back and shown
    pipes = [f"pipe:cat {s}" for s in shards]
    own = _with_sources(table, tmp_path / "own.parquet", lambda s: f"pipe:cat {s}")
    run_cli(["audit", *pipes, "--out", tmp_path / "audit2", "--threshold", "1e9", "-q", "--groups", own])
    section = (tmp_path / "audit2" / "report.html").read_text().split('<section id="groups">')[1]
    assert "not read" not in section and section.count("class=crop src='data:image/png;base64,") == 3


def test_copies_in_shards_a_sample_skipped_are_still_shown(grouped, tmp_path, monkeypatch):
    """With --sample, a copy in an input shard the sample did not reach is still one of the
    audit's inputs, and is shown; so is one the audit names by another spelling of its path (the
    folder given relatively, the table holding absolute paths)."""
    shards, table = grouped
    folder = shards[0].parent
    monkeypatch.chdir(folder.parent)
    out = tmp_path / "audit"
    run_cli(["audit", f"./{folder.name}/", "--out", out, "--threshold", "1e9", "-q", "--sample", "1",
             "--groups", table])
    section = (out / "report.html").read_text().split('<section id="groups">')[1]
    assert "not read" not in section and section.count("class=crop src='data:image/png;base64,") == 3


def test_a_groups_table_of_other_inputs_is_named(grouped, photos, tmp_path):
    """A table whose groups are all in other inputs can show no copy: the audit says so on
    stderr (with ``-q`` too) and its summary counts the inputs the groups are in; the table of
    the audited shards gets no warning."""
    import json

    shards, table = grouped
    other = tmp_path / "other.tar"
    with tarfile.open(other, "w") as tf:
        add_member(tf, "x.png", encode_png(photos[-1][:128, :128]))
    run = run_cli(["audit", other, "--out", tmp_path / "a1", "--threshold", "1e9", "-q", "--groups", table])
    assert "has no group among the audited inputs" in run.output, run.output
    summary = json.loads((tmp_path / "a1" / "summary.json").read_text())["groups"]
    assert summary["inputs_with_groups"] == 0 and summary["inputs_with_groups_not_audited"] == 2
    run = run_cli(["audit", *shards, "--out", tmp_path / "a2", "--threshold", "1e9", "-q", "--groups", table])
    assert "has no group" not in run.output
    assert json.loads((tmp_path / "a2" / "summary.json").read_text())["groups"]["inputs_with_groups"] == 2


def test_the_table_is_matched_from_another_folder_and_a_rewritten_shard_is_not_shown(
        grouped, photos, tmp_path, monkeypatch):
    """The audit names the shards from another folder than ``dedup`` did (the table holds other
    paths): each is matched by its file name and recorded bytes, and its copies are shown. A
    shard rewritten since (same name, same keys, other pictures) shows none: the audit says so
    instead of showing unrelated pictures as copies."""
    import json
    import shutil

    import numpy as np
    import pandas as pd

    shards, table = grouped
    rel = _with_sources(table, tmp_path / "rel.parquet", lambda s: f"elsewhere/{s.rsplit('/', 1)[-1]}")
    monkeypatch.chdir(shards[0].parent)
    run = run_cli(["audit", shards[0].name, shards[1].name, "--out", tmp_path / "a1", "--threshold", "1e9",
                   "-q", "--groups", rel])
    assert "has no group" not in run.output and "not the file" not in run.output
    section = (tmp_path / "a1" / "report.html").read_text().split('<section id="groups">')[1]
    assert "not read" not in section and section.count("class=crop src='data:image/png;base64,") == 3

    copy = tmp_path / "copy"
    copy.mkdir()
    for s in shards:
        shutil.copy(s, copy / s.name)
    keys = pd.read_parquet(table).query("source.str.endswith('b.tar')")["key"].tolist()
    with tarfile.open(copy / shards[1].name, "w") as tf:  # the same keys, other pictures
        for i, key in enumerate(keys):
            add_member(tf, f"{key}.png", encode_png(np.roll(photos[1], 40 * (i + 1), axis=1)[:96, :96]))
    monkeypatch.chdir(copy)
    run = run_cli(["audit", shards[0].name, shards[1].name, "--out", tmp_path / "a2", "--threshold", "1e9",
                   "-q", "--groups", rel])
    assert f"{shards[1].name} is not the file the groups were made from" in run.output, run.output
    section = (tmp_path / "a2" / "report.html").read_text().split('<section id="groups">')[1]
    assert section.count("not shown: ") == 2  # the two copies in the rewritten shard
    assert section.count("class=crop src='data:image/png;base64,") == 1  # step 0, in the intact one
    assert json.loads((tmp_path / "a2" / "summary.json").read_text())["groups"]["inputs_changed_since_the_table"] == 1
