"""Masked (causal) and cross attention of the torch code against the NumPy textbook reference.

``qkv.reference`` uses the book's columns (X is D×N, one column per token; ``Softmax[KᵀQ]`` is
keys × queries); the torch code uses rows. The transposes, for batch item b and head h:

* ``q[b, h]`` is ``(T, D_q)`` = ``Qᵀ`` with ``Q = Ω_q X + β_q 1ᵀ`` (``D_q × T``); ``k[b, h] = Kᵀ``,
  ``v[b, h] = Vᵀ``;
* ``output[b, h]`` is ``(T, D_v)`` = the reference's ``(D_v × T)`` result transposed;
* ``weights[b, h]`` is ``(T, S)`` [query, key] = the reference's ``A`` (``S × T``, [key, query])
  transposed;
* a torch key padding mask ``(B,1,1,S)``, True = real, is the reference's ``mask[m, n] = pad[m]``
  repeated over the queries (``enc_mask = pad`` in cross-attention);
* a ``(B,T,C)`` input to :class:`~qkv.nn.attention.MultiHeadAttention` is ``X = x[b].T``.

Everything runs in float64 against the reference to 1e-10, on every backend that runs the call
(``offset_flash`` runs only an offset score bias, and never a causal mask: it must refuse).
Sizes are distinct (D=6, D_enc=7, D_q=4, D_v=5, H=2, B=3) so that any transpose fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv import reference as ref
from qkv.models.builders import build_attention
from qkv.nn.attend import attend
from qkv.nn.backends import backend_names
from qkv.nn.similarity import build_similarity

B, H, D, DE, DQ, DV = 3, 2, 6, 7, 4, 5
NEEDS_OFFSET_BIAS = ("offset_flash",)  # refuses a call without an OffsetBias (and any causal one)
RUNNING = tuple(b for b in backend_names() if b not in NEEDS_OFFSET_BIAS)
CASES = [(b, w) for b in RUNNING for w in ((False,) if b == "sdpa" else (False, True))]  # sdpa: no weights
ATOL = 1e-10


def _heads(rng, d_q_in=D, d_kv_in=D, h=H, dq=DQ, dv=DV):
    """Per head (Ω_v, β_v, Ω_q, β_q, Ω_k, β_k) in the book's order: Ω_q reads ``d_q_in`` rows of
    the query tokens, Ω_k and Ω_v ``d_kv_in`` rows of the key tokens; biases are columns."""
    return [(rng.normal(size=(dv, d_kv_in)), rng.normal(size=(dv, 1)),
             rng.normal(size=(dq, d_q_in)), rng.normal(size=(dq, 1)),
             rng.normal(size=(dq, d_kv_in)), rng.normal(size=(dq, 1))) for _ in range(h)]


def _rows(Xs, heads, i):
    """``(B,H,N,rows)`` torch tensor, ``[b, h] = (Ω X_b + β 1ᵀ)ᵀ`` for map ``i`` (0 V, 2 Q, 4 K) of head h."""
    return torch.from_numpy(np.stack([[(hd[i] @ X + hd[i + 1]).T for hd in heads] for X in Xs]))  # (B,H,N,rows)


def _pad(n, seed):
    """``(B, n)`` key padding, True = real: item 0 pads its FIRST token (so under a causal mask its
    query 0 sees no key at all), item 1 pads a random few, item 2 pads nothing."""
    g = np.random.default_rng(seed)
    pad = np.ones((B, n), dtype=bool)
    pad[0, [0, n // 2]] = False
    pad[1] = g.random(n) > 0.35
    pad[1, 1] = True
    return pad


def _key_mask(pad):
    return torch.from_numpy(pad)[:, None, None, :]  # (B,S) -> (B,1,1,S)


def _ref_mask(pad_b, n_queries):
    """The reference's [key m, query n] mask of one item's key padding: pad[m] for every query."""
    return np.repeat(pad_b[:, None], n_queries, axis=1)  # (S,) -> (S, T)


def _scores(heads_h, X_q, X_kv, scaled):
    """KᵀQ of one head in the book's layout, (keys × queries), scaled by √D_q when asked."""
    om_v, be_v, om_q, be_q, om_k, be_k = heads_h
    Q, K = om_q @ X_q + be_q, om_k @ X_kv + be_k
    return K.T @ Q / (np.sqrt(om_q.shape[0]) if scaled else 1.0)


def _sim(scaled, dq=DQ, h=H):
    return build_similarity("scaled_dot" if scaled else "dot", n_heads=h, d_head=dq)


