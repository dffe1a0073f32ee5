"""The calibration file format: what a threshold means, where it came from, and for which detector.

A calibration is plain JSON (never pickle). It holds the threshold, the finite-sample bound that
justifies it (name, alpha, confidence, number of clean samples), the per-step drop curve, and two
monotone maps stored as knot arrays: score -> P(degraded) and score -> equivalent replication step.

**Decision rule** (used everywhere): an image is *dropped* when ``score > threshold`` (strictly;
see ``is_dropped``). The order-statistic bound in ``collapseguard.calibration.bounds`` is derived
for exactly this rule; with ties it is conservative.

A calibration is only valid for the detector name *and* version it was made for
(``check_detector``), and its false-drop guarantee only speaks about clean images drawn from the
same distribution as the calibration's clean set.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from collapseguard.errors import CollapseguardError
from collapseguard.io.strict_json import json_ready

#: bumped when the JSON layout changes incompatibly
FORMAT_VERSION = 1

#: folder of the calibrations shipped inside the package
DEFAULTS_DIR = Path(__file__).resolve().parent.parent / "calibration" / "defaults"

#: what ``n_clean`` counts in files whose ``split["bound_unit"]`` says so: distinct clean pictures
#: (each picture's highest clean score), not images (``calibration.build.source_maxima``)
BOUND_UNIT = "pictures"

#: the caveat every calibration carries
SCOPE_NOTE = (
    "The false-drop guarantee holds for clean images drawn from the same distribution as this "
    "calibration's clean set (listed in clean_sources); it says nothing about other kinds of images."
)


def is_dropped(scores, threshold: float) -> np.ndarray:
    """True where ``score > threshold`` (NaN scores are never 'dropped as degraded')."""
    s = np.asarray(scores, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return s > float(threshold)


def _check_rates(alpha: float, confidence: float) -> tuple[float, float]:
    a, c = float(alpha), float(confidence)
    if not 0.0 < a < 1.0:
        raise ValueError(f"max false-drop rate must be in (0, 1), got {alpha!r}")
    if not 0.0 < c < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return a, c


#: the largest count of clean samples a bound may ask for (2**53: the last whole float)
MAX_CLEAN_SAMPLES = 2**53


def min_clean_samples(alpha: float, confidence: float) -> int:
    """Smallest n for which the order-statistic bound exists: (1 - alpha)**n <= 1 - confidence.
    ValueError when that n is over ``MAX_CLEAN_SAMPLES`` (an alpha of about 1e-15 or less)."""
    a, c = _check_rates(alpha, confidence)
    delta = 1.0 - c
    n = math.log(delta) / math.log1p(-a)
    if not n <= MAX_CLEAN_SAMPLES:
        raise ValueError(f"a false-drop rate of {alpha!r} at confidence {confidence!r} needs more "
                         f"than {MAX_CLEAN_SAMPLES} clean samples")
    n = math.ceil(n)
    # guard against floating point at the boundary: the estimate is off by a step or two at most
    for _ in range(8):
        if n > 1 and (n - 1) * math.log1p(-a) <= math.log(delta) and (1 - a) ** (n - 1) <= delta:
            n -= 1
        elif (1 - a) ** n > delta and n * math.log1p(-a) > math.log(delta):
            n += 1
        else:
            break
    return n


#: the most terms ``binomial_cdf`` sums itself (about 0.1 s)
SUMMED_TERMS = 200_000


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), its terms summed in log space from P(X = 0) by their
    ratios (scipy.stats' ``binom.cdf`` to within 1e-7 relative for n up to 1,000,000; loading a calibration file then needs no scipy.stats, whose import costs about 0.7 s of
    every ``filter`` start)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if k > SUMMED_TERMS:  # a file that claims millions of clean scores: scipy's CDF, not a long sum
        from scipy.special import betainc

        return float(betainc(n - k, k + 1, 1 - p))  # the regularised incomplete beta function
    logs = [n * math.log1p(-p)]
    odds = math.log(p) - math.log1p(-p)
    for i in range(k):
        logs.append(logs[-1] + math.log((n - i) / (i + 1)) + odds)
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(v - top) for v in logs))


#: relative slack of the guarantee check: the file's k was chosen with scipy.stats' CDF, which
#: ``binomial_cdf`` matches only to within about 1e-7, so a k exactly at the bound is not refused
_CDF_SLACK = 1e-6


class CalibrationError(CollapseguardError, ValueError):
    """A calibration file is malformed, or a calibration cannot be made from the data given."""


class CalibrationMismatch(CollapseguardError, ValueError):
    """A calibration was made for another detector name or version than the one in use."""


class NoThresholdError(CollapseguardError, ValueError):
    """No threshold was given and no calibration (file or packaged default) applies."""


def _knots(m: dict | None, what: str) -> dict | None:
    """Validate a monotone map stored as ``{"x": [...], "y": [...]}`` (x increasing, y non-decreasing)."""
    if m is None:
        return None
    if not isinstance(m, dict) or "x" not in m or "y" not in m:
        raise CalibrationError(f"{what} must be an object with 'x' and 'y' knot lists")
    try:
        x = np.asarray(m["x"], dtype=np.float64)
        y = np.asarray(m["y"], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"{what}: knots must be numbers ({exc})") from None
    if x.ndim != 1 or x.shape != y.shape or len(x) == 0:
        raise CalibrationError(f"{what}: 'x' and 'y' must be equally long non-empty lists")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise CalibrationError(f"{what}: knots must be finite")
    if np.any(np.diff(x) < 0) or np.any(np.diff(y) < 0):
        raise CalibrationError(f"{what}: knots must be non-decreasing in x and y (monotone map)")
    return {"x": [float(v) for v in x], "y": [float(v) for v in y]}


def _interp(m: dict | None, scores) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if m is None:
        return np.full(s.shape, np.nan)
    out = np.interp(s, m["x"], m["y"])  # clamps outside the knots, so the map stays monotone
    out[~np.isfinite(s)] = np.nan
    return out


@dataclass
class Calibration:
    """A threshold for one detector (name + version), with the evidence behind it.

    Only ``detector``, ``detector_version`` and ``threshold`` are required; the rest is filled by
    ``collapseguard.calibration.build`` (or stays empty for uncalibrated cuts).
    """

    detector: str
    detector_version: str
    threshold: float
    #: "calibrated", or "uncalibrated: drop-fraction ..." for percentile cuts
    label: str = "calibrated"
    #: name of the finite-sample bound, e.g. "binomial order statistic (conformal)"
    method: str = ""
    #: the false-drop rate asked for (alpha) and the confidence 1 - delta
    alpha: float | None = None
    confidence: float | None = None
    #: number of clean scores the threshold was computed from
    n_clean: int = 0
    #: rank k of the threshold among the clean scores (k-th largest)
    k: int | None = None
    #: false-drop rate guaranteed at ``confidence`` (<= alpha)
    guaranteed_false_drop: float | None = None
    #: fraction of the calibration's own clean scores that are dropped (for information)
    empirical_false_drop: float | None = None
    #: "step" or e.g. "fr:ssim<0.9" — what counted as degraded for maps and curves
    target: str = "step"
    clean_steps: list[int] = field(default_factory=list)
    #: where clean samples came from (chains' steps, extra folders), and how they were split
    clean_sources: list[str] = field(default_factory=list)
    split: dict = field(default_factory=dict)
    #: the highest clean scores of the threshold part, highest first ({source_image, path, score}):
    #: the images the threshold rests on. With few clean scores a strict guarantee puts the
    #: threshold at the very top, so one odd (or mislabelled) image can set it; look at these.
    top_clean: list[dict] = field(default_factory=list)
    #: rows {family, step, n, dropped, fraction, ci_low, ci_high}; family "all" = overall
    drop_curve: list[dict] = field(default_factory=list)
    #: family -> {"0.9": step or None, "0.99": step or None}
    first_step_dropped: dict = field(default_factory=dict)
    #: monotone maps as knots {"x": scores, "y": values}
    probability_map: dict | None = None
    step_map: dict | None = None
    #: the held-out drop rates per storage and per clean kind: {"storage": {"clean": [rows],
    #: "steps": [rows]}, "source_kind": {...}, "measured_on": text} (``calibration.build.breakdown``)
    breakdown: dict = field(default_factory=dict)
    #: with a guarantee per clean kind (``calibrate --per-kind``): one row per kind of the threshold
    #: part, {kind, n, k, threshold, confidence, guaranteed_false_drop, dropped_at_threshold}; the
    #: threshold is the largest of the kinds' thresholds. Empty for a pooled guarantee.
    per_kind: list[dict] = field(default_factory=list)
    created: str = ""
    command: str = ""
    scope: str = SCOPE_NOTE
    notes: list[str] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    #: unknown keys read from a newer file, kept for round trips
    extra: dict = field(default_factory=dict)

    # -- maps ---------------------------------------------------------------------------------

    def probability(self, scores) -> np.ndarray:
        """P(degraded | score) from the isotonic map (monotone in score; NaN where unknown)."""
        return _interp(self.probability_map, scores)

    def equivalent_step(self, scores) -> np.ndarray:
        """The replication step whose median image scores like this (monotone, clamped to the
        calibrated steps; NaN if unknown)."""
        return _interp(self.step_map, scores)

    def drops(self, scores) -> np.ndarray:
        """Boolean array: which scores this calibration's threshold drops (``score > threshold``)."""
        return is_dropped(scores, self.threshold)

    # -- text ---------------------------------------------------------------------------------

    @property
    def is_calibrated(self) -> bool:
        return self.label == "calibrated"

    @property
    def counts_pictures(self) -> bool:
        """Does ``n_clean`` count distinct clean pictures (files made before it did count images)?"""
        return (self.split or {}).get("bound_unit") == BOUND_UNIT

    def guarantee_text(self) -> str:
        """e.g. 'at most 1% false drops with 95% confidence (n_clean=600)'."""
        rate = self.alpha if self.alpha is not None else self.guaranteed_false_drop
        if not self.is_calibrated or rate is None or self.confidence is None:
            return self.label
        unit = f" {BOUND_UNIT}" if self.counts_pictures else ""
        if self.per_kind:
            return (f"at most {_pct(rate)} false drops in each of {len(self.per_kind)} clean kinds, "
                    f"jointly with {_pct(self.confidence)} confidence (smallest kind "
                    f"n_clean={min(int(r['n']) for r in self.per_kind)}{unit}; for clean images like each "
                    "kind of the calibration's clean set)")
        return (f"at most {_pct(rate)} false drops with {_pct(self.confidence)} confidence "
                f"(n_clean={self.n_clean}{unit}; for clean images like the calibration's clean set)")

    def describe(self) -> str:
        """One line for logs and reports."""
        return (f"{self.detector}@{self.detector_version}: threshold {self.threshold:.6g}, "
                f"{self.guarantee_text()}")

    # -- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        d = asdict(self)
        extra = d.pop("extra") or {}
        for k, v in extra.items():
            d.setdefault(k, v)
        return d

    def to_json(self, indent: int | None = 1) -> str:
        """Plain JSON text (strict: no NaN/Infinity)."""
        return json.dumps(json_ready(self.to_dict()), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Any) -> Calibration:
        if not isinstance(d, dict):
            raise CalibrationError("a calibration must be a JSON object")
        missing = [k for k in ("detector", "detector_version", "threshold") if k not in d]
        if missing:
            raise CalibrationError(f"calibration is missing {missing}")
        fv = d.get("format_version", FORMAT_VERSION)
        if isinstance(fv, bool) or not isinstance(fv, int) or fv < 1:
            raise CalibrationError(f"calibration format_version must be a positive integer, got {fv!r}")
        if fv > FORMAT_VERSION:
            raise CalibrationError(
                f"calibration format_version {fv!r} is newer than this collapseguard understands "
                f"({FORMAT_VERSION}); upgrade collapseguard")
        names = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in names}
        kw["extra"] = {k: v for k, v in d.items() if k not in names}
        for key in ("detector", "detector_version", "label", "method", "target", "created",
                    "command", "scope"):
            if key in kw and not isinstance(kw[key], str):
                raise CalibrationError(f"calibration field {key!r} must be a string")
        raw = kw["threshold"]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):  # "4.2" is text, not a number
            raise CalibrationError(f"threshold must be a number, got {raw!r}")
        try:
            thr = float(raw)
        except OverflowError:
            thr = math.inf
        if not math.isfinite(thr):
            raise CalibrationError(f"threshold must be a finite number, got {str(raw)[:40]}")
        kw["threshold"] = thr
        for key in ("alpha", "confidence", "guaranteed_false_drop", "empirical_false_drop"):
            v = kw.get(key)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                    raise CalibrationError(f"{key} must be a number in [0, 1], got {v!r}")
                kw[key] = float(v)
        for key in ("n_clean",):
            if key in kw and (isinstance(kw[key], bool) or not isinstance(kw[key], int)
                              or not 0 <= kw[key] <= 2**53):
                raise CalibrationError(f"{key} must be a non-negative integer")
        if kw.get("k") is not None and (isinstance(kw["k"], bool) or not isinstance(kw["k"], int)):
            raise CalibrationError(f"k must be an integer, got {kw['k']!r}")
        for key, typ in (("clean_steps", list), ("clean_sources", list), ("split", dict), ("top_clean", list),
                         ("drop_curve", list), ("first_step_dropped", dict), ("notes", list),
                         ("breakdown", dict), ("per_kind", list)):
            if key in kw and not isinstance(kw[key], typ):
                raise CalibrationError(f"calibration field {key!r} must be a {typ.__name__}")
        _check_rows(kw)
        _check_guarantee(kw)
        if kw.get("label", "calibrated") == "calibrated" and not _states_bound(kw):
            # a threshold with no bound behind it (another tool's summary.json, a hand-written
            # file): it decides, but no guarantee is claimed for it
            kw["label"] = NO_BOUND_LABEL
        kw["probability_map"] = _knots(kw.get("probability_map"), "probability_map")
        kw["step_map"] = _knots(kw.get("step_map"), "step_map")
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str | bytes) -> Calibration:
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, too many
            # digits in a number (ValueError), nesting too deep for the parser (RecursionError)
            raise CalibrationError(f"calibration is not valid JSON: {str(exc)[:200]}") from None
        return cls.from_dict(d)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_rows(kw: dict) -> None:
    """The report fields that ``collapseguard calibrations`` and ``calibrate`` print must
    have the shape ``build_calibration`` writes (a malformed file is an error, not a traceback)."""
    for i, r in enumerate(kw.get("top_clean") or []):
        if not isinstance(r, dict) or not _is_num(r.get("score")):
            raise CalibrationError(f"top_clean[{i}] must be an object with a numeric 'score'")
    for i, r in enumerate(kw.get("drop_curve") or []):
        if not (isinstance(r, dict) and isinstance(r.get("family"), str)
                and all(_is_num(r.get(c)) for c in ("step", "n", "fraction", "ci_low", "ci_high"))):
            raise CalibrationError(f"drop_curve[{i}] must be an object with 'family' (text) and numeric "
                                   "'step', 'n', 'fraction', 'ci_low', 'ci_high'")
    for i, r in enumerate(kw.get("per_kind") or []):
        ok = isinstance(r, dict) and isinstance(r.get("kind"), str)
        n, t = (r.get("n"), r.get("threshold")) if ok else (None, None)
        ok = ok and isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 2**53 and _is_num(t)
        try:
            ok = ok and math.isfinite(float(t))
        except OverflowError:  # an integer too large for a float
            ok = False
        if not ok:
            raise CalibrationError(f"per_kind[{i}] must be an object with 'kind' (text), 'n' (a count) "
                                   "and a finite numeric 'threshold'")
        if float(r["threshold"]) > kw["threshold"]:  # the file would claim a guarantee it breaks
            raise CalibrationError(f"per_kind[{i}] ({r['kind']!r}) has threshold {r['threshold']!r}, above "
                                   f"the file's threshold {kw['threshold']!r}: that kind's guarantee "
                                   "would not hold")
    for fam, v in (kw.get("first_step_dropped") or {}).items():
        if not isinstance(v, dict):
            raise CalibrationError(f"first_step_dropped[{fam!r}] must be an object")


