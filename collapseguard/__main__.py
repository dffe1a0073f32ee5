"""``python -m collapseguard``: the command line, as the ``collapseguard`` script runs it."""

from collapseguard.cli import main

main()
