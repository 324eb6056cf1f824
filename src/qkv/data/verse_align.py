"""Do two Bibles' verses with the same key say the same thing? A length-based alignment check.

Two modules that both declare the KJV versification still differ where one of them numbers its
verses otherwise: the Reina-Valera 1909 module puts its own verse numbers into the KJV slots, so
where its chapters begin a verse earlier (Numbers 13, 1 Samuel 24, Jonah 2, Job 39–41 …) every verse
of the chapter is paired with its neighbour's translation, and the overflow is merged into the
chapter's last verse. Pairing by key alone would put those pairs into training and test data.

The check aligns each book's verse sequences by sentence length (Gale & Church, 1993): a translation
is about ``ratio`` times as long as its source (in characters), with a variance that grows with the
length; a dynamic program over *beads* — one verse to one (1-1), two to one (2-1, 1-2), one to none
(1-0, 0-1) — finds the most probable segmentation of the two sequences, with a strong prior for 1-1
beads (0.99) and 0.0025 for each of the others. A verse is kept when the best segmentation pairs it
with the verse of the same key alone; verses the program merges or shifts are dropped. The search
runs in a band of ±``band`` verses around the key diagonal, so it costs O(verses · band).

    cost(l1, l2) = −log(2 · (1 − Φ(|δ|))),  δ = (l2 − ratio · l1) / √(variance · (l1 + l2 / ratio) / 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LengthModel", "BEADS", "bead_cost", "same_key_mask"]

#: (verses of a, verses of b) → −log prior
BEADS = {(1, 1): -math.log(0.99), (2, 1): -math.log(0.0025), (1, 2): -math.log(0.0025),
         (1, 0): -math.log(0.0025), (0, 1): -math.log(0.0025)}


@dataclass(frozen=True)
class LengthModel:
    """How long a translation is: ``l2 ≈ ratio · l1`` characters, variance ``variance · length``."""

    ratio: float
    variance: float

    @classmethod
    def fit(cls, lengths_a: Sequence[int], lengths_b: Sequence[int]) -> LengthModel:
        """Estimate from paired lengths (pairs with an empty side ignored): the median of the
        per-pair ratios, and the median of the per-pair variance estimates divided by the χ²₁ median
        (0.455) — medians, which a minority of misaligned pairs does not move."""
        a, b = np.asarray(lengths_a, dtype=np.float64), np.asarray(lengths_b, dtype=np.float64)
        keep = (a > 0) & (b > 0)
        if keep.sum() < 2:
            raise ValueError("fitting a length model needs at least two pairs with both sides non-empty")
        a, b = a[keep], b[keep]
        ratio = float(np.median(b / a))
        per_pair = (b - ratio * a) ** 2 / ((a + b / ratio) / 2)
        return cls(ratio, max(float(np.median(per_pair)) / 0.4549, 1e-6))


def bead_cost(l1: np.ndarray | float, l2: np.ndarray | float, model: LengthModel) -> np.ndarray:
    """−log of the probability that texts of ``l1`` and ``l2`` characters translate each other."""
    # Imported here, not at the top: scipy.special costs ~0.26 s (measured with -X importtime) on every
    # `import qkv.data`, and only the Bible datasets need it.
    # lazy: scipy.stats/special take 0.26–0.73 s to import (python -X importtime); only this test needs it
    from scipy.special import log_ndtr

    l1, l2 = np.asarray(l1, dtype=np.float64), np.asarray(l2, dtype=np.float64)
    mean = np.maximum((l1 + l2 / model.ratio) / 2, 1.0)
    delta = np.abs(l2 - model.ratio * l1) / np.sqrt(model.variance * mean)
    return -(math.log(2.0) + log_ndtr(-delta))


def same_key_mask(lengths_a: Sequence[int], lengths_b: Sequence[int], model: LengthModel, *,
                  band: int = 8) -> np.ndarray:
    """For one book's verses (same keys on both sides, 0 = empty): ``True`` where the best
    segmentation pairs verse k of ``a`` with verse k of ``b`` alone.

    Args:
        lengths_a, lengths_b: character lengths, one per key, equal in number.
        model: the length model (:meth:`LengthModel.fit`).
        band: how far (in verses) the alignment may stray from the key diagonal.

    Returns:
        A bool array, one per key; ``False`` for empty verses.
    """
    la, lb = np.asarray(lengths_a, dtype=np.int64), np.asarray(lengths_b, dtype=np.int64)
    if la.shape != lb.shape or la.ndim != 1:
        raise ValueError(f"one length per key on both sides, got shapes {la.shape} and {lb.shape}")
    ia, ib = np.flatnonzero(la > 0), np.flatnonzero(lb > 0)  # the non-empty verses: the units
    n, m = len(ia), len(ib)
    mask = np.zeros(len(la), dtype=bool)
    if n == 0 or m == 0:
        return mask
    pa = np.concatenate([[0], np.cumsum(la[ia])])  # prefix sums of unit lengths
    pb = np.concatenate([[0], np.cumsum(lb[ib])])
    # row i (i units of a consumed) holds j = centre[i] - band … centre[i] + band units of b, centred
    # on the units of b whose keys come before a's unit i (the key diagonal)
    centre = np.searchsorted(ib, np.concatenate([ia, [len(la)]]))
    rows = np.arange(n + 1)[:, None]
    j = centre[:, None] + np.arange(-band, band + 1)[None, :]  # (n+1, W)
    costs = []  # per bead: (n+1, W) cost of the bead ending in that cell, inf where impossible
    for (da, db), prior in BEADS.items():
        ok = (rows >= da) & (j >= db) & (j <= m)
        l1 = pa[rows] - pa[np.clip(rows - da, 0, n)]
        l2 = pb[np.clip(j, 0, m)] - pb[np.clip(j - db, 0, m)]
        costs.append(np.where(ok, prior + bead_cost(l1, l2, model), np.inf).tolist())
    steps = list(BEADS)
    best = _viterbi(costs, steps, centre.tolist(), band, m)
    if best is None:
        return mask  # no path inside the band: nothing can be vouched for
    for i, jj, (da, db) in best:
        if (da, db) == (1, 1) and ia[i - 1] == ib[jj - 1]:
            mask[ia[i - 1]] = True
    return mask


def _viterbi(costs: list[list[list[float]]], steps: list[tuple[int, int]], centre: list[int], band: int,
             m: int) -> list[tuple[int, int, tuple[int, int]]] | None:
    """The cheapest bead path from (0, 0) to (n, m) in the band; ``(i, j, bead)`` of each bead's end."""
    n, width = len(centre) - 1, 2 * band + 1
    inf = math.inf
    cost = [[inf] * width for _ in range(n + 1)]
    back = [[-1] * width for _ in range(n + 1)]
    if not 0 <= band - centre[0] < width:
        return None
    cost[0][band - centre[0]] = 0.0
    for i in range(n + 1):
        row, c_i = cost[i], centre[i]
        for t in range(width):  # columns in order: a 0-1 bead comes from the column before
            j = c_i + t - band
            if j < 0 or j > m:
                continue
            here, arg = row[t], back[i][t]
            for k, (da, db) in enumerate(steps):
                step = costs[k][i][t]
                if step == inf:
                    continue
                tp = j - db - centre[i - da] + band
                if 0 <= tp < width:
                    total = cost[i - da][tp] + step
                    if total < here:
                        here, arg = total, k
            row[t], back[i][t] = here, arg
    t = m - centre[n] + band
    if not (0 <= t < width) or cost[n][t] == inf:
        return None
    path, i = [], n
    while back[i][t] >= 0:
        j = centre[i] + t - band
        da, db = steps[back[i][t]]
        path.append((i, j, (da, db)))
        i, t = i - da, j - db - centre[i - da] + band
    return path[::-1]
