"""The audit report: one self-contained HTML file (no scripts, no external resources).

Plots and images are embedded as ``data:`` URIs; a Content-Security-Policy meta tag forbids
scripts and any fetch, so the page opens offline and nothing from the data can run. Every piece of
text that comes from the data or the command line (keys, captions, paths, error messages,
detector names) goes through ``html.escape`` before it reaches the page — the CSP is a second
line of defence, not the first.
"""

from __future__ import annotations

import html
import math
import os

import pandas as pd

from collapseguard.audit import stats
from collapseguard.audit.labels import SET_ASIDE_LABELS, source_labels
from collapseguard.dedup.gallery import STYLE as GROUPS_STYLE
from collapseguard.images import ALPHA_BACKGROUND
from collapseguard.io.terminal import percent
from collapseguard.scoring.readback import CSP

MAX_TABLE_ROWS = 200

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:24px;margin:8px 0 2px}h2{font-size:19px;margin:0 0 8px}h3{font-size:16px;margin:16px 0 6px}
section{background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:14px 18px;margin:14px 0}
.sub,.note{color:#5b6573;font-size:13px}.note{margin:4px 0 10px}
.headline{display:flex;gap:26px;align-items:center;flex-wrap:wrap}
.big{font-size:44px;font-weight:700;color:#b3261e;line-height:1}
.big.ok{color:#2b7a3d}
.estimate{background:#fff4d6;border:1px solid #e9c46a;border-radius:6px;padding:8px 12px;margin-top:10px}
.fail{background:#fde8e6;border:1px solid #e3a29b;border-radius:6px;padding:8px 12px;margin-top:10px}
nav a{margin-right:14px;color:#2457a6;text-decoration:none;font-size:14px}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{padding:4px 8px;border-bottom:1px solid #eceef1;text-align:right;vertical-align:top}
th{background:#f1f3f6;position:sticky;top:0}
td.l,th.l{text-align:left;overflow-wrap:anywhere;max-width:420px}
.bar{display:inline-block;height:9px;background:#d6452c;border-radius:2px;vertical-align:middle}
.grid{display:flex;flex-wrap:wrap;gap:12px}
figure.card{margin:0;border:1px solid #dfe3e8;border-radius:7px;padding:8px;background:#fbfbfc;flex:1 1 480px;max-width:560px;box-sizing:border-box}
figure.card.flagged{border-color:#e3a29b;background:#fff8f7}
.imgs{display:flex;gap:8px;align-items:flex-start}
.thumb{max-width:200px;max-height:200px;border-radius:3px}
.crop{image-rendering:pixelated;max-width:none;border:1px solid #c9ced6}
.imgs .lbl{font-size:11px;color:#5b6573}
figcaption{font-size:12.5px;margin-top:6px}
.key{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere;font-size:12px}
.tag{display:inline-block;padding:0 6px;border-radius:9px;font-size:11px;font-weight:600}
.tag.f{background:#f6d5d1;color:#8c1d13}.tag.k{background:#dcefe0;color:#1f5e2e}
.cap{color:#3c4450;font-style:italic;overflow-wrap:anywhere}
.err{color:#8c1d13;overflow-wrap:anywhere}
img.plot{max-width:100%;height:auto}
img.alpha{background-color:#fff;background-image:linear-gradient(45deg,#c8ccd2 25%,transparent 25%,transparent 75%,#c8ccd2 75%),linear-gradient(45deg,#c8ccd2 25%,transparent 25%,transparent 75%,#c8ccd2 75%);background-size:16px 16px;background-position:0 0,8px 8px}
.tag.a{background:#e4e7ec;color:#3c4450}
.tag.s{background:#fbe3c4;color:#7a4304}
"""


def e(x) -> str:
    """Escape any value for HTML text and attribute values."""
    return html.escape(str(x), quote=True)


def _num(x, fmt: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, fmt)


def _short(source: str) -> str:
    """A file's own name (the groups table's): not for sources, which ``source_labels`` names."""
    return os.path.basename(str(source).rstrip("/")) or str(source)


def _headline(s: dict) -> str:
    frac = s["flagged_fraction"]
    cls = "big ok" if not s["flagged"] else "big"
    conf = f"{100 * s['confidence']:.0f}%"
    parts = [f'<section class="headline" id="summary"><div><div class="{cls}">{e(percent(frac))}</div>'
             f'<div class="sub">flagged as model-degraded</div></div><div>'
             f"<div><b>{s['flagged']}</b> of <b>{s['scored']}</b> scored images are flagged "
             f"({conf} confidence interval {e(percent(s['ci_low']))} – {e(percent(s['ci_high']))}, "
             f"Clopper–Pearson).</div>"
             f"<div class=\"sub\">Detector <b>{e(s['detector'])}</b> (version {e(s['detector_version'])}); "
             f"{e(s['threshold_source'])}. Rule: {e(s['decision_rule'])}.</div>"]
    if s["errors"]:
        parts.append(f'<div class="sub">{s["errors"]} sample(s) could not be scored '
                     f'(<a href="#errors">see below</a>); they are not in the fraction.</div>')
    aside = s.get("set_aside") or {}
    if aside.get("count"):
        why = ", ".join(f"{n} {SET_ASIDE_LABELS.get(r, r)}" for r, n in aside["by_reason"].items())
        parts.append(f'<div class="sub">{aside["count"]} sample(s) are set aside by <code>filter</code> '
                     f'whatever their score ({e(why)}; <a href="#setaside">see below</a>): they are '
                     "counted here by their scores, but none of them would be kept.</div>")
    smp = s["sample"]
    if smp["sampled"]:
        est = s.get("estimated_flagged_in_dataset")
        extra = (f" About <b>{est['count']}</b> flagged images expected in the whole dataset "
                 f"({est['low']} – {est['high']})." if est else "")
        parts.append(f'<div class="estimate"><b>Estimates.</b> These figures come from a seeded '
                     f"random sample of {smp['audited']} of {smp['population']} samples "
                     f"(seed {e(smp['seed'])}); the interval covers the sampling error.{extra}</div>")
    if s["failures"]:
        items = "".join(f"<li>{e(f.splitlines()[0] if f else f)}</li>" for f in s["failures"])
        parts.append(f'<div class="fail"><b>Some inputs failed and are not in these figures:</b>'
                     f"<ul>{items}</ul></div>")
    cal = s.get("calibration")
    if cal and not cal.get("calibrated", True):
        parts.append(f'<div class="sub">Calibration file: {e(cal["guarantee"])}; no false-drop '
                     "guarantee is claimed for its threshold.</div>")
    elif cal and cal.get("guarantee_applies", True):
        parts.append(f'<div class="sub">Calibration: {e(cal["guarantee"])}. {e(cal["scope"])}</div>')
    elif cal and not (cal.get("has_step_map") or cal.get("has_probability_map")):
        parts.append(f'<div class="sub">The calibration file holds no score maps (it was made without '
                     f'chains) and adds nothing at the threshold used here; its guarantee '
                     f'({e(cal["guarantee"])}) holds at its own threshold {e(_num(cal["threshold"], ".6g"))}.</div>')
    elif cal:  # --threshold with --calibration: the calibration's guarantee is not this threshold's
        parts.append(f'<div class="sub">Calibration used for its score maps only; its guarantee '
                     f'({e(cal["guarantee"])}) holds at its own threshold {e(_num(cal["threshold"], ".6g"))}, '
                     "not at the threshold used here.</div>")
    parts.append("</div></section>")
    return "".join(parts)


def _sources_table(per_source: pd.DataFrame, has_step: bool, labels: dict[str, str]) -> str:
    if per_source.empty:
        return "<p>No samples.</p>"
    df = per_source.sort_values(["fraction", "flagged"], ascending=False, na_position="last", kind="stable")
    head = ("<tr><th class=l>source</th><th>samples</th><th>scored</th><th>not scored</th>"
            "<th>flagged</th><th>fraction</th><th>95% CI</th><th>median score</th><th>max score</th>"
            + ("<th>median step</th>" if has_step else "") + "</tr>")
    rows = []
    for r in df.head(MAX_TABLE_ROWS).to_dict(orient="records"):
        frac = r["fraction"]
        bar = (f'<span class="bar" style="width:{max(1, round(60 * frac))}px"></span> '
               if isinstance(frac, float) and math.isfinite(frac) and frac > 0 else "")
        rows.append(
            f'<tr><td class=l title="{e(r["source"])}">{e(labels[r["source"]])}</td><td>{r["samples"]}</td>'
            f'<td>{r["scored"]}</td><td>{r["errors"]}</td><td>{r["flagged"]}</td>'
            f"<td>{bar}{e(percent(frac))}</td><td>{e(percent(r['ci_low']))} – {e(percent(r['ci_high']))}</td>"
            f"<td>{e(_num(r['median_score']))}</td><td>{e(_num(r['max_score']))}</td>"
            + (f"<td>{e(_num(r.get('median_step'), '.1f'))}</td>" if has_step else "") + "</tr>")
    more = (f'<p class="note">{len(df) - MAX_TABLE_ROWS} more sources are listed in summary.json.</p>'
            if len(df) > MAX_TABLE_ROWS else "")
    return f'<div style="max-height:480px;overflow:auto"><table>{head}{"".join(rows)}</table></div>{more}'


#: what a card of an image with transparent pixels says
ALPHA_NOTE = ("has transparent pixels: shown on a checkerboard, scored composited over mid-grey "
              "(RGB {}, {}, {})".format(*ALPHA_BACKGROUND))


def card(c: dict, main: str, labels: dict[str, str] | None = None) -> str:
    """One gallery card: thumbnail, native crop, key, scores, caption — all text escaped. The
    source is named by its label in ``labels`` (``source_labels``: as the per-source table and
    the terminal name it), else by its file name."""
    aside = c.get("set_aside") or ""
    if aside:  # filter rejects it whatever its score: never "kept"
        tag = (f'<span class="tag s" title="filter rejects this sample whatever its score (reason '
               f'{e(aside)})">set aside: {e(SET_ASIDE_LABELS.get(aside, aside))}</span>')
        if c["flagged"]:
            tag = '<span class="tag f">flagged</span> ' + tag
    else:
        tag = '<span class="tag f">flagged</span>' if c["flagged"] else '<span class="tag k">kept</span>'
    meta = [f"{e(main)} score <b>{e(_num(c['score']))}</b>"]
    if math.isfinite(c["step"]):
        meta.append(f"step ≈ {c['step']:.1f}")
    for name, (score, flagged) in c.get("others", {}).items():
        meta.append(f"{e(name)} {e(_num(score))}{' (flags)' if flagged else ''}")
    if c["width"]:
        meta.append(f"{c['width']}×{c['height']}px")
    if c.get("alpha"):
        tag += f' <span class="tag a" title="{e(ALPHA_NOTE)}">transparent</span>'
    if "thumb" in c:
        (y, x), (cw, ch) = c["crop_at"], c["crop_size"]
        a = " alpha" if c.get("alpha") else ""
        imgs = (f'<div><img class="thumb{a}" src="{c["thumb"]}" alt="thumbnail of {e(c["key"])}">'
                f'<div class="lbl">whole image (reduced)</div></div>'
                f'<div><img class="crop{a}" src="{c["crop"]}" width="{cw}" height="{ch}" '
                f'alt="native-resolution crop of {e(c["key"])}">'
                f'<div class="lbl">1:1 crop at x={x}, y={y}</div></div>')
    else:
        imgs = f'<div class="err">image not shown: {e(c["error"])}</div>'
    cap = f'<div class="cap">{e(c["caption"])}</div>' if c.get("caption") else ""
    cls = "card flagged" if c["flagged"] else "card"
    return (f'<figure class="{cls}"><div class="imgs">{imgs}</div><figcaption>{tag} '
            f'<span class="key">{e(c["key"])}</span><div>{" · ".join(meta)}</div>'
            f'<div class="sub" title="{e(c["source"])}">in {e((labels or {}).get(c["source"]) or _short(c["source"]))}</div>{cap}'
            f"</figcaption></figure>")


def _gallery(cards: list[dict], main: str, empty: str, labels: dict[str, str]) -> str:
    if not cards:
        return f'<p class="note">{e(empty)}</p>'
    return '<div class="grid">' + "".join(card(c, main, labels) for c in cards) + "</div>"


#: shown where a figure would be when matplotlib (the ``[plots]`` extra) is not installed
NO_PLOTS = "Figures need matplotlib: pip install 'collapseguard[plots]'."


def _plot(figures: dict, key: str, alt: str) -> str:
    """The figure ``key`` as an image (``alt`` is plain text), or a note when none was drawn."""
    if key not in figures:
        return f'<p class="note">{e(NO_PLOTS)}</p>'
    return f'<img class="plot" src="{figures[key]}" alt="{e(alt)}">'


def render(summary: dict, per_source: pd.DataFrame, cards: dict, figures: dict, comparisons,
           groups_html: str | None = None) -> str:
    """The whole report page as a string. ``groups_html``: the near-duplicate groups, rendered
    (escaped) by ``dedup.gallery.render_groups``, or None for no such section."""
    s = summary
    main = s["detector"]
    has_step = s["equivalent_step"]["available"]
    # sources named as the terminal table names them: two 00000.tar of different folders differ
    labels = source_labels([r["source"] for r in s["per_source"]])
    aside = s.get("set_aside") or {}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>collapseguard audit: {e(percent(s['flagged_fraction']))} flagged</title>",
           f"<style>{STYLE}{GROUPS_STYLE if groups_html is not None else ''}</style></head><body><main>",
           "<h1>Dataset audit: model-degraded images</h1>",
           f'<div class="sub">{len(s["inputs"])} input(s): {e(", ".join(s["inputs"][:5]))}'
           f'{" …" if len(s["inputs"]) > 5 else ""} · {e(s["created"])} · collapseguard '
           f'{e(s["collapseguard_version"])}</div>',
           '<nav><a href="#scores">scores</a><a href="#steps">replication step</a>'
           '<a href="#sources">per source</a>'
           + ('<a href="#storage">storage</a>' if s.get("storage") else "")
           + '<a href="#degraded">most degraded</a>'
           '<a href="#borderline">borderline</a><a href="#kept">kept sample</a>'
           + ('<a href="#compare">other metrics</a>' if comparisons else "")
           + ('<a href="#groups">near-duplicate groups</a>' if groups_html is not None else "")
           + ('<a href="#setaside">set aside</a>' if (s.get("set_aside") or {}).get("count") else "")
           + ('<a href="#errors">not scored</a>' if s["errors"] else "") + "</nav>",
           _headline(s)]

    out.append(f'<section id="scores"><h2>Score distribution</h2><p class="note">Higher = more '
               f'degraded. Images to the right of the dashed line ({e(_num(s["threshold"]))}) are '
               f'flagged.</p>{_plot(figures, "scores", "histogram of scores")}</section>')
    if has_step:
        q = s["equivalent_step"].get("flagged") or {}
        med = (f" Median for flagged images: {stats.format_step(q['p50'], s['equivalent_step'].get('max_step'))}."
               if q else "")
        body = (f'<p class="note">The replication step whose median image scores like each image '
                f"(from the calibration's chains: 0 = scores like a typical original; the last "
                f"calibrated step, e.g. 20, means at least as damaged as a typical image of that "
                f"step).{e(med)}</p>"
                + _plot(figures, "steps", "histogram of estimated replication steps"))
    else:
        body = f'<p class="note">Unavailable: {e(s["equivalent_step"]["reason"])}.</p>'
    out.append(f'<section id="steps"><h2>Estimated replication step</h2>{body}</section>')
    out.append(f'<section id="sources"><h2>Per source</h2><p class="note">Shards (or folders) with '
               f"the highest flagged fraction first.</p>{_sources_table(per_source, has_step, labels)}</section>")

    if s.get("storage"):
        rows = "".join(f'<tr><td class=l>{e(r["storage"])}</td><td>{r["samples"]}</td><td>{r["scored"]}</td>'
                       f'<td>{r["flagged"]}</td><td>{e(percent(r["fraction"]))}</td></tr>' for r in s["storage"])
        note = f'<p class="estimate">{e(s["storage_note"])}</p>' if s.get("storage_note") else ""
        if s.get("transparent"):
            note += (f'<p class="note">{s["transparent"]} scored image(s) have transparent pixels '
                     f'(column has_alpha): {e(ALPHA_NOTE.partition(": ")[2])}.</p>')
        out.append('<section id="storage"><h2>How the images are stored</h2><p class="note">File '
                   "format, and for JPEG the chroma subsampling, read from each scored image's header."
                   f'</p>{note}<table><tr><th class=l>storage</th><th>samples</th><th>scored</th>'
                   f"<th>flagged</th><th>fraction</th></tr>{rows}</table></section>")

    how = ("Left: the whole image, reduced. Right: a crop at native resolution (1:1, never resampled, "
           "lossless) from the most textured part — replication damage (grain, coloured dots, "
           "smeared texture, colour cast) is usually invisible in the reduced image.")
    out.append(f'<section id="degraded"><h2>Most degraded</h2><p class="note">The highest-scoring '
               f'images, flagged or not. {e(how)}</p>{_gallery(cards.get("degraded", []), main, "No image was scored.", labels)}</section>')
    out.append(f'<section id="borderline"><h2>Borderline</h2><p class="note">Of the images not '
               f"shown above, those scoring nearest the threshold, on both sides: where the "
               f"decision is least certain.</p>"
               f'{_gallery(cards.get("borderline", []), main, "No other scored images.", labels)}</section>')
    out.append(f'<section id="kept"><h2>Random sample of kept images</h2><p class="note">What '
               f"passes the threshold and is not shown above (random, seeded): check that no damage slips "
               f"through.</p>"
               f'{_gallery(cards.get("kept", []), main, "No kept image beyond those shown above.", labels)}</section>')

    if comparisons:
        parts = ['<section id="compare"><h2>Where other metrics disagree</h2><p class="note">Each '
                 "compared detector is given a percentile-matched threshold: it flags the same "
                 f"fraction of images as {e(main)} (or fewer, where its scores tie at that "
                 "threshold: tied images are all kept). Images one flags and the other calls fine show "
                 "where a metric misses replication damage (or sees damage that is not there): the "
                 "Banana100 study's evaluator failure, on your own data.</p>"]
        for c in comparisons:
            d = c.as_dict()
            ties = (f" (not {c.main_flagged}: its scores tie at the "
                    "threshold, and tied images are kept)" if c.other_flagged != c.main_flagged else "")
            parts.append(
                f"<h3>{e(main)} vs {e(c.name)}</h3><p class=\"note\">{d['images_compared']} images "
                f"scored by both; {e(main)} flags {c.main_flagged}, {e(c.name)} flags "
                f"{c.other_flagged}{ties} at its threshold {e(_num(c.threshold))}; agreement "
                f"{e(percent(c.agreement))}, Cohen's κ {e(_num(c.cohen_kappa, '.2f'))}, Spearman ρ "
                f"{e(_num(c.spearman, '.2f'))}; {d['main_flags_other_calls_fine']} flagged only by "
                f"{e(main)}, {d['other_flags_main_calls_fine']} only by {e(c.name)}.</p>"
                + _plot(figures, f"compare:{c.name}", f"scores of {main} against {c.name}")
                +                 f"<h3>{e(main)} flags, {e(c.name)} calls fine</h3>"
                + _gallery(cards.get(f"main_only:{c.name}", []), main, "None.", labels)
                + f"<h3>{e(c.name)} flags, {e(main)} calls fine</h3>"
                + _gallery(cards.get(f"other_only:{c.name}", []), main, "None.", labels))
        parts.append("</section>")
        out.append("".join(parts))

    if groups_html is not None:
        g = s.get("groups", {})
        out.append(f'<section id="groups"><h2>Near-duplicate groups</h2><p class="note">'
                   f'{e(g.get("shown", 0))} group(s) of {e(_short(g.get("table", "")))} (made by '
                   "<code>collapseguard dedup</code>), those with a degraded copy first: the kept "
                   "copy, then the others by rank, each as a thumbnail and a 1:1 crop of the same "
                   f"part of the picture. Red: marked degraded_copy.</p>{groups_html}</section>")

    if aside.get("count"):
        ex = aside["examples"]
        rows = "".join(
            f'<tr><td class=l title="{e(r["source"])}">{e(labels.get(r["source"]) or _short(r["source"]))}</td>'
            f'<td class=l>{e(r["key"])}</td><td class=l>{e(SET_ASIDE_LABELS.get(r["reason"], r["reason"]))}</td>'
            f'<td>{e(_num(r["score"]))}{" (flagged)" if r["flagged"] else ""}</td>'
            f'<td class=l>{e(r["error"])}</td></tr>' for r in ex)
        more = (f'<p class="note">Showing {len(ex)} of {aside["count"]}; all are in scores.parquet '
                "(column set_aside).</p>" if aside["count"] > len(ex) else "")
        out.append('<section id="setaside"><h2>Set aside by filter whatever the score</h2><p class="note">'
                   "<code>filter</code> rejects these samples for how they are stored, not for their "
                   "score: member names it had to change (unsafe name), members it did not read "
                   "(refused member), or a key that already named an earlier sample of the shard "
                   "(repeated key). Their galleries' tags say so; the random sample of kept images "
                   "leaves them out.</p><table><tr><th class=l>source</th><th class=l>key</th>"
                   f"<th class=l>reason</th><th>score</th><th class=l>note</th></tr>{rows}</table>{more}</section>")

    if s["errors"]:
        rows = "".join(f'<tr><td class=l title="{e(r["source"])}">{e(labels.get(r["source"]) or _short(r["source"]))}</td><td class=l>{e(r["key"])}</td>'
                       f'<td class=l>{e(r["error"])}</td></tr>' for r in s["error_examples"])
        more = (f'<p class="note">Showing {len(s["error_examples"])} of {s["errors"]}; all are in '
                "scores.parquet (column error).</p>" if s["errors"] > len(s["error_examples"]) else "")
        out.append(f'<section id="errors"><h2>Could not be scored</h2><table><tr><th class=l>source'
                   f"</th><th class=l>key</th><th class=l>reason</th></tr>{rows}</table>{more}</section>")

    out.append('<section><h2>Files</h2><p class="note">summary.json (these figures), flagged.csv '
               "(source, key, score, equivalent_step of every flagged sample), scores.parquet (every "
               "audited sample, all detectors' scores as columns; set_aside names filter's reason to "
               "reject a sample whatever its score; p_degraded_chain_mix is the "
               "calibration's share of degraded images at each score, relative to the calibration's own mix "
               "of clean and chain images: not the decision, no guarantee), report.html (this page).</p></section>")
    out.append("</main></body></html>")
    return "\n".join(out)