#: the label of a file that holds a threshold and states no false-drop bound
NO_BOUND_LABEL = "uncalibrated: the file states no false-drop bound"


def _states_bound(kw: dict) -> bool:
    """Does the file state the bound a guarantee needs: a rate, a confidence and the clean count?"""
    rate = kw.get("alpha") if kw.get("alpha") is not None else kw.get("guaranteed_false_drop")
    return rate is not None and kw.get("confidence") is not None and kw.get("n_clean", 0) > 0


def _check_guarantee(kw: dict) -> None:
    """A calibrated file that states a guarantee (``guarantee_text``) must state one that the
    order-statistic bound supports for its n_clean (and k, when given); otherwise ``filter`` and
    ``audit`` would repeat, e.g., "at most 1% false drops with 95% confidence" from 10 clean scores."""
    if kw.get("label", "calibrated") != "calibrated":
        return
    a, c, g = kw.get("alpha"), kw.get("confidence"), kw.get("guaranteed_false_drop")
    rate = a if a is not None else g
    if rate is None or c is None:
        return  # no guarantee stated
    if not (0 < rate < 1 and 0 < c < 1):
        raise CalibrationError(f"a calibrated file must state a false-drop rate and confidence in (0, 1), "
                               f"got {rate!r} and {c!r}")
    n, k = kw.get("n_clean", 0), kw.get("k")
    what = f"at most {_pct(rate)} false drops with {_pct(c)} confidence"
    try:
        needed = min_clean_samples(rate, c)
    except ValueError as exc:
        raise CalibrationError(f"calibration states {what}: {exc}") from None
    if n < needed:
        raise CalibrationError(f"calibration states {what} from n_clean={n} clean scores, but that "
                               f"needs at least {needed}")
    if k is not None and not (1 <= k <= n and binomial_cdf(k - 1, n, rate) <= (1 - c) * (1 + _CDF_SLACK)):
        raise CalibrationError(f"calibration states {what}, which the k={k}-th largest of n_clean={n} "
                               "clean scores does not support")
    if a is not None and g is not None and g > a * (1 + 1e-9):
        raise CalibrationError(f"guaranteed_false_drop {g!r} is above alpha {a!r}")


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration JSON file; CalibrationError with the path on anything malformed, and on
    a path that is not a regular file (a FIFO, device or folder is refused without blocking)."""
    from collapseguard.io.tar import NotRegularFileError, open_regular_file
    path = Path(path)
    try:
        with open_regular_file(str(path)) as f:
            text = f.read()
    except NotRegularFileError:
        raise CalibrationError(f"cannot read calibration {path}: not a regular file (a FIFO, "
                               "device, socket or folder)") from None
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration {path}: {exc.strerror or exc}") from None
    try:
        return Calibration.from_json(text)
    except CalibrationError as exc:
        raise CalibrationError(f"{path}: {exc}") from None


def save_calibration(cal: Calibration, path: str | Path) -> Path:
    """Write a calibration as JSON (to a temporary name, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(cal.to_json() + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


# Detector checks and packaged defaults

def _name_version(detector) -> tuple[str, str]:
    """(name, version) of a Detector, or of a ``(name, version)`` pair."""
    if isinstance(detector, (tuple, list)) and len(detector) == 2:
        return str(detector[0]), str(detector[1])
    name, version = getattr(detector, "name", None), getattr(detector, "version", None)
    if not isinstance(name, str) or version is None:
        raise TypeError("detector must be a Detector (with .name and .version) or a (name, version) pair")
    return name, str(version)


#: detector families whose argument is only where the weights are: their version is a hash of
#: the weights, so ``cnn``, ``cnn:w.safetensors`` and ``cnn:../w.safetensors`` with the same
#: version are the same detector
_WEIGHTS_PATH_FAMILIES = ("cnn",)


def _detector_kind(name: str) -> str:
    family = name.partition(":")[0]
    return family if family in _WEIGHTS_PATH_FAMILIES else name


def check_detector(cal: Calibration, detector, threshold_given: bool = False) -> None:
    """Raise CalibrationMismatch unless ``cal`` was made for this detector and version (for
    ``cnn``, any spelling of the weights path with the same weights version). With
    ``threshold_given`` (an explicit threshold beside the calibration, which then gives only its
    score maps) the advice is to drop the calibration."""
    name, version = _name_version(detector)
    if _detector_kind(cal.detector) != _detector_kind(name) or cal.detector_version != version:
        advice = ("drop --calibration: beside --threshold only its score maps are used, and they "
                  "are another detector's" if threshold_given else "or pass --threshold")
        raise CalibrationMismatch(
            f"calibration was made for detector {cal.detector}@{cal.detector_version}, "
            f"but the detector in use is {name}@{version}; recalibrate with "
            f"`collapseguard calibrate --detector {name} ...` {advice}")


def default_calibration_path(detector_name: str) -> Path:
    """Where the packaged default calibration for a detector name lives (may not exist); ``cnn``
    and ``cnn:PATH`` share ``cnn.json`` (which is used only when its version matches)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", _detector_kind(detector_name)).strip(".") or "_"
    return DEFAULTS_DIR / f"{safe}.json"


def default_calibration(detector_name: str, version: str) -> Calibration | None:
    """The packaged calibration for ``detector_name`` if present and made for ``version``, else None."""
    path = default_calibration_path(detector_name)
    if not path.is_file():
        return None
    cal = load_calibration(path)
    if _detector_kind(cal.detector) != _detector_kind(detector_name) or cal.detector_version != str(version):
        return None
    return cal
