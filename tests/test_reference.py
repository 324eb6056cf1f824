"""Tests of :mod:`qkv.reference`, the NumPy textbook reference (column convention, X is D×N).

The reference is checked against (a) its own per-token loop and (b) an independent transcription
of the book's equations written here (einsum, no helpers shared with the module under test).
Sizes are distinct (D=6, N=7, D_q=4, D_v=5) so that any transpose fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from qkv import reference as ref

D, N, DQ, DV = 6, 7, 4, 5


def _maps(rng, d=D, dq=DQ, dv=DV):
    """Ω_v, β_v, Ω_q, β_q, Ω_k, β_k in the book's order; biases are (rows × 1) columns."""
    return (
        rng.normal(size=(dv, d)), rng.normal(size=(dv, 1)),
        rng.normal(size=(dq, d)), rng.normal(size=(dq, 1)),
        rng.normal(size=(dq, d)), rng.normal(size=(dq, 1)),
    )


def book_self_attention(X, om_v, b_v, om_q, b_q, om_k, b_k, scaled=False):
    """Eqs. 12.8–12.12 written out independently: V = β_v1ᵀ + Ω_vX, Q, K likewise,
    a[m, n] = exp(k_mᵀq_n) / Σ_m' exp(k_m'ᵀq_n), Sa[X] = V A."""
    V = np.einsum("dc,cn->dn", om_v, X) + b_v  # (D_v, N)
    Q = np.einsum("dc,cn->dn", om_q, X) + b_q  # (D_q, N)
    K = np.einsum("dc,cn->dn", om_k, X) + b_k  # (D_q, N)
    S = np.einsum("dm,dn->mn", K, Q)  # S[m, n] = k_m · q_n  (keys × queries)
    if scaled:
        S = S / np.sqrt(om_q.shape[0])
    E = np.exp(S)  # values are small here: no shift needed for a plain transcription
    A = E / E.sum(axis=0, keepdims=True)  # each column (one query) sums to 1 over the keys
    return np.einsum("dm,mn->dn", V, A)  # (D_v, N)


def hand_multihead(X, heads, omega_c):
    """Eq. 12.14 by hand: each head is a scaled Sa with D/H rows, stacked head 1 on top, then Ω_c."""
    outs = []
    for om_v, b_v, om_q, b_q, om_k, b_k in heads:
        Q = om_q @ X + b_q
        K = om_k @ X + b_k
        V = om_v @ X + b_v
        S = (K.T @ Q) / np.sqrt(om_q.shape[0])
        E = np.exp(S - S.max(axis=0))
        outs.append(V @ (E / E.sum(axis=0)))
    return omega_c @ np.vstack(outs)


@pytest.mark.parametrize("scaled", [False, True])
def test_self_attention_matches_per_token_loop_and_book(scaled):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    out = ref.self_attention(X, *maps, scaled=scaled)
    assert out.shape == (DV, N)
    loop = ref.self_attention_per_token(X, *maps, scaled=scaled)
    book = book_self_attention(X, *maps, scaled=scaled)
    np.testing.assert_allclose(out, loop, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, book, rtol=0, atol=1e-12)


def test_scaled_differs_from_unscaled_by_sqrt_dq():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(D, N))
    om_v, b_v, om_q, b_q, om_k, b_k = _maps(rng)
    # scaling by √D_q equals dividing Ω_q and β_q by √D_q in the unscaled form
    s = np.sqrt(DQ)
    a = ref.self_attention(X, om_v, b_v, om_q, b_q, om_k, b_k, scaled=True)
    b = ref.self_attention(X, om_v, b_v, om_q / s, b_q / s, om_k, b_k, scaled=False)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    assert not np.allclose(a, ref.self_attention(X, om_v, b_v, om_q, b_q, om_k, b_k))


def test_self_attention_accepts_flat_biases():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    flat = tuple(m.reshape(-1) if i % 2 else m for i, m in enumerate(maps))
    np.testing.assert_allclose(ref.self_attention(X, *flat), ref.self_attention(X, *maps), atol=1e-14)


def test_self_attention_is_permutation_equivariant():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    perm = rng.permutation(N)
    P = np.eye(N)[:, perm]  # X @ P permutes the columns
    np.testing.assert_allclose(
        ref.self_attention(X @ P, *maps), ref.self_attention(X, *maps) @ P, atol=1e-12
    )


def test_softmax_cols_columns_sum_to_one_and_match_naive():
    rng = np.random.default_rng(4)
    A = rng.normal(size=(5, 3))
    S = ref.softmax_cols(A)
    assert S.shape == (5, 3)
    np.testing.assert_allclose(S.sum(axis=0), 1.0, atol=1e-15)
    naive = np.exp(A) / np.exp(A).sum(axis=0)
    np.testing.assert_allclose(S, naive, atol=1e-15)
    # softmax is per column: rows do not sum to 1 in general
    assert not np.allclose(S.sum(axis=1), 1.0)


