"""The study's arithmetic on constructed, hand-computable scores: Δ, AUROC, Spearman, failure counts."""

import math

import numpy as np
import pandas as pd
import pytest

from collapseguard.evaluation import metrics
from collapseguard.evaluation.metrics import (
    auroc,
    chain_deltas,
    detector_scale,
    spearman_with_step,
)
from collapseguard.evaluation.run import evaluate_scores

# --- scale ------------------------------------------------------------------------------------

def test_scale_std_is_population_std_of_finite_scores():
    s = detector_scale([1.0, 3.0, float("nan"), 1.0, 3.0], "std")
    assert s.value == pytest.approx(1.0)  # values ±1 around 2
    assert s.n == 4 and not s.degenerate


def test_scale_iqr():
    s = detector_scale(np.arange(9.0), "iqr")  # q25 = 2, q75 = 6
    assert s.value == pytest.approx(4 / 1.349)


def test_scale_degenerate_becomes_one_and_is_flagged():
    for vals in ([2.0, 2.0, 2.0], [float("nan")], []):
        s = detector_scale(vals)
        assert s.value == 1.0 and s.degenerate
    with pytest.raises(ValueError):
        detector_scale([1, 2], "mad")


# --- Δ gap and the criterion ------------------------------------------------------------------

def test_deltas_hand_computed_and_pass():
    steps = [0, 1, 2, 5, 10, 20]
    scores = [0.0, 1.0, 1.5, 2.0, 4.0, 9.0]
    r = chain_deltas(steps, scores, scale=2.0)
    assert r.deltas == {5: 0.5, 10: 1.5, 20: 4.0}
    assert r.status == metrics.PASSED and r.passed is True and r.reason == ""
    assert r.spearman == pytest.approx(1.0)


def test_base_is_step_one_not_step_zero():
    # step 0 scores highest: irrelevant to the criterion, which compares with step 1
    r = chain_deltas([0, 1, 5, 10, 20], [100.0, 1.0, 2.0, 3.0, 4.0], scale=1.0)
    assert r.passed is True


def test_one_negative_gap_fails_with_reason():
    r = chain_deltas([1, 5, 10, 20], [1.0, 2.0, 0.5, 3.0], scale=1.0)
    assert r.deltas[10] == pytest.approx(-0.5)
    assert r.status == metrics.FAILED and r.passed is False
    assert "[10]" in r.reason


def test_tie_is_a_failure():
    r = chain_deltas([1, 5, 10, 20], [1.0, 1.0, 2.0, 3.0], scale=1.0)
    assert r.deltas[5] == 0.0 and r.passed is False


def test_nan_score_is_a_failure_with_reason():
    r = chain_deltas([1, 5, 10, 20], [1.0, 2.0, float("nan"), 3.0], scale=1.0)
    assert r.status == metrics.FAILED and "NaN" in r.reason and "10" in r.reason
    # the steps that did score keep their deltas (the tables' medians read them)
    assert r.deltas[5] == 1.0 and r.deltas[20] == 2.0 and np.isnan(r.deltas[10])
    r = chain_deltas([1, 5, 10, 20], [float("nan"), 2.0, 3.0, 4.0], scale=1.0)
    assert r.status == metrics.FAILED and "[1]" in r.reason
    assert all(np.isnan(v) for v in r.deltas.values())


def test_missing_step_is_skipped_with_note():
    r = chain_deltas([0, 1, 5, 20], [0.0, 1.0, 2.0, 3.0], scale=1.0)
    assert r.status == metrics.SKIPPED and r.passed is None and "10" in r.reason
    assert all(math.isnan(v) for v in r.deltas.values())
    r = chain_deltas([0, 5, 10, 20], [0.0, 1.0, 2.0, 3.0], scale=1.0)  # no base step
    assert r.status == metrics.SKIPPED and "[1" in r.reason


def test_custom_steps_and_bad_input():
    r = chain_deltas([0, 2, 4], [3.0, 1.0, 2.0], scale=0.5, ks=(4,), base=0)
    assert r.deltas == {4: -2.0} and r.passed is False
    with pytest.raises(ValueError):
        chain_deltas([1, 1, 5], [0, 1, 2], scale=1.0)
    with pytest.raises(ValueError):
        chain_deltas([1, 5], [0, 1], scale=0.0)


# --- AUROC ------------------------------------------------------------------------------------

def test_auroc_perfect_inverse_and_hand_counted():
    assert auroc([0, 1], [2, 3]) == 1.0
    assert auroc([2, 3], [0, 1]) == 0.0
    # pairs (neg, pos): (1,2) win, (1,0) loss, (3,2) loss, (3,0) loss -> 1/4
    assert auroc([1, 3], [2, 0]) == pytest.approx(0.25)


def test_auroc_ties_count_half():
    assert auroc([1, 1], [1, 1, 1]) == pytest.approx(0.5)
    # (1 vs 1) tie 0.5, (1 vs 2) win 1, (2 vs 1) loss, (2 vs 2) tie 0.5 -> 2/4
    assert auroc([1, 2], [1, 2]) == pytest.approx(0.5)
    # neg [0, 1], pos [1]: win over 0, tie with 1 -> 1.5/2
    assert auroc([0, 1], [1]) == pytest.approx(0.75)


