"""The length-based verse alignment check, against an exhaustive search on small books."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from qkv.data.verse_align import BEADS, LengthModel, bead_cost, same_key_mask

MODEL = LengthModel(ratio=0.9, variance=2.0)


def test_bead_cost_is_the_gale_church_formula():
    for l1, l2 in [(100, 90), (100, 150), (37, 20), (0, 12)]:
        mean = max((l1 + l2 / 0.9) / 2, 1)
        delta = abs(l2 - 0.9 * l1) / math.sqrt(2.0 * mean)
        want = -math.log(math.erfc(delta / math.sqrt(2)))  # 2 (1 - Φ(δ)) = erfc(δ / √2)
        assert float(bead_cost(l1, l2, MODEL)) == pytest.approx(want, rel=1e-9)


def _segmentations(n: int, m: int):
    """Every sequence of beads that covers n units of a and m of b."""
    if n == 0 and m == 0:
        yield []
        return
    for da, db in BEADS:
        if da <= n and db <= m:
            for rest in _segmentations(n - da, m - db):
                yield [(da, db)] + rest


@functools.cache
def _cost(l1: int, l2: int) -> float:
    return float(bead_cost(l1, l2, MODEL))


def _exhaustive(la, lb):
    ia, ib = [k for k, x in enumerate(la) if x], [k for k, x in enumerate(lb) if x]
    ua, ub = [la[k] for k in ia], [lb[k] for k in ib]
    best, best_path = math.inf, None
    for path in _segmentations(len(ua), len(ub)):
        i = j = 0
        total = 0.0
        for da, db in path:
            total += BEADS[(da, db)] + _cost(int(sum(ua[i:i + da])), int(sum(ub[j:j + db])))
            i, j = i + da, j + db
        if total < best:
            best, best_path = total, path
    mask = np.zeros(len(la), dtype=bool)
    i = j = 0
    for da, db in best_path:
        if (da, db) == (1, 1) and ia[i] == ib[j]:
            mask[ia[i]] = True
        i, j = i + da, j + db
    return mask


@pytest.mark.parametrize("seed", range(12))
def test_banded_search_equals_exhaustive_search(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 6))
    la = rng.integers(20, 200, n)
    lb = np.round(la * 0.9 * rng.normal(1, 0.1, n)).astype(int)
    if seed % 3 == 1:  # shift b by one verse, its last verse absorbing the overflow, one slot empty
        lb = np.concatenate([[0], lb[:-2], [lb[-2] + lb[-1]]])
    if seed % 3 == 2:
        lb[int(rng.integers(0, n))] = 0
    np.testing.assert_array_equal(same_key_mask(la, lb, MODEL, band=n), _exhaustive(list(la), list(lb)))


def test_a_shifted_chapter_is_found_and_the_rest_kept():
    rng = np.random.default_rng(7)
    la = rng.integers(40, 250, 60)
    lb = np.round(la * 0.9 * rng.normal(1, 0.08, 60)).astype(int)
    # verses 20-29 of b hold the translation of the verse before; 19's slot is empty, 29 holds two
    lb[20:30] = lb[19:29].copy()
    lb[29] += lb[29] // 2 + 60
    lb[19] = 0
    mask = same_key_mask(la, lb, MODEL)
    assert not mask[19:30].any()
    assert mask[:18].all() and mask[31:].all()


def test_fit_ignores_empty_sides_and_a_few_outliers():
    rng = np.random.default_rng(0)
    la = rng.integers(50, 300, 500)
    lb = la * 0.8 + rng.normal(0, np.sqrt(3.0 * la))
    lb[:20] = la[:20] * 3  # misaligned pairs
    model = LengthModel.fit(np.concatenate([la, [0, 40]]), np.concatenate([lb, [30, 0]]))
    assert model.ratio == pytest.approx(0.8, rel=0.02)
    assert model.variance == pytest.approx(3.0, rel=0.2)  # the outliers move the median up by ~15 %
    with pytest.raises(ValueError, match="at least two pairs"):
        LengthModel.fit([0, 5], [5, 0])
    with pytest.raises(ValueError, match="one length per key"):
        same_key_mask([1, 2], [1], MODEL)
