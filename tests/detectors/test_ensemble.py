"""ens:<a>+<b>: members mapped to a common scale (quantiles or P(degraded)) and averaged."""

from __future__ import annotations

import numpy as np
import pytest

from collapseguard.detectors import DetectorError, create
from collapseguard.detectors.ensemble import ProbabilityMap, QuantileMap, builtin_reference_images


def _imgs(n=6, size=96, seed=0):
    rng = np.random.default_rng(seed)
    xx = np.mgrid[0:size, 0:size][1] / size
    base = np.stack([128 + 60 * np.sin(5 * xx + c) for c in range(3)], 2)
    return [np.clip(base + rng.normal(0, 4 + 12 * i, base.shape), 0, 255).astype(np.uint8) for i in range(n)]


@pytest.fixture(scope="module")
def reference():
    return builtin_reference_images(size=96, n_scenes=2)


def test_quantile_map_is_strictly_monotone_and_bounded():
    qm = QuantileMap(np.array([1.0, 2.0, 2.0, 3.0, 10.0]))
    s = np.array([-50.0, 0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 10.0, 11.0, 500.0, np.nan])
    q = qm(s)
    assert np.isnan(q[-1])
    assert np.all(np.diff(q[:-1]) >= 0) and np.all((q[:-1] > 0) & (q[:-1] < 1))
    assert q[0] < q[1] < q[2] and q[-3] < q[-2]  # tails keep order outside the reference range
    assert q[4] == pytest.approx(0.4)  # mid-rank of the tied value 2.0: (1 + 1) / 5


def test_probability_map_keeps_the_order_an_isotonic_map_ties():
    """The isotonic map is flat over runs of scores (the shipped nss map over 0.66-6.87) and at 1
    above its last knot: an ensemble through it tied images its members tell apart. The strict
    map is increasing everywhere, in (0, 1), and keeps each run's level at the run's centre."""
    iso = {"x": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "y": [0.0, 0.2, 0.2, 0.2, 1.0, 1.0]}
    m = ProbabilityMap(iso)
    s = np.array([-100.0, -1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 4.5, 5.0, 6.0, 1e6, np.nan])
    p = m(s)
    assert np.isnan(p[-1]) and np.all(np.diff(p[:-1]) > 0) and np.all((p[:-1] > 0) & (p[:-1] < 1))
    shrink = ProbabilityMap.SHRINK
    assert m(2.0) == pytest.approx(shrink + (1 - 2 * shrink) * 0.2)  # the centre of the 0.2 run
    assert m(4.5) == pytest.approx(1 - shrink)  # the centre of the run at 1
    one = ProbabilityMap({"x": [3.0], "y": [0.4]})(np.array([2.0, 3.0, 4.0]))  # a single knot
    assert np.all(np.diff(one) > 0) and one[1] == pytest.approx(shrink + (1 - 2 * shrink) * 0.4)


