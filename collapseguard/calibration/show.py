"""What a calibration file says, as text: detector and version, threshold and guarantee, the
held-out false-drop rate (in-sample for ``--holdout 0``), each clean kind's own threshold (a
``--per-kind`` file), the drop rate at steps 0, 1, 3, 5, 10, 20 per family (Clopper–Pearson
interval) and the first steps with 90 % / 99 % dropped. ``collapseguard calibrations`` prints it.
"""

from __future__ import annotations

from pathlib import Path

from collapseguard.calibration.build import (
    bound_count_text,
    curve_table,
    first_steps_text,
    per_kind_text,
    top_clean_text,
)
from collapseguard.calibration.thresholds import DEFAULTS_DIR, load_calibration
from collapseguard.io.terminal import percent, printable


def shipped_paths() -> list[str]:
    """The calibrations shipped in the package."""
    return sorted(str(p) for p in DEFAULTS_DIR.glob("*.json"))


def title(path) -> str:
    """A shipped file by its name (where the package is installed says nothing about it), any
    other by the path given."""
    p = Path(path)
    return f"{p.name} (shipped with the package)" if p.parent.resolve() == DEFAULTS_DIR.resolve() else str(path)


def _interval(ci) -> str:
    """A [low, high] interval as percentages, or as given."""
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in ci):
        return f"[{percent(ci[0], 2)}, {percent(ci[1], 2)}]"
    return str(ci)


def show(path) -> str:
    """The file's text (CalibrationError for a file that is not a calibration); names from the
    file are printed with control characters escaped."""
    cal = load_calibration(path)
    split = cal.split or {}
    # --holdout 0: the clean false-drop rate is measured on the images that set the threshold
    in_sample = split.get("holdout") == 0
    if not cal.is_calibrated:  # a threshold alone (e.g. a run's summary.json): nothing more to say
        lines = [f"== {title(path)}", cal.describe()] + [f"  note: {note}" for note in cal.notes]
        return "\n".join(printable(line) for line in "\n".join(lines).split("\n"))
    counted = bound_count_text(cal)
    guaranteed = f"guaranteed false-drop rate {percent(cal.guaranteed_false_drop, 2)} at confidence {cal.confidence}"
    if cal.per_kind:  # the rate is the largest of the kinds' own bounds, not the binding kind's
        worst = max(cal.per_kind, key=lambda r: r.get("guaranteed_false_drop") or 0)
        guaranteed = (f"guaranteed false-drop rate of every kind at most {percent(cal.guaranteed_false_drop, 2)}, "
                      f"jointly at confidence {cal.confidence} (the largest of the kinds' own bounds: kind "
                      f"{worst['kind']}'s, k={worst['k']} of n={worst['n']} at its own threshold "
                      f"{worst['threshold']:.6g})")
    lines = [f"== {title(path)}", cal.describe(),
             f"bound: {cal.method}",
             (f"{counted}; {guaranteed}; {'in-sample (--holdout 0)' if in_sample else 'held-out'} clean false drops "
              f"{percent(split.get('heldout_false_drop'), 2)} "
              f"(n={split.get('n_clean_holdout')}, CI {_interval(split.get('heldout_false_drop_ci'))})"
              + (f"; by picture {split['heldout_pictures_dropped']} of {split.get('n_clean_holdout_pictures')} "
                 f"(CI {_interval(split.get('heldout_pictures_dropped_ci'))})"
                 if "heldout_pictures_dropped" in split else "")),
             curve_table(cal)]
    if cal.per_kind:
        lines.insert(-1, per_kind_text(cal))
    if cal.top_clean:
        lines.insert(-1, top_clean_text(cal))
    if cal.first_step_dropped:
        lines.append(first_steps_text(cal, "  {family}: first step >=90% dropped: {0.9}, >=99%: {0.99}"))
    lines += [f"  note: {note}" for note in cal.notes]
    # a calibration file may come from elsewhere: its names are printed with control characters escaped
    return "\n".join(printable(line) for line in "\n".join(lines).split("\n"))
