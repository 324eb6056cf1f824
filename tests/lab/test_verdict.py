"""Verdicts: Holm's correction against a hand computation, the paired t-test against scipy's, and the
decision rules (gap in every seed, divergence, tie, mixed) on hand-written values."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from qkv.lab.verdict import best_rate, compare, holm, mean_std, with_holm


def test_holm_matches_a_hand_computation():
    # sorted: 0.01 (×4 = 0.04), 0.02 (×3 = 0.06), 0.03 (×2 = 0.06), 0.5 (×1 = 0.5); in input order
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    # monotone: a later raw product below an earlier one is raised to it; capped at 1
    assert holm([0.04, 0.011]) == pytest.approx([0.04, 0.022])
    assert holm([0.3, 0.4]) == pytest.approx([0.6, 0.6])
    assert holm([0.9, 0.8]) == [1.0, 1.0]
    out = holm([float("nan"), 0.02, 0.01])  # NaN is not counted: m = 2
    assert math.isnan(out[0]) and out[1:] == pytest.approx([0.02, 0.02])
    assert holm([]) == []


def test_decided_by_a_gap_in_every_seed():
    values = {"qkv": {0: 1.0, 1: 0.98, 2: 0.99}, "raw": {0: 0.7, 1: 0.81, 2: 0.75}}
    c = compare("qkv", "raw", values)
    assert c.decided and c.winner == "qkv" and c.reason == "gap"
    assert c.diffs == pytest.approx({0: 0.3, 1: 0.17, 2: 0.24})
    assert c.mean == pytest.approx(0.71 / 3) and c.std == pytest.approx(stats.tstd([0.3, 0.17, 0.24]))
    assert c.p == pytest.approx(stats.ttest_rel([1.0, 0.98, 0.99], [0.7, 0.81, 0.75]).pvalue)
    assert "decided: qkv ahead in all 3 seeds, by ≥ 0.170" in c.sentence()
    flipped = compare("raw", "qkv", values)
    assert flipped.decided and flipped.winner == "qkv"


def test_one_seed_under_the_gap_is_not_decided_and_a_tie_is_named():
    values = {"a": {0: 0.9, 1: 0.9, 2: 0.9}, "b": {0: 0.5, 1: 0.5, 2: 0.85}, "c": {0: 0.88, 1: 0.95, 2: 0.9}}
    ab = compare("a", "b", values)
    assert not ab.decided and ab.outcome == "mixed" and ab.winner is None
    assert ab.sentence() == "not decided: a ahead in 3 of 3 seeds, 1 of them within 0.10"
    ac = compare("a", "c", values)
    assert ac.outcome == "tie" and ac.sentence() == "tie: every seed within 0.10"


def test_divergence_decides_whatever_the_accuracies():
    values = {"pre": {0: 0.2, 1: 0.3}, "post": {0: 0.25, 1: 0.1}}
    diverged = {"pre": {0: False, 1: False}, "post": {0: True, 1: True}}
    c = compare("pre", "post", values, diverged)
    assert c.decided and c.reason == "divergence" and c.winner == "pre" and c.diverged_b == (0, 1)
    assert c.sentence() == "decided: post diverged in all 2 seeds, pre in none"
    partly = compare("pre", "post", values, {"post": {0: True, 1: False}})
    assert not partly.decided


def test_only_common_seeds_are_paired_and_none_is_refused():
    values = {"a": {0: 1.0, 1: 1.0, 5: 0.0}, "b": {0: 0.5, 1: 0.6}}
    assert set(compare("a", "b", values).diffs) == {0, 1}
    with pytest.raises(ValueError, match="'a' and 'z' share no seed"):
        compare("a", "z", values)


def test_with_holm_sets_the_corrected_p_and_best_rate_takes_the_best_mean():
    values = {"a": {0: 1.0, 1: 0.9, 2: 0.95}, "b": {0: 0.5, 1: 0.6, 2: 0.4}, "c": {0: 0.1, 1: 0.2, 2: 0.3}}
    cs = with_holm([compare("a", "b", values), compare("a", "c", values)])
    assert [c.p_holm for c in cs] == pytest.approx(holm([c.p for c in cs]))
    assert best_rate({"x@lr=0.001": {0: 0.2, 1: 0.4}, "x@lr=0.01": {0: 0.5, 1: 0.5}}) == "x@lr=0.01"
    m, s = mean_std([1.0, 2.0, 3.0])
    assert (m, s) == (2.0, 1.0) and math.isnan(mean_std([1.0])[1])


def test_one_seed_is_never_a_verdict():
    values = {"a": {0: 1.0}, "b": {0: 0.2}}
    c = compare("a", "b", values)
    assert not c.decided and c.outcome == "too few seeds" and c.winner is None
    assert c.sentence() == "not decided: 1 seed — a verdict needs ≥ 2 that agree (--seeds 3)"
    assert not compare("a", "b", values, {"b": {0: True}}).decided  # one divergence is no pattern either
