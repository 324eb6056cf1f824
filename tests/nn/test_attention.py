"""Tests of :class:`qkv.nn.attention.MultiHeadAttention`.

* against ``torch.nn.MultiheadAttention(batch_first=True)`` with copied weights (float32, 1e-5),
  with and without key padding, need_weights on and off, causal, forward and backward;
* permutation equivariance Sa[XP] = Sa[X]P (no positions);
* ``qkv_proj=False`` / ``out_proj=False`` / ``bias=False`` against the NumPy reference (float64);
* ``qk_pos`` goes into queries and keys only, never into the values (hand computation, float64);
* bad input → ``ValueError`` naming the value and what is allowed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from qkv import reference as ref
from qkv.models.builders import build_attention
from qkv.nn.attention import AttentionOutput
from qkv.nn.masks import causal_mask

BUILTIN = ("dot", "scaled_dot", "bilinear", "additive", "cosine")
B, T, C, NH = 5, 7, 24, 3  # distinct sizes; head dim 8
DH = C // NH
PATHS = ("auto", "sdpa", "explicit", "chunked")



def _pad(seed=0):
    g = torch.Generator().manual_seed(seed)
    pad = torch.rand(B, T, generator=g) > 0.35
    pad[:, 1] = True  # every sequence keeps a real token (torch's module returns NaN otherwise)
    pad[0] = True  # and one is unpadded
    return pad


def _pair(path="auto", seed=0):
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(C, NH, batch_first=True)
    with torch.no_grad():  # torch zero-initialises the biases; make them count
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = build_attention(C, NH, backend=path, chunk_size=3)
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(theirs.in_proj_weight)  # rows [q; k; v] in both
        ours.qkv_proj.bias.copy_(theirs.in_proj_bias)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    return ours, theirs


# ---------------------------------------------------------------------------------------------
# against torch.nn.MultiheadAttention


@pytest.mark.parametrize(  # the fused path cannot return weights (a ValueError, tested below)
    "path, need_weights", [(p, w) for p in PATHS for w in (False, True) if not (p == "sdpa" and w)]
)
@pytest.mark.parametrize("padded", [False, True], ids=["no_pad", "pad"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_matches_torch_multihead_attention(path, padded, need_weights, grad):
    ours, theirs = _pair(path)
    if not grad:  # eval + no_grad lets torch take its own fused fast path
        ours.eval(), theirs.eval()
    x = torch.randn(B, T, C)
    pad = _pad() if padded else None
    with torch.set_grad_enabled(grad):
        got = ours(x, pad, need_weights=need_weights)
        want, want_w = theirs(x, x, x, key_padding_mask=None if pad is None else ~pad,
                              need_weights=need_weights, average_attn_weights=False)
    assert isinstance(got, AttentionOutput)
    assert got.output.shape == (B, T, C)
    torch.testing.assert_close(got.output, want, rtol=0, atol=1e-5)
    if need_weights:
        assert got.weights.shape == (B, NH, T, T)
        torch.testing.assert_close(got.weights, want_w, rtol=0, atol=1e-5)
    else:
        assert got.weights is None


@pytest.mark.parametrize("path", PATHS)
def test_matches_torch_causal_and_gradients(path):
    ours, theirs = _pair(path, seed=1)
    x0 = torch.randn(B, T, C)
    pad = _pad(1)
    g_out = torch.randn(B, T, C)
    res = {}
    for who, mod in (("ours", ours), ("theirs", theirs)):
        x = x0.clone().requires_grad_()
        if who == "ours":
            out = mod(x, pad, causal=True).output
        else:
            out, _ = mod(x, x, x, key_padding_mask=~pad, attn_mask=~causal_mask(T), need_weights=False)
        (out * g_out).sum().backward()
        res[who] = (out.detach(), x.grad)
    torch.testing.assert_close(res["ours"][0], res["theirs"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(res["ours"][1], res["theirs"][1], rtol=0, atol=1e-5)
    ours_g = [ours.qkv_proj.weight.grad, ours.qkv_proj.bias.grad, ours.out_proj.weight.grad,
              ours.out_proj.bias.grad]
    theirs_g = [theirs.in_proj_weight.grad, theirs.in_proj_bias.grad, theirs.out_proj.weight.grad,
                theirs.out_proj.bias.grad]
    for a, b in zip(ours_g, theirs_g):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# permutation equivariance


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("path", ["auto", "chunked"])
def test_permutation_equivariance(name, path):
    torch.manual_seed(2)
    mha = build_attention(C, NH, similarity=name, backend=path, chunk_size=3)
    x = torch.randn(B, T, C)
    pad = _pad(2)
    perm = torch.randperm(T)
    assert not torch.equal(perm, torch.arange(T))
    with torch.no_grad():
        a = mha(x, pad, need_weights=path == "chunked")
        b = mha(x[:, perm], pad[:, perm], need_weights=path == "chunked")
    torch.testing.assert_close(b.output, a.output[:, perm], rtol=0, atol=1e-5)  # Sa[XP] = Sa[X]P
    if a.weights is not None:
        torch.testing.assert_close(b.weights, a.weights[:, :, perm][..., perm], rtol=0, atol=1e-6)
    # with positions on q and k the symmetry is broken (a sanity check of the test itself)
    pos = torch.randn(T, C)
    with torch.no_grad():
        c = mha(x, pad, qk_pos=pos).output
        d = mha(x[:, perm], pad[:, perm], qk_pos=pos).output
    assert not torch.allclose(d, c[:, perm], atol=1e-3)


# ---------------------------------------------------------------------------------------------
# ablations against the reference (float64)


def _selector(h):
    """(D/H × C) map picking head h's slice of the embedding: Ω = [0 … I … 0], β = 0."""
    return np.eye(C)[h * DH:(h + 1) * DH]


