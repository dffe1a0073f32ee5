"""``ens:<a>+<b>[+...]`` — an ensemble of detectors on a common, calibrated scale.

Scores of different detectors live on different scales (PIQE 0..100, 5 - VLM rating 0..4, RALI
-quality, cnn logits ...), so each member's score is first mapped to a common scale, then the
ensemble score is the (weighted) mean of the mapped scores. Higher = more degraded, as always.

Common scale, in order of preference:

1. **P(degraded)** — when *every* member has a calibration with a probability map (passed in
   ``calibrations={name: Calibration or path}``, or the packaged default calibration for the
   member's name *and* version from ``collapseguard.io.calibration_file.default_calibration``), each
   score becomes that map's probability, made strictly monotone (``ProbabilityMap``): the
   isotonic map is flat over whole ranges of scores (the shipped nss map over 0.66-6.87), which
   would tie images a member tells apart. Mixing probabilities with quantiles would compare
   unlike things, so if any member lacks one, all members use (2).
2. **Quantile against a fixed reference set** — each member scores the same reference images once
   at creation; a score becomes its position in that member's reference distribution (the
   empirical CDF, linearly interpolated, with hyperbolic tails outside the reference range so it
   stays strictly monotone in (0, 1)). The reference is ``reference=`` (a list of RGB uint8 images,
   ideally a sample of clean *and* degraded images from your own data) or, by default, a small
   deterministic built-in set of procedurally generated images with and without noise, blur and
   JPEG damage (:func:`builtin_reference_images`). The quantile of an image never depends on the
   other images in its batch.

A member that cannot score an image (NaN) makes the ensemble NaN for it (``nan_policy="propagate"``,
the default) or is left out of the mean (``nan_policy="omit"``).

The member spec is split on ``+``; nested ensembles are not allowed. Keyword arguments for members
go in ``member_kwargs={name: {...}}``.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from collapseguard.detectors.base import Detector, DetectorError, create, params_version


def builtin_reference_images(size: int = 192, n_scenes: int = 4) -> list[np.ndarray]:
    """A small deterministic reference set: procedural scenes, clean and damaged (noise, blur, JPEG).

    Returns ``n_scenes * 6`` RGB uint8 images of ``size`` x ``size``.
    """
    from PIL import Image, ImageFilter

    out: list[np.ndarray] = []
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    for s in range(n_scenes):
        rng = np.random.default_rng(1000 + s)
        base = np.zeros((size, size, 3))
        for c in range(3):
            a, b, f = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(2, 12)
            base[..., c] = 0.5 + 0.25 * (a * xx + b * yy) + 0.2 * np.sin(2 * np.pi * f * (xx * a + yy * b + c))
        for _ in range(6):  # a few hard-edged shapes for structure
            cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.2)
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
            base[mask] = rng.uniform(0, 1, 3)
        clean = np.clip(base * 255 + rng.normal(0, 1.5, base.shape), 0, 255).astype(np.uint8)
        pil = Image.fromarray(clean)
        noisy = np.clip(clean + rng.normal(0, 12, clean.shape), 0, 255).astype(np.uint8)
        very_noisy = np.clip(clean + rng.normal(0, 35, clean.shape), 0, 255).astype(np.uint8)
        blurred = np.asarray(pil.filter(ImageFilter.GaussianBlur(2.5)))
        buf = io.BytesIO()
        pil.save(buf, format="JPEG", quality=8)
        jpeg = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
        small = pil.resize((size // 4, size // 4), Image.BILINEAR).resize((size, size), Image.NEAREST)
        out += [clean, noisy, very_noisy, blurred, jpeg, np.asarray(small)]
    return [np.ascontiguousarray(a) for a in out]



def split_members(spec: str) -> list[str]:
    """The member specs of ``A+B+...``: a ``+`` starts a new member only where a registered
    detector name or family (``nss``, ``pyiqa:``, ``cnn:``, ...) follows it, so metric names and
    paths that hold a ``+`` (``pyiqa:clipiqa+``, ``cnn:/runs/a+b/w.safetensors``) stay whole."""
    from collapseguard.detectors.base import list_detectors

    registered = list_detectors()
    names: list[str] = []
    for part in spec.split("+"):
        head = part.strip()
        starts = head in registered or (":" in head and head.split(":", 1)[0] + ":" in registered)
        if names and not starts:
            names[-1] += "+" + part
        else:
            names.append(head)
    return [n.strip() for n in names]

def _interp_with_tails(scores, knots_x: np.ndarray, knots_y: np.ndarray, scale: float) -> np.ndarray:
    """Linear through the knots (their one level when there is one knot), and outside them
    hyperbolic tails towards 0 and 1: strictly monotone and, unlike exp, not flattened by
    underflow. NaN where a score is not finite."""
    s = np.asarray(scores, dtype=np.float64)
    out = np.interp(s, knots_x, knots_y) if knots_x.size > 1 else np.full_like(s, knots_y[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(s < knots_x[0], knots_y[0] / (1.0 + (knots_x[0] - s) / scale), out)
        out = np.where(s > knots_x[-1], 1.0 - (1.0 - knots_y[-1]) / (1.0 + (s - knots_x[-1]) / scale), out)
    return np.where(np.isfinite(s), out, np.nan)


class QuantileMap:
    """Strictly monotone map from a member's score to its quantile in a reference distribution."""

    def __init__(self, reference_scores: np.ndarray):
        ref = np.sort(np.asarray(reference_scores, dtype=np.float64))
        ref = ref[np.isfinite(ref)]
        if ref.size < 2:
            raise DetectorError("need at least 2 finite reference scores for quantile normalisation")
        self.knots_x, counts = np.unique(ref, return_counts=True)
        n = ref.size
        cum = np.cumsum(counts)
        self.knots_y = (cum - counts / 2.0) / n  # mid-rank ECDF at each distinct value
        spread = np.subtract(*np.percentile(ref, [75, 25])) or ref.std() or 1.0
        self.scale = float(spread)

    def __call__(self, scores) -> np.ndarray:
        return _interp_with_tails(scores, self.knots_x, self.knots_y, self.scale)


