"""The one base of every error collapseguard raises on purpose.

Each domain error (``DecodeError``, ``InputError``, ``DetectorError``, ``CalibrationError``,
``ManifestError``, ``FilterError``, ...) derives from :class:`CollapseguardError` and keeps its
other base (``ValueError``, ``RuntimeError``, ``tarfile.ReadError``), so code that catches those
still works. The command line catches :class:`CollapseguardError` once and prints its message as
one line (``collapseguard: error: ...``) with exit code 1.

This module is the package's floor: it imports nothing from collapseguard.
"""

from __future__ import annotations


class CollapseguardError(Exception):
    """A problem collapseguard can name: bad input, a missing file or extra, data it cannot use.
    Its message is meant for the user, one line, without a traceback."""
