"""Build a Calibration from a scores table (see ``scoring``): threshold, drop curve, maps.

The split (by source image, never by row, using ``manifest.split_by_source``):
- **threshold part** (share ``1 - holdout`` of sources): its clean images give the clean scores
  for the order-statistic threshold;
- **holdout part** (share ``holdout``): its images, clean and degraded, give the drop curve and a
  held-out false-drop estimate, so the curve is never measured on the images the threshold was
  chosen from.
The isotonic maps (for reports only, they carry no guarantee) are fitted on all rows.

What counts as clean / degraded (``target``):
- ``"step"``: chain images at ``clean_steps`` (default: step 0, the originals) and every extra
  clean image are clean; chain images at later steps are degraded.
- ``"fr:ssim"`` (or ``fr:ssim<L``, ``fr:psnr<L``): a chain image is degraded when its similarity
  to its chain's step-0 image is below the level L (SSIM 0.90 / PSNR 30 dB by default) and clean
  otherwise, whatever its step; extra clean images are clean.
"""

from __future__ import annotations

import datetime as _dt
import math
import re

import numpy as np
import pandas as pd

from collapseguard.calibration.bounds import (
    NotEnoughCleanSamples,
    clopper_pearson,
    isotonic_knots,
    order_statistic_threshold,
    per_kind_threshold,
)
from collapseguard.calibration.scoring import CLEAN_FAMILY, parse_target, target_label
from collapseguard.calibration.thresholds import (
    BOUND_UNIT,
    Calibration,
    CalibrationError,
    is_dropped,
)
from collapseguard.io.terminal import percent, printable
from collapseguard.training_data_tools.manifest import source_group, split_by_source

#: drop levels for "first step at which this fraction is dropped"
LEVELS = (0.9, 0.99)


#: how many of the highest clean scores a calibration records (at least k + 3)
TOP_CLEAN = 5


def step_knots(chains: pd.DataFrame) -> dict:
    """Score -> "equivalent replication step": the step whose *median* score equals this score.

    An isotonic fit through (median score of step k, k) for every step present, interpolated
    between steps and clamped at the ends, so a score typical of originals maps to 0 and one
    typical of step 20 to 20. (A regression of step on score over all chain images would instead
    give E[step | score], which puts every clean-looking image at the average step of the
    images that overlap it -- around step 5 for an original -- and reads as "replicated".)
    """
    med = chains.groupby("step", sort=True)["score"].median()
    return isotonic_knots(med.to_numpy(dtype=np.float64), med.index.to_numpy(dtype=np.float64))


def top_clean_text(cal: Calibration, n: int = TOP_CLEAN) -> str:
    """Lines naming the clean images with the highest scores, i.e. those the threshold rests on
    (one per picture in a file whose bound counts pictures)."""
    rows = cal.top_clean[:n]
    if not rows:
        return ""
    each = ", each picture's highest" if cal.counts_pictures else ""
    lines = [f"  highest clean scores{each} (the threshold rests on these; check that they are clean):"]
    for r in rows:
        mark = "dropped" if r["score"] > cal.threshold else "kept"
        name = str(r.get("path") or r.get("source_image"))
        name = name if name.isprintable() else ascii(name)  # no terminal control codes from file names
        lines.append(f"    {r['score']:10.4g}  {mark:<8} {name}")
    return "\n".join(lines)


def bound_count_text(cal: Calibration) -> str:
    """``k=2 of n=539 clean pictures (669 images)``: what the bound was taken over (files made
    before the bound counted pictures say ``clean scores (N sources)``)."""
    split = cal.split or {}
    if cal.counts_pictures:
        text = f"k={cal.k} of n={cal.n_clean} clean pictures ({split.get('n_clean_threshold_images')} images)"
    else:
        text = f"k={cal.k} of n={cal.n_clean} clean scores ({split.get('n_clean_threshold_sources')} sources)"
    binding = binding_kind(cal)
    return text if binding is None else f"{text} of kind {_shown(binding['kind'])}, which sets the threshold"


def binding_kind(cal: Calibration) -> dict | None:
    """A ``--per-kind`` file's row of the kind that sets the threshold (whose n and k the file's
    ``n_clean`` and ``k`` are); None for a pooled file."""
    return max(cal.per_kind, key=lambda r: r["threshold"]) if cal.per_kind else None


