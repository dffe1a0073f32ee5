"""The detector contract, over the registry (as timm tests its model registry): every detector the
package registers is built here, offline (tiny random-weight models where a real one needs the hub),
and on real photos returns float32, one score per image, the same scores twice, the same score
alone as in a batch, its spec as name, a version, the registry's description, and, where that is
the detector's claim, a higher score for a degraded copy than for its clean original. And over the
shipped calibrations: each loads, names a detector that exists at the version it was made for, has
a finite threshold, and keeps these clean photos while dropping their degraded copies."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from cg_testutil import degrade

import collapseguard
from collapseguard.detectors import base, create, list_detectors

PACKAGED_WEIGHTS = Path(collapseguard.__file__).parent / "weights" / "cnn.safetensors"
DEFAULTS = sorted((Path(collapseguard.__file__).parent / "calibration" / "defaults").glob("*.json"))


def shipped_detectors() -> list[str]:
    """The registry entries the package itself ships (tests register their own beside them)."""
    return [k for k, f in base._REGISTRY.items() if isinstance(f, str) and f.startswith("collapseguard.")]


def _tiny_vlm(tmp):
    pytest.importorskip("transformers")
    from cg_models import build_tiny_qwen

    return create(f"vlm:{build_tiny_qwen(tmp, 'qwen2_vl')}", max_new_tokens=8, device="cpu")


def _tiny_rali(tmp):
    pytest.importorskip("transformers")
    pytest.importorskip("sklearn")
    from cg_models import make_rali_dir

    root, _, _ = make_rali_dir(tmp)
    return create(f"rali:{root}", trust_pickle=True)


def _pyiqa(tmp):
    pytest.importorskip("pyiqa")
    return create("pyiqa:piqe")  # no weights to download


#: registry entry -> how to build one of it here (a spec for the ones that take an argument)
BUILDERS = {
    "nss": lambda tmp: create("nss"),
    "cnn": lambda tmp: create("cnn"),
    "cnn:": lambda tmp: create(f"cnn:{PACKAGED_WEIGHTS}"),
    "pyiqa:": _pyiqa,
    "vlm:": _tiny_vlm,
    "rali:": _tiny_rali,
    "ens:": lambda tmp: create("ens:cnn+nss"),
    "compare": lambda tmp: create("compare"),
    "npr": lambda tmp: create("npr"),
    "fixedpoint": lambda tmp: create("fixedpoint"),
}

#: entries whose test build makes no claim about direction, and why
NO_DIRECTION = {
    "vlm:": "a tiny random-weight model built offline (a real judge needs hub weights): its ratings "
            "mean nothing, and most answers do not parse (NaN)",
    "rali:": "a tiny random-weight CLIP built offline (a real RALI checkpoint needs hub weights)",
    "npr": "reads the distance of the top-octave residual share from that of clean photographs: "
           "noise brings a smooth photo's share up toward it (the fixture's astronaut crop); "
           "tests/detectors/test_signals.py checks its direction on replicator chains",
    "fixedpoint": "reads nearness to a re-rendering's fixed point, which added noise moves an image "
                  "away from (the fixture's degradation is noise and sharpening; tests/detectors/"
                  "test_signals.py checks its direction on replicator chains)",
}


def test_every_shipped_detector_has_a_contract_build():
    shipped = shipped_detectors()
    assert {"nss", "cnn", "ens:"} <= set(shipped)
    assert set(shipped) <= set(list_detectors())
    missing = sorted(set(shipped) - set(BUILDERS))
    assert not missing, f"registered without a build in this contract test: {missing}"


@pytest.fixture(scope="module")
def images(photos):
    clean = [p[:192, :224] for p in photos[:3]]
    return clean, [degrade(p, seed=i) for i, p in enumerate(clean)]


_built: dict[str, object] = {}


@pytest.fixture(scope="module", params=shipped_detectors())
def built(request, tmp_path_factory):
    key = request.param
    if key not in _built:
        _built[key] = BUILDERS[key](tmp_path_factory.mktemp(key.strip(":") or "det"))
    return key, _built[key]


def test_float32_one_per_image_and_deterministic(built, images):
    key, det = built
    clean, _ = images
    a = det.score(clean)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (len(clean),)
    np.testing.assert_array_equal(det.score(clean), a)  # NaN in the same places counts as equal
    detailed = det.score_detailed(clean)
    np.testing.assert_array_equal(np.asarray(detailed["score"]), a)
    if key not in NO_DIRECTION:
        assert np.isfinite(a).all(), a


def test_an_image_scores_alone_as_in_a_batch(built, images):
    _, det = built
    clean, _ = images
    batch = det.score(clean)
    alone = np.concatenate([det.score([im]) for im in clean])
    np.testing.assert_allclose(alone, batch, rtol=1e-4, atol=1e-4)


def test_name_version_and_the_registrys_description(built):
    key, det = built
    assert isinstance(det.name, str) and det.name.startswith(key.rstrip(":"))
    assert isinstance(det.version, str) and det.version
    assert det.description == list_detectors()[key] and det.description
    assert base.registry_key(det.name) == key


def test_a_degraded_copy_scores_higher(built, images):
    key, det = built
    if key in NO_DIRECTION:
        pytest.skip(NO_DIRECTION[key])
    clean, degraded = images
    a, b = det.score(clean), det.score(degraded)
    assert (b > a).all(), (a, b)


def test_the_detector_options_help_names_every_shipped_detector():
    from click.testing import CliRunner

    from collapseguard.cli import main

    res = CliRunner().invoke(main, ["score", "--help"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and all(f"{k}," in text or f"{k}." in text for k in shipped_detectors())


def test_registry_keys_and_descriptions():
    assert base.registry_key(" nss") == "nss"
    assert base.registry_key("pyiqa:piqe") == "pyiqa:"
    assert base.registry_key("cnn:w.safetensors") == "cnn:"
    assert base.registry_key("nope") is None and base.registry_key("nope:x") is None
    assert base.describe("nope") == ""


# ---------------------------------------------------------------------------------------------
# the shipped calibrations
# ---------------------------------------------------------------------------------------------

def test_calibrations_ship():
    assert {p.stem for p in DEFAULTS} >= {"cnn", "nss"}


@pytest.mark.parametrize("path", DEFAULTS, ids=[p.stem for p in DEFAULTS])
def test_a_shipped_calibration_fits_its_detector(path, images):
    from collapseguard.calibration.thresholds import (
        check_detector,
        default_calibration,
        is_dropped,
        load_calibration,
    )

    cal = load_calibration(path)
    assert base.registry_key(cal.detector) is not None, cal.detector
    det = create(cal.detector)
    assert det.version == cal.detector_version, (det.version, cal.detector_version)
    check_detector(cal, det)
    assert math.isfinite(cal.threshold)
    assert default_calibration(det.name, det.version).threshold == cal.threshold
    clean, degraded = images
    assert not is_dropped(det.score(clean), cal.threshold).any()
    assert is_dropped(det.score(degraded), cal.threshold).all()
