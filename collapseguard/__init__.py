"""collapseguard: find and filter model-degraded images in image training data.

Every detector returns one float per image, higher = more degraded.
"""

__version__ = "0.1.0"

from collapseguard.detectors import create, list_detectors  # noqa: E402

__all__ = ["__version__", "create", "list_detectors"]
