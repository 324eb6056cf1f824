"""Paired rankings over seeds on constructed results: stable orders, ties, paired differences."""

from __future__ import annotations

import math

import pytest

from qkv.experiments.ranking import (by_seed, paired_differences, paired_t_p, ranking_section,
                                     resolved_below, resolved_pairs, seed_rankings, stable_order, stable_since,
                                     values_over_budget)


def _rows(table: dict[str, list[float]], **extra) -> list[dict]:
    return [{"variant": v, "seed": s, "status": "ok", "eval_loss": x, **extra}
            for v, xs in table.items() for s, x in enumerate(xs)]


# h8 lower than h2 and h4 in every seed; h2 and h4 swap in seed 2; h1 highest everywhere
HEADS = {"h1": [6.9846, 6.9868, 7.0058], "h2": [6.9820, 6.9831, 6.9972],
         "h4": [6.9825, 6.9856, 6.9953], "h8": [6.9817, 6.9828, 6.9940]}


def test_stable_order_needs_every_seed_and_a_significant_paired_t_test():
    values = by_seed(_rows(HEADS))
    # h1 is the highest in every seed, but its paired differences scatter too much for p < 0.05
    assert stable_order(values, list(HEADS)) == "h8 ≈ h2 ≈ h4 ≈ h1"
    assert seed_rankings(values, list(HEADS)) == {0: ["h8", "h2", "h4", "h1"], 1: ["h8", "h2", "h4", "h1"],
                                                  2: ["h8", "h4", "h2", "h1"]}
    # a small difference, consistent against its spread, is resolved although the seeds spread widely
    base = [6.0, 6.5, 7.0]
    values = by_seed(_rows({"x": [b + d for b, d in zip(base, (0.010, 0.011, 0.012))], "y": base,
                            "z": [b + 0.3 for b in base]}))
    assert stable_order(values) == "y < x < z"
    assert resolved_below(values["y"], values["x"]) and not resolved_below(values["x"], values["y"])


def test_paired_t_p_matches_the_closed_form_at_two_degrees_of_freedom():
    # with n = 3 the t distribution has 2 degrees of freedom: two-sided p = 1 − |t| / √(2 + t²)
    for diffs in ([-0.0029, -0.0040, -0.0118], [0.1, 0.11, 0.12], [-1.0, 0.5, 0.2]):
        mean = sum(diffs) / 3
        std = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 2)
        t = mean / (std / math.sqrt(3))
        assert paired_t_p(diffs) == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), rel=1e-9)
    assert math.isnan(paired_t_p([0.1])) and paired_t_p([0.2, 0.2]) == 0.0 and paired_t_p([0.0, 0.0]) == 1.0


def test_a_large_mean_gap_that_one_seed_contradicts_is_a_tie():
    # b's mean is far lower, but seed 2 has it higher: the seeds disagree
    values = by_seed(_rows({"a": [7.0, 7.0, 6.0], "b": [6.0, 6.0, 6.5]}))
    assert stable_order(values) == "b ≈ a"
    # and a single seed never makes a ranking stable
    assert stable_order(by_seed(_rows({"a": [7.0], "b": [6.0]}))) == "b ≈ a"


def test_paired_differences_match_a_hand_computation():
    values = by_seed(_rows(HEADS))
    d = paired_differences(values, "h4")
    diffs = [a - b for a, b in zip(HEADS["h8"], HEADS["h4"])]
    mean = sum(diffs) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 2)
    assert d["h8"]["mean"] == pytest.approx(mean, abs=1e-12) and d["h8"]["std"] == pytest.approx(std, abs=1e-12)
    assert d["h8"]["lower"] == 3 and d["h8"]["n"] == 3 and d["h8"]["p"] == pytest.approx(paired_t_p(diffs))
    assert d["h2"]["lower"] == 2 and d["h1"]["lower"] == 0 and "h4" not in d
    # the paired spread is far below the unpaired one: the seeds' shared variation cancels
    unpaired = math.sqrt(sum((x - sum(HEADS["h8"]) / 3) ** 2 for x in HEADS["h8"]) / 2)
    assert d["h8"]["std"] < unpaired / 5


def test_failed_runs_missing_seeds_and_non_finite_values_are_left_out():
    rows = _rows({"a": [1.0, 2.0, 3.0], "b": [0.5, 1.5, 2.5]})
    rows[4]["status"] = "failed"  # b, seed 1
    rows.append({"variant": "c", "seed": 0, "status": "ok", "eval_loss": float("nan")})
    values = by_seed(rows)
    assert values["b"] == {0: 0.5, 2: 2.5} and "c" not in values
    d = paired_differences(values, "a")["b"]
    assert d["n"] == 2 and d["lower"] == 2 and d["mean"] == pytest.approx(-0.5)
    assert stable_order(values, ["a", "b", "c"]) == "b < a"  # −0.5 in both shared seeds: p = 0


def test_ranking_section_markdown():
    lines = ranking_section(_rows(HEADS), list(HEADS))
    text = "\n".join(lines)
    assert lines[0] == "## Ranking over seeds"
    assert "**h8 ≈ h2 ≈ h4 ≈ h1**" in text
    assert "- seed 2: h8 < h4 < h2 < h1" in text
    assert "| h8 | -0.0062 ± 0.0049 | 3/3 seeds | 0.156 |" in text  # against h1, the grid's first variant
    assert ranking_section(_rows({"a": [1.0], "b": [2.0]}), ["a", "b"]) == []  # one seed: no ranking
    assert ranking_section(_rows({"a": [1.0, 2.0]}), ["a"]) == []  # one variant