class ProbabilityMap:
    """A calibration's P(degraded) map (``{"x": knots, "y": non-decreasing levels}``, isotonic:
    flat over whole ranges of scores) as a strictly increasing map in (0, 1): linear through the
    centre of each level's run of knots, levels shrunk by ``SHRINK`` towards 1/2 so that the top
    level is under 1, and hyperbolic tails towards 0 and 1 outside the centres (as
    ``QuantileMap``'s). Scores that the isotonic map ties keep their order; the levels it gives
    between runs are kept, to within ``SHRINK``."""

    SHRINK = 1e-3

    def __init__(self, probability_map: dict):
        x = np.asarray(probability_map["x"], dtype=np.float64)
        y = np.asarray(probability_map["y"], dtype=np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        if x.size == 0:
            raise DetectorError("a probability map with no finite knots")
        levels, first = np.unique(y, return_index=True)  # y is non-decreasing: runs in x order
        last = np.r_[first[1:], x.size] - 1
        order = np.argsort(first)
        self.knots_x = (x[first[order]] + x[last[order]]) / 2.0
        self.knots_y = self.SHRINK + (1.0 - 2 * self.SHRINK) * np.clip(levels[order], 0.0, 1.0)
        gaps = np.diff(self.knots_x)
        self.scale = float(np.median(gaps)) if gaps.size and np.median(gaps) > 0 else float(np.ptp(x) or 1.0)

    def __call__(self, scores) -> np.ndarray:
        return _interp_with_tails(scores, self.knots_x, self.knots_y, self.scale)


def _load_cal(value):
    from collapseguard.io.calibration_file import Calibration, load_calibration

    if isinstance(value, Calibration):
        return value
    if isinstance(value, (str, Path)):
        return load_calibration(value)
    raise DetectorError(f"calibration must be a Calibration or a path, got {type(value).__name__}")


def _default_cal(det: Detector):
    try:
        from collapseguard.io.calibration_file import default_calibration
    except ImportError:
        return None
    try:
        return default_calibration(det.name, det.version)
    except Exception:  # a broken packaged file must not break the ensemble: fall back to quantiles
        return None


class EnsembleDetector(Detector):
    """Mean of member scores on a common scale (P(degraded) when all calibrated, else quantiles).

    Args:
        spec: member names joined by ``+``, e.g. ``"cnn+nss"`` or ``"nss+pyiqa:piqe"``.
        weights: one non-negative weight per member (default: equal).
        calibrations: ``{member name: Calibration or path}`` overriding packaged defaults.
        reference: reference images for quantile normalisation (default: built-in set).
        nan_policy: ``"propagate"`` (any member NaN -> NaN) or ``"omit"``.
        member_kwargs: ``{member name: kwargs}`` passed to ``create`` for that member.
        members: already-created detectors to use instead of creating them from ``spec``.
        trust_pickle: passed on to members that load pickles (``rali:``), as ``--trust-pickle``.
    """


    def __init__(
        self,
        spec: str,
        weights: Sequence[float] | None = None,
        calibrations: Mapping[str, object] | None = None,
        reference: Sequence[np.ndarray] | None = None,
        nan_policy: str = "propagate",
        member_kwargs: Mapping[str, dict] | None = None,
        members: Sequence[Detector] | None = None,
        trust_pickle: bool = False,
    ):
        names = split_members(str(spec))
        if len(names) == 1 and "+" in names[0]:  # a '+' followed by no known detector name
            from collapseguard.detectors.base import check_spec
            for part in names[0].split("+")[1:]:
                if re.fullmatch(r"[\w-]+:?", part.strip()):  # a name, not a path's piece
                    check_spec(part.strip())  # names the unknown one, and the known ones
        if len(names) < 2 or any(not n for n in names):
            raise DetectorError(f"ens: needs two or more detector names joined by '+' (a '+' starts a "
                                f"member only before a known detector name), got {spec!r}")
        if any(n.startswith("ens:") for n in names):
            raise DetectorError("nested ensembles are not supported")
        if len(set(names)) != len(names):
            raise DetectorError(f"ens: lists a detector twice: {spec!r}")
        if nan_policy not in ("propagate", "omit"):
            raise DetectorError(f"nan_policy must be 'propagate' or 'omit', got {nan_policy!r}")
        member_kwargs = dict(member_kwargs or {})
        unknown = set(member_kwargs) - set(names)
        if unknown:
            raise DetectorError(f"member_kwargs for detectors not in the ensemble: {sorted(unknown)}")
        if trust_pickle:
            for n in names:
                if n.startswith("rali:"):
                    member_kwargs.setdefault(n, {})
                    member_kwargs[n] = {"trust_pickle": True, **member_kwargs[n]}
        if members is not None:
            if len(members) != len(names):
                raise DetectorError("members must match the names in the spec one to one")
            self.members = list(members)
        else:
            self.members = [create(n, **member_kwargs.get(n, {})) for n in names]
        self.member_names = names
        w = np.ones(len(names)) if weights is None else np.asarray(list(weights), dtype=np.float64)
        if w.shape != (len(names),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise DetectorError(f"weights must be {len(names)} non-negative numbers, not all zero")
        self.weights = w / w.sum()
        self.nan_policy = nan_policy

        cal_in = dict(calibrations or {})
        unknown = set(cal_in) - set(names)
        if unknown:
            raise DetectorError(f"calibrations for detectors not in the ensemble: {sorted(unknown)}")
        cals = []
        for n, det in zip(names, self.members):
            cal = _load_cal(cal_in[n]) if n in cal_in else _default_cal(det)
            if cal is not None and n in cal_in:
                from collapseguard.io.calibration_file import check_detector

                check_detector(cal, det)
            cals.append(cal if cal is not None and cal.probability_map else None)
        ref_digest = b""
        if all(c is not None for c in cals):
            self.mode = "probability"
            self._maps = [ProbabilityMap(c.probability_map) for c in cals]
            map_ids = ["strict-p", *(repr(c.probability_map) for c in cals)]
        else:
            self.mode = "quantile"
            ref = list(reference) if reference is not None else builtin_reference_images()
            if len(ref) < 2:
                raise DetectorError("reference needs at least 2 images")
            self._maps, map_ids = [], []
            for n, det in zip(names, self.members):
                rs = np.asarray(det.score(ref), dtype=np.float64)
                if np.isfinite(rs).sum() < 2:
                    raise DetectorError(f"member {n!r} scored fewer than 2 reference images")
                qm = QuantileMap(rs)
                self._maps.append(qm)
                map_ids.append(qm.knots_x.tobytes())
            ref_digest = b"builtin" if reference is None else params_version(*(np.asarray(a).tobytes() for a in ref)).encode()
        self.batch_size = min(int(getattr(m, "batch_size", 16) or 16) for m in self.members)
        self.version = params_version(
            "ens", self.mode, [(n, m.version) for n, m in zip(names, self.members)],
            self.weights.tolist(), nan_policy, ref_digest, *map_ids,
        )
        self.name = "ens:" + "+".join(names)

    def score_detailed(self, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        mapped = []
        why: list[list[str]] = [[] for _ in images]  # per image: each member's reason for a NaN
        for n, det, fmap in zip(self.member_names, self.members, self._maps):
            s = np.asarray(det.score(images), dtype=np.float64)
            reasons = getattr(det, "last_nan_reasons", None) or []
            for i in np.flatnonzero(~np.isfinite(s)):
                said = reasons[i] if i < len(reasons) and reasons[i] else "could not score the image"
                why[i].append(said if said.startswith(f"{n}:") else f"{n}: {said}")
            cols[n] = s.astype(np.float32)
            m = np.asarray(fmap(s), dtype=np.float64)
            cols[f"{n}:{'p' if self.mode == 'probability' else 'q'}"] = m.astype(np.float32)
            mapped.append(m)
        M = np.stack(mapped, axis=1) if mapped else np.zeros((len(images), 0))
        W = np.broadcast_to(self.weights, M.shape)
        ok = np.isfinite(M)
        if self.nan_policy == "propagate":
            score = np.where(ok.all(axis=1), (np.where(ok, M, 0) * W).sum(axis=1), np.nan)
        else:
            wsum = np.where(ok, W, 0).sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                score = np.where(wsum > 0, (np.where(ok, M, 0) * W).sum(axis=1) / wsum, np.nan)
        cols["score"] = score.astype(np.float32)
        # why a NaN score is NaN: the members' own reasons (the scoring table's error)
        self.last_nan_reasons = ["; ".join(w) if not np.isfinite(v) else "" for w, v in zip(why, score)]
        return cols

    def score(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return self.score_detailed(images)["score"]

    def to(self, device: str) -> EnsembleDetector:
        """Move every member (``--device cuda`` must reach the members, which do the work)."""
        self.members = [m.to(device) or m for m in self.members]
        return self
