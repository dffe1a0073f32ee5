"""Text from the data (family, chain and file names come from folder names and manifests) written
into Markdown files: on one line, and shown by a viewer that renders inline HTML instead of run."""

from __future__ import annotations

import re


def one_line(text: str) -> str:
    """Text on one line: a line break (possible in a folder name) would end a table row or list
    item, so each becomes a visible ``↵``."""
    return text.replace("\r\n", "↵").replace("\n", "↵").replace("\r", "↵")


def md_text(text) -> str:
    """``text`` on one line with ``&``, ``<`` and ``>`` as entities (a list item, a sentence)."""
    return one_line(str(text)).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def md_cell(text) -> str:
    """``md_text`` with ``|`` escaped too: one table cell."""
    return md_text(text).replace("|", "\\|")


def md_code(text) -> str:
    """``text`` as Markdown inline code on one line, whatever backticks it holds."""
    text = one_line(str(text))
    fence = "`" * (max((len(m) for m in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
