"""Every scorer behind one protocol and one registry: ``create(name)``, ``list_detectors()``."""

from collapseguard.detectors.base import (
    DEFAULT_DETECTOR,
    Detector,
    DetectorError,
    create,
    list_detectors,
    register,
)

__all__ = ["DEFAULT_DETECTOR", "Detector", "DetectorError", "create", "list_detectors", "register"]
