"""Calibration: thresholds with a stated false-drop guarantee, score -> probability / equivalent step."""
