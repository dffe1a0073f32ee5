"""dedup's colour rules: a monochrome copy never outranks a colour copy of the same picture
(colour lost, here), and one layout in other colours is another picture (colour variants, below).

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


# ---------------------------------------------------------------------------------------------
# Colour variants: one layout in other colours is another picture
# ---------------------------------------------------------------------------------------------
# The fingerprints read luma only, so a product shot in red and the same shot in blue, or a
# photo with its hues turned, group as copies, and the comparator would then drop one as a
# degraded copy. Damage changes colour too, but otherwise: a uniform cast (the study's green
# tint), a saturation change, noise that the 32 px reduction averages out. So two copies are
# colour variants when, whatever cast of up to ``MAX_CAST`` levels is taken off one of them
# (none, the median difference, or the difference of any one cell), at least ``VARIANT_SHARE``
# of the cells of their ``pair_features.colour_layout`` change colour beyond it: the hue turns
# by more than acos(``TURN_COS``) (about 41 degrees) where both hold a colour (``HUE_CHROMA``
# levels or more), or a colour of ``STRONG_CELL`` levels or more falls to under ``GONE_SHARE``
# of itself (a cell recoloured to grey or black). A copy with no colour anywhere is read by its
# tones instead: a greyscale copy keeps its original's luma cell by cell (``tones_apart``: none
# beyond a uniform brightness change) and stays, where the lost-colour rule decides it; a grey or
# black product beside coloured versions does not. Measured by ``recipes/colour_variants.py``:
# of the evaluation set's chains (15 families, four storages), no step 5 is a variant of its step
# 0, and no step 10 but 7 of 120 of animevideov3's (an anime upscaler whose flat colours drift;
# they leave the group and are decided on their own); no copy of the bundled photos cropped by 5%
# or 10% a side, blurred, desaturated to 50% or saturated to 150%, JPEG q10 or greyscale (also 20
# levels darker) is; of copies tinted green by 34 and 67 levels, 1 and 6 of 10 are (singles then:
# nothing lost, one copy fewer found). A shirt in six colours, black included: every pair parts;
# photos with hues turned by 90 or 180 degrees or red and blue swapped: 70-90%; a catalogue's
# garment in ten colours: 19 of 28 pairs of two colours and 12 of 17 pairs with grey or black.
# Neighbouring hues (red/orange/pink, yellow/orange, blue/purple), one hue darker (purple/navy)
# and a grey whose tones match a colour's stay together.

#: the share of a layout's cells that must change colour for two copies to be colour variants
VARIANT_SHARE = 1 / 8
#: the largest uniform cast (levels of 255, opponent chroma) taken for damage, not a recolouring
MAX_CAST = 32.0
#: a cell holds a colour at this chroma (levels) or more, and a strong one at ``STRONG_CELL``
HUE_CHROMA = 25.0
STRONG_CELL = 60.0
#: a hue turns when the cosine between a cell's two chroma vectors is under this (about 41 degrees)
TURN_COS = 0.75
#: a strong colour is gone when the other copy keeps under this share of its chroma
GONE_SHARE = 0.2
#: a cell's luma differs, beyond the layouts' median difference, by this many levels (of 255)
#: between two pictures (``tones_apart``)
LUMA_APART = 24.0


def _changed_cells(a: np.ndarray, b: np.ndarray, casts: np.ndarray) -> np.ndarray:
    """For each cast (C, 2), how many cells of ``b`` less it change colour from ``a``'s."""
    b = b[None] - casts[:, None]  # (C, cells, 2)
    ma, mb = np.linalg.norm(a, axis=1)[None], np.linalg.norm(b, axis=2)
    cos = (a[None] * b).sum(axis=2) / (ma * mb + 1e-9)
    turned = (ma >= HUE_CHROMA) & (mb >= HUE_CHROMA) & (cos < TURN_COS)
    hi, lo = np.maximum(ma, mb), np.minimum(ma, mb)
    gone = (hi >= STRONG_CELL) & (lo < GONE_SHARE * hi)
    return (turned | gone).sum(axis=1)


