"""``collapseguard calibrations``: print what calibration files say."""

import click


@click.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
def calibrations(files):
    """Print what calibration files say. For each of FILES (default: the calibrations shipped
    with the package): detector and version, threshold and guarantee, the held-out false-drop
    rate, per-kind thresholds, and the drop rate by family and step."""
    from collapseguard.calibration.show import shipped_paths, show
    from collapseguard.calibration.thresholds import CalibrationError

    paths = list(files) or shipped_paths()
    if not paths:
        raise click.ClickException("no calibration files given and none shipped")
    for path in paths:
        try:
            text = show(path)
        except CalibrationError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(text)