def _shown(name) -> str:
    return str(name) if str(name).isprintable() else ascii(name)


def per_kind_text(cal: Calibration) -> str:
    """Lines giving each clean kind's own threshold (``--per-kind``) and how many of its clean
    scores the final threshold drops; ``""`` for a pooled calibration."""
    lines = []
    unit = "pictures" if cal.counts_pictures else "scores"
    for r in cal.per_kind:
        name = r["kind"] if str(r["kind"]).isprintable() else ascii(r["kind"])
        lines.append(f"  kind {name}: threshold {r['threshold']:.6g} (k={r['k']} of n={r['n']}), "
                     f"{r['dropped_at_threshold']} of its {r['n']} clean {unit} above the final threshold")
    return "\n".join(lines)


def label_clean(table: pd.DataFrame, target: str = "step", clean_steps=(0,)) -> np.ndarray:
    """Boolean per row: is this image clean under ``target`` (see module docstring)?"""
    kind, _, level = parse_target(target)
    extra = (table["kind"] == "clean").to_numpy()
    if kind == "step":
        return extra | table["step"].isin(list(clean_steps)).to_numpy()
    if "fr" not in table.columns:
        raise CalibrationError(f"target {target!r} needs full-reference values (column 'fr')")
    fr = table["fr"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return extra | (fr >= level) | ((table["step"] == 0).to_numpy() & ~np.isfinite(fr))


def clean_kinds(t: pd.DataFrame) -> np.ndarray:
    """Each row's clean kind for a per-kind guarantee: ``source_kind``, or ``(none)`` when empty."""
    if "source_kind" not in t.columns:
        return np.full(len(t), BREAKDOWN["source_kind"], dtype=object)
    labels = t["source_kind"].fillna("").astype(str).to_numpy(dtype=object)
    labels[labels == ""] = BREAKDOWN["source_kind"]
    return labels


def _dedupe_clean(t: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct image: a chain's step 0 is shared by every chain of the same source
    (and storage: the copies of one original that ``chains store`` wrote are different files).
    Where rows of one name hold different images (two chains of one ``source_image`` from
    different originals, a key a shard repeats) the highest score stands for them: the bound
    never leaves out a clean image that scores above the one kept (and the figures built on these
    rows, the step-0 drop rates among them, lean to the conservative side there)."""
    step0 = (t["kind"] == "chain") & (t["step"] == 0)
    top = t.assign(_step0=step0).sort_values("score", ascending=False, kind="stable",
                                             na_position="last")
    a = top[top["_step0"]].drop_duplicates(["source_image", "storage"] if "storage" in t.columns
                                           else "source_image")
    b = top[~top["_step0"]].drop_duplicates("path")
    return pd.concat([a, b]).sort_index().drop(columns="_step0")


def source_maxima(clean: pd.DataFrame, by_kind: bool = False) -> pd.DataFrame:
    """One row per clean picture (per picture and kind with ``by_kind``, for a per-kind bound):
    the row of its highest clean score.

    Images of one picture (its views ``<name>@<view>``, crops and stored copies ``<name>__<x>``,
    and its clean steps) score alike, so counting them as independent clean scores makes the
    order-statistic bound optimistic: four crops of each of 75 photos look like 300 scores where
    there are 75 pictures. The bound is taken over the pictures' maxima instead: if pictures are
    drawn independently, at most alpha of clean pictures have any image above the threshold (with
    the stated confidence). For data of distinct pictures, one image each, that is at most alpha
    of its images; where some pictures have many images, the share of images can differ."""
    t = clean.assign(_group=clean["source_image"].map(source_group).to_numpy(),
                     _kind=clean_kinds(clean) if by_kind else "")
    top = t.sort_values("score", ascending=False, kind="stable").drop_duplicates(["_kind", "_group"])
    return top.drop(columns=["_group", "_kind"]).sort_index()


def _no_kind_text(t: pd.DataFrame, exc: NotEnoughCleanSamples) -> str:
    """For a per-kind refusal naming the kind ``(none)`` among those short of pictures: what it
    holds here (chain originals of a manifest without a ``kind`` column, --clean images given
    without KIND=) and how to fix it; ``""`` when ``(none)`` is not short."""
    none = BREAKDOWN["source_kind"]
    if f"{none!r} has " not in (exc.detail or "") and exc.kind != none:
        return ""
    c = t[t["clean"]]
    c = c[clean_kinds(c) == none]
    chain = c[c["kind"] == "chain"]
    extra = c[c["kind"] == "clean"]
    held = []
    if len(chain):
        held.append(f"the clean steps of {chain['source_image'].nunique()} chain source(s) (the chains "
                    "manifest has no `kind` column, or empty cells in it)")
    if len(extra):
        held.append(f"{len(extra)} --clean image(s) given without KIND=")
    fixes = []
    if len(chain):
        fixes.append("add a `kind` column to the chains manifest, or leave --chains out")
    if len(extra):
        fixes.append("name their kind with --clean KIND=LOCATION")
    return (f"; kind {none!r} is the clean images without a kind" + (": " + " and ".join(held) if held else "")
            + (f"; bring more of them, or {' or '.join(fixes)}" if fixes else ""))


def drop_curve(table: pd.DataFrame, threshold: float, confidence: float = 0.95) -> list[dict]:
    """Fraction of images dropped (score > threshold) per family and step, plus family "all".

    Each row: family, step, n, dropped, fraction, ci_low, ci_high (Clopper–Pearson at
    ``confidence``) and pictures (the distinct source pictures behind the n images). A step-0
    image shared by several chains (of one family or of several) is counted once. NaN scores (not
    scored) are left out; +-inf are scores. The interval treats the n images as independent: where
    they come from fewer pictures (the "all" row pools every family's chains of the same
    sources), it is narrower than the evidence, which ``curve_table`` says.
    """
    t = table[~np.isnan(table["score"].to_numpy(dtype=np.float64))]
    rows = []
    chains = t[t["kind"] == "chain"]
    groups = [(fam, _dedupe_clean(g)) for fam, g in chains.groupby("family", sort=True)]
    groups.append(("all", _dedupe_clean(chains)))
    extra = t[t["kind"] == "clean"]
    if len(extra):
        groups.append((CLEAN_FAMILY, extra))
    for fam, g in groups:
        for step, gs in g.groupby("step", sort=True):
            n = len(gs)
            d = int(is_dropped(gs["score"].to_numpy(), threshold).sum())
            lo, hi = clopper_pearson(d, n, confidence)
            rows.append({"family": str(fam), "step": int(step), "n": n, "dropped": d,
                         "fraction": d / n, "ci_low": lo, "ci_high": hi,
                         "pictures": int(gs["source_image"].map(source_group).nunique())})
    return rows


#: the scores-table columns a calibration is broken down by, and how an empty cell is shown
BREAKDOWN = {"storage": "(unknown)", "source_kind": "(none)"}


#: JPEG quality bands of the per-storage table (lowest quality of each band), used when it would
#: otherwise hold more than MAX_JPEG_ROWS JPEG rows (a few qualities, as `chains store` writes
#: them, keep their own rows)
JPEG_BANDS = (0, 50, 70, 80, 90, 95)
MAX_JPEG_ROWS = 4


def storage_band(label: str) -> str:
    """A storage label with its JPEG quality put into a band (``jpeg q71 4:2:0`` -> ``jpeg
    q70-79 4:2:0``): web JPEGs estimate to a score of qualities, and a row for each drowned the
    table. Other labels are unchanged."""
    m = re.fullmatch(r"jpeg q(\d+)(.*)", label)
    if not m:
        return label
    q = int(m.group(1))
    lo = max(b for b in JPEG_BANDS if b <= q)
    hi = next((b - 1 for b in JPEG_BANDS if b > q), 100)
    return f"jpeg q{lo}-{hi}{m.group(2)}"


def breakdown(part: pd.DataFrame, threshold: float, confidence: float = 0.95) -> dict:
    """Per storage and per clean kind (``BREAKDOWN``) of ``part`` (rows with a ``clean`` label):
    ``{"storage": {"clean": [...], "steps": [...]}, "source_kind": {...}}``. ``clean`` rows give
    the share of clean images dropped (score > threshold; originals counted once per source and
    storage), ``steps`` rows the share of degraded chain images dropped per step, every family
    together; each with n, dropped, fraction and a Clopper-Pearson interval. The kind part is left
    out when no row has a kind. NaN scores (not scored) are left out; +-inf are scores."""
    out = {}
    t = part[~np.isnan(part["score"].to_numpy(dtype=np.float64))]
    for col, empty in BREAKDOWN.items():
        if col not in t.columns or (col == "source_kind" and not (t[col].fillna("") != "").any()):
            continue
        labels = t[col].fillna("").astype(str)
        if col == "storage" and labels[labels.str.startswith("jpeg q")].nunique() > MAX_JPEG_ROWS:
            labels = labels.map(storage_band)  # web JPEGs: one row per quality band, not per quality
        clean_rows, step_rows = [], []
        for value, g in t.assign(_group=labels.where(labels != "", empty)).groupby("_group", sort=True):
            groups = [(None, _dedupe_clean(g[g["clean"]]))]
            deg = g[~g["clean"] & (g["kind"] == "chain")]
            groups += list(deg.groupby("step", sort=True))
            for step, gs in groups:
                n = len(gs)
                if n == 0:
                    continue
                d = int(is_dropped(gs["score"].to_numpy(), threshold).sum())
                lo, hi = clopper_pearson(d, n, confidence)
                row = {col: str(value), "n": n, "dropped": d, "fraction": d / n, "ci_low": lo, "ci_high": hi}
                if step is None:
                    clean_rows.append(row)
                else:
                    step_rows.append({**row, "step": int(step)})
        out[col] = {"clean": clean_rows, "steps": step_rows}
    return out


def first_steps(curve: list[dict], levels=LEVELS) -> dict:
    """family -> {"0.9": first step whose dropped fraction >= 0.9 (point estimate) or None, ...}."""
    out: dict[str, dict] = {}
    for fam in dict.fromkeys(r["family"] for r in curve):
        rows = sorted((r for r in curve if r["family"] == fam and r["step"] > 0), key=lambda r: r["step"])
        if not rows:  # extra clean images have no later steps
            continue
        out[fam] = {f"{lv:g}": next((r["step"] for r in rows if r["fraction"] >= lv), None) for lv in levels}
    return out


def first_steps_text(cal: Calibration, line: str) -> str:
    """``line`` (with ``{family}``, ``{0.9}`` and ``{0.99}`` fields) per family of the file's first
    steps dropped: a step number, or ``never (to step N)`` when no step measured reached the level
    (``n/a`` when the file does not say)."""
    last = {}
    for r in cal.drop_curve:
        last[r["family"]] = max(last.get(r["family"], 0), int(r["step"]))
    out = []
    for fam, lv in cal.first_step_dropped.items():
        cells = {}
        for level in LEVELS:
            v = (lv or {}).get(f"{level:g}")
            cells[f"{level:g}"] = (str(v) if v is not None else
                                   f"never (to step {last[fam]})" if fam in last else "never")
        out.append(line.replace("{family}", printable(fam)).replace("{0.9}", cells["0.9"])
                   .replace("{0.99}", cells["0.99"]))
    return "\n".join(out)


def build_calibration(table: pd.DataFrame, detector: str, detector_version: str, *,
                      alpha: float = 0.01, confidence: float = 0.95, clean_steps=(0,),
                      target: str = "step", holdout: float = 0.3, salt: str = "calibration",
                      command: str = "", clean_sources: list[str] | None = None,
                      per_kind: bool = False) -> Calibration:
    """Compute threshold (order-statistic bound), drop curve and isotonic maps from a scores table.

    With ``per_kind``, the guarantee is for each clean kind (the ``source_kind`` column; clean
    images without one form the kind ``(none)``) rather than for the pooled clean images
    (``bounds.per_kind_threshold``); a kind with too few scored images, none at all included, is
    refused by name. Raises NotEnoughCleanSamples (with the number needed) when
    the threshold part has too few clean scores for ``alpha`` at ``confidence``.
    """
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"holdout must be in [0, 1), got {holdout!r}")
    clean_steps = sorted({int(s) for s in clean_steps})
    t = table.reset_index(drop=True).copy()
    t["clean"] = label_clean(t, target, clean_steps)
    # every kind of clean image, scored or not: with per_kind, a kind none of whose images could
    # be scored is refused by name, never left out of the guarantee
    kinds_named = clean_kinds(t[t["clean"]])
    pooled_note = None
    if per_kind and len(set(kinds_named.tolist())) <= 1:  # one kind: its guarantee is the pooled one
        named = sorted(set(kinds_named.tolist()) - {BREAKDOWN["source_kind"]})
        pooled_note = (f"--per-kind: every clean image is of one kind ({printable(named[0])}), so the "
                       "guarantee is the pooled one" if named else
                       "--per-kind: no clean kind is named (no --clean KIND=LOCATION, no `kind` column "
                       "in the chains manifest), so all clean images are one kind and the guarantee is "
                       "the pooled one")
        per_kind = False
    # NaN = not scored, left out (and counted); +inf is a score, above every threshold: dropping
    # such clean images from the bound would make the guarantee optimistic
    scored = ~np.isnan(t["score"].to_numpy(dtype=np.float64))
    n_unscored = int((~scored).sum())
    t = t[scored].reset_index(drop=True)
    if holdout > 0:
        parts = split_by_source(t, {"threshold": 1.0 - holdout, "holdout": holdout}, salt=salt)
        thr_part, hold_part = parts["threshold"], parts["holdout"]
    else:
        thr_part, hold_part = t, t
    clean_thr = _dedupe_clean(thr_part[thr_part["clean"]])
    pictures = source_maxima(clean_thr, by_kind=per_kind)  # the bound counts pictures (source_maxima)
    kind_bounds = []
    try:
        if per_kind:
            bound, kind_bounds = per_kind_threshold(pictures["score"].to_numpy(), clean_kinds(pictures),
                                                    alpha, confidence, required=kinds_named)
        else:
            bound = order_statistic_threshold(pictures["score"].to_numpy(), alpha, confidence)
    except NotEnoughCleanSamples as exc:  # say what the count was taken from, and what to bring
        n_all = len(source_maxima(_dedupe_clean(t[t["clean"]]), by_kind=per_kind))
        unit = "distinct clean pictures"
        views = (" (views, crops and stored copies of one picture, named <name>@<view> or "
                 "<name>__<variant>, count once)")
        if per_kind:  # exc.detail names the kinds and their counts in the threshold part
            detail = views + (f", counted in the threshold part (--holdout {holdout:g} keeps the other "
                              f"sources for the drop curve: bring about {math.ceil(exc.needed / (1 - holdout))} "
                              "clean pictures of each kind named, or pass --holdout 0)" if holdout > 0 else "")
        else:
            detail = views + (f" in the threshold part, which holds {exc.n} of the {n_all} scored clean "
                              f"pictures (--holdout {holdout:g} keeps the other sources for the drop curve: "
                              f"bring about {math.ceil(exc.needed / (1 - holdout))} clean pictures in all, or "
                              "pass --holdout 0)" if holdout > 0 else "")
        if per_kind:
            detail += _no_kind_text(t, exc)
        if n_unscored:
            detail += f"; {n_unscored} image(s) could not be scored and were left out"
        raise NotEnoughCleanSamples(exc.n, exc.needed, alpha, confidence, exc.detail + detail,
                                    unit=unit, kind=exc.kind) from None
    # the share of the threshold part's clean *images* above the threshold (the bound's own
    # empirical figure counts pictures with any image above it)
    bound.empirical_false_drop = float(is_dropped(clean_thr["score"].to_numpy(), bound.threshold).mean())
    top = pictures.sort_values("score", ascending=False, kind="stable").head(max(TOP_CLEAN, (bound.k or 0) + 3))
    top_clean = [{"source_image": str(r.source_image), "path": str(getattr(r, "path", "")),
                  "score": float(r.score)} for r in top.itertuples(index=False)]

    curve = drop_curve(hold_part, bound.threshold, confidence)
    by = breakdown(hold_part, bound.threshold, confidence)
    by["measured_on"] = "holdout sources" if holdout > 0 else "every source (holdout 0: in-sample)"
    hold_clean = _dedupe_clean(hold_part[hold_part["clean"]])
    held_fd = float(is_dropped(hold_clean["score"].to_numpy(), bound.threshold).mean()) if len(hold_clean) else None
    # the same held out by picture, the unit of the guarantee: pictures with any image dropped
    hold_pics = source_maxima(hold_clean)
    held_pics = int(is_dropped(hold_pics["score"].to_numpy(), bound.threshold).sum())

    # maps, for reports: all rows; P(degraded) on the clean/degraded label, step on chain rows
    uniq = _dedupe_clean(t)
    uniq = uniq[np.isfinite(uniq["score"].to_numpy(dtype=np.float64))]
    prob_map = step_map = None
    if uniq["clean"].nunique() == 2:
        prob_map = isotonic_knots(uniq["score"], (~uniq["clean"]).astype(float), y_min=0.0, y_max=1.0)
    chains = uniq[uniq["kind"] == "chain"]
    if chains["step"].nunique() >= 2:
        step_map = step_knots(chains)

    # the images behind the bound's pictures; per kind, those of the kind whose n and k the file states
    labels = clean_kinds(clean_thr)
    binding = max(kind_bounds, key=lambda kb: kb.bound.threshold).kind if kind_bounds else None
    n_images = int((labels == binding).sum()) if kind_bounds else len(clean_thr)
    notes = [
        "Decision rule: drop when score > threshold.",
        ("P(degraded) is relative to this calibration's mix of clean and degraded images (the chains' "
        "steps and extra clean images); it is for reports and carries no guarantee."),
        "The drop curve and held-out false-drop rate are measured on holdout sources only, disjoint "
        "from the sources whose clean scores set the threshold." if holdout > 0 else
        "holdout=0: the drop curve is measured on the same images that set the threshold (in-sample).",
    ]
    notes.append(
        f"n_clean counts distinct clean pictures ({bound.n}, from {n_images} clean images): a picture's "
        "views, crops, stored copies and clean steps give one score, its highest, so images of one "
        "picture never count as independent evidence. With pictures drawn independently, at most "
        "alpha of clean pictures have any image above the threshold: for data of distinct pictures, "
        "one image each, at most alpha of its images.")
    if n_unscored:
        notes.append(f"{n_unscored} image(s) could not be scored (NaN) and were left out.")
    if pooled_note:
        notes.append(pooled_note)
    if kind_bounds:
        notes.append(
            f"Per clean kind: each of the {len(kind_bounds)} kinds has its own order-statistic "
            f"threshold at confidence 1 - delta/{len(kind_bounds)}; the threshold is the largest, so "
            "every kind's false-drop rate is at most alpha, all together with the stated confidence. "
            "n_clean and k are those of the kind that sets the threshold.")
    kind, _, _ = parse_target(target)
    split = {
        "by": "source_image", "salt": salt, "holdout": holdout,
        "threshold_sources": int(thr_part["source_image"].nunique()),
        "holdout_sources": int(hold_part["source_image"].nunique()) if holdout > 0 else 0,
        "bound_unit": BOUND_UNIT, "n_clean_threshold": bound.n, "n_clean_threshold_sources": bound.n,
        "n_clean_threshold_images": n_images,
        "n_clean_holdout": len(hold_clean),
        "heldout_false_drop": held_fd,
        "heldout_false_drop_ci": list(clopper_pearson(round((held_fd or 0) * len(hold_clean)),
                                                      len(hold_clean), confidence)) if len(hold_clean) else None,
        "n_clean_holdout_pictures": len(hold_pics),
        "heldout_pictures_dropped": held_pics,
        "heldout_pictures_dropped_ci": list(clopper_pearson(held_pics, len(hold_pics), confidence))
        if len(hold_pics) else None,
        "n_unscored": n_unscored,
    }
    return Calibration(
        detector=detector, detector_version=str(detector_version), threshold=bound.threshold,
        label="calibrated", method=bound.method, alpha=bound.alpha, confidence=bound.confidence,
        n_clean=bound.n, k=bound.k, guaranteed_false_drop=bound.guaranteed_false_drop,
        empirical_false_drop=bound.empirical_false_drop, target=target_label(target),
        clean_steps=clean_steps if kind == "step" else [], clean_sources=list(clean_sources or []),
        split=split, top_clean=top_clean, drop_curve=curve, first_step_dropped=first_steps(curve),
        probability_map=prob_map, step_map=step_map, breakdown=by,
        per_kind=[{"kind": kb.kind, "n": kb.bound.n, "k": kb.bound.k, "threshold": kb.bound.threshold,
                   "confidence": kb.bound.confidence, "guaranteed_false_drop": kb.bound.guaranteed_false_drop,
                   "dropped_at_threshold": int(is_dropped(  # pictures, as n and k count
                       pictures["score"].to_numpy()[clean_kinds(pictures) == kb.kind], bound.threshold).sum())}
                  for kb in kind_bounds],
        created=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=command, notes=notes)


def breakdown_text(cal: Calibration, steps=None) -> str:
    """Lines of the per-storage and per-kind tables: clean images dropped, step-k images dropped
    (``steps``, default: the steps after 0 the breakdown holds, ``table_steps``; none without
    chains)."""
    if steps is None:
        steps = table_steps(r["step"] for col in ("storage", "source_kind")
                            for r in ((cal.breakdown or {}).get(col) or {}).get("steps", [])
                            if int(r["step"]) > 0)
    lines = []
    for col, title in (("storage", "storage"), ("source_kind", "clean kind")):
        part = (cal.breakdown or {}).get(col)
        if not part:
            continue
        by = {(r[col], r["step"]): r for r in part.get("steps", [])}
        lines.append(f"  by {title} ({cal.breakdown.get('measured_on', '')}):")
        lines.append(f"    {title:<18}{'clean dropped':>30}" + "".join(f"{'step ' + str(s):>10}" for s in steps))
        for r in part.get("clean", []):
            name = r[col] if str(r[col]).isprintable() else ascii(r[col])
            cells = "".join(f"{by[(r[col], s)]['fraction']:>10.1%}" if (r[col], s) in by else f"{'-':>10}"
                            for s in steps)
            clean = f"{percent(r['fraction'])} of {r['n']} [{percent(r['ci_low'])},{percent(r['ci_high'])}]"
            lines.append(f"    {name:<18}{clean:>30}{cells}")
    return "\n".join(lines)


#: the steps a drop-curve table shows first, where the chains hold them
TABLE_STEPS = (0, 1, 3, 5, 10, 20)
#: at most this many step columns
TABLE_COLUMNS = 7


def table_steps(present) -> tuple[int, ...]:
    """The steps of a drop-curve table: every step the chains hold when they fit, else those of
    ``TABLE_STEPS`` they hold and then the others in order, ``TABLE_COLUMNS`` in all."""
    present = sorted({int(s) for s in present})
    if len(present) <= TABLE_COLUMNS:
        return tuple(present)
    chosen = [s for s in TABLE_STEPS if s in present]
    chosen += [s for s in present if s not in chosen][:TABLE_COLUMNS - len(chosen)]
    return tuple(sorted(chosen))


def curve_table(cal: Calibration, steps=None) -> str:
    """A small text table: dropped fraction [CI] per family at ``steps`` (default: the steps the
    calibration's chains hold, ``table_steps``), family names from a chains manifest or a
    calibration file with control characters escaped."""
    if steps is None:
        steps = table_steps(r["step"] for r in cal.drop_curve)
    by = {(r["family"], r["step"]): r for r in cal.drop_curve}
    fams = list(dict.fromkeys(r["family"] for r in cal.drop_curve))
    head = f"{'family':<22}" + "".join(f"{'step ' + str(s):>29}" for s in steps)
    lines = [head]
    for fam in fams:
        cells = []
        for s in steps:
            r = by.get((fam, s))
            # intervals to 0.1 %: whole percents showed 1 drop in 1,120 as "0.1% [0%,0%]"
            cells.append(f"{'-':>29}" if r is None else
                         f"{r['fraction']:>7.1%} [{r['ci_low']:.1%},{r['ci_high']:.1%}] n={r['n']:<4}".rjust(29))
        lines.append(f"{printable(fam):<22}" + "".join(cells))
    shared = [r for r in cal.drop_curve if r["step"] in steps and isinstance(r.get("pictures"), int)
              and 0 < r["pictures"] < r["n"]]
    if shared:  # the intervals count images as independent; say where they are not
        r = max(shared, key=lambda r: r["n"] / r["pictures"])
        lines.append(f"  intervals treat images as independent; {len(shared)} cell(s) hold images of fewer "
                     f"pictures (e.g. {printable(r['family'])} step {r['step']}: {r['n']} images of "
                     f"{r['pictures']} pictures), where they are narrower than the evidence")
    return "\n".join(lines)