# ---------------------------------------------------------------------------------------------
# attend(causal=True) against masked_self_attention


@pytest.mark.parametrize("path,need_weights", CASES)
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_attend_causal_equals_masked_self_attention(path, need_weights, scaled, padded):
    n = 7
    rng = np.random.default_rng(0)
    heads = _heads(rng)
    Xs = [rng.normal(size=(D, n)) for _ in range(B)]  # one D×N matrix per batch item
    q, k, v = _rows(Xs, heads, 2), _rows(Xs, heads, 4), _rows(Xs, heads, 0)  # (B,H,N,D_q|D_q|D_v)
    pad = _pad(n, seed=1) if padded else None
    res = attend(q, k, v, similarity=_sim(scaled), causal=True, mask=None if pad is None else _key_mask(pad),
                 backend=path, chunk_size=3, need_weights=need_weights)
    assert res.output.dtype == torch.float64 and res.output.shape == (B, H, n, DV)
    assert (res.weights is not None) == need_weights
    for b, X in enumerate(Xs):
        mask = None if pad is None else _ref_mask(pad[b], n)
        for h, hd in enumerate(heads):
            want = ref.masked_self_attention(X, *hd, scaled=scaled, mask=mask)  # (D_v, N)
            np.testing.assert_allclose(res.output[b, h].numpy().T, want, rtol=0, atol=ATOL)
            if need_weights:
                allowed = ref.causal_mask(n) if mask is None else ref.causal_mask(n) & mask
                A = ref.masked_softmax_cols(_scores(hd, X, X, scaled), allowed)  # (keys, queries)
                np.testing.assert_allclose(res.weights[b, h].numpy(), A.T, rtol=0, atol=ATOL)
    if padded:  # item 0's query 0 sees only its own (padded) token: zeros, never NaN
        np.testing.assert_array_equal(res.output[0, :, 0].numpy(), 0.0)
        assert torch.isfinite(res.output).all()


@pytest.mark.parametrize("path,need_weights", CASES)
@pytest.mark.parametrize("padded", [False, True])
def test_causal_queries_align_with_the_last_keys(path, need_weights, padded):
    """S > T (a KV cache: the last T tokens' queries over all S keys) = the reference on the whole
    sequence, read at its last T columns."""
    s, t = 9, 4
    rng = np.random.default_rng(2)
    heads = _heads(rng)
    Xs = [rng.normal(size=(D, s)) for _ in range(B)]
    q = _rows(Xs, heads, 2)[:, :, s - t:]  # (B,H,S,D_q) -> the last T queries (B,H,T,D_q)
    k, v = _rows(Xs, heads, 4), _rows(Xs, heads, 0)  # (B,H,S,D_q), (B,H,S,D_v)
    pad = _pad(s, seed=3) if padded else None
    res = attend(q, k, v, similarity=_sim(True), causal=True, mask=None if pad is None else _key_mask(pad),
                 backend=path, chunk_size=3, need_weights=need_weights)
    assert res.output.shape == (B, H, t, DV)
    for b, X in enumerate(Xs):
        mask = None if pad is None else _ref_mask(pad[b], s)
        for h, hd in enumerate(heads):
            full = ref.masked_self_attention(X, *hd, scaled=True, mask=mask)  # (D_v, S)
            np.testing.assert_allclose(res.output[b, h].numpy().T, full[:, s - t:], rtol=0, atol=ATOL)
            if need_weights:
                allowed = ref.causal_mask(s) if mask is None else ref.causal_mask(s) & mask
                A = ref.masked_softmax_cols(_scores(hd, X, X, True), allowed)[:, s - t:]  # (S keys, T queries)
                np.testing.assert_allclose(res.weights[b, h].numpy(), A.T, rtol=0, atol=ATOL)


def test_offset_flash_refuses_a_causal_call():
    rng = np.random.default_rng(4)
    heads = _heads(rng)
    Xs = [rng.normal(size=(D, 5)) for _ in range(B)]
    q, k, v = _rows(Xs, heads, 2), _rows(Xs, heads, 4), _rows(Xs, heads, 0)
    for name in NEEDS_OFFSET_BIAS:
        with pytest.raises(ValueError, match=name):
            attend(q, k, v, similarity=_sim(True), causal=True, backend=name)


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention(causal=True) against the multi-head reference


