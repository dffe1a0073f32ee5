"""Helpers shared by tests (importable because setup.cfg puts tests/ on pytest's pythonpath)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np

from collapseguard.images import encode_jpeg


def add_member(tf: tarfile.TarFile, name: str, data: bytes, mtime: int = 1_700_000_000) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    tf.addfile(info, io.BytesIO(data))


def read_members(path) -> list[tuple[str, bytes]]:
    """All regular members of a tar as (name, bytes), in order."""
    out = []
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if m.isfile():
                out.append((m.name, tf.extractfile(m).read()))
    return out


def degrade(img: np.ndarray, rounds: int = 6, seed: int = 0) -> np.ndarray:
    """A crude replication loop for fixtures: noise, sharpen, slight green cast, each round."""
    from scipy import ndimage
    rng = np.random.default_rng(seed)
    x = img.astype(np.float32)
    for _ in range(rounds):
        x = x + rng.normal(0, 4, x.shape)
        blur = ndimage.gaussian_filter(x, (1, 1, 0))
        x = x + 0.6 * (x - blur)
        x[..., 1] += 1.5
        x = np.clip(x, 0, 255)
    return x.astype(np.uint8)


def make_shard(path: Path, photos, *, degraded=True, extra=(), start=0) -> list[tuple[str, bytes]]:
    """A shard of clean + degraded photos (jpg + txt + json per sample) with captions and json; returns its members."""
    members = []
    for i, img in enumerate(photos):
        for deg in ((0, 1) if degraded else (0,)):
            key = f"{path.stem}_{start + i:04d}_{deg}"
            im = degrade(img, seed=i) if deg else img
            members += [(f"{key}.jpg", encode_jpeg(im, 92)), (f"{key}.txt", f"caption {i}".encode()),
                        (f"{key}.json", json.dumps({"i": i, "deg": deg}).encode())]
    members += list(extra)
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            add_member(tf, name, data)
    return members


def echo_or_die(task, detector, progress=None):
    """Engine task for tests: returns ``task``, except that the task ``"die"`` kills its worker
    process outright (as the kernel's out-of-memory killer would) instead of raising."""
    import os
    import signal
    if task == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if task == "exit":  # a detector or library calling sys.exit
        raise SystemExit(3)
    return task


def stage_or_die(task, detector, progress=None):
    """Engine task for tests: ``task`` is ``(folder, name)``; it stages ``folder/name.tmp`` and, for
    a name starting with ``die``, kills its worker before committing it (renaming it to ``name``)."""
    import os
    import signal
    folder, name = task
    tmp = os.path.join(folder, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(name)
    if name.startswith("die"):
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(tmp, os.path.join(folder, name))
    return name


def _discard_stage(task) -> None:
    import os
    folder, name = task
    try:
        os.unlink(os.path.join(folder, name + ".tmp"))
    except FileNotFoundError:
        pass


stage_or_die.discard_abandoned = _discard_stage


def pid_and_detector(task, detector, progress=None):
    """Engine task for tests: ``(pid, detector class name)`` of the process that ran it, after a
    progress report of 1 and, for a task ``"slow"``, half a second of sleep (``"die"``: as in
    ``echo_or_die``)."""
    import os
    import time
    if task == "die":
        echo_or_die(task, detector)
    if task == "slow":
        time.sleep(0.5)
    if progress is not None:
        progress(1)
    return os.getpid(), type(detector).__name__


def run_cli(args, expect=0):
    """The command line in this process (click's runner): arguments as text, the exit code checked."""
    from click.testing import CliRunner

    from collapseguard.cli import main
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, res.output
    return res


def run_with_stdout_closed_early(cmd, lines: int = 1, timeout: float = 300) -> tuple[int, str]:
    """Run ``cmd`` with its stdout a pipe whose reader stops early, as ``| head -n LINES`` does:
    it reads ``lines`` lines and closes the pipe; with ``lines=0`` the reader is gone before the
    command starts (its first write meets the closed pipe, whatever its output's size).
    Returns the exit status and stderr."""
    import os
    import subprocess
    if lines:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(lines):
            proc.stdout.readline()
        proc.stdout.close()
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)
        proc = subprocess.Popen(cmd, stdout=write_end, stderr=subprocess.PIPE)
        os.close(write_end)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")


def same_weights(a: Path, b: Path) -> bool:
    """Every tensor equal bit for bit, and the same metadata (safetensors writes the metadata's
    keys in no fixed order, so two files of the same weights may differ in their header bytes)."""
    from safetensors import safe_open

    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        if fa.metadata() != fb.metadata() or set(fa.keys()) != set(fb.keys()):
            return False
        return all(fa.get_tensor(k).numpy().tobytes() == fb.get_tensor(k).numpy().tobytes() for k in fa.keys())  # noqa: SIM118 - safe_open, not a dict