def test_softmax_cols_is_stable_for_huge_values():
    A = np.array(
        [[1e308, -1e308, 1000.0, -1000.0],
         [1e308, -1e308, 999.0, -1001.0],
         [0.0, 5.0, -1e300, -1e300]]
    )
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        S = ref.softmax_cols(A)
    assert np.all(np.isfinite(S)) and np.all(S >= 0)
    np.testing.assert_allclose(S.sum(axis=0), 1.0, atol=1e-15)
    np.testing.assert_allclose(S[:, 0], [0.5, 0.5, 0.0], atol=1e-15)
    np.testing.assert_allclose(S[:, 1], [0.0, 0.0, 1.0], atol=1e-15)
    e = np.exp(-1.0)
    np.testing.assert_allclose(S[:, 2], [1 / (1 + e), e / (1 + e), 0.0], atol=1e-15)
    np.testing.assert_allclose(S[:, 3], [1 / (1 + e), e / (1 + e), 0.0], atol=1e-15)
    # shift invariance per column
    B = np.random.default_rng(5).normal(size=(4, 6))
    np.testing.assert_allclose(ref.softmax_cols(B + np.arange(6) * 1e4), ref.softmax_cols(B), atol=1e-12)


def test_multihead_matches_hand_written_per_head():
    H = 3
    d = 12  # D/H = 4
    rng = np.random.default_rng(6)
    X = rng.normal(size=(d, N))
    heads = [_maps(rng, d=d, dq=d // H, dv=d // H) for _ in range(H)]
    omega_c = rng.normal(size=(d, d))
    out = ref.multihead_self_attention(X, heads, omega_c)
    assert out.shape == (d, N)
    np.testing.assert_allclose(out, hand_multihead(X, heads, omega_c), rtol=0, atol=1e-12)
    # head order matters: head 1 is on top of the stack
    swapped = [heads[1], heads[0], heads[2]]
    assert not np.allclose(out, ref.multihead_self_attention(X, swapped, omega_c))
    # with Ω_c = I the output is the stack of scaled single heads
    stack = ref.multihead_self_attention(X, heads, np.eye(d))
    for h, head in enumerate(heads):
        np.testing.assert_allclose(
            stack[h * 4:(h + 1) * 4], book_self_attention(X, *head, scaled=True), atol=1e-12
        )


def _msg(excinfo):
    return str(excinfo.value)


def test_softmax_cols_rejects_non_matrix():
    with pytest.raises(ValueError, match=r"\(5,\)"):
        ref.softmax_cols(np.zeros(5))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
        ref.softmax_cols(np.zeros((2, 3, 4)))


def test_self_attention_bad_shapes_raise():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(D, N))
    om_v, b_v, om_q, b_q, om_k, b_k = _maps(rng)
    for fn in (ref.self_attention, ref.self_attention_per_token):
        with pytest.raises(ValueError, match=r"\(6,\)"):
            fn(X[:, 0], om_v, b_v, om_q, b_q, om_k, b_k)
    with pytest.raises(ValueError, match=r"\(6, 7, 1\)"):
        ref.self_attention(X[..., None], om_v, b_v, om_q, b_q, om_k, b_k)
    with pytest.raises(ValueError) as e:  # Ω_q has the wrong width
        ref.self_attention(X, om_v, b_v, om_q[:, :5], b_q, om_k, b_k)
    assert "(4, 5)" in _msg(e) and "6" in _msg(e)
    with pytest.raises(ValueError) as e:  # β_v does not match Ω_v
        ref.self_attention(X, om_v, b_v[:3], om_q, b_q, om_k, b_k)
    assert "(3, 1)" in _msg(e)
    with pytest.raises(ValueError) as e:  # queries and keys with different numbers of rows
        ref.self_attention(X, om_v, b_v, om_q, b_q, om_k[:3], b_k[:3])
    assert "(4, 6)" in _msg(e) and "(3, 6)" in _msg(e)


def test_multihead_bad_shapes_raise():
    rng = np.random.default_rng(8)
    d, H = 12, 3
    X = rng.normal(size=(d, N))
    heads = [_maps(rng, d=d, dq=4, dv=4) for _ in range(H)]
    omega_c = rng.normal(size=(d, d))
    with pytest.raises(ValueError, match=r"\(12,\)"):
        ref.multihead_self_attention(X[:, 0], heads, omega_c)
    with pytest.raises(ValueError):
        ref.multihead_self_attention(X, [], omega_c)
    with pytest.raises(ValueError) as e:  # 12 not divisible by 5 heads
        ref.multihead_self_attention(X, heads + heads[:2], omega_c)
    assert "12" in _msg(e) and "5" in _msg(e)
    with pytest.raises(ValueError) as e:  # a head tuple of the wrong length
        ref.multihead_self_attention(X, [heads[0], heads[1], heads[2][:4]], omega_c)
    assert "4" in _msg(e)
    bad = list(heads)
    bad[1] = _maps(rng, d=d, dq=3, dv=4)
    with pytest.raises(ValueError) as e:  # a head map of the wrong size
        ref.multihead_self_attention(X, bad, omega_c)
    assert "(3, 12)" in _msg(e) and "(4 × 12)" in _msg(e)
    with pytest.raises(ValueError) as e:
        ref.multihead_self_attention(X, heads, omega_c[:, :10])
    assert "(12, 10)" in _msg(e)
