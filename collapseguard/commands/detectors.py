"""``collapseguard detectors``: list the registered detectors."""

import click

from collapseguard.detectors import DEFAULT_DETECTOR, list_detectors


@click.command()
def detectors():
    """List registered detectors (a name ending in ':' takes an argument)."""
    for name, help_text in list_detectors().items():
        mark = " (default)" if name == DEFAULT_DETECTOR else ""
        click.echo(f"{name:<10} {help_text}{mark}")
