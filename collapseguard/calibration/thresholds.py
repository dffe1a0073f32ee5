"""Using calibrations: resolving the threshold a run applies, and percentile cuts.

The file format (``Calibration``, loading, saving, the detector check and the packaged defaults)
lives in ``collapseguard.io.calibration_file``, below the detectors that read it (the ``ens:``
ensemble normalises its members by their calibrations); its names are re-exported here.

**Decision rule** (used everywhere): an image is *dropped* when ``score > threshold`` (strictly;
see ``is_dropped``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from collapseguard.io.calibration_file import (
    BOUND_UNIT,
    DEFAULTS_DIR,
    SCOPE_NOTE,
    Calibration,
    CalibrationError,
    CalibrationMismatch,
    NoThresholdError,
    _name_version,
    check_detector,
    default_calibration,
    default_calibration_path,
    is_dropped,
    load_calibration,
    save_calibration,
)

#: what ``filter`` and ``score`` users pass when no calibration applies
NO_THRESHOLD_HOW = ("pass --threshold T, --calibration FILE (made with `collapseguard calibrate`), or "
                    "--drop-fraction F (an uncalibrated percentile cut)")


def resolve_threshold(
    detector,
    threshold: float | None = None,
    calibration: str | Path | Calibration | None = None,
    how: str = NO_THRESHOLD_HOW,
) -> tuple[float, str, Calibration | None]:
    """Decide the threshold to use, and say where it came from.

    Order: an explicit ``threshold`` wins; else a calibration file (checked against the detector,
    CalibrationMismatch if made for another); else the packaged default for this detector and
    version; else NoThresholdError telling the user what to pass, in the caller's terms
    (``how``: the options of a command, the arguments of a function). Returns
    ``(threshold, description, calibration or None)``; drop images with ``score > threshold``.
    """
    name, version = _name_version(detector)
    if threshold is not None:
        t = float(threshold)
        if not math.isfinite(t):
            raise ValueError(f"threshold must be a finite number, got {threshold!r}")
        cal, note = None, ""
        if calibration is not None:
            cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
            check_detector(cal, detector, threshold_given=True)
            maps = cal.step_map is not None or cal.probability_map is not None
            note = (f"; the calibration's own threshold {cal.threshold:.6g} is not used, only its "
                    "score maps" if maps else f"; the calibration's own threshold {cal.threshold:.6g} "
                    "is not used, and it holds no score maps: it adds nothing here")
        return t, f"explicit threshold {t:.6g} (--threshold; uncalibrated, no stated guarantee{note})", cal
    if calibration is not None:
        if isinstance(calibration, Calibration):
            cal, where = calibration, "calibration"
        else:
            cal, where = load_calibration(calibration), f"calibration {calibration}"
        check_detector(cal, detector)
        return cal.threshold, f"{where} for {name}@{version}: threshold {cal.threshold:.6g}, {cal.guarantee_text()}", cal
    cal = default_calibration(name, version)
    if cal is not None:
        return (cal.threshold,
                (f"default calibration for {name}@{version}: threshold {cal.threshold:.6g}, "
                f"{cal.guarantee_text()}"), cal)
    hint = ""
    path = default_calibration_path(name)
    if path.is_file():
        try:
            other = load_calibration(path)
            hint = (f" (the packaged default calibration is for {other.detector}@"
                    f"{other.detector_version}, not {name}@{version})")
        except CalibrationError:
            pass
    raise NoThresholdError(f"no threshold for detector {name}@{version}{hint}: {how}")


# ---------------------------------------------------------------------------------------------
# Decisions and uncalibrated cuts
# ---------------------------------------------------------------------------------------------

def flag_columns(df, threshold: float | None):
    """``df`` (a scores table with a ``score`` column) with ``flagged`` (``score > threshold``, as
    ``is_dropped``; empty where the score is empty) and ``threshold`` columns placed after ``score``;
    both empty everywhere when ``threshold`` is None (no threshold applies)."""
    import pandas as pd

    s = pd.to_numeric(df["score"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    scored = np.isfinite(s)
    if threshold is None:
        flagged = pd.array([pd.NA] * len(df), dtype="boolean")
        t = np.full(len(df), np.nan)
    else:
        flagged = pd.array(is_dropped(s, threshold), dtype="boolean")
        flagged[~scored] = pd.NA
        t = np.full(len(df), float(threshold))
    out = df.drop(columns=[c for c in ("flagged", "threshold") if c in df.columns])
    at = list(out.columns).index("score") + 1
    out.insert(at, "flagged", flagged)
    out.insert(at + 1, "threshold", t)
    return out


def threshold_for_drop_fraction(scores: Sequence[float] | np.ndarray, fraction: float) -> float:
    """The threshold that drops the top ``fraction`` of ``scores`` (uncalibrated percentile cut).

    With the rule ``score > threshold``, the threshold is the (m+1)-th largest score, where
    m = round(fraction * n); ties at the threshold are kept, so at most m scores are dropped.
    NaN scores are ignored; +-inf are scores (ranked, counted in n). No guarantee about clean
    images comes with this cut.
    """
    f = float(fraction)
    if not 0.0 <= f < 1.0:
        raise ValueError(f"drop fraction must be in [0, 1), got {fraction!r}")
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    s = s[~np.isnan(s)]
    if len(s) == 0:
        raise ValueError("no scores (all NaN) to take a drop-fraction cut from")
    m = round(f * len(s))
    m = min(m, len(s) - 1)
    desc = np.sort(s)[::-1]
    return float(desc[m])


def drop_fraction_calibration(detector, scores, fraction: float) -> Calibration:
    """An uncalibrated Calibration record for a ``--drop-fraction`` cut (for scores files/reports)."""
    name, version = _name_version(detector)
    t = threshold_for_drop_fraction(scores, fraction)
    return Calibration(detector=name, detector_version=version, threshold=t,
                       label=f"uncalibrated: drop-fraction {float(fraction):g} of the data being filtered",
                       method="percentile cut", n_clean=0)


__all__ = [
    "BOUND_UNIT",
    "DEFAULTS_DIR",
    "SCOPE_NOTE",
    "Calibration",
    "CalibrationError",
    "CalibrationMismatch",
    "NoThresholdError",
    "check_detector",
    "default_calibration",
    "default_calibration_path",
    "drop_fraction_calibration",
    "is_dropped",
    "load_calibration",
    "resolve_threshold",
    "save_calibration",
    "threshold_for_drop_fraction",
]
