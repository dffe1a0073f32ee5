"""Calibration: thresholds with a stated false-drop guarantee, score -> probability / equivalent step.

``thresholds`` resolves the threshold a run applies (what the filter and audit import) and re-exports
the file format of ``collapseguard.io.calibration_file`` (the Calibration record, loading/saving,
detector checks); ``bounds`` holds the finite-sample bound; ``build`` builds a calibration from
replication chains (``collapseguard calibrate``); ``show`` prints a file (``collapseguard
calibrations``).
"""

from collapseguard.calibration.thresholds import (
    Calibration,
    CalibrationError,
    CalibrationMismatch,
    NoThresholdError,
    check_detector,
    default_calibration,
    is_dropped,
    load_calibration,
    resolve_threshold,
    save_calibration,
    threshold_for_drop_fraction,
)

__all__ = [
    "Calibration", "CalibrationError", "CalibrationMismatch", "NoThresholdError", "check_detector",
    "default_calibration", "is_dropped", "load_calibration", "resolve_threshold", "save_calibration",
    "threshold_for_drop_fraction",
]
