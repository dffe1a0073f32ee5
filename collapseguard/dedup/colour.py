"""Colour lost: a monochrome copy never outranks a colour copy of the same picture.

The comparator reads saturation as one input among five, and a copy with no chroma at all (a
greyscale or 1-bit dithered copy) looks clean to it: no colour noise, no cast. Losing the colour
is damage all the same, so in a group that holds a colour copy every monochrome copy ranks after
every colour copy (``decide_groups``) and is a ``degraded_copy`` (reason ``lost_colour``).

The chroma measures are the comparator's own ``sat`` (mean over pixels of max - min of the
channels, in [0, 1]) and ``cast`` (the chroma of the mean colour), computed from the image
already decoded for its description. A copy is monochrome at ``MONOCHROME_CHROMA`` of ``sat`` or
less (2.55 levels of 255) at the scale the group is compared at. Whether a copy is colour is read
on the copy reduced to 16 px on its shorter side (``pair_features.coarse_chroma``): colour is
a picture's coarse content, while chroma noise added to a grey picture averages out there (noise
of 8 levels on each channel of skimage's camera, moon and coins reads under ``COLOUR_CHROMA``
there: ``tests/dedup/test_colour_and_kept_copy.py``), so a noisy copy of a grey original is no
colour copy and the comparator decides between them. A copy is colour when that ``sat`` is above ``STRONG_CHROMA``,
or when its chroma beyond a uniform cast, ``sat - CAST_SHARE * cast``, is above
``COLOUR_CHROMA``. A uniform tint of a grey picture (the
green cast of a damaged copy, a sepia toning) has ``sat`` at most 1.42 times its ``cast``, so
under ``STRONG_CHROMA`` (25 levels) it never counts as colour and cannot outrank the grey
original; most photos have one dominant hue (skimage's astronaut: ``sat`` 0.20, ``cast`` 0.13)
and count by their strength. Greyscale and 1-bit copies decode to ``sat`` 0 (stored as RGB JPEG
too), while a JPEG copy of a colour photo keeps nearly all of its chroma (astronaut 0.19, rocket
0.15 as PNG and at JPEG q40 alike; at 70% saturation, JPEG q75, still 0.10 or more), so a
slightly desaturated copy is never monochrome. A group with no colour copy ranks as the
comparator alone ranks it: only grey copies, grey copies beside tinted or noisy ones, or a picture
with as faint a colour as skimage's ``hubble_deep_field`` (the test of slightly desaturated copies
below ``COLOUR_CHROMA``). Limits: a grey
original beside a copy tinted by more than 25 levels loses to it; a photo of one faint hue
(``sat`` under 0.10, nearly all of it the mean colour) does not count as colour, and its grey
copy is left to the comparator.
"""

from __future__ import annotations

import numpy as np

from collapseguard.detectors.pair_features import FEATURES

#: mean chroma (``sat``) at or below which a copy is monochrome
MONOCHROME_CHROMA = 0.01
#: chroma beyond a uniform cast (``sat - CAST_SHARE * cast``) above which a copy is colour (a
#: group needs one for the rule to apply)
COLOUR_CHROMA = 0.02
#: mean chroma (``sat``) above which a copy is colour whatever its cast
STRONG_CHROMA = 0.10
#: over the largest ``sat / cast`` of a uniform cast (sqrt 2, a tint along one channel pair)
CAST_SHARE = 1.5

_SAT, _CAST = FEATURES.index("sat"), FEATURES.index("cast")


def group_chroma(ladders: np.ndarray) -> np.ndarray:
    """Each copy's ``(sat, cast)`` at the largest scale all copies reach (as
    ``compare.group_utilities`` compares them); ``ladders`` is (copies, scales, features). NaN
    where it was not computed."""
    reached = ~np.isnan(ladders[:, :, 0]).any(axis=0)
    idx = np.flatnonzero(reached)
    return ladders[:, int(idx[-1]) if idx.size else 0][:, [_SAT, _CAST]]


def _sat_cast(chroma) -> tuple[np.ndarray, np.ndarray]:
    chroma = np.asarray(chroma, np.float64)
    return (chroma[:, 0], chroma[:, 1]) if chroma.ndim == 2 else (chroma, np.zeros_like(chroma))


def lost_colour(chroma: np.ndarray, coarse: np.ndarray | None = None) -> np.ndarray:
    """The copies that lost their colour: monochrome, in a group that holds a colour copy (none
    when any chroma is unknown). ``chroma`` is ``group_chroma``'s (copies, 2), or each copy's
    ``sat`` alone (no cast): what tells a monochrome copy. ``coarse``, each copy's
    ``pair_features.coarse_chroma`` (copies, 2), tells a colour copy where every copy has it;
    without it (or where any is NaN) ``chroma`` does."""
    sat, cast = _sat_cast(chroma)
    csat, ccast = (sat, cast)
    if coarse is not None:
        k_sat, k_cast = _sat_cast(coarse)
        if len(k_sat) == len(sat) and np.isfinite(k_sat).all() and np.isfinite(k_cast).all():
            csat, ccast = k_sat, k_cast
    colour = (csat > STRONG_CHROMA) | (csat - CAST_SHARE * ccast > COLOUR_CHROMA)
    if np.isnan(sat).any() or np.isnan(cast).any() or not colour.any():
        return np.zeros(len(sat), bool)
    return sat <= MONOCHROME_CHROMA
