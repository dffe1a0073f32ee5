"""Colour lost: a monochrome copy never outranks a colour copy of the same picture.

The comparator reads saturation as one input among five, and a copy with no chroma at all (a
greyscale or 1-bit dithered copy) looks clean to it: no colour noise, no cast. Losing the colour
is damage all the same, so in a group that holds a colour copy every monochrome copy ranks after
every colour copy (``decide_groups``) and is a ``degraded_copy`` (reason ``lost_colour``).

The chroma measure is the comparator's own ``sat`` feature (mean over pixels of max - min of the
channels, in [0, 1]) at the scale the group is compared at, computed from the image already
decoded for its description: a copy is monochrome at ``MONOCHROME_CHROMA`` or less (2.55 levels
of 255), a copy is colour above ``COLOUR_CHROMA``. Greyscale and 1-bit copies decode to 0
(stored as RGB JPEG too), while a JPEG copy of a colour photo keeps nearly all of its chroma
(skimage's astronaut 0.19, rocket 0.15 as PNG and at JPEG q40 alike; at 70% saturation, JPEG q75,
still 0.10 or more), so a slightly desaturated copy is never monochrome. A group with no copy
above ``COLOUR_CHROMA`` ranks as the comparator alone ranks it: only grey copies, or a picture
with as faint a colour as skimage's ``hubble_deep_field`` (0.017-0.022 by scale), whose grey
copy is left to the comparator.
"""

from __future__ import annotations

import numpy as np

from collapseguard.detectors.pair_features import FEATURES

#: mean chroma (``sat``) at or below which a copy is monochrome
MONOCHROME_CHROMA = 0.01
#: mean chroma above which a copy is colour (a group needs one for the rule to apply)
COLOUR_CHROMA = 0.02

_SAT = FEATURES.index("sat")


def group_chroma(ladders: np.ndarray) -> np.ndarray:
    """Each copy's ``sat`` at the largest scale all copies reach (as ``compare.group_utilities``
    compares them); ``ladders`` is (copies, scales, features). NaN where it was not computed."""
    reached = ~np.isnan(ladders[:, :, 0]).any(axis=0)
    idx = np.flatnonzero(reached)
    return ladders[:, int(idx[-1]) if idx.size else 0, _SAT]


def lost_colour(chroma: np.ndarray) -> np.ndarray:
    """The copies that lost their colour: monochrome, in a group that holds a colour copy (none
    when any chroma is unknown)."""
    chroma = np.asarray(chroma, np.float64)
    if np.isnan(chroma).any() or not (chroma > COLOUR_CHROMA).any():
        return np.zeros(len(chroma), bool)
    return chroma <= MONOCHROME_CHROMA
