"""Is a grid's ranking stable? Paired comparisons of variants over seeds.

Every variant of a grid is trained with the same seeds, and a seed fixes the data order and the
masks (only the variant's own change differs), so two variants' results at the same seed are a
*pair*. Comparing pairs removes the seed-to-seed variation the variants share, which the
mean ± std columns of the table do not.

* :func:`paired_differences` — per variant, the held-out loss minus the reference variant's at
  the same seed: mean ± std over seeds, in how many seeds it is lower, and the two-sided p-value
  of the paired t-test (is the mean difference zero?).
* :func:`stable_order` — the variants sorted by mean loss, each neighbour pair joined by ``<``
  when the better one is lower in *every* shared seed **and** the paired t-test gives p < 0.05
  (resolved at this budget), else by ``≈`` (not resolved: a tie at this budget). With 3 seeds,
  "lower in every seed" alone happens by chance for a quarter of equal pairs; the t-test also
  asks that the difference be large against its own seed-to-seed spread (|t| > 4.30 at 2
  degrees of freedom).
* :func:`seed_rankings` — the order of the variants in each seed.
* :func:`values_over_budget` — the held-out loss per variant and seed at every evaluation during
  training (the runs' loss curves), :func:`resolved_pairs` — every resolved ``a < b`` over all pairs, and
  :func:`stable_since` — from which evaluation on the final value held: is the budget large enough
  that more steps would not change the ranking? Within a tie the order of the means may keep
  changing; the set of resolved pairs is what a ranking claims.

Only finished runs (``status == "ok"``) with a finite value take part.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["by_seed", "paired_t_p", "resolved_below", "paired_differences", "stable_order", "seed_rankings", "ranking_section",
           "values_over_budget", "resolved_pairs", "stable_since", "ALPHA"]

#: Significance level of the paired t-test behind ``<`` in :func:`stable_order`.
ALPHA = 0.05


def by_seed(rows: Sequence[dict], key: str = "eval_loss") -> dict[str, dict[int, float]]:
    """``{variant: {seed: value}}`` of the finished runs with a finite ``key``."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        v = r.get(key)
        if r.get("status") != "ok" or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out.setdefault(r["variant"], {})[int(r["seed"])] = float(v)
    return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; NaN for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def paired_t_p(diffs: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test that the mean of ``diffs`` is zero (n − 1 degrees of
    freedom); NaN for fewer than two, 0 for identical non-zero differences, 1 for all zeros."""
    n = len(diffs)
    if n < 2:
        return float("nan")
    mean, std = _mean_std(list(diffs))
    if std == 0:
        return 1.0 if mean == 0 else 0.0
    # lazy: scipy.stats/special take 0.26–0.73 s to import (python -X importtime); only this test needs it
    from scipy.stats import t as student_t

    return float(2 * student_t.sf(abs(mean) / (std / math.sqrt(n)), n - 1))


def paired_differences(values: dict[str, dict[int, float]], reference: str) -> dict[str, dict]:
    """Per variant other than ``reference``: ``{"mean", "std", "lower", "n", "p"}`` of
    ``value[variant, seed] − value[reference, seed]`` over the seeds both have (std: sample, n−1;
    NaN for one seed), ``lower`` = seeds where the variant's value is below the reference's,
    ``p`` = :func:`paired_t_p`. Variants without a shared seed are left out."""
    ref = values.get(reference, {})
    out = {}
    for variant, seeds in values.items():
        if variant == reference:
            continue
        common = sorted(set(seeds) & set(ref))
        if not common:
            continue
        diffs = [seeds[s] - ref[s] for s in common]
        mean, std = _mean_std(diffs)
        out[variant] = {"mean": mean, "std": std, "lower": sum(d < 0 for d in diffs), "n": len(common),
                        "p": paired_t_p(diffs)}
    return out


def resolved_below(a: dict[int, float], b: dict[int, float], alpha: float = ALPHA) -> bool:
    """True when ``a`` is below ``b`` in every shared seed (at least two) and the paired t-test of
    ``a − b`` gives p < ``alpha``."""
    common = sorted(set(a) & set(b))
    if len(common) < 2 or not all(a[s] < b[s] for s in common):
        return False
    return paired_t_p([a[s] - b[s] for s in common]) < alpha


def stable_order(values: dict[str, dict[int, float]], order: Sequence[str] | None = None) -> str:
    """The variants by mean value, lowest first, neighbours joined by ``<`` (:func:`resolved_below`:
    lower in every shared seed and paired t-test p < 0.05) or ``≈`` (not resolved).

    ``order`` (the grid's variant order) breaks exact ties in the mean. Example:
    ``"h8 < h2 ≈ h4 < h1"``.
    """
    names = [v for v in (order or values) if values.get(v)]
    means = {v: sum(values[v].values()) / len(values[v]) for v in names}
    ranked = sorted(names, key=lambda v: (means[v], names.index(v)))
    if not ranked:
        return ""
    parts = [ranked[0]]
    for prev, cur in zip(ranked, ranked[1:]):
        parts += ["<" if resolved_below(values[prev], values[cur]) else "≈", cur]
    return " ".join(parts)


def seed_rankings(values: dict[str, dict[int, float]], order: Sequence[str] | None = None) -> dict[int, list[str]]:
    """``{seed: variants ordered by value, lowest first}`` over the variants that ran that seed."""
    names = [v for v in (order or values) if v in values]
    seeds = sorted({s for v in names for s in values[v]})
    return {s: sorted((v for v in names if s in values[v]), key=lambda v: (values[v][s], names.index(v)))
            for s in seeds}


def values_over_budget(rows: Sequence[dict]) -> list[tuple[int, dict[str, dict[int, float]]]]:
    """``[(step, {variant: {seed: held-out loss at step}})]`` over the evaluation steps that every
    finished run's ``curve`` (``[[step, loss, accuracy], …]``) has, in step order."""
    curves = [(r["variant"], int(r["seed"]), {int(c[0]): c[1] for c in r.get("curve") or []})
              for r in rows if r.get("status") == "ok"]
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(c) for _, _, c in curves)))
    return [(step, by_seed([{"variant": v, "seed": s, "status": "ok", "eval_loss": c[step]}
                            for v, s, c in curves])) for step in steps]


