"""The ``collapseguard`` command line: one click group.

Each command lives in ``collapseguard/commands/<name>.py`` as a thin wrapper over library calls,
and is imported only when used, so ``collapseguard --help`` stays fast and optional extras are
never imported by accident.

Errors: a :class:`~collapseguard.errors.CollapseguardError` from any command, a command's own
one-line failure, and a missing optional extra (``errors.EXTRA_OF``: which extra to install) print
one line ``collapseguard: error: <message>`` on stderr and exit with 1;
wrong usage (a bad option value, a missing argument) is click's usage message and exit 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from collapseguard.errors import CollapseguardError, missing_extra

#: command name -> "module:attribute" of a click command
COMMANDS = {
    "demo": "collapseguard.commands.demo:demo",
    "score": "collapseguard.commands.score:score",
    "filter": "collapseguard.commands.filter:filter_cmd",
    "audit": "collapseguard.commands.audit:audit",
    "calibrate": "collapseguard.commands.calibrate:calibrate",
    "calibrations": "collapseguard.commands.calibrations:calibrations",
    "evaluate": "collapseguard.commands.evaluate:evaluate",
    "train": "collapseguard.commands.train:train",
    "chains": "collapseguard.commands.chains:chains",
    "detectors": "collapseguard.commands.detectors:detectors",
    "dedup": "collapseguard.commands.dedup:dedup",
}


class CommandError(click.ClickException):
    """One line on stderr, ``collapseguard: error: <message>``, exit code 1. Messages name paths
    and keys from the data: they are printed terminal-safe (``io.terminal.printable``)."""

    def show(self, file=None) -> None:
        from collapseguard.io.terminal import printable
        click.echo(f"collapseguard: error: {printable(self.format_message())}", file=file, err=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler, ``kill``), taken as Ctrl-C is: every command's interrupt path runs
    (parts and checkpoints kept, labels flushed, how to resume said), then exit status 143."""


def _stop_on_sigterm():
    """Make SIGTERM raise ``Terminated`` in this process (the main thread) and pass it on to this
    process's worker processes, which a ``kill PID`` (docker, a job scheduler) does not reach:
    the engine's workers stop their tasks on it and clean up (``engines.local``), so the parent
    is not left waiting for whole shards. A process forked from this one dies of SIGTERM as it
    would have, whatever it inherited. Returns the handler it replaced (None: none set, not the
    main thread), for ``invoke`` to put back."""
    import multiprocessing
    import os
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def terminated(signum, frame):
        if os.getpid() != parent:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        for child in multiprocessing.active_children():
            try:
                os.kill(child.pid, signal.SIGTERM)
            except (OSError, TypeError):  # gone already, or not started
                pass
        raise Terminated()

    return signal.signal(signal.SIGTERM, terminated)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use, and the one place where errors
    become one line."""

    def invoke(self, ctx):
        before = _stop_on_sigterm()
        try:
            return super().invoke(ctx)
        except CollapseguardError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt as exc:
            # an engine may need to end the process its own way (the Ray engine, while Ray is
            # initialised here: os._exit(1)); none can have run when the engines were not loaded
            engines = sys.modules.get("collapseguard.engines.local")
            if engines is not None:
                engines.on_interrupt()
            if isinstance(exc, Terminated):
                sys.exit(143)  # 128 + SIGTERM, as for a process the signal ended
            raise
        except ImportError as exc:  # an optional extra this command needs is not installed
            missing = missing_extra(exc, f"`collapseguard {ctx.invoked_subcommand}`"
                                   if ctx.invoked_subcommand else "this command")
            if missing is None:
                raise
            raise CommandError(str(missing)) from None
        except click.ClickException as exc:
            if type(exc) is click.ClickException:  # a command's own one-line failure
                raise CommandError(exc.format_message()) from None
            raise
        finally:
            if before is not None:  # a caller running the command in its own process keeps its own
                import signal
                signal.signal(signal.SIGTERM, before)

    def list_commands(self, ctx):
        names = [n for n, target in COMMANDS.items()
                 if importlib.util.find_spec(target.partition(":")[0]) is not None]
        return names

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        if importlib.util.find_spec(module) is None:
            return None
        return getattr(importlib.import_module(module), attr)


@click.group("collapseguard", cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="collapseguard")
def main():
    """Find and filter model-degraded images in image training data.

    Scores are oriented so that higher = more degraded, for every detector.
    """


if __name__ == "__main__":  # pragma: no cover
    main()
