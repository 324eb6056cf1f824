"""Layer statistics against hand-computed cases and their defining properties."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.analysis.layers import (
    anisotropy,
    cka_matrix,
    intra_similarity,
    linear_cka,
    linear_probe,
    self_similarity,
)


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _random_orthogonal(d: int, rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


# ------------------------------------------------------------------------------------------ CKA


def test_cka_of_a_layer_with_itself_is_one():
    x = np.random.default_rng(0).normal(size=(50, 7))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_cka_invariant_to_orthogonal_transform_and_isotropic_scaling():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 9))
    y = x @ rng.normal(size=(9, 5)) + 0.5 * rng.normal(size=(60, 5))  # related, different width
    base = linear_cka(x, y)
    assert 0.05 < base < 0.99
    q = _random_orthogonal(9, rng)
    assert linear_cka(x @ q, y) == pytest.approx(base, rel=1e-10)
    assert linear_cka(3.7 * x, y) == pytest.approx(base, rel=1e-10)
    assert linear_cka(x, 0.01 * y @ _random_orthogonal(5, rng)) == pytest.approx(base, rel=1e-10)
    assert linear_cka(x @ q * 2.0, x) == pytest.approx(1.0, rel=1e-10)
    # … and to a constant shift (it centres), but not to an anisotropic scaling
    assert linear_cka(x + 5.0, y) == pytest.approx(base, rel=1e-10)
    assert linear_cka(x * np.linspace(0.1, 5, 9), y) != pytest.approx(base, rel=1e-3)


def test_cka_matches_the_hsic_definition():
    """Independent reference: CKA = HSIC(K,L)/sqrt(HSIC(K,K) HSIC(L,L)) with linear Gram matrices."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(20, 4)), rng.normal(size=(20, 6))
    n = 20
    h = np.eye(n) - np.ones((n, n)) / n
    k, lm = h @ x @ x.T @ h, h @ y @ y.T @ h
    hsic = lambda a, b: np.trace(a @ b)
    ref = hsic(k, lm) / np.sqrt(hsic(k, k) * hsic(lm, lm))
    assert linear_cka(x, y) == pytest.approx(ref, rel=1e-10)


def test_cka_matrix_is_symmetric_with_unit_diagonal():
    layers = np.random.default_rng(3).normal(size=(4, 30, 6))
    m = cka_matrix(layers)
    np.testing.assert_allclose(m, m.T)
    np.testing.assert_allclose(np.diag(m), 1.0)


# ---------------------------------------------------------------------- Ethayarajh's similarities


def test_anisotropy_averages_only_pairs_from_different_contexts():
    v = np.array([[1.0, 0], [1, 0], [0, 1], [1, 1]])
    ctx = np.array([0, 0, 1, 2])
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j and ctx[i] != ctx[j]]
    ref = np.mean([_cos(v[i], v[j]) for i, j in pairs])
    assert anisotropy(v, ctx) == pytest.approx(ref)


def test_anisotropy_of_identical_vectors_is_one_and_of_opposed_is_negative():
    assert anisotropy(np.ones((5, 3)), np.arange(5)) == pytest.approx(1.0)
    assert anisotropy(np.array([[1.0, 0], [-1, 0]]), np.array([0, 1])) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="two contexts"):
        anisotropy(np.ones((3, 2)), np.zeros(3))


def test_self_similarity_per_type_and_mean():
    v = np.array([[1.0, 0], [0, 1], [1, 1], [3, 0], [2, 0]])
    types = np.array([7, 7, 7, 9, 9])
    mean, per = self_similarity(v, types)
    ref7 = np.mean([_cos(v[i], v[j]) for i in range(3) for j in range(3) if i != j])
    assert per[7] == pytest.approx(ref7)
    assert per[9] == pytest.approx(1.0)
    assert mean == pytest.approx((ref7 + 1.0) / 2)


def test_intra_similarity_against_a_loop():
    rng = np.random.default_rng(4)
    h = rng.normal(size=(3, 5, 4))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], bool)
    got = intra_similarity(h, mask)
    for b in range(3):
        toks = h[b][mask[b]]
        mean = toks.mean(0)
        assert got[b] == pytest.approx(np.mean([_cos(t, mean) for t in toks]))
    assert np.isnan(intra_similarity(h, np.zeros((3, 5), bool))).all()


# ---------------------------------------------------------------------------------------- probes


def test_probe_is_at_chance_on_shuffled_labels():
    rng = np.random.default_rng(5)
    n, k = 900, 3
    x = rng.normal(size=(n, 12))
    y_true = np.argmax(x[:, :k], axis=1)  # learnable from x …
    good = linear_probe(x, y_true, n_folds=4, eval_folds=4, seed=0)
    assert good.accuracy > 0.9
    shuffled = rng.permutation(y_true)  # … but not once shuffled
    bad = linear_probe(x, shuffled, n_folds=4, eval_folds=4, seed=0)
    assert abs(bad.accuracy - 1 / k) < 0.07
    assert abs(bad.accuracy - bad.chance) < 0.08
    assert bad.n_test == n and bad.n_classes == k


def test_probe_groups_never_straddle_train_and_test():
    """Memorising a group id is useless when whole groups are held out: accuracy falls to chance."""
    rng = np.random.default_rng(6)
    groups = np.repeat(np.arange(40), 10)
    x = np.eye(40)[groups] + 0.01 * rng.normal(size=(400, 40))  # x reveals the group
    y = rng.integers(0, 2, size=40)[groups]  # a random label per group
    res = linear_probe(x, y, groups, n_folds=4, eval_folds=4, seed=0)
    assert res.accuracy < 0.75
    mixed = linear_probe(x, y, None, n_folds=4, eval_folds=4, seed=0)  # ungrouped: it memorises
    assert mixed.accuracy > 0.95
