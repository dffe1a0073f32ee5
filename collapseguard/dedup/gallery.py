"""``groups.html``: the groups ``dedup`` found, each copy beside the kept one.

One self-contained HTML file (images embedded as ``data:`` URIs, every text from the data escaped).
Groups with a degraded copy come first, then the largest. Each group is a row: the kept copy,
then the others by rank, each with a thumbnail and a 1:1 crop (not resampled, stored as PNG) of
the same part of the picture (the kept copy's most textured window, at the same relative place in
each copy, or through the matching window in a crop; an image with transparency as PNG on a checkerboard, as the audit galleries show it), its key, decision, rank and P(more degraded than the kept copy). Only the images
shown are read back (``scoring.readback.fetch_samples``: each shard streamed once).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from collapseguard.errors import CollapseguardError
from collapseguard.io.atomic import replaced_when_done
from collapseguard.scoring.readback import (
    CSP,
    Fetched,
    detail_window,
    fetch_samples,
    png_uri,
    thumb_uri,
    thumbnail,
)

CROP = 192
MAX_MEMBERS = 8


def e(x) -> str:
    return html.escape(str(x), quote=True)


def _crop_at(img: np.ndarray, fy: float, fx: float, size: int) -> np.ndarray:
    """The ``size`` x ``size`` native-resolution window of ``img`` centred at the relative place."""
    h, w = img.shape[:2]
    ch, cw = min(size, h), min(size, w)
    y = int(np.clip(round(fy * h - ch / 2), 0, h - ch))
    x = int(np.clip(round(fx * w - cw / 2), 0, w - cw))
    return img[y: y + ch, x: x + cw]


def place_in(img: np.ndarray, kept: np.ndarray, fy: float, fx: float) -> tuple[float, float]:
    """The relative place in ``img`` of the relative place ``(fy, fx)`` of ``kept``: the same
    place, or, when one is a crop of the other (a central window of one matches the other's
    whole better than the wholes match, ``groups.FRAMING_MARGIN``), that place through the
    window: so a crop's 1:1 crop shows the same part of the picture as the kept copy's."""
    from collapseguard.dedup.groups import FRAMING_MARGIN, window_relation
    from collapseguard.detectors.fingerprint import WINDOWS, fingerprint_arrays

    _, thumbs, _, wthumbs = fingerprint_arrays(
        [np.ascontiguousarray(a[..., :3]) if a.ndim == 3 else a for a in (img, kept)])
    k, img_is_crop = window_relation(thumbs, wthumbs, 0, 1, FRAMING_MARGIN)
    if k < 0:
        return fy, fx
    share, margin = WINDOWS[k], (1 - WINDOWS[k]) / 2
    if img_is_crop:  # img is kept's central window
        return float(np.clip((fy - margin) / share, 0, 1)), float(np.clip((fx - margin) / share, 0, 1))
    return margin + fy * share, margin + fx * share


def pick_groups(rows: list[dict], max_groups: int) -> list[list[dict]]:
    """Groups to show: those with a degraded copy first, then by size. Of a group larger than
    ``MAX_MEMBERS``, the kept copy, then its degraded copies (the decisions a reader checks), then
    the others by rank; shown by rank."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["group"]:
            groups.setdefault(r["group"], []).append(r)
    ordered = sorted(groups.values(), key=lambda ms: (
        not any(m["decision"] == "degraded_copy" for m in ms), -len(ms), ms[0]["group"]))
    out = []
    for ms in ordered[:max_groups]:
        first = sorted(ms, key=lambda m: (m["rank"] != 0, m["decision"] != "degraded_copy", m["rank"]))
        out.append(sorted(first[:MAX_MEMBERS], key=lambda m: m["rank"]))
    return out


#: the columns the gallery reads from a groups table
COLUMNS = ("source", "key", "group", "rank", "decision", "p_worse", "reason", "image")

#: the gallery's CSS, scoped to ``.cg-groups`` (audit's report embeds it beside its own)
STYLE = (".cg-groups .row{display:flex;gap:8px;overflow-x:auto}"
         ".cg-groups .tile{border:2px solid #8a8;padding:4px}"
         ".cg-groups .tile.degraded_copy{border-color:#c44}"
         ".cg-groups .crop{display:block;image-rendering:pixelated}.cg-groups .err{color:#c44}"
         ".cg-groups img.alpha{background-color:#fff;background-image:linear-gradient(45deg,#c8ccd2 25%,"
         "transparent 25%,transparent 75%,#c8ccd2 75%),linear-gradient(45deg,#c8ccd2 25%,transparent 25%,"
         "transparent 75%,#c8ccd2 75%);background-size:16px 16px;background-position:0 0,8px 8px}")


class NotAGroupsTable(CollapseguardError, ValueError):
    """The file cannot be read as a ``dedup`` groups.parquet (one line, naming the file)."""


def read_gallery_rows(groups_parquet: str | Path) -> list[dict]:
    """The gallery's columns of a groups table, checked: a file that is not one is one line."""
    try:
        names = set(pq.read_schema(groups_parquet).names)
    except (OSError, ValueError) as exc:
        raise NotAGroupsTable(f"cannot read {groups_parquet} as a groups table: {exc}") from None
    missing = set(COLUMNS) - names
    if missing:
        raise NotAGroupsTable(f"{groups_parquet} is not a dedup groups.parquet (no column "
                              f"{', '.join(sorted(missing))})")
    extra = [c for c in OPTIONAL_COLUMNS if c in names]
    rows = pq.read_table(groups_parquet, columns=[*COLUMNS, *extra]).to_pylist()
    return with_nth(rows)