def colour_variants(layout_a: np.ndarray, layout_b: np.ndarray) -> bool:
    """Are two copies' ``colour_layout``s (int8, halves of levels) those of colour variants of
    one layout rather than of one picture (see above)?"""
    a, b = _chroma(layout_a), _chroma(layout_b)
    if min(np.linalg.norm(a, axis=1).max(), np.linalg.norm(b, axis=1).max()) < HUE_CHROMA:
        return False  # a copy without colour anywhere: the lost-colour rule's case, not a variant
    d = b - a
    casts = np.concatenate([np.zeros((1, 2)), np.median(d, axis=0)[None], d])
    casts = casts[np.hypot(casts[:, 0], casts[:, 1]) <= MAX_CAST]
    return int(_changed_cells(a, b, casts).min()) >= VARIANT_SHARE * len(a)


def has_colour(layout: np.ndarray) -> bool:
    """Does a ``colour_layout`` hold a colour anywhere (a cell of ``HUE_CHROMA`` or more)?"""
    return bool(np.linalg.norm(_chroma(layout), axis=1).max() >= HUE_CHROMA)


def _chroma(layout: np.ndarray) -> np.ndarray:
    """A ``colour_layout``'s opponent chroma per cell, (cells, 2), levels of 255."""
    return np.asarray(layout, np.float64).reshape(-1, 3)[:, 1:] * 2


def _luma(layout: np.ndarray) -> np.ndarray:
    """A ``colour_layout``'s mean luma per cell, levels of 255."""
    return (np.asarray(layout, np.float64).reshape(-1, 3)[:, 0] + 64) * 2


def tones_apart(layout_a: np.ndarray, layout_b: np.ndarray) -> bool:
    """Do two layouts' tones differ as two pictures' do: beyond the uniform brightness change most
    cells agree on (the cell difference with the most cells within ``LUMA_APART / 2`` of it), do
    at least ``VARIANT_SHARE`` of the cells differ in luma by ``LUMA_APART`` levels or more? A
    greyscale copy keeps its original's luma (BT.601, as the copy's grey is made) and a darker
    copy moves every cell alike: neither is apart; a grey product beside its red version, whose
    background agrees and whose garment does not, is."""
    d = _luma(layout_a) - _luma(layout_b)
    near = (np.abs(d[None] - d[:, None]) <= LUMA_APART / 2).sum(axis=1)
    offset = d[int(np.argmax(near))]
    return int((np.abs(d - offset) >= LUMA_APART).sum()) >= VARIANT_SHARE * len(d)


#: members of a set a copy is checked against before it joins it (all of a small set)
SET_CHECK = 16


def split_colour_variants(members: np.ndarray, layout: np.ndarray) -> list[np.ndarray]:
    """``members`` (rows of one group) cut into sets of copies of one picture's colours, none a
    colour variant of another in its set (of the first ``SET_CHECK`` members of a large set). The
    copies that hold a colour are placed in an order read from their layouts, not their names or
    rows (the same data gives the same sets however its files are called): each joins the first
    set it is no variant of, or starts one. A crop is placed as any copy (cropped by up to 10% a
    side its cells still read as its original's: ``recipes/colour_variants.py``). A copy without
    colour anywhere joins the largest colour set holding a copy whose tones it keeps (not
    ``tones_apart``: a greyscale copy, of the whole or of a crop, which the lost-colour rule
    decides there; a crop's tones lie where its own framing's do); the others
    (a grey or black product beside its coloured versions, the copies of a grey picture) form one
    set: copies without colour are never cut apart from each other."""
    colourful = [m for m in members if has_colour(layout[m])]
    colourful.sort(key=lambda m: (layout[m].tobytes(), int(m)))
    sets: list[list[int]] = []
    for m in colourful:
        home = next((s for s in sets if not any(colour_variants(layout[o], layout[m]) for o in s[:SET_CHECK])),
                    None)
        if home is None:
            sets.append([m])
        else:
            home.append(m)
    grey = sorted((m for m in members if not has_colour(layout[m])), key=lambda m: (layout[m].tobytes(), int(m)))
    coloured, greys = list(sets), []
    for m in grey:  # the largest colour set whose tones it keeps (a greyscale copy), else the grey set
        home = max((s for s in coloured if any(not tones_apart(layout[o], layout[m]) for o in s[:SET_CHECK])),
                   key=lambda s: (len(s), -min(s)), default=None)
        (greys if home is None else home).append(m)
    if greys:
        sets.append(greys)
    return [np.array(sorted(s), dtype=members.dtype) for s in sets]
