"""Safetensors files whose bytes depend only on their contents: the ``safetensors`` writer keeps
the ``__metadata__`` of its header in a hash map, so one set of tensors and metadata is written
with its keys in a different order from one call to the next; ``sort_metadata`` puts them in
sorted order, so identical weights give identical files (and SHA-256)."""

from __future__ import annotations

import json
from pathlib import Path


def sort_metadata(path: str | Path) -> None:
    """Rewrite the header of the safetensors file ``path`` in place with its ``__metadata__``
    keys sorted. The header keeps its length (only the order of its entries changes) and the
    tensor data is not touched; a header that would not keep its length is left as it is."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        raw = f.read(n)
        header = json.loads(raw)
        meta = header.get("__metadata__")
        if not isinstance(meta, dict) or len(meta) < 2:
            return
        header = {"__metadata__": dict(sorted(meta.items())),
                  **{k: v for k, v in header.items() if k != "__metadata__"}}
        new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(new) != len(raw.rstrip(b" ")):
            return
        f.seek(8)
        f.write(new.ljust(n, b" "))