def _reference_heads(mha):
    """The book's per-head maps sliced from the fused weight rows [0:C] queries, [C:2C] keys,
    [2C:3C] values (``nn.Linear`` computes x Wᵀ + b, i.e. W X + b 1ᵀ on columns); Ω_c, β_c = the
    output map."""
    C, Dh = mha.d_model, mha.d_head
    W = mha.qkv_proj.weight.detach().numpy()
    bvec = mha.qkv_proj.bias.detach().numpy()
    heads = []
    for h in range(mha.n_heads):
        q, k, v = (slice(base + h * Dh, base + (h + 1) * Dh) for base in (0, C, 2 * C))
        heads.append((W[v], bvec[v][:, None], W[q], bvec[q][:, None], W[k], bvec[k][:, None]))
    return heads, mha.out_proj.weight.detach().numpy(), mha.out_proj.bias.detach().numpy()[:, None]


@pytest.mark.parametrize("path,need_weights", CASES)
@pytest.mark.parametrize("padded", [False, True])
def test_multihead_causal_equals_reference(path, need_weights, padded):
    torch.manual_seed(5)
    C, nh, t = 24, 3, 7
    mha = build_attention(C, nh, backend=path, chunk_size=3).double().eval()
    x = torch.randn(B, t, C, dtype=torch.float64)
    pad = _pad(t, seed=6) if padded else None
    with torch.no_grad():  # the inplace backend runs without autograd
        res = mha(x, None if pad is None else torch.from_numpy(pad), causal=True, need_weights=need_weights)
    heads, omega_c, beta_c = _reference_heads(mha)
    for b in range(B):
        X = x[b].numpy().T  # (C, T): one column per token
        mask = None if pad is None else _ref_mask(pad[b], t)
        want = ref.multihead_self_attention(X, heads, omega_c, causal=True, mask=mask) + beta_c  # + β_c 1ᵀ
        np.testing.assert_allclose(res.output[b].numpy().T, want, rtol=0, atol=ATOL)
        if need_weights:
            allowed = ref.causal_mask(t) if mask is None else ref.causal_mask(t) & mask
            for h, hd in enumerate(heads):
                A = ref.masked_softmax_cols(_scores(hd, X, X, True), allowed)
                np.testing.assert_allclose(res.weights[b, h].numpy(), A.T, rtol=0, atol=ATOL)
    if padded:  # a query with no visible key: the heads give zeros, so the output is β_c
        np.testing.assert_allclose(res.output[0, 0].numpy(), beta_c[:, 0], rtol=0, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# attend with T ≠ S (queries from one sequence, keys/values from another) against cross_attention


@pytest.mark.parametrize("path,need_weights", CASES)
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_attend_cross_equals_cross_attention(path, need_weights, scaled, padded):
    t, s = 5, 8  # decoder and encoder lengths
    rng = np.random.default_rng(7)
    heads = _heads(rng, d_q_in=D, d_kv_in=DE)  # Ω_q reads the decoder's D, Ω_k and Ω_v the encoder's D_enc
    X_dec = [rng.normal(size=(D, t)) for _ in range(B)]
    X_enc = [rng.normal(size=(DE, s)) for _ in range(B)]
    q = _rows(X_dec, heads, 2)  # (B,H,T,D_q): Q from the decoder
    k, v = _rows(X_enc, heads, 4), _rows(X_enc, heads, 0)  # (B,H,S,D_q), (B,H,S,D_v): K, V from the encoder
    pad = None
    if padded:
        pad = _pad(s, seed=8)
        pad[2] = False  # item 2's encoder is all padding: every decoder query gets zeros
    res = attend(q, k, v, similarity=_sim(scaled), mask=None if pad is None else _key_mask(pad),
                 backend=path, chunk_size=2, need_weights=need_weights)
    assert res.output.shape == (B, H, t, DV)
    for b in range(B):
        enc_mask = None if pad is None else pad[b]
        for h, hd in enumerate(heads):
            want = ref.cross_attention(X_dec[b], X_enc[b], *hd, scaled=scaled, enc_mask=enc_mask)  # (D_v, T)
            np.testing.assert_allclose(res.output[b, h].numpy().T, want, rtol=0, atol=ATOL)
            if need_weights:
                scores = _scores(hd, X_dec[b], X_enc[b], scaled)  # (S encoder keys, T decoder queries)
                A = (ref.softmax_cols(scores) if enc_mask is None
                     else ref.masked_softmax_cols(scores, _ref_mask(enc_mask, t)))
                np.testing.assert_allclose(res.weights[b, h].numpy(), A.T, rtol=0, atol=ATOL)
    if padded:
        np.testing.assert_array_equal(res.output[2].numpy(), 0.0)
