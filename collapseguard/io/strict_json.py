"""Values made ready for strict JSON (``json.dumps(..., allow_nan=False)``): JSON has no NaN or
infinity, and a bare ``NaN`` in a file breaks strict readers (``jq``, JavaScript's
``JSON.parse``). One rule for every file collapseguard writes: non-finite floats become null and
numpy values become Python ones."""

from __future__ import annotations

import math

import numpy as np


def json_ready(o):
    """``o`` with NaN and infinities as None, numpy scalars and arrays as Python values, and dict
    keys as strings (recursively)."""
    if isinstance(o, dict):
        return {str(k): json_ready(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_ready(v) for v in o]
    if isinstance(o, np.ndarray):
        return [json_ready(v) for v in o.tolist()]
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return f if math.isfinite(f) else None
    return o