def test_auroc_drops_nan_and_is_nan_when_empty():
    assert auroc([0, float("nan")], [1, float("nan")]) == 1.0
    assert math.isnan(auroc([], [1.0]))
    assert math.isnan(auroc([1.0], [float("nan")]))


def test_auroc_matches_sklearn_on_random_scores():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    neg = rng.integers(0, 5, 40).astype(float)  # many ties
    pos = rng.integers(1, 7, 30).astype(float)
    y = np.r_[np.zeros(40), np.ones(30)]
    assert auroc(neg, pos) == pytest.approx(roc_auc_score(y, np.r_[neg, pos]))


# --- Spearman ---------------------------------------------------------------------------------

def test_spearman_cases():
    assert spearman_with_step([0, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert spearman_with_step([0, 1, 2, 3], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks of scores [1, 3, 2] vs steps [1, 2, 3]: d = (0, 1, -1) -> 1 - 6*2/(3*8) = 0.5
    assert spearman_with_step([0, 1, 2], [1, 3, 2]) == pytest.approx(0.5)
    assert math.isnan(spearman_with_step([0, 1, 2], [5, 5, 5]))
    assert math.isnan(spearman_with_step([0, 1, 2], [1, float("nan"), 3]))  # 2 finite left


# --- tables over a scores frame ---------------------------------------------------------------

def _frame(chains):
    """chains: {(chain, family): {detector: {step: score}}} -> long frame."""
    rows = []
    for (chain, fam), dets in chains.items():
        for det, by_step in dets.items():
            for step, s in by_step.items():
                rows.append({"chain_id": chain, "family": fam, "step": step, "detector": det, "score": s})
    return pd.DataFrame(rows)


def test_failure_counts_and_auroc_tables():
    up = {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 5: 5.0, 10: 10.0, 20: 20.0}
    down = {k: -v for k, v in up.items()}
    nan10 = {**up, 10: float("nan")}
    missing20 = {k: v for k, v in up.items() if k != 20}
    df = _frame({
        ("a", "blur"): {"good": up, "bad": down},
        ("b", "blur"): {"good": up, "bad": nan10},
        ("c", "noise"): {"good": up, "bad": up},
        ("d", "noise"): {"good": missing20, "bad": missing20},
    })
    ev = evaluate_scores(df)
    f = ev.failures.set_index("detector")
    assert f.loc["good", ["evaluated", "failed", "passed", "skipped", "fail_nan"]].tolist() == [3, 0, 3, 1, 0]
    assert f.loc["bad", ["evaluated", "failed", "passed", "skipped", "fail_nan"]].tolist() == [3, 2, 1, 1, 1]
    assert f.loc["bad", "pass_rate"] == pytest.approx(1 / 3)
    fam = ev.failures_by_family.set_index(["detector", "family"])
    assert fam.loc[("bad", "blur"), "failed"] == 2 and fam.loc[("bad", "noise"), "failed"] == 0
    pc = ev.per_chain.set_index(["detector", "chain_id"])
    sd = ev.scales["good"].value
    assert pc.loc[("good", "a"), "delta_20"] == pytest.approx(19.0 / sd)
    assert pc.loc[("bad", "b"), "status"] == "fail" and "NaN" in pc.loc[("bad", "b"), "reason"]
    assert pc.loc[("good", "d"), "status"] == "skipped"

    au = ev.auroc.set_index(["detector", "family"])
    assert au.loc[("good", "all"), "k5"] == 1.0
    assert au.loc[("good", "all"), "n_clean"] == 8 and au.loc[("good", "all"), "n_k20"] == 3
    # "bad" on blur: clean {0,-1, 0,1}, step 5 {-5, 5}: -5 beats none, 5 beats all 4 -> 4/8
    assert au.loc[("bad", "blur"), "k5"] == pytest.approx(0.5)
    # "bad" on blur at step 10: chain b's NaN dropped, -10 beats no clean score
    assert au.loc[("bad", "blur"), "k10"] == 0.0 and au.loc[("bad", "blur"), "n_k10"] == 1

    sp = ev.spearman.set_index(["detector", "family"])
    assert sp.loc[("good", "all"), "mean"] == pytest.approx(1.0)
    # bad: a -> -1, b -> +1 (NaN dropped), c -> +1, d -> +1 ; mean 0.5, median 1
    assert sp.loc[("bad", "all"), "mean"] == pytest.approx(0.5)
    assert sp.loc[("bad", "all"), "median"] == pytest.approx(1.0)
    assert sp.loc[("bad", "blur"), "mean"] == pytest.approx(0.0)


def test_absent_auroc_step_is_noted():
    df = _frame({("a", "f"): {"d": {0: 0.0, 1: 1.0, 5: 2.0, 10: 3.0, 20: 4.0}}})
    ev = evaluate_scores(df)
    assert math.isnan(ev.auroc.loc[0, "k2"]) and ev.auroc.loc[0, "k5"] == 1.0
    assert any("[2, 3]" in n for n in ev.notes)


def test_small_families_get_a_note_with_how_far_one_image_moves_their_auroc():
    from collapseguard.evaluation.run import FEW_IMAGES

    up = {0: 0.0, 1: 1.0, 5: 5.0, 10: 10.0, 20: 20.0}
    big = {(f"b{i}", "big"): {"d1": up, "d2": up} for i in range(FEW_IMAGES)}
    small = {("s0", "small"): {"d1": up, "d2": {**up, 5: float("nan")}},
             ("s1", "small"): {"d1": up, "d2": up}}
    ev = evaluate_scores(_frame({**big, **small}))
    notes = [n for n in ev.notes if n.startswith("AUROC of family")]
    # family "small": 2 chains -> 4 clean images but 2 at each step k; d2 lost one step-5 image
    assert "AUROC of family small for d1 rests on 2 step 5 image(s): one image moves it by up to 0.50" in notes
    assert "AUROC of family small for d2 rests on 1 step 5 image(s): one image moves it by up to 1.00" in notes
    assert not any("family big" in n or "family all" in n for n in notes)  # 20 chains: 20 per step
    assert len(notes) == 2
    same = evaluate_scores(_frame({**big, ("s1", "small"): {"d1": up, "d2": up}}))
    assert [n for n in same.notes if n.startswith("AUROC")] == [
        "AUROC of family small rests on 1 step 5 image(s): one image moves it by up to 1.00"]


def test_a_family_named_all_gets_its_own_rows_not_the_overall_ones():
    # a chains folder "all/" is a family like any other: its rows must hold its own chains only,
    # and the overall rows must stay distinguishable from it
    from scipy.stats import spearmanr
    from sklearn.metrics import roc_auc_score

    up = {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 5: 5.0, 10: 10.0, 20: 20.0}
    down = {k: -v for k, v in up.items()}
    wobble = {0: 0.0, 1: 3.0, 2: 1.0, 3: 4.0, 5: 2.0, 10: 6.0, 20: 5.0}
    df = _frame({("a", "all"): {"d": down}, ("b", "all"): {"d": wobble},
                 ("c", "other"): {"d": up}})
    ev = evaluate_scores(df)
    au = ev.auroc.set_index("family")
    assert list(ev.auroc["family"]) == ["(all)", "all", "other"]
    fam = df[df.family == "all"]
    for k in (2, 5, 20):
        clean, pos = fam[fam.step.isin([0, 1])].score, fam[fam.step == k].score
        ref = roc_auc_score(np.r_[np.zeros(len(clean)), np.ones(len(pos))], np.r_[clean, pos])
        assert au.loc["all", f"k{k}"] == pytest.approx(ref)
        clean, pos = df[df.step.isin([0, 1])].score, df[df.step == k].score
        ref = roc_auc_score(np.r_[np.zeros(len(clean)), np.ones(len(pos))], np.r_[clean, pos])
        assert au.loc["(all)", f"k{k}"] == pytest.approx(ref)
    assert au.loc["all", "n_clean"] == 4 and au.loc["(all)", "n_clean"] == 6
    sp = ev.spearman.set_index("family")
    rho = [spearmanr(list(c), list(c.values())).statistic for c in (down, wobble)]
    assert sp.loc["all", "chains"] == 2 and sp.loc["all", "mean"] == pytest.approx(np.mean(rho))
    assert sp.loc["(all)", "chains"] == 3
    # without such a family the overall rows keep their plain name
    assert set(evaluate_scores(df[df.family == "other"]).auroc["family"]) == {"all", "other"}


def test_gap_steps_must_exclude_the_base_and_be_distinct():
    # Δ at the base step is 0 by definition, so every chain would fail the "all Δ > 0" criterion
    with pytest.raises(ValueError, match="base"):
        chain_deltas([0, 1, 5], [0.0, 1.0, 2.0], scale=1.0, ks=(1, 5))
    with pytest.raises(ValueError):
        chain_deltas([0, 1, 5], [0.0, 1.0, 2.0], scale=1.0, ks=(5, 5))


def test_chains_with_an_undefined_spearman_are_counted_in_a_note():
    up = {0: 0.0, 1: 1.0, 5: 2.0, 10: 3.0, 20: 4.0}
    flat = dict.fromkeys(up, 1.0)
    ev = evaluate_scores(_frame({("a", "f"): {"d": up, "e": up}, ("b", "f"): {"d": flat, "e": up}}))
    sp = ev.spearman.set_index(["detector", "family"])
    assert sp.loc[("d", "f"), "chains"] == 1 and sp.loc[("e", "f"), "chains"] == 2
    notes = [n for n in ev.notes if "Spearman" in n]
    assert len(notes) == 1 and notes[0].startswith("detector d: Spearman ρ is undefined for 1 of 2 chain(s)")
