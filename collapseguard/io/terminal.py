"""Text that came from data, made safe to print on a terminal.

Shard paths, member names, keys and error messages holding them are untrusted: a name with
terminal escape sequences would set the window title or clear the screen when printed raw. Every
message that prints such a name passes it through :func:`printable`.
"""

from __future__ import annotations

import math
import numbers


def first_of(items, shown: int = 5, sep: str = "; ") -> str:
    """The first ``shown`` of ``items`` (strings, already escaped where they hold data) joined by
    ``sep``, and how many more there are: ``a; b (and 3 more)``."""
    items = list(items)
    more = f" (and {len(items) - shown} more)" if len(items) > shown else ""
    return sep.join(items[:shown]) + more


def printable(text: object) -> str:
    """``text`` with every character that is not printable (control characters, escape, DEL, C1
    controls, bidirectional overrides, line and paragraph separators) written as a Python escape
    (``\\x1b``, ``\\u202e``); spaces are kept."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in s)


def percent(x, digits: int = 1) -> str:
    """A rate in [0, 1] as a percentage with ``digits`` decimals ("n/a" for None, NaN and a
    value that is no number)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
        return "n/a"
    return f"{100 * x:.{digits}f}%"