@pytest.mark.parametrize("out_proj", [True, False])
@pytest.mark.parametrize("path", PATHS)
def test_no_qkv_proj_is_attention_on_the_embeddings(out_proj, path):
    torch.manual_seed(3)
    mha = build_attention(C, NH, qkv_proj=False, out_proj=out_proj, backend=path, chunk_size=2).double()
    assert mha.qkv_proj is None
    assert not any("qkv" in n for n, _ in mha.named_parameters())
    x = torch.randn(B, T, C, dtype=torch.float64)
    res = mha(x, need_weights=path in ("explicit", "chunked"))
    zero = np.zeros((DH, 1))
    heads = [(_selector(h), zero, _selector(h), zero, _selector(h), zero) for h in range(NH)]
    if out_proj:
        omega_c = mha.out_proj.weight.detach().numpy()
        beta_c = mha.out_proj.bias.detach().numpy()[:, None]
    else:
        assert mha.out_proj is None and len(list(mha.parameters())) == 0
        omega_c, beta_c = np.eye(C), np.zeros((C, 1))
    for b in range(B):
        X = x[b].numpy().T  # (C, T)
        want = ref.multihead_self_attention(X, heads, omega_c) + beta_c
        np.testing.assert_allclose(res.output[b].detach().numpy().T, want, rtol=0, atol=1e-10)
        if res.weights is not None:  # head h: softmax over keys of x_h(m)·x_h(n)/√D
            for h in range(NH):
                Xh = X[h * DH:(h + 1) * DH]
                A = ref.softmax_cols(Xh.T @ Xh / math.sqrt(DH))
                np.testing.assert_allclose(res.weights[b, h].detach().numpy(), A.T, rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", PATHS)
def test_shared_qk_is_the_textbook_with_the_key_map_equal_to_the_query_map(path):
    """One map for queries and keys: the NumPy reference with Ω_k = Ω_q, β_k = β_q per head, and a
    symmetric score matrix kᵀq in every head."""
    torch.manual_seed(4)
    mha = build_attention(C, NH, shared_qk=True, backend=path, chunk_size=2).double()
    assert tuple(mha.qkv_proj.weight.shape) == (2 * C, C) and mha.qk_rows == C
    x = torch.randn(B, T, C, dtype=torch.float64)
    res = mha(x, need_weights=path in ("explicit", "chunked"))
    W = mha.qkv_proj.weight.detach().numpy()  # (2C, C): rows q = k | v
    bvec = mha.qkv_proj.bias.detach().numpy()[:, None]
    heads = []
    for h in range(NH):
        q_rows, v_rows = slice(h * DH, (h + 1) * DH), slice(C + h * DH, C + (h + 1) * DH)
        heads.append((W[v_rows], bvec[v_rows], W[q_rows], bvec[q_rows], W[q_rows], bvec[q_rows]))  # (v, q, k = q)
    omega_c, beta_c = mha.out_proj.weight.detach().numpy(), mha.out_proj.bias.detach().numpy()[:, None]
    for b in range(B):
        X = x[b].numpy().T  # (C, T)
        want = ref.multihead_self_attention(X, heads, omega_c) + beta_c
        np.testing.assert_allclose(res.output[b].detach().numpy().T, want, rtol=0, atol=1e-10)
    q, k, _ = mha.project(x)
    assert q is k  # one tensor: the scores kᵀq of a head are symmetric
    with pytest.raises(ValueError, match="shared_qk=True needs a qkv_proj and n_kv_heads = n_heads"):
        build_attention(C, NH, shared_qk=True, n_kv_heads=1)
    with pytest.raises(ValueError, match="shared_qk=True needs a qkv_proj"):
        build_attention(C, NH, shared_qk=True, qkv_proj=False)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("path", ["sdpa", "chunked"])
def test_no_out_proj_is_the_stack_of_heads(bias, path):
    torch.manual_seed(4)
    mha = build_attention(C, NH, out_proj=False, bias=bias, backend=path, chunk_size=4).double()
    assert mha.out_proj is None
    assert (mha.qkv_proj.bias is None) == (not bias)
    x = torch.randn(B, T, C, dtype=torch.float64)
    out = mha(x).output.detach()
    W = mha.qkv_proj.weight.detach().numpy()
    bv = mha.qkv_proj.bias.detach().numpy() if bias else np.zeros(3 * C)
    for b in range(B):
        X = x[b].numpy().T
        for h in range(NH):
            rows = lambda base: slice(base + h * DH, base + (h + 1) * DH)  # noqa: E731
            q, k, v = rows(0), rows(C), rows(2 * C)
            want = ref.self_attention(X, W[v], bv[v][:, None], W[q], bv[q][:, None], W[k],
                                      bv[k][:, None], scaled=True)  # (D, T)
            np.testing.assert_allclose(out[b, :, h * DH:(h + 1) * DH].numpy().T, want, rtol=0,
                                       atol=1e-10)


# ---------------------------------------------------------------------------------------------
# qk_pos: positions into the query and key maps only


def _by_hand(mha, x, pos_q, pos_v, pad=None):
    """Attention with positions ``pos_q`` added to the input of q and k, ``pos_v`` to that of v."""
    if mha.qkv_proj is None:
        q = k = x + pos_q
        v = x + pos_v
    else:
        Wq, Wk, Wv = mha.qkv_proj.weight.detach().split(C)
        bq, bk, bv = mha.qkv_proj.bias.detach().split(C)
        q, k, v = (x + pos_q) @ Wq.T + bq, (x + pos_q) @ Wk.T + bk, (x + pos_v) @ Wv.T + bv
    heads = lambda t: t.reshape(B, T, NH, DH).transpose(1, 2)  # noqa: E731  (B,T,C) -> (B,H,T,D)
    q, k, v = heads(q), heads(k), heads(v)
    s = q @ k.transpose(-2, -1) / math.sqrt(DH)  # (B,H,T,T)
    if pad is not None:
        s = s.masked_fill(~pad[:, None, None, :], float("-inf"))
    out = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    if mha.out_proj is not None:
        out = out @ mha.out_proj.weight.detach().T + mha.out_proj.bias.detach()
    return out


@pytest.mark.parametrize("qkv_proj", [True, False])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("batched_pos", [False, True], ids=["pos_TC", "pos_BTC"])
def test_qk_pos_only_enters_queries_and_keys(qkv_proj, path, batched_pos):
    torch.manual_seed(5)
    mha = build_attention(C, NH, qkv_proj=qkv_proj, backend=path, chunk_size=3).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    pos = torch.randn(B, T, C, dtype=torch.float64) if batched_pos else torch.randn(T, C, dtype=torch.float64)
    pad = _pad(5)
    got = mha(x, pad, qk_pos=pos).output.detach()
    want = _by_hand(mha, x, pos, 0.0, pad)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    # positions added to the input itself (values too) give something else
    assert not torch.allclose(got, _by_hand(mha, x, pos, pos, pad), atol=1e-3)
    # zero positions change nothing
    torch.testing.assert_close(mha(x, pad, qk_pos=torch.zeros(T, C, dtype=torch.float64)).output.detach(),
                               mha(x, pad).output.detach(), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# small behaviours


def test_dropout_only_in_training():
    torch.manual_seed(6)
    a = build_attention(C, NH, dropout=0.5, backend="explicit")
    b = build_attention(C, NH, dropout=0.0, backend="explicit")
    b.load_state_dict(a.state_dict())
    x = torch.randn(B, T, C)
    a.eval()
    torch.testing.assert_close(a(x).output, b(x).output, rtol=0, atol=0)
    a.train()
    assert not torch.allclose(a(x).output, b(x).output)
    torch.testing.assert_close(a(x, need_weights=True).weights, b(x, need_weights=True).weights,
                               rtol=0, atol=0)  # weights are reported before dropout


def test_weights_sum_to_one_over_real_keys_and_ignore_padding():
    torch.manual_seed(7)
    mha = build_attention(C, NH, similarity="additive")
    x = torch.randn(B, T, C)
    pad = _pad(7)
    w = mha(x, pad, need_weights=True).weights
    assert (w[~pad[:, None, None, :].expand_as(w)] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(B, NH, T))
    # the content of padded tokens cannot leak into real ones
    x2 = x.clone()
    x2[~pad] = 100.0
    torch.testing.assert_close(mha(x2, pad).output[pad], mha(x, pad).output[pad], rtol=0, atol=1e-5)


@pytest.mark.parametrize(  # additive has no dot-product form: sdpa is a ValueError, tested below
    "name, path", [(n, p) for n in BUILTIN for p in PATHS if not (n == "additive" and p == "sdpa")]
)
def test_fully_padded_sequence_gives_output_bias_and_no_nan(name, path):
    torch.manual_seed(8)
    mha = build_attention(C, NH, similarity=name, backend=path, chunk_size=3)
    x = torch.randn(B, T, C, requires_grad=True)
    pad = _pad(8)
    pad[2] = False  # every key of sequence 2 is padding
    res = mha(x, pad, causal=True, need_weights=path in ("explicit", "chunked"))
    assert not res.output.isnan().any()
    # attention gives zeros there, so only the output map's bias is left
    torch.testing.assert_close(res.output[2], mha.out_proj.bias.detach().expand(T, C), rtol=0, atol=0)
    if res.weights is not None:
        assert (res.weights[2] == 0).all() and not res.weights.isnan().any()
    res.output.square().sum().backward()
    assert (x.grad[2] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in mha.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------
# bad input


def _raises(needles, fn, *args, **kwargs):
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_bad_constructor_arguments():
    _raises(["d_model=24", "n_heads=5", "[1, 2, 3, 4, 6, 8, 12, 24]"], build_attention, 24, 5)
    _raises(["d_model", "0"], build_attention, 0, 3)
    _raises(["n_heads", "0"], build_attention, 24, 0)
    _raises(["n_heads", "2.0"], build_attention, 24, 2.0)
    _raises(["'softmax_dot'", "additive", "bilinear", "cosine", "dot", "scaled_dot"],
            build_attention, C, NH, similarity="softmax_dot")
    _raises(["'flash'", "auto", "sdpa", "explicit", "chunked"], build_attention, C, NH, backend="flash")
    _raises(["1.5", "[0, 1)"], build_attention, C, NH, dropout=1.5)


def test_bad_forward_inputs():
    mha = build_attention(C, NH)
    x = torch.randn(B, T, C)
    _raises(["(7, 24)", "3-D", "C=24"], mha, x[0])
    _raises(["(1, 5, 7, 24)", "3-D"], mha, x[None])
    _raises(["list", "3-D"], mha, x.tolist())
    _raises(["C=20", "d_model=24"], mha, x[..., :20])
    _raises(["torch.float32", "bool"], mha, x, torch.ones(B, T))
    _raises(["torch.int64", "bool"], mha, x, torch.ones(B, T, dtype=torch.long))
    _raises(["(5, 8)", "(5, 7)"], mha, x, torch.ones(B, T + 1, dtype=torch.bool))
    _raises(["(7, 5)", "(5, 7)"], mha, x, torch.ones(T, B, dtype=torch.bool))
    _raises(["(7,)", "(5, 7)"], mha, x, torch.ones(T, dtype=torch.bool))
    _raises(["(5, 1, 1, 7)", "(5, 7)"], mha, x, torch.ones(B, 1, 1, T, dtype=torch.bool))
    _raises(["(7, 25)", "(7,24)"], mha, x, qk_pos=torch.zeros(T, C + 1))
    _raises(["(8, 24)", "(7,24)"], mha, x, qk_pos=torch.zeros(T + 1, C))
    _raises(["(24,)", "(7,24)"], mha, x, qk_pos=torch.zeros(C))
    _raises(["weights", "explicit"], build_attention(C, NH, backend="sdpa"), x, need_weights=True)
    _raises(["additive", "explicit"], build_attention(C, NH, similarity="additive", backend="sdpa"), x)
