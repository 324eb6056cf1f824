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

Only finished runs (``status == "ok"``) with a finite value take part.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["by_seed", "paired_t_p", "resolved_below", "paired_differences", "stable_order", "seed_rankings", "ranking_section",
           "ALPHA"]

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


def ranking_section(rows: Sequence[dict], order: Sequence[str], key: str = "eval_loss",
                    label: str = "held-out loss") -> list[str]:
    """Markdown lines for ``results.md``: the stable order, the per-seed orders and the paired
    differences against the first variant of ``order`` (the grid's reference). Empty with fewer
    than two seeds or two variants."""
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
    return lines
