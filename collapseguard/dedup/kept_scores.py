"""The no-reference verdict of each group's kept copy, recorded for ``filter --groups``.

``filter --groups`` rejects a group's other copies as ``degraded_copy`` (or ``duplicate``) because
the group keeps a better one; when the no-reference filter rejects that kept copy too, nothing of
the picture would survive. A shard is filtered on its own, and a group's kept copy may lie in
another shard, so ``dedup`` scores each group's kept copy (rank 0) with the default no-reference
detector (``detectors.DEFAULT_DETECTOR``, the one ``filter`` runs unless told otherwise) and
writes the score on every row of the group (``kept_score``) beside the detector that gave it
(``kept_detector``, ``name@version``). ``filter`` running that detector compares the score with its
own threshold (``filter.decisions.apply_group``). A kept sample of several images scores as
``filter`` scores it: the highest score of its images (``scoring.records.score_records``). The
caller may score the kept copies (``score_rows``: ``dedup`` reads them again on its engine's
workers, in parallel, as ``filter`` reads them); the rows it leaves unread are read back here as
the gallery reads them (``scoring.readback.fetch_samples``: each shard streamed once), each image
of a sample scored on its own and the highest score taken.
"""

from __future__ import annotations

import numpy as np


def kept_copy_scores(desc: dict, labels: np.ndarray, rank: np.ndarray,
                     image_column: str | None = None, score_rows=None) -> tuple[np.ndarray, list[str]]:
    """``(kept_score, kept_detector)`` per row: the default detector's score of the row's group's
    kept copy (NaN for a single, or when the kept copy cannot be read back, one of its images
    cannot be decoded, or none of its images can be scored) and ``name@version`` of that
    detector ("" for a single); a kept sample of several images gets the highest score of its
    images, as ``filter`` scores it. ``score_rows(rows)``, when given, scores
    the kept rows (indices into ``desc``) with that detector and returns ``(scores, unread)``:
    the rows it could not read again (``unread``, a bool mask over ``rows``) are read back here."""
    from collapseguard.detectors import DEFAULT_DETECTOR
    from collapseguard.engines import get_detector
    from collapseguard.scoring.readback import fetch_samples, occurrence

    n = len(labels)
    scores = np.full(n, np.nan)
    named = [""] * n
    kept = np.flatnonzero((labels >= 0) & (rank == 0))
    if not kept.size:
        return scores, named
    det = get_detector(DEFAULT_DETECTOR)
    by_group = {}
    if score_rows is not None:
        got, unread = score_rows(kept)
        for i, s in zip(kept[~unread], got[~unread]):
            by_group[labels[i]] = float(s)
        kept = kept[unread]
    # which sample of a key that repeats in its source (only for the rows read back here)
    nth = occurrence(desc["source"], desc["key"]) if kept.size else None

    def score(img: np.ndarray) -> float:  # an RGBA copy is composited by score, as from its file
        return float(np.asarray(det.score([img]), np.float64)[0])

    wanted = [(desc["source"][i], desc["key"][i], desc["image"][i], int(nth[i])) for i in kept]
    fetched = fetch_samples(wanted, prepare=score, image_column=image_column,
                            every_image=True) if wanted else {}
    for i, w in zip(kept, wanted):
        f = fetched.get((w[0], w[1], w[3]))
        got = np.asarray(f.prepared if f is not None and f.prepared is not None else [], np.float64)
        got = got[np.isfinite(got)]  # as filter: the highest of the images scored (NaN: none)
        by_group[labels[i]] = float(got.max()) if got.size else np.nan
    ident = f"{det.name}@{det.version}"
    for i in np.flatnonzero(labels >= 0):
        scores[i] = by_group.get(labels[i], np.nan)
        named[i] = ident
    return scores, named


def source_digest(source: str) -> tuple[int | None, str]:
    """``(size, SHA-256)`` of a shard or Parquet file's bytes; ``(None, "")`` for a source that
    cannot be read again as bytes (a ``pipe:`` command) or cannot be read."""
    from collapseguard.io.outdir import digest_stream
    from collapseguard.io.urls import open_stream, scheme, store_call

    if scheme(source) == "pipe":
        return None, ""
    try:  # a store's own errors (botocore's) as OSError: a source that cannot be read, not a traceback
        with store_call(source), open_stream(source, allow_pipe=False) as f:
            d = digest_stream(f)
        return d["size"], d["sha256"]
    except (OSError, ValueError):
        return None, ""


def source_digests(desc: dict) -> tuple[list[int | None], list[str]]:
    """``(source_size, source_sha256)`` per row: the size and SHA-256 of the shard or Parquet file
    the row was read from (None and "" for an image file, or a source that cannot be read again
    as bytes: a ``pipe:`` command), each source read once (``desc["digests"]``: the digests the
    parts were named by, not read again). ``filter --groups`` refuses to apply the table to an
    input of the same stem whose bytes differ."""
    known: dict[str, tuple[int | None, str]] = dict(desc.get("digests") or {})
    sizes, digests = [], []
    for source, stem in zip(desc["source"], desc["shard"]):
        if stem and source not in known:
            known[source] = source_digest(source)
        size, digest = known.get(source, (None, "")) if stem else (None, "")
        sizes.append(size)
        digests.append(digest)
    return sizes, digests