def _curve_rows(curves: dict[str, list[list[float]]]) -> list[dict]:
    """``{variant: [losses at steps 100, 200, … for seed 0, seed 1, …]}`` → rows with curves."""
    rows = []
    for v, per_seed in curves.items():
        for s, losses in enumerate(per_seed):
            curve = [[100 * (i + 1), x, 0.0] for i, x in enumerate(losses)]
            rows.append({"variant": v, "seed": s, "status": "ok", "eval_loss": losses[-1], "curve": curve})
    return rows


# b starts below a, a overtakes it at step 200 and is resolved below it from step 300 on
CURVES = {"a": [[7.0, 6.9, 6.5, 6.4], [7.1, 7.0, 6.6, 6.5], [7.2, 7.1, 6.7, 6.6]],
          "b": [[6.9, 7.0, 6.6, 6.5], [7.0, 7.1, 6.7, 6.61], [7.1, 7.2, 6.8, 6.72]]}


def test_the_order_at_every_evaluation_and_the_step_it_has_held_since():
    orders = [(step, stable_order(values, ["a", "b"])) for step, values in values_over_budget(_curve_rows(CURVES))]
    assert orders == [(100, "b < a"), (200, "a < b"), (300, "a < b"), (400, "a < b")]
    assert stable_since(orders) == 200 and stable_since(orders[:1]) == 100 and stable_since([]) is None
    pairs = [(step, resolved_pairs(values)) for step, values in values_over_budget(_curve_rows(CURVES))]
    assert pairs[0][1] == {("b", "a")} and pairs[-1][1] == {("a", "b")}
    # resolved pairs are over all pairs: x < z holds although x ≈ y ≈ z as neighbours
    values = by_seed(_rows({"x": [1.00, 2.00, 3.00], "y": [1.05, 1.95, 3.06], "z": [1.10, 2.11, 3.12]}))
    assert stable_order(values) == "x ≈ y ≈ z" and resolved_pairs(values) == {("x", "z")}
    # the last evaluation agrees with the final column, so the table's last line is the headline
    assert orders[-1][1] == stable_order(by_seed(_curve_rows(CURVES)), ["a", "b"])
    # only the steps every finished run evaluated count; a failed run's curve is ignored
    rows = _curve_rows(CURVES)
    rows[0]["curve"] = rows[0]["curve"][1:]
    rows.append({"variant": "c", "seed": 0, "status": "failed", "curve": [[50, 1.0, 0.0]]})
    assert [step for step, _ in values_over_budget(rows)] == [200, 300, 400]


def test_ranking_section_states_whether_the_budget_settled_the_ranking():
    text = "\n".join(ranking_section(_curve_rows(CURVES), ["a", "b"]))
    assert "| 100 | b < a |" in text and "| 400 | a < b |" in text
    assert ("Resolved pairs at the end: 1 of 1 (`a < b`); the set of resolved pairs has held at every evaluation since step "
            "200 (50 % of the budget), the whole ranking (the order of the means included) has held at every "
            "evaluation since step 200 (50 % of the budget).") in text
    # a ranking that flips at the last evaluation is reported as not settled
    flipped = {v: [c[:-1] + [c[-1] + (0.3 if v == "a" else 0)] for c in cs] for v, cs in CURVES.items()}
    text = "\n".join(ranking_section(_curve_rows(flipped), ["a", "b"]))
    assert ("the set of resolved pairs has changed at the last evaluation (step 400), the whole ranking (the "
            "order of the means included) has changed at the last evaluation (step 400). Since step 300: "
            "`b < a` resolved; `a < b` no longer resolved.") in text
    # a full tie whose means keep swapping: nothing resolved at any step, so the resolved pairs hold
    tie = {"a": [[7.0, 6.9], [7.1, 7.0], [7.2, 7.1]], "b": [[6.98, 6.92], [7.11, 6.99], [7.19, 7.12]]}
    text = "\n".join(ranking_section(_curve_rows(tie), ["a", "b"]))
    assert ("Resolved pairs at the end: 0 of 1; the set of resolved pairs has held at every evaluation since step "
            "100 (50 % of the budget), the whole ranking (the order of the means included) has changed at the "
            "last evaluation (step 200).") in text
    # more than ten evaluations: every k-th one, ending at the last
    long = {v: [[7.0 - 0.01 * i - (0.001 * s if v == "a" else 0) for i in range(25)] for s in range(3)]
            for v in ("a", "b")}
    lines = [l for l in ranking_section(_curve_rows(long), ["a", "b"]) if l.startswith("| ") and "≈" in l
             or l.startswith("| ") and "<" in l and "seeds" not in l]
    assert [int(l.split("|")[1]) for l in lines] == [100, 400, 700, 1000, 1300, 1600, 1900, 2200, 2500]
    # a pair resolved past its neighbours is named: the chain alone reads as a full tie
    chain = {"x": [[1.00, 1.00], [2.00, 2.00], [3.00, 3.00]], "y": [[1.05, 1.05], [1.95, 1.95], [3.06, 3.06]],
             "z": [[1.10, 1.10], [2.11, 2.11], [3.12, 3.12]]}
    text = "\n".join(ranking_section(_curve_rows(chain), ["x", "y", "z"]))
    assert "**x ≈ y ≈ z**" in text and "Resolved pairs at the end: 1 of 3 (`x < z`); " in text
