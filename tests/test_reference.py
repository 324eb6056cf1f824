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


# ---------------------------------------------------------------------------------------------
# masked (causal) self-attention and cross-attention


def book_masked(X, om_v, b_v, om_q, b_q, om_k, b_k, allowed, scaled=False):
    """Masked Sa written out independently: S[m, n] = k_m · q_n, −∞ where not allowed, softmax per
    column over the allowed keys only, a column with none stays zero; Sa = V A."""
    V = np.einsum("dc,cn->dn", om_v, X) + b_v
    Q = np.einsum("dc,cn->dn", om_q, X) + b_q
    K = np.einsum("dc,cn->dn", om_k, X) + b_k
    S = np.einsum("dm,dn->mn", K, Q) / (np.sqrt(om_q.shape[0]) if scaled else 1.0)
    A = np.zeros_like(S)
    for n in range(S.shape[1]):
        keep = allowed[:, n]
        if keep.any():
            e = np.exp(S[keep, n] - S[keep, n].max())
            A[keep, n] = e / e.sum()
    return np.einsum("dm,mn->dn", V, A)


def test_causal_mask_is_keys_up_to_the_query():
    M = ref.causal_mask(3)
    assert M.dtype == bool
    # [key m, query n]: query 0 sees key 0; query 2 sees keys 0, 1, 2
    np.testing.assert_array_equal(M, [[True, True, True], [False, True, True], [False, False, True]])
    assert ref.causal_mask(0).shape == (0, 0)


def test_masked_self_attention_hand_checked_2x3():
    """D = 2, N = 3, Ω = I, β_q = β_k = 0, β_v = (1, −1)ᵀ: Q = K = X, V = X + β_v 1ᵀ.
    X = [x_0 x_1 x_2] = [[1, 0, 1], [0, 1, 1]], so KᵀQ = XᵀX = [[1, 0, 1], [0, 1, 1], [1, 1, 2]].
    Column 0 sees key 0 only: a = (1, 0, 0).
    Column 1 sees keys 0, 1 with scores (0, 1): a = (1, e, 0) / (1 + e).
    Column 2 sees all three with scores (1, 1, 2): a = (e, e, e²) / (2e + e²) = (1, 1, e) / (2 + e)."""
    X = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    I, z = np.eye(2), np.zeros((2, 1))
    b_v = np.array([[1.0], [-1.0]])
    e = np.e
    A = np.array([[1.0, 1 / (1 + e), 1 / (2 + e)],
                  [0.0, e / (1 + e), 1 / (2 + e)],
                  [0.0, 0.0, e / (2 + e)]])
    want = X @ A + b_v  # each column of A sums to 1, so the bias passes through
    np.testing.assert_allclose(want[:, 0], [2.0, -1.0], atol=1e-15)
    np.testing.assert_allclose(want[:, 2], [(1 + e) / (2 + e) + 1, (1 + e) / (2 + e) - 1], atol=1e-15)
    for fn in (ref.masked_self_attention, ref.masked_self_attention_per_token):
        np.testing.assert_allclose(fn(X, I, b_v, I, z, I, z), want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(ref.masked_softmax_cols(X.T @ X, ref.causal_mask(3)), A, atol=1e-15)


def _masks(rng, n=N):
    pad = np.ones((n, n), dtype=bool)
    pad[[1, 4], :] = False  # keys 1 and 4 are padding, for every query
    general = rng.random((n, n)) > 0.4
    general[:, 2] = False  # query 2 may see no key at all
    return {"none": None, "padding": pad, "general": general}


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("which", ["none", "padding", "general"])
def test_masked_matches_per_token_loop_and_book(scaled, causal, which):
    rng = np.random.default_rng(10)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    mask = _masks(rng)[which]
    out = ref.masked_self_attention(X, *maps, scaled=scaled, causal=causal, mask=mask)
    assert out.shape == (DV, N)
    loop = ref.masked_self_attention_per_token(X, *maps, scaled=scaled, causal=causal, mask=mask)
    allowed = np.ones((N, N), dtype=bool) if mask is None else mask.copy()
    if causal:
        allowed &= np.triu(np.ones((N, N), dtype=bool))  # keys m ≤ query n
    book = book_masked(X, *maps, allowed, scaled=scaled)
    np.testing.assert_allclose(out, loop, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, book, rtol=0, atol=1e-12)


def test_unmasked_is_plain_self_attention():
    rng = np.random.default_rng(11)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    everything = np.ones((N, N), dtype=bool)
    for scaled in (False, True):
        plain = ref.self_attention(X, *maps, scaled=scaled)
        np.testing.assert_allclose(ref.masked_self_attention(X, *maps, scaled=scaled, causal=False), plain,
                                   atol=1e-12)
        np.testing.assert_allclose(
            ref.masked_self_attention(X, *maps, scaled=scaled, causal=False, mask=everything), plain, atol=1e-12)
    # causal differs from plain everywhere but in the last column (which sees every key)
    causal = ref.masked_self_attention(X, *maps)
    np.testing.assert_allclose(causal[:, -1], ref.self_attention(X, *maps)[:, -1], atol=1e-12)
    assert not np.allclose(causal[:, :-1], ref.self_attention(X, *maps)[:, :-1])


def test_causal_column_n_ignores_tokens_after_n():
    rng = np.random.default_rng(12)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    out = ref.masked_self_attention(X, *maps, scaled=True)
    for n in range(N):
        # column n is plain attention over the prefix x_0..x_n, read at its last token
        prefix = ref.self_attention(X[:, : n + 1], *maps, scaled=True)
        np.testing.assert_allclose(out[:, n], prefix[:, -1], rtol=0, atol=1e-12)
        # changing the tokens after n changes nothing up to n
        Y = X.copy()
        Y[:, n + 1:] = rng.normal(size=(D, N - n - 1)) * 10
        np.testing.assert_allclose(ref.masked_self_attention(Y, *maps, scaled=True)[:, : n + 1],
                                   out[:, : n + 1], rtol=0, atol=1e-12)


def test_all_masked_column_is_zero_never_nan():
    rng = np.random.default_rng(13)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    mask = np.ones((N, N), dtype=bool)
    mask[:, 3] = False  # query 3 sees no key
    mask[0, :] = False  # key 0 is padding: with causal, query 0 sees nothing either
    with np.errstate(all="raise"):
        out = ref.masked_self_attention(X, *maps, mask=mask)
        loop = ref.masked_self_attention_per_token(X, *maps, mask=mask)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[:, [0, 3]], 0.0)
    np.testing.assert_array_equal(loop[:, [0, 3]], 0.0)
    assert np.all(np.abs(out[:, [1, 2, 4, 5, 6]]).sum(axis=0) > 0)
    A = ref.masked_softmax_cols(rng.normal(size=(N, N)), mask & ref.causal_mask(N))
    np.testing.assert_array_equal(A[~(mask & ref.causal_mask(N))], 0.0)
    np.testing.assert_allclose(A.sum(axis=0), [0, 1, 1, 0, 1, 1, 1], atol=1e-15)


