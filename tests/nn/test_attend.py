"""Tests of the staged attention core :func:`qkv.nn.attend.attend`.

* float64 torch paths against the NumPy textbook reference (``qkv.reference``, D×N columns);
* the sdpa, explicit and chunked paths against each other (float32; outputs 1e-5, weights 1e-6),
  with masks, causal, bias tensors and row-block bias functions, odd chunk sizes;
* fully-masked query rows: zeros, never NaN, forward and backward, on every path;
* hypothesis properties over random shapes and masks;
* bad input → ``ValueError`` naming the value and what is allowed.

Row convention here: ``q (B,H,T,D)``, one row per token; the reference's ``X`` is ``x.T``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkv import reference as ref
from qkv.nn.attend import attend
from qkv.nn.attention import MultiHeadAttention
from qkv.models.builders import build_attention
from qkv.nn.masks import causal_mask
from qkv.nn.similarity import SIMILARITIES, build_similarity

BUILTIN = ("dot", "scaled_dot", "bilinear", "additive", "cosine")
B, H, T, S, D, E = 5, 3, 7, 9, 8, 6  # distinct sizes (S ≠ T: keys need not be the queries)



def _paths_for(name):
    return ("sdpa", "explicit", "chunked") if SIMILARITIES[name].has_dot_form else ("explicit", "chunked")


def _sim(name, h=H, d=D, dtype=torch.float32, seed=0):
    sim = build_similarity(name, n_heads=h, d_head=d).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # move off the default initialisation
        for p in sim.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return sim


def _qkv(seed=0, b=B, h=H, t=T, s=S, d=D, e=E, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, s, d, generator=g, dtype=dtype)
    v = torch.randn(b, h, s, e, generator=g, dtype=dtype)
    return q, k, v


# ---------------------------------------------------------------------------------------------
# float64 against the textbook reference


@pytest.mark.parametrize("path", ["sdpa", "explicit", "chunked"])
@pytest.mark.parametrize("scaled", [False, True])
def test_single_head_equals_reference(path, scaled):
    d, n, dq, dv, b = 6, 7, 4, 5, 3
    rng = np.random.default_rng(0)
    om_q, om_k, om_v = rng.normal(size=(dq, d)), rng.normal(size=(dq, d)), rng.normal(size=(dv, d))
    be_q, be_k, be_v = rng.normal(size=(dq, 1)), rng.normal(size=(dq, 1)), rng.normal(size=(dv, 1))
    Xs = [rng.normal(size=(d, n)) for _ in range(b)]  # one D×N matrix per batch item
    x = torch.from_numpy(np.stack([X.T for X in Xs]))  # (B,N,D): row n = column n of X

    def rows(om, be):  # x Ωᵀ + βᵀ: (B,N,D)(D,rows) -> (B,N,rows), then a head axis
        return (x @ torch.from_numpy(om).T + torch.from_numpy(be).T)[:, None]  # (B,1,N,rows)

    q, k, v = rows(om_q, be_q), rows(om_k, be_k), rows(om_v, be_v)
    sim = build_similarity("scaled_dot" if scaled else "dot", n_heads=1, d_head=dq)
    res = attend(q, k, v, similarity=sim, backend=path, chunk_size=3, need_weights=path != "sdpa")
    assert res.output.dtype == torch.float64 and res.output.shape == (b, 1, n, dv)
    for i, X in enumerate(Xs):
        want = ref.self_attention(X, om_v, be_v, om_q, be_q, om_k, be_k, scaled=scaled)  # (D_v, N)
        np.testing.assert_allclose(res.output[i, 0].numpy().T, want, rtol=0, atol=1e-10)
        if res.weights is not None:
            Q, K = om_q @ X + be_q, om_k @ X + be_k
            A = ref.softmax_cols(K.T @ Q / (np.sqrt(dq) if scaled else 1.0))  # (keys, queries)
            np.testing.assert_allclose(res.weights[i, 0].numpy(), A.T, rtol=0, atol=1e-10)


def _reference_heads(mha: MultiHeadAttention):
    """Book-convention maps of each head, sliced from the fused weight rows
    [0:C] = queries, [C:2C] = keys, [2C:3C] = values; Ω_c = the output map."""
    C, Dh = mha.d_model, mha.d_head
    W = mha.qkv_proj.weight.detach().numpy()
    bvec = mha.qkv_proj.bias.detach().numpy()
    heads = []
    for h in range(mha.n_heads):
        sl = lambda base: slice(base + h * Dh, base + (h + 1) * Dh)  # noqa: E731
        q, k, v = sl(0), sl(C), sl(2 * C)
        heads.append((W[v], bvec[v][:, None], W[q], bvec[q][:, None], W[k], bvec[k][:, None]))
    return heads, mha.out_proj.weight.detach().numpy(), mha.out_proj.bias.detach().numpy()[:, None]


@pytest.mark.parametrize("path", ["auto", "sdpa", "explicit", "chunked"])
def test_multihead_equals_reference(path):
    torch.manual_seed(0)
    C, nh = 24, 3
    mha = build_attention(C, nh, backend=path, chunk_size=3).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    need = path in ("explicit", "chunked")
    res = mha(x, need_weights=need)
    heads, omega_c, beta_c = _reference_heads(mha)
    for b in range(B):
        X = x[b].numpy().T  # (C, T)
        want = ref.multihead_self_attention(X, heads, omega_c) + beta_c  # Ω_c·heads + β_c 1ᵀ
        np.testing.assert_allclose(res.output[b].detach().numpy().T, want, rtol=0, atol=1e-10)
        if need:
            for h, (om_v, be_v, om_q, be_q, om_k, be_k) in enumerate(heads):
                Q, K = om_q @ X + be_q, om_k @ X + be_k
                A = ref.softmax_cols(K.T @ Q / np.sqrt(C // nh))
                np.testing.assert_allclose(res.weights[b, h].detach().numpy(), A.T, rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", ["sdpa", "explicit", "chunked"])
def test_multihead_masks_equal_reference_on_subsequences(path):
    """Key padding = the reference on the real tokens only; causal = the reference on each prefix."""
    torch.manual_seed(1)
    C, nh = 24, 3
    mha = build_attention(C, nh, backend=path, chunk_size=2).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    pad = torch.rand(B, T) > 0.4
    pad[:, 3] = True  # at least one real token per sequence
    heads, omega_c, beta_c = _reference_heads(mha)
    out = mha(x, pad).output.detach()
    for b in range(B):
        X = x[b].numpy().T[:, pad[b].numpy()]  # real tokens only, (C, n_real)
        want = ref.multihead_self_attention(X, heads, omega_c) + beta_c
        np.testing.assert_allclose(out[b][pad[b]].numpy().T, want, rtol=0, atol=1e-10)
    out = mha(x, causal=True).output.detach()
    for b in range(B):
        for n in range(T):
            X = x[b, : n + 1].numpy().T  # prefix up to and including token n
            want = ref.multihead_self_attention(X, heads, omega_c)[:, -1] + beta_c[:, 0]
            np.testing.assert_allclose(out[b, n].numpy(), want, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# the three paths agree (float32)


class RowBias:
    """A row-block bias function over a full (1,H,T,S) tensor that records the blocks asked for."""

    def __init__(self, full):
        self.full, self.calls = full, []

    def __call__(self, start, stop):
        self.calls.append((start, stop))
        return self.full[:, :, start:stop]


def _case(name, t=T, s=S):
    g = torch.Generator().manual_seed(5)
    key_pad = torch.rand(B, 1, 1, s, generator=g) > 0.3
    key_pad[..., 0] = True
    full = torch.rand(B, H, t, s, generator=g) > 0.4
    bias = torch.randn(1, H, t, s, generator=g)
    bias_b = torch.randn(B, 1, t, s, generator=g)
    bias_row = torch.randn(H, 1, s, generator=g)  # one bias per key, shared by all queries
    cases = {
        "none": {},
        "key_pad": {"mask": key_pad},
        "full_mask": {"mask": full},
        "mask_2d": {"mask": full[0, 0]},
        "causal": {"causal": True},
        "causal_key_pad": {"causal": True, "mask": key_pad},
        "bias": {"bias": bias},
        "bias_batch_mask": {"bias": bias_b, "mask": full},
        "bias_3d_rowvec": {"bias": bias_row, "mask": key_pad},
        "callable_bias": {"bias": RowBias(bias)},
        "callable_bias_causal_mask": {"bias": RowBias(bias_b.expand(B, H, t, s)), "causal": True,
                                      "mask": full},
    }
    return cases[name]


CASES = ["none", "key_pad", "full_mask", "mask_2d", "causal", "causal_key_pad", "bias",
         "bias_batch_mask", "bias_3d_rowvec", "callable_bias", "callable_bias_causal_mask"]


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("square", [False, True], ids=["S!=T", "S==T"])
def test_paths_agree(name, case, square):
    s = T if square else S
    q, k, v = _qkv(seed=2, s=s)
    sim = _sim(name)
    kw = _case(case, s=s)
    base = attend(q, k, v, similarity=sim, backend="explicit", need_weights=True, **kw)
    assert base.weights.shape == (B, H, T, s) and not base.output.isnan().any()
    assert attend(q, k, v, similarity=sim, backend="explicit", **kw).weights is None
    if "sdpa" in _paths_for(name):
        out = attend(q, k, v, similarity=sim, backend="sdpa", **kw)
        assert out.weights is None
        torch.testing.assert_close(out.output, base.output, rtol=0, atol=1e-5)
        auto = attend(q, k, v, similarity=sim, **kw).output
        torch.testing.assert_close(auto, base.output, rtol=0, atol=1e-5)
    for chunk in (1, 2, 3, 4, 5, 6, 8, None):
        if isinstance(kw.get("bias"), RowBias):
            kw["bias"].calls.clear()
        res = attend(q, k, v, similarity=sim, backend="chunked", chunk_size=chunk, need_weights=True, **kw)
        torch.testing.assert_close(res.output, base.output, rtol=0, atol=1e-5)
        torch.testing.assert_close(res.weights, base.weights, rtol=0, atol=1e-6)
        if isinstance(kw.get("bias"), RowBias):  # asked once per block, blocks tile [0, T)
            c = T if chunk is None else chunk
            assert kw["bias"].calls == [(a, min(T, a + c)) for a in range(0, T, c)]
    # a small budget makes the default chunk small; auto with weights then goes chunked
    small = attend(q, k, v, similarity=sim, need_weights=True, budget=B * H * s * 2 * 10, **kw)
    torch.testing.assert_close(small.weights, base.weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(small.output, base.output, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("case", ["key_pad", "causal_key_pad", "bias_batch_mask", "callable_bias"])
def test_path_gradients_agree(name, case):
    """Backward through every path (the chunked one recomputes blocks under checkpointing)."""
    q0, k0, v0 = _qkv(seed=3)
    sim = _sim(name)
    kw = _case(case)
    if isinstance(kw.get("bias"), torch.Tensor):
        kw["bias"] = kw["bias"].clone().requires_grad_()
    g_out = torch.randn(B, H, T, E, generator=torch.Generator().manual_seed(4))
    grads = {}
    for path, chunk in [(p, 3) for p in _paths_for(name)] + [("chunked", 1), ("chunked", 4)]:
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        sim.zero_grad()
        bias = kw.get("bias")
        if isinstance(bias, torch.Tensor):
            bias.grad = None
        out = attend(q, k, v, similarity=sim, backend=path, chunk_size=chunk, **kw).output
        (out * g_out).sum().backward()
        got = [q.grad, k.grad, v.grad] + [p.grad for p in sim.parameters()]
        if isinstance(bias, torch.Tensor):
            got.append(bias.grad)
        grads[(path, chunk)] = got
    want = grads[("explicit", 3)]
    for key, got in grads.items():
        for a, b in zip(got, want):
            assert torch.isfinite(a).all(), key
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=lambda m: f"{key}: {m}")


def test_weights_are_before_dropout_and_checkpointing_replays_dropout():
    q0, k0, v0 = _qkv(seed=6)
    sim = _sim("scaled_dot")
    clean = attend(q0, k0, v0, similarity=sim, backend="explicit", need_weights=True)
    torch.manual_seed(0)
    dropped = attend(q0, k0, v0, similarity=sim, backend="explicit", need_weights=True, dropout_p=0.5)
    torch.testing.assert_close(dropped.weights, clean.weights, rtol=0, atol=0)
    assert not torch.allclose(dropped.output, clean.output)
    # chunked with autograd: checkpointed blocks (no weights) vs plain blocks (weights) use the
    # same random stream, so outputs and gradients are identical
    res = {}
    for need in (False, True):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        torch.manual_seed(1)
        out = attend(q, k, v, similarity=sim, backend="chunked", chunk_size=3, dropout_p=0.5,
                     need_weights=need).output
        out.square().sum().backward()
        res[need] = (out.detach(), q.grad, k.grad, v.grad)
    for a, b in zip(res[False], res[True]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("callable_bias", [False, True])
def test_bias_dtype_follows_the_queries_on_every_path(callable_bias):
    q, k, v = _qkv(seed=9)
    sim = _sim("scaled_dot")
    full = torch.randn(1, H, T, S, dtype=torch.float64)  # e.g. a position table kept in float64
    bias = RowBias(full) if callable_bias else full
    want = attend(q, k, v, similarity=sim, bias=full.float(), backend="explicit").output
    for path in ("sdpa", "explicit", "chunked"):
        res = attend(q, k, v, similarity=sim, bias=bias, backend=path, chunk_size=3,
                     need_weights=path != "sdpa")
        assert res.output.dtype == torch.float32, path
        torch.testing.assert_close(res.output, want, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# fully-masked query rows: zeros, never NaN


def _empty_row_cases():
    g = torch.Generator().manual_seed(7)
    m = torch.rand(B, H, T, S, generator=g) > 0.5
    m[:, :, 2] = False  # query 2 sees no key in any head
    m[1, 0, 4] = False  # query 4 of one head in one batch item
    pad = torch.ones(B, 1, 1, S, dtype=torch.bool)
    pad[3] = False  # a sequence with every key padded
    return {
        "rows": ({"mask": m}, S),
        "all_keys_padded": ({"mask": pad}, S),
        "causal_T_gt_S": ({"causal": True}, 4),  # aligned at the end: queries 0..2 see nothing
        "rows_with_bias": ({"mask": m, "bias": torch.randn(1, H, T, S, generator=g)}, S),
        "rows_with_callable_bias": ({"mask": m, "bias": RowBias(torch.randn(B, H, T, S, generator=g))}, S),
    }


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("case", ["rows", "all_keys_padded", "causal_T_gt_S", "rows_with_bias",
                                  "rows_with_callable_bias"])
def test_fully_masked_rows_give_zeros_never_nan(name, case):
    kw, s = _empty_row_cases()[case]
    q0, k0, v0 = _qkv(seed=8, s=s)
    allowed = torch.ones(B, H, T, s, dtype=torch.bool)
    if "mask" in kw:
        allowed = allowed & kw["mask"]
    if kw.get("causal"):
        allowed = allowed & causal_mask(T, s)
    empty = ~allowed.any(-1)  # (B,H,T)
    assert empty.any()
    sim = _sim(name)
    for path in _paths_for(name):
        for chunk in (2, 3):
            q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
            need = path != "sdpa"
            res = attend(q, k, v, similarity=sim, backend=path, chunk_size=chunk, need_weights=need, **kw)
            assert not res.output.isnan().any(), path
            assert (res.output[empty] == 0).all(), path
            assert (res.output[~empty].abs().sum(-1) > 0).all(), path
            if need:
                assert not res.weights.isnan().any()
                assert (res.weights[empty] == 0).all()
                assert (res.weights[~allowed] == 0).all()
                torch.testing.assert_close(res.weights.sum(-1)[~empty], torch.ones(int((~empty).sum())))
            # backward too: finite everywhere, and an empty query row receives no gradient
            res.output.pow(2).sum().backward()
            for t in (q, k, v) + tuple(sim.parameters()):
                assert torch.isfinite(t.grad).all(), (path, chunk)
            assert (q.grad[empty] == 0).all(), path
            sim.zero_grad()


# ---------------------------------------------------------------------------------------------
# hypothesis properties over random shapes and masks


@st.composite
def attention_problems(draw):
    b, h = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    t, s, d = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    full = (b, h, t, s)
    mask_shape = tuple(n if draw(st.booleans()) else 1 for n in full)
    use_mask = draw(st.booleans())
    return {
        "shape": full,
        "d": d,
        "mask_shape": mask_shape if use_mask else None,
        "density": draw(st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0])),
        "causal": draw(st.booleans()),
        "name": draw(st.sampled_from(BUILTIN)),
        "path": draw(st.sampled_from(["explicit", "chunked"])),
        "chunk": draw(st.integers(1, t + 1)),
        "magnitude": draw(st.sampled_from([1.0, 30.0, 1e3])),
        "with_bias": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attention_problems())
def test_weight_properties(p):
    b, h, t, s = p["shape"]
    g = torch.Generator().manual_seed(p["seed"])
    q, k, v = _qkv(seed=p["seed"], b=b, h=h, t=t, s=s, d=p["d"], e=3)
    q, k = q * p["magnitude"], k * p["magnitude"]
    sim = _sim(p["name"], h=h, d=p["d"], seed=p["seed"])
    mask = None
    if p["mask_shape"] is not None:
        mask = torch.rand(p["mask_shape"], generator=g) < p["density"]
    bias = torch.randn(1, h, t, s, generator=g) * p["magnitude"] if p["with_bias"] else None
    res = attend(q, k, v, similarity=sim, mask=mask, bias=bias, causal=p["causal"], backend=p["path"],
                 chunk_size=p["chunk"], need_weights=True)
    w = res.weights
    allowed = torch.ones(b, h, t, s, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if p["causal"]:
        allowed = allowed & causal_mask(t, s)
    empty = ~allowed.any(-1)
    assert w.shape == (b, h, t, s)
    assert not w.isnan().any() and not res.output.isnan().any()
    assert (w >= 0).all()
    assert (w[~allowed] == 0).all()  # exactly zero, not merely small
    sums = w.sum(-1)
    torch.testing.assert_close(sums[~empty], torch.ones_like(sums[~empty]), rtol=0, atol=1e-5)
    assert (sums[empty] == 0).all() and (res.output[empty] == 0).all()
    if sim.has_dot_form:  # the fused path obeys the same rule for empty rows
        fused = attend(q, k, v, similarity=sim, mask=mask, bias=bias, causal=p["causal"], backend="sdpa")
        assert not fused.output.isnan().any()
        assert (fused.output[empty] == 0).all()
        if p["magnitude"] == 1.0:
            torch.testing.assert_close(fused.output, res.output, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# bad input


def _raises(needles, fn, *args, **kwargs):
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_bad_inputs_name_the_value_and_what_is_allowed():
    q, k, v = _qkv()
    sim = _sim("scaled_dot")
    add = _sim("additive")
    _raises(["(5, 3, 7)", "4-D"], attend, q[..., 0], k, v, similarity=sim)
    _raises(["(5, 3, 9, 8, 1)", "4-D"], attend, q, k[..., None], v, similarity=sim)
    _raises(["v", "list"], attend, q, k, [1.0], similarity=sim)
    _raises(["(5, 3)", "(4, 3)"], attend, q, k[:4], v[:4], similarity=sim)
    _raises(["(5, 3)", "(5, 2)"], attend, q, k, v[:, :2], similarity=sim)
    _raises(["9", "8"], attend, q, k, v[:, :, :8], similarity=sim)
    _raises(["8", "5"], attend, q, k[..., :5], v, similarity=sim)
    _raises(["'fast'", "sdpa", "explicit", "chunked", "auto"], attend, q, k, v, similarity=sim,
            backend="fast")
    _raises(["additive", "explicit"], attend, q, k, v, similarity=add, backend="sdpa")
    _raises(["weights", "explicit"], attend, q, k, v, similarity=sim, backend="sdpa", need_weights=True)
    _raises(["torch.float32", "bool"], attend, q, k, v, similarity=sim, mask=torch.ones(T, S))
    _raises(["torch.int64", "bool"], attend, q, k, v, similarity=sim,
            mask=torch.ones(T, S, dtype=torch.long))
    _raises(["(7, 8)", "dim S", "9"], attend, q, k, v, similarity=sim,
            mask=torch.ones(T, 8, dtype=torch.bool))
    _raises(["(9, 7)"], attend, q, k, v, similarity=sim, mask=torch.ones(S, T, dtype=torch.bool))
    _raises(["(4, 1, 1, 9)", "dim B", "5"], attend, q, k, v, similarity=sim,
            mask=torch.ones(4, 1, 1, S, dtype=torch.bool))
    _raises(["(1, 5, 3, 7, 9)", "4"], attend, q, k, v, similarity=sim,
            mask=torch.ones(1, B, H, T, S, dtype=torch.bool))
    _raises(["torch.int64", "floating"], attend, q, k, v, similarity=sim,
            bias=torch.ones(T, S, dtype=torch.long))
    _raises(["0"], attend, q, k, v, similarity=sim, backend="chunked", chunk_size=0)
    _raises(["1.0", "[0, 1)"], attend, q, k, v, similarity=sim, dropout_p=1.0)
    _raises(["-0.1", "[0, 1)"], attend, q, k, v, similarity=sim, dropout_p=-0.1)


def test_auto_path_choice_matches_docs():
    """auto: sdpa for dot forms without weights; explicit otherwise; additive never on sdpa."""
    q, k, v = _qkv()
    for name in BUILTIN:
        sim = _sim(name)
        res = attend(q, k, v, similarity=sim)
        assert res.weights is None
        ref_out = attend(q, k, v, similarity=sim, backend="explicit").output
        torch.testing.assert_close(res.output, ref_out, rtol=0, atol=1e-5)
        assert math.isfinite(float(res.output.detach().sum()))
