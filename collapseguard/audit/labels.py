"""How the audit names its sources to people: in the terminal table and in report.html alike."""

from __future__ import annotations

from collections import Counter

from collapseguard.io.terminal import printable
from collapseguard.scoring.records import SET_ASIDE_REASONS

#: ``filter``'s reasons for setting a sample aside whatever its score (``records.SET_ASIDE_REASONS``,
#: in their order), as the report and the terminal say them
SET_ASIDE_LABELS = {reason: reason.replace("_", " ") for reason in SET_ASIDE_REASONS}


def source_labels(sources) -> dict[str, str]:
    """A label for each source: its shortest trailing run of path components that no other
    source ends with (``a/shards`` and ``b/shards``, not ``shards`` twice; the file name alone
    where it is unique), escaped with ``printable``. Components are compared escaped, so labels
    of distinct sources differ as printed. The report HTML-escapes these labels in turn."""
    sources = list(dict.fromkeys(sources))
    parts = {s: tuple(printable(p) for p in s.rstrip("/").split("/") if p) or (printable(s),) for s in sources}
    ends = Counter(p[-n:] for p in parts.values() for n in range(1, len(p) + 1))
    label: dict[str, str] = {}
    for s in sources:
        mine = parts[s]
        n = next((n for n in range(1, len(mine) + 1) if ends[mine[-n:]] == 1), None)
        if n is not None:
            label[s] = "/".join(mine[-n:])
        else:  # every suffix is shared (``x`` and ``x/``): the whole source, escaped
            same = any(printable(o) == printable(s) for o in sources if o != s)
            label[s] = ascii(s) if same else printable(s)
    return label