def test_masked_softmax_cols_is_stable_for_huge_values():
    A = np.array([[1e308, 1000.0], [1e308, 999.0], [0.0, 5e307]])  # the masked 5e307 must not win
    mask = np.array([[True, True], [True, True], [True, False]])
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        S = ref.masked_softmax_cols(A, mask)
    e = np.exp(-1.0)
    np.testing.assert_allclose(S, [[0.5, 1 / (1 + e)], [0.5, e / (1 + e)], [0.0, 0.0]], atol=1e-15)


def test_multihead_causal_and_masked_match_hand_written_per_head():
    H, d = 3, 12
    rng = np.random.default_rng(14)
    X = rng.normal(size=(d, N))
    heads = [_maps(rng, d=d, dq=d // H, dv=d // H) for _ in range(H)]
    omega_c = rng.normal(size=(d, d))
    pad = np.ones((N, N), dtype=bool)
    pad[5, :] = False
    for causal, mask in ((True, None), (True, pad), (False, pad)):
        allowed = (ref.causal_mask(N) if causal else np.ones((N, N), dtype=bool)) & (True if mask is None else mask)
        want = omega_c @ np.vstack([book_masked(X, *hd, allowed, scaled=True) for hd in heads])
        got = ref.multihead_self_attention(X, heads, omega_c, causal=causal, mask=mask)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # causal=False without a mask is eq. 12.14 unchanged
    np.testing.assert_allclose(ref.multihead_self_attention(X, heads, omega_c, causal=False),
                               hand_multihead(X, heads, omega_c), atol=1e-12)


DE, NE = 7, 9  # encoder width and length, distinct from the decoder's D = 6, N = 7


def _cross_maps(rng, d_dec=D, d_enc=DE, dq=DQ, dv=DV):
    """Ω_v (D_v × D_enc), β_v, Ω_q (D_q × D_dec), β_q, Ω_k (D_q × D_enc), β_k — the book's order."""
    return (
        rng.normal(size=(dv, d_enc)), rng.normal(size=(dv, 1)),
        rng.normal(size=(dq, d_dec)), rng.normal(size=(dq, 1)),
        rng.normal(size=(dq, d_enc)), rng.normal(size=(dq, 1)),
    )


def book_cross(X_dec, X_enc, om_v, b_v, om_q, b_q, om_k, b_k, keep=None, scaled=False):
    """§12.8 written out: Q from the decoder, K and V from the encoder, a softmax over the encoder's
    (real) tokens for every decoder token."""
    Q = np.einsum("dc,cn->dn", om_q, X_dec) + b_q  # (D_q, N_dec)
    K = np.einsum("dc,cm->dm", om_k, X_enc) + b_k  # (D_q, N_enc)
    V = np.einsum("dc,cm->dm", om_v, X_enc) + b_v  # (D_v, N_enc)
    S = np.einsum("dm,dn->mn", K, Q) / (np.sqrt(om_q.shape[0]) if scaled else 1.0)  # (N_enc, N_dec)
    keep = np.ones(S.shape[0], dtype=bool) if keep is None else keep
    A = np.zeros_like(S)
    if keep.any():
        E = np.exp(S[keep] - S[keep].max(axis=0))
        A[keep] = E / E.sum(axis=0)
    return np.einsum("dm,mn->dn", V, A)  # (D_v, N_dec)


@pytest.mark.parametrize("scaled", [False, True])
def test_cross_attention_matches_book_and_padding_drops_keys(scaled):
    rng = np.random.default_rng(15)
    X_dec, X_enc = rng.normal(size=(D, N)), rng.normal(size=(DE, NE))
    maps = _cross_maps(rng)
    out = ref.cross_attention(X_dec, X_enc, *maps, scaled=scaled)
    assert out.shape == (DV, N)
    np.testing.assert_allclose(out, book_cross(X_dec, X_enc, *maps, scaled=scaled), rtol=0, atol=1e-12)
    keep = np.array([True, True, False, True, True, True, False, False, True])
    masked = ref.cross_attention(X_dec, X_enc, *maps, scaled=scaled, enc_mask=keep)
    np.testing.assert_allclose(masked, book_cross(X_dec, X_enc, *maps, keep, scaled=scaled), rtol=0, atol=1e-12)
    # padding the encoder = the encoder without its padded tokens
    np.testing.assert_allclose(masked, ref.cross_attention(X_dec, X_enc[:, keep], *maps, scaled=scaled),
                               rtol=0, atol=1e-12)
    # changing a padded encoder token changes nothing
    Y = X_enc.copy()
    Y[:, ~keep] = 100.0
    np.testing.assert_allclose(ref.cross_attention(X_dec, Y, *maps, scaled=scaled, enc_mask=keep), masked,
                               rtol=0, atol=1e-12)
    # an all-padding encoder gives zeros for every decoder token
    np.testing.assert_array_equal(
        ref.cross_attention(X_dec, X_enc, *maps, enc_mask=np.zeros(NE, dtype=bool)), 0.0)


def test_cross_attention_on_the_same_tokens_is_self_attention():
    rng = np.random.default_rng(16)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    for scaled in (False, True):
        np.testing.assert_allclose(ref.cross_attention(X, X, *maps, scaled=scaled),
                                   ref.self_attention(X, *maps, scaled=scaled), rtol=0, atol=1e-12)


def test_cross_attention_columns_are_independent_decoder_tokens():
    """No causal mask in cross-attention: column n depends on decoder token n and the encoder only."""
    rng = np.random.default_rng(17)
    X_dec, X_enc = rng.normal(size=(D, N)), rng.normal(size=(DE, NE))
    maps = _cross_maps(rng)
    out = ref.cross_attention(X_dec, X_enc, *maps, scaled=True)
    for n in range(N):
        np.testing.assert_allclose(ref.cross_attention(X_dec[:, [n]], X_enc, *maps, scaled=True)[:, 0], out[:, n],
                                   rtol=0, atol=1e-12)


def test_multihead_cross_matches_hand_written_per_head():
    H, d = 3, 12
    rng = np.random.default_rng(18)
    X_dec, X_enc = rng.normal(size=(d, N)), rng.normal(size=(DE, NE))
    heads = [_cross_maps(rng, d_dec=d, dq=d // H, dv=d // H) for _ in range(H)]
    omega_c = rng.normal(size=(d, d))
    keep = rng.random(NE) > 0.3
    keep[0] = True
    for mask in (None, keep):
        want = omega_c @ np.vstack([book_cross(X_dec, X_enc, *hd, mask, scaled=True) for hd in heads])
        got = ref.multihead_cross_attention(X_dec, X_enc, heads, omega_c, enc_mask=mask)
        assert got.shape == (d, N)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_masked_and_cross_bad_shapes_raise():
    rng = np.random.default_rng(19)
    X = rng.normal(size=(D, N))
    maps = _maps(rng)
    for fn in (ref.masked_self_attention, ref.masked_self_attention_per_token):
        with pytest.raises(ValueError, match=r"\(6,\)"):
            fn(X[:, 0], *maps)
        with pytest.raises(ValueError) as e:  # a mask of the wrong size
            fn(X, *maps, mask=np.ones((N, N - 1), dtype=bool))
        assert "(7 × 7)" in _msg(e) and "(7, 6)" in _msg(e)
        with pytest.raises(ValueError, match="boolean"):  # 0/1 floats are not a mask
            fn(X, *maps, mask=np.ones((N, N)))
    with pytest.raises(ValueError, match="boolean"):
        ref.masked_softmax_cols(np.zeros((3, 2)), np.ones((3, 2), dtype=int))
    with pytest.raises(ValueError, match=r"\(3 × 2\)"):
        ref.masked_softmax_cols(np.zeros((3, 2)), np.ones((2, 3), dtype=bool))
    with pytest.raises(ValueError, match=r"\(4,\)"):
        ref.masked_softmax_cols(np.zeros(4), np.ones(4, dtype=bool))
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="non-negative int"):
            ref.causal_mask(bad)

    X_dec, X_enc = rng.normal(size=(D, N)), rng.normal(size=(DE, NE))
    cmaps = _cross_maps(rng)
    with pytest.raises(ValueError, match=r"X_enc must be D_enc×N_enc.*\(7,\)"):
        ref.cross_attention(X_dec, X_enc[:, 0], *cmaps)
    with pytest.raises(ValueError, match=r"X_dec must be D_dec×N_dec.*\(6,\)"):
        ref.cross_attention(X_dec[:, 0], X_enc, *cmaps)
    with pytest.raises(ValueError) as e:  # Ω_q must read the decoder's width
        ref.cross_attention(X_dec, X_enc, cmaps[0], cmaps[1], rng.normal(size=(DQ, DE)), *cmaps[3:])
    assert "X_dec" in _msg(e) and "(4, 7)" in _msg(e) and "× 6" in _msg(e)
    with pytest.raises(ValueError) as e:  # Ω_k must read the encoder's width
        ref.cross_attention(X_dec, X_enc, *cmaps[:4], rng.normal(size=(DQ, D)), cmaps[5])
    assert "X_enc" in _msg(e) and "(4, 6)" in _msg(e) and "× 7" in _msg(e)
    with pytest.raises(ValueError) as e:  # Ω_v must read the encoder's width too
        ref.cross_attention(X_dec, X_enc, rng.normal(size=(DV, D)), *cmaps[1:])
    assert "V (from X_enc)" in _msg(e)
    with pytest.raises(ValueError) as e:  # an encoder mask over the wrong number of tokens
        ref.cross_attention(X_dec, X_enc, *cmaps, enc_mask=np.ones(N, dtype=bool))
    assert "(9,)" in _msg(e) and "(7,)" in _msg(e)
    with pytest.raises(ValueError, match="boolean"):
        ref.cross_attention(X_dec, X_enc, *cmaps, enc_mask=np.ones(NE))

    d, H = 12, 3
    heads = [_cross_maps(rng, d_dec=d, dq=4, dv=4) for _ in range(H)]
    with pytest.raises(ValueError) as e:  # head maps read the wrong widths
        ref.multihead_cross_attention(rng.normal(size=(d, N)), rng.normal(size=(d, NE)), heads, np.eye(d))
    assert "(4 × 12)" in _msg(e) and "(4, 7)" in _msg(e)
    with pytest.raises(ValueError, match=r"\(12, 10\)"):
        ref.multihead_cross_attention(rng.normal(size=(d, N)), X_enc, heads, np.eye(d)[:, :10])
    Xm = rng.normal(size=(d, N))
    mheads = [_maps(rng, d=d, dq=4, dv=4) for _ in range(H)]
    with pytest.raises(ValueError, match=r"\(7 × 7\)"):
        ref.multihead_self_attention(Xm, mheads, np.eye(d), causal=True, mask=np.ones((N, 2), dtype=bool))