#: columns of a groups table the gallery reads when it has them: the stem and bytes each source's
#: rows were made from (``audit --groups`` matches its inputs by them) and a Parquet row's index
OPTIONAL_COLUMNS = ("shard", "row", "source_size", "source_sha256")


def with_nth(rows: list[dict]) -> list[dict]:
    """``rows`` with ``nth``: which of the samples (or Parquet rows) with its key in its source
    the row is (``scoring.readback.fetch_samples``' ``nth``), by the row index where the table
    has one, else by the table's order (``dedup`` writes each source's rows in reading order). A
    key that repeats in a shard or file then shows its own image, not the first one's."""
    by_key: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        by_key.setdefault((r["source"], r["key"]), []).append(i)
    for idx in by_key.values():
        order = sorted(idx, key=lambda i: (rows[i].get("row") is None, rows[i].get("row") or 0, i))
        for nth, i in enumerate(order):
            rows[i]["nth"] = nth
    return rows


def render_groups(rows: list[dict], max_groups: int = 30, image_column: str | None = None,
                  heading: str = "h2", sources: Collection[str] | None = None) -> tuple[str, int]:
    """The groups of ``rows`` (from ``read_gallery_rows``) as an HTML fragment inside
    ``<div class=cg-groups>`` (styled by ``STYLE``), and the number of groups shown. ``sources``:
    the sources that may be read to show the copies (None: any; see
    ``scoring.readback.fetch_samples``)."""
    shown = pick_groups(rows, max_groups)
    sizes = Counter(r["group"] for r in rows if r["group"])
    fetched = fetch_samples([(m["source"], m["key"], m["image"], m.get("nth", 0)) for ms in shown
                             for m in ms if not m.get("unreadable")],
                            image_column=image_column, sources=sources)
    for ms in shown:  # rows the caller knows cannot be shown (``unreadable``: why)
        for m in ms:
            if m.get("unreadable"):
                fetched[(m["source"], m["key"], m.get("nth", 0))] = Fetched(error=m["unreadable"])
    parts = []
    for ms in shown:
        kept = fetched.get((ms[0]["source"], ms[0]["key"], ms[0].get("nth", 0)))
        fy = fx = 0.5
        if kept is not None and kept.image is not None:
            y, x, ch, cw = detail_window(kept.image, CROP)
            h, w = kept.image.shape[:2]
            fy, fx = (y + ch / 2) / h, (x + cw / 2) / w
        tiles = []
        for m in ms:
            f = fetched.get((m["source"], m["key"], m.get("nth", 0)))
            my, mx = fy, fx
            if f is not None and f.image is not None and kept is not None and kept.image is not None \
                    and m is not ms[0]:
                my, mx = place_in(f.image, kept.image, fy, fx)
            p = m["p_worse"]
            why = m.get("reason")  # decisions the comparator's P alone did not make
            label = (f"{e(m['key'])}<br>{e(m['decision'])}"
                     + (f" ({e(why)})" if why in ("lost_colour", "larger_copy", "other_framing") else "")
                     + f" · rank {e(m['rank'])}"
                     + ("" if p is None or p != p else f" · P(worse) {p:.3f}"))
            if f is None or f.image is None:
                body = f"<div class=err>{e(f.error if f is not None else 'not read')}</div>"
            else:
                h, w = f.image.shape[:2]
                alpha = f.image.ndim == 3 and f.image.shape[2] == 4  # shown on a checkerboard
                thumb_class, crop_class = ("alpha", "'crop alpha'") if alpha else ("", "crop")
                body = (f"<img{' class=' + thumb_class if thumb_class else ''} "
                        f"src='{thumb_uri(thumbnail(f.image, 160))}' alt=''>"
                        f"<img class={crop_class} src='{png_uri(_crop_at(f.image, my, mx, CROP))}' alt=''>"
                        f"<div>{w}x{h}</div>")
            tiles.append(f"<div class='tile {e(m['decision'])}'>{body}<div>{label}</div></div>")
        n = sizes[ms[0]["group"]]
        hidden = (f" · {len(ms)} of its {n} copies shown: the kept one, its degraded copies first"
                  if n > len(ms) else "")
        parts.append(f"<{heading}>{e(ms[0]['group'])}{hidden}</{heading}><div class=row>{''.join(tiles)}</div>")
    return f"<div class=cg-groups>{''.join(parts)}</div>", len(shown)


def write_gallery(groups_parquet: str | Path, out_html: str | Path, max_groups: int = 30,
                  image_column: str | None = None) -> int:
    """Write the gallery; returns the number of groups shown. ``image_column``: the image column
    of Parquet sources (None: found as ``score`` finds it)."""
    body, n = render_groups(read_gallery_rows(groups_parquet), max_groups, image_column)
    page = ("<!doctype html><meta charset=utf-8>"
            f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">'
            "<title>dedup groups</title><style>"
            f"body{{font:13px sans-serif;margin:1em}}{STYLE}</style>"
            f"<h1>dedup groups</h1><p>{n} group(s): the kept copy first, then the others "
            "by rank; thumbnails, then 1:1 crops of the same part of the picture. Red: marked "
            "degraded_copy.</p>" + body)
    out_html = Path(out_html)
    with replaced_when_done(out_html, suffix=".html") as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return n
