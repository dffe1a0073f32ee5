"""``collapseguard dedup`` and ``filter --groups`` on Parquet files (one written by pyarrow with a
``jpg`` bytes column, one written by ``datasets`` with an ``Image`` feature): the chain's rows are
one group whose least damaged step is kept, the groups name the rows as ``filter`` does (the
file's stem, the row's key), and the filter rejects the degraded copies while every row lands
once, in order, byte for byte, in kept/ or rejected/."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cg_testutil import run_cli

WRITERS = ("pyarrow", "datasets")


def _keys(writer: str, parquet_rows) -> list[str]:
    """The row keys ``score`` gives: the ``key`` column, or the row index."""
    return ([k for k, _ in parquet_rows] if writer == "pyarrow"
            else [str(i) for i in range(len(parquet_rows))])


@pytest.fixture(scope="module", params=WRITERS)
def deduped(request, dedup_parquets, tmp_path_factory):
    writer = request.param
    src = dedup_parquets[writer]
    out = tmp_path_factory.mktemp(f"dedup_{writer}")
    # the datasets file names its column; the pyarrow file's jpg column is found
    column = ["--image-column", "image"] if writer == "datasets" else []
    run_cli(["dedup", src, "--out", out, "-q", "--no-pipe", "--gallery", "1", *column])
    return writer, src, out


def _groups(out: Path) -> list[dict]:
    return pq.read_table(out / "groups.parquet").to_pylist()


def test_the_chain_is_one_group_and_its_least_damaged_row_is_kept(deduped, parquet_rows):
    writer, src, out = deduped
    rows = _groups(out)
    assert [r["key"] for r in rows] == _keys(writer, parquet_rows)
    assert {r["shard"] for r in rows} == {src.stem} and {r["source"] for r in rows} == {str(src)}
    assert all(r["error"] == "" for r in rows)
    by_step = {step: r for (_, step), r in zip(parquet_rows, rows)}
    chain = [by_step[s] for s in (0, 1, 3, 5, 10)]
    assert len({r["group"] for r in chain}) == 1 and chain[0]["group"]
    assert [r["rank"] for r in chain] == [0, 1, 2, 3, 4]
    assert (chain[0]["decision"], chain[0]["reason"]) == ("keep", "least_degraded")
    assert by_step[10]["decision"] == "degraded_copy"
    assert (by_step[None]["group"], by_step[None]["decision"]) == ("", "single")


def test_the_gallery_shows_the_chain_read_back_from_the_parquet_file(deduped):
    page = (deduped[2] / "groups.html").read_text()
    assert "class=err" not in page and page.count("<h2>") == 1
    assert page.count("data:image/png;base64,") >= 5 and "degraded_copy" in page


@pytest.mark.parametrize("deduped", ["pyarrow"], indirect=True)
def test_image_column_names_the_images_beside_a_binary_column_found_first(deduped, tmp_path):
    writer, src, out = deduped
    # a binary column named "image" is the one found; --image-column jpg names the photos
    t = pq.read_table(src)
    t = t.append_column("image", pa.array([b"not an image"] * t.num_rows, pa.binary()))
    copy = tmp_path / "in" / src.name
    copy.parent.mkdir()
    pq.write_table(t, copy)
    found = tmp_path / "found"
    run_cli(["dedup", copy, "--out", found, "-q"])
    assert {r["reason"] for r in _groups(found)} == {"not_fingerprinted"}
    named = tmp_path / "named"
    run_cli(["dedup", copy, "--out", named, "-q", "--image-column", "jpg", "--gallery", "1"])
    cols = ["key", "group", "rank", "decision", "reason", "shard"]
    assert pq.read_table(named / "groups.parquet", columns=cols) == pq.read_table(
        out / "groups.parquet", columns=cols)
    page = (named / "groups.html").read_text()  # the gallery reads the named column back
    assert "class=err" not in page and page.count("<h2>") == 1


def test_a_second_run_reuses_the_part_and_writes_the_same_bytes(deduped, tmp_path):
    import shutil
    writer, src, out = deduped
    again = tmp_path / "again"
    shutil.copytree(out, again)
    (again / "groups.parquet").unlink()
    assert len(list((again / ".parts").glob("*.npz"))) == 1  # one task per Parquet file
    column = ["--image-column", "image"] if writer == "datasets" else []
    run_cli(["dedup", src, "--out", again, "-q", *column])
    for name in ("groups.parquet", "summary.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes()
    assert len(list((again / ".parts").glob("*.npz"))) == 1


def _check_conserved(src: Path, out: Path) -> list[dict]:
    """Every input row in exactly one of kept/ and rejected/, in order, every value identical;
    one scores row per input row."""
    rows = pq.read_table(src).to_pylist()
    kept = pq.read_table(out / "kept" / src.name).to_pylist()
    rej = pq.read_table(out / "rejected" / src.name).to_pylist()
    scores = pq.read_table(out / "scores" / f"{src.stem}.parquet").to_pylist()
    assert [s["row"] for s in scores] == list(range(len(rows)))
    is_kept = [s["decision"] == "kept" for s in scores]
    assert kept == [r for r, k in zip(rows, is_kept) if k]
    assert rej == [r for r, k in zip(rows, is_kept) if not k]
    return scores


def test_filter_groups_rejects_the_degraded_rows_and_conserves_every_row(deduped, tmp_path):
    writer, src, out = deduped
    filtered = tmp_path / "filtered"
    run_cli(["filter", src, "--out", filtered, "--groups", out / "groups.parquet",
             "--threshold", "1e9", "-w", "1", "-q"])
    scores = _check_conserved(src, filtered)
    groups = _groups(out)
    assert [s["key"] for s in scores] == [g["key"] for g in groups]
    assert [s["group"] for s in scores] == [g["group"] for g in groups]
    assert any(g["decision"] == "degraded_copy" for g in groups)
    for s, g in zip(scores, groups):
        if g["decision"] == "degraded_copy":
            assert (s["decision"], s["reason"]) == ("rejected", "degraded_copy")
        else:
            assert s["decision"] == "kept", s


def test_a_table_naming_rows_the_file_does_not_have_is_refused(deduped, tmp_path):
    """A groups table with no record of the bytes it was made from (as a hand-edited one, or an
    older dedup's) whose row indices run past the file: refused by name, where those rows'
    decisions were silently never applied."""
    _, src, out = deduped
    t = pq.read_table(out / "groups.parquet").drop(["source_size", "source_sha256"])
    n = pq.ParquetFile(src).metadata.num_rows
    grouped = [i for i, g in enumerate(t.column("group").to_pylist()) if g]
    rows = t.column("row").to_pylist()
    rows[grouped[-1]] = n + 5
    edited = tmp_path / "edited.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("row"), "row", pa.array(rows, t.schema.field("row").type)), edited)
    res = run_cli(["filter", src, "--out", tmp_path / "o", "--groups", edited, "--threshold", "1e9",
                   "-w", "1", "-q"], expect=1)
    assert f"names row {n + 5}" in res.output and f"which has {n} rows" in res.output, res.output
    assert not (tmp_path / "o" / "kept" / src.name).exists()
    ok = tmp_path / "ok.parquet"  # the same table with its own rows: applied
    pq.write_table(t, ok)
    run_cli(["filter", src, "--out", tmp_path / "o2", "--groups", ok, "--threshold", "1e9", "-w", "1", "-q"])
    _check_conserved(src, tmp_path / "o2")


@pytest.mark.parametrize("deduped", ["pyarrow"], indirect=True)  # keys repeat in a key column
def test_the_first_row_of_a_repeated_key_takes_the_groups_decision(deduped, tmp_path):
    writer, src, out = deduped
    # the same file with one more row that repeats the key of the degraded step 10
    t = pq.read_table(src)
    extra = t.slice(1, 1).set_column(0, "key", pa.array(["chain_s10"]))
    copy = tmp_path / "in" / src.name
    copy.parent.mkdir()
    pq.write_table(pa.concat_tables([t, extra]), copy)
    # a table made from the file as it was is refused for these other bytes
    res = run_cli(["filter", copy, "--out", tmp_path / "refused", "--groups", out / "groups.parquet",
                   "--threshold", "1e9", "-w", "1", "-q"], expect=1)
    assert "not applied" in res.output
    # a table without row indices and source identities (as dedup wrote before it recorded them)
    # is matched by key: the first row of a repeated key takes the key's decision
    old = tmp_path / "groups_by_key.parquet"
    pq.write_table(pq.read_table(out / "groups.parquet").drop(["row", "source_size", "source_sha256"]), old)
    filtered = tmp_path / "filtered"
    run_cli(["filter", copy, "--out", filtered, "--groups", old, "--threshold", "1e9", "-w", "1", "-q"])
    scores = _check_conserved(copy, filtered)
    first, repeat = scores[0], scores[-1]
    assert first["key"] == repeat["key"] == "chain_s10"
    assert (first["reason"], repeat["reason"]) == ("degraded_copy", "kept")
    assert first["group"] and repeat["group"] == ""


def test_no_pipe_refuses_a_command(dedup_parquets, tmp_path):
    res = run_cli(["dedup", f"pipe:cat {dedup_parquets['pyarrow']}", "--out", tmp_path / "o",
                   "--no-pipe"], expect=1)
    assert "--no-pipe" in res.output and not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad,match", [
    ("no_kept", "every group needs exactly one rank-0 row"),
    ("two_kept", "every group needs exactly one rank-0 row"),
    ("float_rank", "column rank holds double"),
    ("text_rank", "column rank holds string"),
    ("negative", "no rank, or a negative one"),
])
def test_a_groups_table_whose_ranks_name_no_single_kept_copy_is_refused(deduped, tmp_path, bad, match):
    """The rules read rank 0 as the group's kept copy: a table (hand-edited, or crafted) whose
    group has none or two, or whose ranks are no whole numbers, is refused in one line naming the
    table, before anything runs; a group without a kept copy would lose every copy."""
    _, src, out = deduped
    t = pq.read_table(out / "groups.parquet")
    ranks, groups = t.column("rank").to_pylist(), t.column("group").to_pylist()
    g = next(x for x in groups if x)
    first = next(i for i, (x, r) in enumerate(zip(groups, ranks)) if x == g and r == 0)
    other = next(i for i, (x, r) in enumerate(zip(groups, ranks)) if x == g and r != 0)
    col = pa.array(ranks, t.schema.field("rank").type)
    if bad == "no_kept":
        col = pa.array([5 if i == first else r for i, r in enumerate(ranks)], t.schema.field("rank").type)
    elif bad == "two_kept":
        col = pa.array([0 if i == other else r for i, r in enumerate(ranks)], t.schema.field("rank").type)
    elif bad == "float_rank":
        col = pa.array([float("nan") if i == first else float(r) for i, r in enumerate(ranks)])
    elif bad == "text_rank":
        col = pa.array([str(r) for r in ranks])
    elif bad == "negative":
        col = pa.array([-1 if i == other else r for i, r in enumerate(ranks)], t.schema.field("rank").type)
    crafted = tmp_path / "crafted.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("rank"), "rank", col), crafted)
    res = run_cli(["filter", src, "--out", tmp_path / "o", "--groups", crafted, "--threshold", "1e9",
                   "--drop-duplicates", "-w", "1", "-q"], expect=1)
    assert match in res.output and str(crafted) in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "o" / "kept").exists()