def test_builtin_reference_is_deterministic():
    a, b = builtin_reference_images(64, 1), builtin_reference_images(64, 1)
    assert len(a) == 6 and all(x.shape == (64, 64, 3) and x.dtype == np.uint8 for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_quantile_ensemble_averages_member_quantiles(reference):
    pytest.importorskip("pyiqa")  # the [iqa] extra: optional, not part of the core
    ens = create("ens:nss+pyiqa:piqe", reference=reference)
    assert ens.mode == "quantile" and ens.name == "ens:nss+pyiqa:piqe"
    imgs = _imgs()
    out = ens.score_detailed(imgs)
    assert set(out) == {"score", "nss", "nss:q", "pyiqa:piqe", "pyiqa:piqe:q"}
    np.testing.assert_allclose(out["score"], (out["nss:q"] + out["pyiqa:piqe:q"]) / 2, rtol=1e-6)
    # member columns are the members' own scores; quantiles are monotone in them
    np.testing.assert_allclose(out["nss"], create("nss").score(imgs), rtol=1e-6)
    order = np.argsort(out["pyiqa:piqe"])
    assert np.all(np.diff(out["pyiqa:piqe:q"][order]) >= 0)
    # increasing noise: both members agree, so the ensemble rises with it
    assert out["score"][-1] > out["score"][0]
    # an image's score does not depend on its batch mates
    assert ens.score(imgs[2:3])[0] == pytest.approx(out["score"][2], rel=1e-6)


def test_weights_and_nan_policy(reference):
    pytest.importorskip("pyiqa")  # the [iqa] extra: optional, not part of the core
    piqe, nss = create("pyiqa:piqe"), create("nss")
    w = create("ens:nss+pyiqa:piqe", reference=reference, weights=[3, 1], members=[nss, piqe])
    out = w.score_detailed(_imgs(3))
    np.testing.assert_allclose(out["score"], 0.75 * out["nss:q"] + 0.25 * out["pyiqa:piqe:q"], rtol=1e-6)
    tiny = np.zeros((4, 4, 3), np.uint8)  # PIQE cannot score it -> NaN
    assert np.isnan(w.score([tiny])[0])
    omit = create("ens:nss+pyiqa:piqe", reference=reference, nan_policy="omit", members=[nss, piqe])
    got = omit.score_detailed([tiny])
    assert got["score"][0] == pytest.approx(got["nss:q"][0])
    assert omit.version != w.version


def test_probability_mode_when_every_member_is_calibrated(reference):
    pytest.importorskip("pyiqa")  # the [iqa] extra: optional, not part of the core
    from collapseguard.calibration.thresholds import Calibration

    nss, piqe = create("nss"), create("pyiqa:piqe")
    cals = {
        "nss": Calibration("nss", nss.version, 1.0, probability_map={"x": [0.0, 10.0], "y": [0.0, 1.0]}),
        "pyiqa:piqe": Calibration(piqe.name, piqe.version, 50.0, probability_map={"x": [0.0, 100.0], "y": [0.0, 1.0]}),
    }
    ens = create("ens:nss+pyiqa:piqe", calibrations=cals, members=[nss, piqe])
    assert ens.mode == "probability"
    out = ens.score_detailed(_imgs(3))
    shrink = ProbabilityMap.SHRINK  # the map's levels, shrunk by SHRINK towards 1/2
    np.testing.assert_allclose(out["nss:p"], shrink + (1 - 2 * shrink) * out["nss"] / 10, rtol=1e-5)
    np.testing.assert_allclose(out["pyiqa:piqe:p"], shrink + (1 - 2 * shrink) * out["pyiqa:piqe"] / 100, rtol=1e-5)
    np.testing.assert_allclose(out["score"], (out["nss:p"] + out["pyiqa:piqe:p"]) / 2, rtol=1e-6)
    # one member without a calibration: everything falls back to quantiles
    part = create("ens:nss+pyiqa:piqe", calibrations={"nss": cals["nss"]}, reference=reference,
                  members=[nss, piqe])
    assert part.mode == "quantile"
    # a calibration for another version is refused, not silently applied
    wrong = {"nss": Calibration("nss", "not-this-version", 1.0, probability_map={"x": [0, 1], "y": [0, 1]})}
    with pytest.raises(ValueError, match="recalibrate"):
        create("ens:nss+pyiqa:piqe", calibrations=wrong, members=[nss, piqe], reference=reference)


@pytest.mark.parametrize("spec,match", [
    ("ens:nss", "two or more"),
    ("ens:nss+", "two or more"),
    ("ens:nss+nss", "twice"),
    ("ens:nss+ens:a+b", "nested"),
    ("ens:nss+nosuch", "unknown detector 'nosuch'"),
])
def test_bad_specs(spec, match):
    with pytest.raises(DetectorError, match=match):
        create(spec)


def test_trust_pickle_reaches_rali_members_only(tmp_path, reference):
    pytest.importorskip("transformers")
    from cg_models import make_rali_dir

    root, _, _ = make_rali_dir(tmp_path)
    with pytest.raises(DetectorError, match="trust_pickle"):
        create(f"ens:nss+rali:{root}", reference=reference)
    ens = create(f"ens:nss+rali:{root}", reference=reference, trust_pickle=True)
    assert ens.members[1].temperature == 0.5  # the RALI member loaded its checkpoint
    assert np.all(np.isfinite(ens.score(_imgs(2))))


def test_a_plus_inside_a_member_name_or_path_does_not_split_it(tmp_path):
    from collapseguard.detectors.ensemble import split_members

    assert split_members("nss+pyiqa:clipiqa+") == ["nss", "pyiqa:clipiqa+"]
    assert split_members("pyiqa:clipiqa+_rn50_512+nss") == ["pyiqa:clipiqa+_rn50_512", "nss"]
    # a real weights file in a folder whose name holds a '+', as members of a real ensemble
    from collapseguard.detectors.cnn import default_weights_bytes

    w = tmp_path / "runs+a" / "w.safetensors"
    w.parent.mkdir()
    w.write_bytes(default_weights_bytes())
    ens = create(f"ens:cnn:{w}+nss")
    assert [m.name for m in ens.members] == [f"cnn:{w}", "nss"]
    assert ens.members[0].version == create("cnn").version


def test_an_ensemble_nan_says_which_member_could_not_score_and_why(reference):
    from collapseguard.detectors import Detector, register
    from collapseguard.scoring.records import score_records

    class Refuses(Detector):
        """The mean pixel, NaN (with a reason) for an image under 64 px a side."""
        name, version, batch_size = "enstest-refuses", "1", 4

        def score(self, images):
            small = [min(im.shape[:2]) < 64 for im in images]
            self.last_nan_reasons = ["too small to judge" if s else "" for s in small]
            return np.array([np.nan if s else float(im.mean()) for s, im in zip(small, images)], np.float32)

    register("enstest-refuses", Refuses)
    ens = create("ens:nss+enstest-refuses", reference=reference)
    tiny = _imgs(1)[0][:48, :48]
    (_, res), = list(score_records([[("a.png", tiny)]], ens, images_only=False))
    assert res.status == "score_error" and "enstest-refuses: too small to judge" in res.error
