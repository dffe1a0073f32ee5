"""CSV cells made inert for spreadsheets (CSV / formula injection), reversibly.

A text cell that starts like a formula (``=``, ``+``, ``-``, ``@``, tab, carriage return) runs as
one when a spreadsheet opens the file: a key such as ``=HYPERLINK(...)`` from a shard is data,
never a formula. Such a cell is written with a leading ``'``, as spreadsheets expect; so is a
cell that already starts with ``'``, so that ``csv_uncell`` gives back exactly the value written.
Parquet outputs keep values as they are.
"""

from __future__ import annotations

#: a CSV cell starting with one of these runs as a formula in a spreadsheet
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v):
    """A text cell made inert: one that starts like a formula (or with ``'``) gets a leading
    ``'``; other values pass unchanged."""
    if isinstance(v, str) and v.startswith((*FORMULA_STARTS, "'")):
        return "'" + v
    return v


def csv_uncell(v):
    """The value ``csv_cell`` was given (for reading such a CSV back)."""
    if isinstance(v, str) and v.startswith("'"):
        return v[1:]
    return v