def resolved_pairs(values: dict[str, dict[int, float]]) -> frozenset[tuple[str, str]]:
    """Every ``(a, b)`` of variants with ``a`` resolved below ``b`` (:func:`resolved_below`), over
    all pairs — not only the neighbours that :func:`stable_order` joins."""
    return frozenset((a, b) for a in values for b in values if a != b and resolved_below(values[a], values[b]))


def stable_since(history: Sequence[tuple[int, object]]) -> int | None:
    """The first step from which every later ``(step, value)`` of ``history`` has the final value
    (None if empty)."""
    if not history:
        return None
    since = history[-1][0]
    for step, value in reversed(history):
        if value != history[-1][1]:
            break
        since = step
    return since


def _over_budget_lines(rows: Sequence[dict], names: Sequence[str], label: str) -> list[str]:
    """The evaluations-during-training part of :func:`ranking_section` (empty with fewer than two)."""
    history = [(step, {v: values[v] for v in names if v in values}) for step, values in values_over_budget(rows)]
    if len(history) < 2:
        return []
    last = history[-1][0]
    orders = [(step, stable_order(values, names)) for step, values in history]
    pairs = [(step, resolved_pairs(values)) for step, values in history]
    n_pairs = len(names) * (len(names) - 1) // 2
    shown = orders
    if len(orders) > 10:  # every k-th evaluation, ending at the last
        shown = orders[::-1][::math.ceil(len(orders) / 10)][::-1]
    lines = ["", f"The same ranking at the held-out evaluations during training (the same runs' {label} "
             "curves; `<` and `≈` as above):", "", "| step | ranking |", "|---:|---|"]
    lines += [f"| {step} | {text} |" for step, text in shown]

    def since(values_by_step: list) -> str:
        step = stable_since(values_by_step)
        if step == last:
            return f"changed at the last evaluation (step {last})"
        return f"held at every evaluation since step {step} ({100 * step / last:.0f} % of the budget)"

    final, end = pairs[-1][1], history[-1][1]
    mean = {v: statistics.fmean(end[v].values()) for v in end}
    listed = ", ".join(f"`{a} < {b}`" for a, b in sorted(final, key=lambda ab: (mean[ab[0]], mean[ab[1]])))
    lines += ["", f"Resolved pairs at the end: {len(final)} of {n_pairs}{f' ({listed})' if listed else ''}; "
              "the set of resolved pairs has "
              f"{since(pairs)}, the whole ranking (the order of the means included) has {since(orders)}."]
    (prev_step, before), (_, after) = pairs[-2], pairs[-1]
    if before != after:
        changes = [f"`{a} < {b}` resolved" for a, b in sorted(after - before)]
        changes += [f"`{a} < {b}` no longer resolved" for a, b in sorted(before - after)]
        lines[-1] += f" Since step {prev_step}: {'; '.join(changes)}."
    return lines


def ranking_section(rows: Sequence[dict], order: Sequence[str], key: str = "eval_loss",
                    label: str = "held-out loss") -> list[str]:
    """Markdown lines for ``results.md``: the stable order, the per-seed orders, the paired
    differences against the first variant of ``order`` (the grid's reference) and, for the held-out
    loss, the stable order at each evaluation during training (:func:`values_over_budget`), the
    resolved pairs at the end and the steps since which they and the order have held. Empty with
    fewer than two seeds or two variants."""
    values = by_seed(rows, key)
    names = [v for v in order if values.get(v)]
    n_seeds = len({s for v in names for s in values[v]})
    if len(names) < 2 or n_seeds < 2:
        return []
    reference = names[0]
    lines = ["## Ranking over seeds", "",
             f"By mean {label}, lowest first; `<`: lower in every seed and paired t-test p < {ALPHA:g} "
             "(resolved), `≈`: not resolved at this budget. A seed fixes data order and masks, so runs "
             "of the same seed are pairs.",
             "", f"**{stable_order(values, names)}**", ""]
    for seed, ranked in seed_rankings(values, names).items():
        lines.append(f"- seed {seed}: {' < '.join(ranked)}")
    diffs = paired_differences(values, reference)
    lines += ["", f"Paired difference in {label} against `{reference}` (same seed; negative = lower):", "",
              f"| variant | Δ {label} | lower than `{reference}` in | p (paired t) |", "|---|---:|---:|---:|"]
    for variant in names[1:]:
        d = diffs.get(variant)
        if d is None:
            continue
        spread = "" if math.isnan(d["std"]) else f" ± {d['std']:.4f}"
        p = "—" if math.isnan(d["p"]) else f"{d['p']:.3f}"
        lines.append(f"| {variant} | {d['mean']:+.4f}{spread} | {d['lower']}/{d['n']} seeds | {p} |")
    if key == "eval_loss":
        lines += _over_budget_lines(rows, names, label)
    return lines
