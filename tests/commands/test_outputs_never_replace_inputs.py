"""`score` and `audit` write their tables whole at the end; an output path that is one of the
inputs (named, or a Parquet dataset inside an input folder) is refused before anything is read,
so the scores never replace the images they were made from. Real Parquet datasets, the real CLI."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import skimage.data as sd
from cg_testutil import run_cli
from PIL import Image


def _dataset(path) -> bytes:
    rows = []
    for name in ("astronaut", "coffee"):
        b = io.BytesIO()
        Image.fromarray(getattr(sd, name)()).resize((96, 96)).save(b, "PNG")
        rows.append({"key": name, "image": {"bytes": b.getvalue(), "path": f"{name}.png"}})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


def test_score_refuses_an_out_that_is_its_input(tmp_path):
    data = tmp_path / "victim.parquet"
    before = _dataset(data)
    res = run_cli(["score", data, "-o", data, "-d", "nss", "-q"], expect=1)
    assert "would replace the input" in res.output and "choose another --out" in res.output
    assert data.read_bytes() == before
    run_cli(["score", data, "-o", tmp_path / "scores.parquet", "-d", "nss", "-q"])  # elsewhere: fine
    # an earlier scores table in the input folder is not an input: a rerun may replace it
    folder = tmp_path / "d"
    folder.mkdir()
    _dataset(folder / "part.parquet")
    run_cli(["score", folder, "-o", folder / "scores.parquet", "-d", "nss", "-q"])
    run_cli(["score", folder, "-o", folder / "scores.parquet", "-d", "nss", "-q"])
    res = run_cli(["score", folder, "-o", folder / "part.parquet", "-d", "nss", "-q"], expect=1)
    assert "would replace the input" in res.output


def test_audit_refuses_an_out_holding_an_input_it_would_write_over(tmp_path):
    out = tmp_path / "ov"
    out.mkdir()
    before = _dataset(out / "scores.parquet")  # a dataset that happens to be named scores.parquet
    res = run_cli(["audit", out / "scores.parquet", "-o", out, "-d", "nss", "-q"], expect=1)
    assert "would replace the input" in res.output
    assert (out / "scores.parquet").read_bytes() == before and not (out / "report.html").exists()
    res = run_cli(["audit", out, "-o", out, "-d", "nss", "-q"], expect=1)  # the folder, same file
    assert "would replace the input" in res.output
