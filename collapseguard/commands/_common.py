"""Options and helpers shared by several commands."""

from __future__ import annotations

import math
import os

import click

from collapseguard.detectors import DEFAULT_DETECTOR, create, list_detectors


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf``: a NaN passes every range
    comparison, so ``--min-corr nan`` would be taken and silently make every image a single."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{rv!r} is not a finite number", param, ctx)
        return rv


class FiniteFloat(click.types.FloatParamType):
    """A float option that refuses ``nan`` and ``inf`` (``FiniteFloatRange`` without a range):
    a NaN threshold compares false with every score, so nothing would ever be flagged."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{rv!r} is not a finite number", param, ctx)
        return rv


def detector_option(default: str = DEFAULT_DETECTOR):
    names = ", ".join(list_detectors())  # the registry's names, so the help never lags behind it
    return click.option("--detector", "-d", default=default, show_default=True,
                        help=f"Detector name: {names}. A name ending in ':' takes an argument, "
                             "e.g. pyiqa:piqe or ens:cnn+nss; `collapseguard detectors` describes each.")


def workers_option(default: int | None = None):
    return click.option("--workers", "-w", type=click.IntRange(min=1),
                        default=default or min(2, os.cpu_count() or 1), show_default=True,
                        help="Worker processes (each loads the detector once).")


def quiet_option(help: str = "No progress bar."):
    """``--quiet/-q``. Besides the command's own bars it quiets Hugging Face's ("Loading weights",
    "Fetching files") in this process and in the workers it starts, where a detector loads a
    transformers model (vlm:, rali:)."""
    return click.option("--quiet", "-q", is_flag=True, help=help, callback=_quiet_libraries)


def _quiet_libraries(ctx, param, value: bool) -> bool:
    if value:
        import sys

        # read when huggingface_hub is imported (here or in a worker process) ...
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        # ... and switched where it already was
        if "huggingface_hub" in sys.modules:
            sys.modules["huggingface_hub"].utils.disable_progress_bars()
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    return value


def no_pipe_option():
    return click.option("--no-pipe", is_flag=True, default=False,
                        help="Refuse pipe:CMD inputs: no argument runs as a shell command (a file "
                             "that exists is read as that file either way).")


def refuse_pipes(inputs, no_pipe: bool) -> None:
    """With ``--no-pipe``, one line naming the first argument that would run as a command."""
    if no_pipe:
        from collapseguard.io.parse import refuse_pipes as refuse
        refuse(inputs)


def trust_pickle_option():
    return click.option("--trust-pickle", is_flag=True, default=False,
                        help="Allow loading pickled checkpoints (RALI's pca.pkl/ckpt.pt). Only for "
                             "files you trust: unpickling can run arbitrary code.")


def detector_kwargs(name: str, trust_pickle: bool) -> tuple:
    return (("trust_pickle", True),) if trust_pickle and name.startswith(("rali:", "ens:")) else ()


def load_detector(name: str, kwargs: tuple = ()):
    """Create a detector; a bad spec raises DetectorError, which the command line prints as one
    line."""
    return create(name, **dict(kwargs))


def threshold_options(verb: str):
    """``--threshold`` and ``--calibration``, shared by the commands that decide or mark (filter, audit, score)."""
    def deco(f):
        f = click.option("--calibration", type=click.Path(exists=True, dir_okay=False), default=None,
                         help="calibration.json from `collapseguard calibrate` (must match the "
                              "detector); default: the calibration shipped for the detector.")(f)
        return click.option("--threshold", type=FiniteFloat(), default=None,
                            help=f"{verb} samples scoring above this (uncalibrated; overrides any "
                                 "calibration).")(f)
    return deco


def _check_ancestors(p) -> None:
    """Raise NotADirectoryError naming the nearest existing ancestor of ``p`` when it is a file
    (``mkdir`` would say only "File exists")."""
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(f"{parent} is a file, not a folder")
            return


def check_out_file(path, what: str = "--out") -> None:
    """Fail now, with one line, when ``path`` cannot be written as a file (before any long work):
    its folder cannot be made, it is a folder, or opening it for writing fails."""
    from pathlib import Path

    p = Path(path)
    try:
        if p.is_dir():
            raise IsADirectoryError("it is a folder")
        _check_ancestors(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        existed = p.exists()
        with open(p, "ab"):
            pass
        if not existed:
            p.unlink()
    except OSError as exc:
        raise click.ClickException(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def check_out_dir(path, what: str = "--out") -> None:
    """Fail now, with one line, when ``path`` cannot be used as an output folder."""
    from pathlib import Path

    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise NotADirectoryError("a file of that name exists")
        _check_ancestors(p)
        p.mkdir(parents=True, exist_ok=True)
        if not os.access(p, os.W_OK):
            raise PermissionError("permission denied")
    except OSError as exc:
        raise click.ClickException(f"cannot use {what} {path} as a folder: {exc.strerror or exc}") from None



class RecordsArgs(click.Command):
    """A command that keeps the arguments it was given (``command_line``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["collapseguard.args"] = list(args)
        return super().parse_args(ctx, args)


def command_line(ctx: click.Context) -> str:
    """The running command as a shell line, e.g. for a file to record what made it: the command's
    names from the root group's own name down (``collapseguard calibrate``, also when it was
    called from Python or as ``python -m collapseguard``) and the arguments it was given, from the
    click context of a ``RecordsArgs`` command rather than ``sys.argv``."""
    import shlex

    names = []
    c = ctx
    while c.parent is not None:
        names.append(c.info_name)
        c = c.parent
    names.append(c.command.name or c.info_name)
    return " ".join([*reversed(names)] + [shlex.quote(a) for a in ctx.meta.get("collapseguard.args", [])])
