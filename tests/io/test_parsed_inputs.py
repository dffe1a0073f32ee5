"""Each input parsed once (``io.parse``): what kind it is, where it is read from, and the rule
for ``pipe:``: an argument naming an existing file is that file; a command runs only when it is
the user's own argument and ``--no-pipe`` is not given."""

from __future__ import annotations

import pickle

import pytest
from cg_testutil import make_shard, read_members, run_cli

EVIL = "pipe:touch PWNED_A; echo a.tar"


def test_a_file_named_like_a_pipe_command_on_the_command_line_is_that_file(tmp_path, photos, monkeypatch):
    """``collapseguard filter *.tar`` in a folder holding ``pipe:touch PWNED_A; echo a.tar`` (the
    shell expands the glob): the file is filtered as a file, and no command runs."""
    d = tmp_path / "d"
    d.mkdir()
    members = make_shard(d / EVIL, photos[:2], degraded=False)
    monkeypatch.chdir(d)
    run_cli(["filter", EVIL, "-o", tmp_path / "o", "-d", "nss", "--threshold", "1e9", "-w", "1", "-q"])
    assert not (d / "PWNED_A").exists() and not (tmp_path / "PWNED_A").exists()
    assert read_members(tmp_path / "o" / "kept" / EVIL) == members  # named after the file
    run_cli(["score", EVIL, "-d", "nss", "-o", tmp_path / "s.csv", "-q"])
    run_cli(["audit", EVIL, "-d", "nss", "--threshold", "1e9", "-o", tmp_path / "a", "-q"])
    run_cli(["calibrate", "--clean", EVIL, "-d", "nss", "--max-false-drop", "0.5", "--confidence", "0.5",
             "--holdout", "0", "--no-plot", "-o", tmp_path / "c.json", "--scores-out", tmp_path / "c.csv"])
    assert not (d / "PWNED_A").exists()
    import pandas as pd
    assert len(pd.read_csv(tmp_path / "s.csv")) == len(pd.read_csv(tmp_path / "c.csv")) == 2


def test_the_parse_rule(tmp_path, photos, monkeypatch):
    from collapseguard.io.inputs import InputError, expand
    from collapseguard.io.parse import Input, parse_argument
    monkeypatch.chdir(tmp_path)
    make_shard(tmp_path / EVIL, photos[:1], degraded=False)
    got = parse_argument(EVIL)
    assert [(i.kind, i.via) for i in got] == [("tar", "local")]
    assert got[0].name == f"./{EVIL}" and got[0].basename == EVIL
    # no such file: the user's own command, braces expanded into one command each
    cmds = parse_argument("pipe:cat s-{0..1}.tar")
    assert [(i.kind, i.via, i.name, i.stem) for i in cmds] == [
        ("tar", "pipe", "pipe:cat s-0.tar", "s-0"), ("tar", "pipe", "pipe:cat s-1.tar", "s-1")]
    with pytest.raises(InputError, match="--no-pipe"):
        parse_argument("pipe:cat s.tar", allow_pipe=False)
    # a local brace pattern whose expansion reads like a command is a path, never run
    with pytest.raises(InputError, match="no such file"):
        expand(["{pipe:touch PWNED_B; echo ,x}y.tar"])
    assert not (tmp_path / "PWNED_B").exists()
    # values are small, frozen and picklable (they travel to worker processes)
    assert pickle.loads(pickle.dumps(got[0])) == got[0]
    with pytest.raises(AttributeError):
        got[0].name = "x"  # type: ignore[misc]
    assert isinstance(got[0], Input)


def test_no_pipe_refuses_every_command(tmp_path, photos):
    for cmd in (["filter", "pipe:cat x.tar", "-o", tmp_path / "o", "-d", "nss", "--threshold", "1"],
                ["score", "pipe:cat x.tar", "-d", "nss", "-o", tmp_path / "s.csv"],
                ["audit", "pipe:cat x.tar", "-d", "nss", "--threshold", "1", "-o", tmp_path / "a"]):
        res = run_cli([*cmd, "--no-pipe"], expect=1)
        assert "--no-pipe" in res.output
    assert not (tmp_path / "o").exists() and not (tmp_path / "a").exists()
