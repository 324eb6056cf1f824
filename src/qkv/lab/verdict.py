"""Verdicts of a lab grid: paired comparisons over seeds, Holm's correction, and when a question is decided.

A comparison of variants ``a`` and ``b`` pairs their values seed by seed (the same seed means the
same initialisation stream and the same training rows) and is **decided** when

* every seed's difference has the same sign and is at least :data:`~qkv.lab.grid.DECISION_GAP`
  (10 accuracy points) — the winner is the variant ahead in every seed; or
* one variant diverged (a non-finite loss or gradient) in every seed and the other in none — the
  winner is the one that trained.

Both need at least :data:`MIN_SEEDS` common seeds: one seed cannot show that seeds agree, so a
comparison over fewer is **too few seeds**, whatever its difference.
Otherwise it is a **tie** (every seed within the gap) or **mixed** (the seeds disagree). The paired
t-test's two-sided p-value is reported beside it, Holm-corrected over the grid's comparisons
(:func:`holm`); with 3 seeds a t-test is weak, which is why the decision asks every seed to agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from qkv.experiments.ranking import paired_t_p
from qkv.lab.grid import DECISION_GAP

__all__ = ["Comparison", "compare", "with_holm", "holm", "best_rate", "mean_std", "MIN_SEEDS"]

#: The fewest common seeds a comparison is decided on (every seed must agree: one cannot).
MIN_SEEDS = 2


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; NaN for fewer than two values, NaN mean for none)."""
    vals = [float(v) for v in values]
    if not vals:
        return float("nan"), float("nan")
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else float("nan"))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input's order (NaN stays NaN and is not counted).

    The i-th smallest of m p-values becomes ``max_{j ≤ i} min(1, (m − j + 1) · p_(j))``.
    """
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(order)
    out = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` over their common seeds.

    Attributes:
        diffs: seed → value(a) − value(b). mean, std: of the differences.
        p: the paired t-test's two-sided p-value; p_holm: Holm-corrected over the grid (NaN until set).
        diverged_a, diverged_b: seeds where each diverged.
        outcome: ``"decided"``, ``"tie"``, ``"mixed"`` or ``"too few seeds"`` (fewer than
            :data:`MIN_SEEDS`); winner: the decided winner, else ``None``;
        reason: ``"gap"`` or ``"divergence"`` when decided.
    """

    a: str
    b: str
    diffs: dict[int, float]
    mean: float
    std: float
    p: float
    diverged_a: tuple[int, ...]
    diverged_b: tuple[int, ...]
    outcome: str
    winner: str | None
    reason: str = ""
    p_holm: float = float("nan")

    @property
    def decided(self) -> bool:
        return self.outcome == "decided"

    def sentence(self, gap: float = DECISION_GAP) -> str:
        """The verdict in words."""
        n = len(self.diffs)
        if self.outcome == "too few seeds":
            return (f"not decided: {n} seed{'s' if n != 1 else ''} — a verdict needs ≥ {MIN_SEEDS} that agree "
                    f"(--seeds {max(3, MIN_SEEDS)})")
        if self.reason == "divergence":
            loser = self.b if self.winner == self.a else self.a
            return f"decided: {loser} diverged in all {n} seeds, {self.winner} in none"
        if self.decided:
            lo = min(abs(d) for d in self.diffs.values())
            return f"decided: {self.winner} ahead in all {n} seeds, by ≥ {lo:.3f} (gap needed {gap:.2f})"
        if self.outcome == "tie":
            return f"tie: every seed within {gap:.2f}"
        ahead = sum(d > 0 for d in self.diffs.values())
        small = sum(abs(d) < gap for d in self.diffs.values())
        return (f"not decided: {self.a} ahead in {ahead} of {n} seeds, {small} of them within {gap:.2f}"
                if small else f"not decided: {self.a} ahead in {ahead} of {n} seeds")


def compare(a: str, b: str, values: Mapping[str, Mapping[int, float]],
            diverged: Mapping[str, Mapping[int, bool]] | None = None, gap: float = DECISION_GAP) -> Comparison:
    """The :class:`Comparison` of variants ``a`` and ``b`` (values: variant → seed → value).

    Raises:
        ValueError: the two share no seed.
    """
    seeds = sorted(set(values.get(a, {})) & set(values.get(b, {})))
    if not seeds:
        raise ValueError(f"{a!r} and {b!r} share no seed with a result; train both (same --seeds)")
    diffs = {s: float(values[a][s]) - float(values[b][s]) for s in seeds}
    div = diverged or {}
    div_a = tuple(s for s in seeds if div.get(a, {}).get(s, False))
    div_b = tuple(s for s in seeds if div.get(b, {}).get(s, False))
    mean, std = mean_std(list(diffs.values()))
    p = paired_t_p(list(diffs.values()))
    if len(seeds) < MIN_SEEDS:
        return Comparison(a, b, diffs, mean, std, p, div_a, div_b, "too few seeds", None)
    if len(div_a) == len(seeds) and not div_b:
        return Comparison(a, b, diffs, mean, std, p, div_a, div_b, "decided", b, "divergence")
    if len(div_b) == len(seeds) and not div_a:
        return Comparison(a, b, diffs, mean, std, p, div_a, div_b, "decided", a, "divergence")
    if all(d >= gap for d in diffs.values()):
        return Comparison(a, b, diffs, mean, std, p, div_a, div_b, "decided", a, "gap")
    if all(d <= -gap for d in diffs.values()):
        return Comparison(a, b, diffs, mean, std, p, div_a, div_b, "decided", b, "gap")
    outcome = "tie" if all(abs(d) < gap for d in diffs.values()) else "mixed"
    return Comparison(a, b, diffs, mean, std, p, div_a, div_b, outcome, None)


def with_holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons with ``p_holm`` set over all of them."""
    adjusted = holm([c.p for c in comparisons])
    return [replace(c, p_holm=q) for c, q in zip(comparisons, adjusted)]


def best_rate(cells: Mapping[str, Mapping[int, float]]) -> str:
    """The cell with the highest mean value (ties: the first); ``cells``: cell → seed → value."""
    means = {name: mean_std(list(v.values()))[0] for name, v in cells.items() if v}
    if not means:
        raise ValueError("no cell has a result")
    return max(means, key=lambda n: (-math.inf if math.isnan(means[n]) else means[n]))

