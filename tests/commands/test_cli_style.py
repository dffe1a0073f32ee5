"""One CLI style: the shared options have the same names in every command, older spellings
still parse, progress bars appear on a terminal only, a refused rerun names only what differs,
and filter's per-shard score tables carry the shard."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import click
import pandas as pd
import pytest
from cg_testutil import make_shard, run_with_stdout_closed_early
from click.testing import CliRunner

from collapseguard.cli import main

#: long name -> short name, the same in every command that has the option
SHARED = {"--out": "-o", "--quiet": "-q", "--workers": "-w", "--detector": "-d"}


def all_commands():
    ctx = click.Context(main)
    out = []

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), path + [name])
        else:
            out.append((" ".join(path), cmd))
    walk(main, [])
    return out


def test_shared_options_have_the_same_names_everywhere():
    wrong, seen = [], set()
    for path, cmd in all_commands():
        for p in cmd.params:
            if not isinstance(p, click.Option):
                continue
            names = set(p.opts) | set(p.secondary_opts)
            for long, short in SHARED.items():
                if long in names or short in names:
                    seen.add(long)
                    if not {long, short} <= names:
                        wrong.append(f"{path}: {sorted(names)} should be {long}/{short}")
    assert not wrong, "\n".join(wrong)
    assert seen == set(SHARED)
    paths = {p for p, _ in all_commands()}
    with_out = {p for p, c in all_commands() if any("--out" in q.opts for q in c.params)}
    assert {"score", "filter", "audit", "calibrate", "evaluate", "train", "chains make",
            "chains export"} <= with_out <= paths


@pytest.mark.parametrize("argv,param,value", [
    (["evaluate", "--detectors", "cnn,nss", "-o", "x"], "detectors", ["cnn", "nss"]),
    (["evaluate", "-d", "nss", "--out", "x"], "detectors", ["nss"]),
    (["chains", "make", "--sources", "art:1", "-o", "x", "--no-progress"], "progress", False),
    (["chains", "make", "--sources", "art:1", "-o", "x", "-q", "-w", "1"], "quiet", True),
    (["calibrate", "-d", "nss", "-o", "c.json", "-q"], "detector_name", "nss"),
])
def test_old_and_new_spellings_parse(argv, param, value):
    ctx = click.Context(main)
    cmd, args = main, list(argv)
    while isinstance(cmd, click.Group):
        cmd, args = cmd.get_command(ctx, args[0]), args[1:]
    parsed = cmd.make_context(argv[0], args, resilient_parsing=True)
    assert parsed.params[param] == value


@pytest.fixture()
def shard(tmp_path, photos):
    s = tmp_path / "in" / "s.tar"
    s.parent.mkdir()
    make_shard(s, photos[:2])
    return s


def test_refused_rerun_names_only_the_settings_that_differ(shard, tmp_path):
    args = ["filter", str(shard), "-o", str(tmp_path / "out"), "-d", "nss", "-w", "1", "-q"]
    assert CliRunner().invoke(main, args + ["--threshold", "1"]).exit_code == 0
    res = CliRunner().invoke(main, args + ["--threshold", "2", "--reject-no-image"])
    assert res.exit_code == 1
    assert "reject_no_image False there, True now; threshold 1.0 there, 2.0 now" in res.output
    assert "detector_kwargs" not in res.output and "write_rejected" not in res.output


def test_filter_score_tables_carry_the_shard(shard, tmp_path):
    res = CliRunner().invoke(main, ["filter", str(shard), "-o", str(tmp_path / "out"), "-d", "nss",
                                    "--threshold", "1", "-w", "1", "-q"])
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(tmp_path / "out/scores/s.parquet")
    assert set(table["shard"]) == {"s"} and len(table) == 4


def _stderr_of(argv, tty: bool) -> str:
    env = {**os.environ, "COLUMNS": "100"}
    cmd = [sys.executable, "-c", "from collapseguard.cli import main; main()", *map(str, argv)]
    if not tty:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300,
                              check=True).stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_score_shows_a_bar_with_total_on_a_terminal_and_none_in_a_log(shard, tmp_path):
    argv = ["score", shard, "-d", "nss", "-o", tmp_path / "s.csv", "-w", "1"]
    on_tty = _stderr_of(argv, tty=True)
    assert "score: 100%" in on_tty and "4/4" in on_tty, on_tty
    in_log = _stderr_of(argv, tty=False)
    assert "scored 4 row(s)" in in_log and "score:" not in in_log and "%|" not in in_log
    assert "score:" not in _stderr_of(argv + ["-q"], tty=True)


def test_chains_make_shows_a_bar_on_a_terminal_and_none_in_a_log(tmp_path):
    def argv(out):
        return ["chains", "make", "--sources", "art:1:48-64", "--families", "codec", "--steps", "2",
                "--keep", "0,1,2", "-w", "1", "-o", tmp_path / out]
    on_tty = _stderr_of(argv("a"), tty=True)
    assert "chains: 100%" in on_tty and "1/1" in on_tty, on_tty
    in_log = _stderr_of(argv("b"), tty=False)
    assert "chains:" not in in_log and "%|" not in in_log, in_log
    assert (tmp_path / "b" / "manifest.csv").is_file()


def test_an_output_under_a_file_names_the_file(shard, tmp_path):
    (tmp_path / "afile.jpg").write_bytes(b"x")
    res = CliRunner().invoke(main, ["score", str(shard), "-o", str(tmp_path / "afile.jpg" / "out.csv"),
                                    "-d", "nss", "-q"])
    assert res.exit_code == 1 and f"{tmp_path / 'afile.jpg'} is a file, not a folder" in res.output
    res = CliRunner().invoke(main, ["filter", str(shard), "-o", str(tmp_path / "afile.jpg" / "a" / "out"),
                                    "-d", "nss", "-w", "1", "-q"])
    assert res.exit_code == 1 and "Not a directory" in res.output and "File exists" not in res.output
    assert (tmp_path / "afile.jpg").read_bytes() == b"x"


@pytest.mark.parametrize("argv", [["detectors"], ["chains", "families"], ["calibrations"], ["--help"]])
def test_printing_into_a_pipe_closed_early_stops_quietly(argv):
    """``collapseguard detectors | head -1``: click ends a command whose stdout was closed by its
    reader with exit status 1 and nothing on stderr. In the first run the reader is gone before the command writes, so it always meets
    the closed pipe."""
    cmd = [sys.executable, "-c", "from collapseguard.cli import main; main()", *argv]
    assert run_with_stdout_closed_early(cmd, lines=0) == (1, "")
    # as `| head -1`: one line read, then closed; the rest may all be written by then (exit 0)
    status, err = run_with_stdout_closed_early(cmd, lines=1)
    assert err == "" and status in (0, 1), err


@pytest.mark.parametrize("args", [
    ["dedup", ".", "--out", "OUT", "--min-corr", "nan"],
    ["dedup", ".", "--out", "OUT", "--level", "nan"],
    ["filter", ".", "--out", "OUT", "--drop-fraction", "nan"],
    ["calibrate", "--clean", ".", "--out", "OUT/c.json", "--holdout", "nan"],
    ["train", "--chains", ".", "--out", "OUT/w.safetensors", "--epochs", "inf"],
    ["score", ".", "--out", "OUT/s.csv", "--threshold", "nan"],
    ["audit", ".", "--out", "OUT", "--threshold", "-inf"],
    ["filter", ".", "--out", "OUT", "--threshold", "inf"],
    ["demo", "OUT", "--threshold", "nan"],
])
def test_a_number_option_refuses_nan_and_inf_before_anything_runs(tmp_path, args):
    """A NaN passes every range comparison: `--min-corr nan` was taken and made every image a
    single. Every ranged number option refuses it, and infinity, as a usage error."""
    from click.testing import CliRunner

    from collapseguard.cli import main
    res = CliRunner().invoke(main, [a.replace("OUT", str(tmp_path / "o")) for a in args])
    assert res.exit_code == 2 and "is not a finite number" in res.output, res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("seed", ["-5", str(2**64)])
def test_audit_refuses_a_seed_it_cannot_use_before_scoring(tmp_path, seed):
    """A negative seed failed after the whole dataset was scored, one of 2**64 with a traceback:
    both are a usage error naming --seed, before anything runs."""
    from click.testing import CliRunner

    from collapseguard.cli import main
    res = CliRunner().invoke(main, ["audit", str(tmp_path), "--out", str(tmp_path / "o"), "--sample", "5",
                                    "--seed", seed])
    assert res.exit_code == 2 and "--seed" in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "o").exists()
