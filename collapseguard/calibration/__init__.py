"""Calibration: thresholds with a stated false-drop guarantee, score -> probability / equivalent step.

``files`` holds the Calibration record, loading/saving, detector checks and threshold resolution
(what the filter and audit import); ``bounds`` the finite-sample bound; ``calibrate`` builds a
calibration from replication chains.
"""

from collapseguard.calibration.files import (
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
