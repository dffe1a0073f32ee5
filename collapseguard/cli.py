"""The ``collapseguard`` command line: one click group.

Each command lives in ``collapseguard/commands/<name>.py`` as a thin wrapper over library calls,
and is imported only when used, so ``collapseguard --help`` stays fast and optional extras are
never imported by accident.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

#: command name -> "module:attribute" of a click command
COMMANDS = {
    "demo": "collapseguard.commands.demo:demo",
    "score": "collapseguard.commands.score:score",
    "filter": "collapseguard.commands.filter:filter_cmd",
    "audit": "collapseguard.commands.audit:audit",
    "calibrate": "collapseguard.commands.calibrate:calibrate",
    "evaluate": "collapseguard.commands.evaluate:evaluate",
    "train": "collapseguard.commands.train:train",
    "chains": "collapseguard.commands.chains:chains",
    "detectors": "collapseguard.commands.detectors:detectors",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="collapseguard")
def main():
    """Find and filter model-degraded images in image training data.

    Scores are oriented so that higher = more degraded, for every detector.
    """


if __name__ == "__main__":  # pragma: no cover
    main()
