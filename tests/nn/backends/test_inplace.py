"""Tests of the in-place weights backend (:mod:`qkv.nn.backends.inplace`).

``need_weights=True`` without autograd (backend "auto", a dot-product similarity) fills the returned
weights in place (:func:`~qkv.nn.backends.inplace.dot_scores_`,
:func:`~qkv.nn.backends.inplace.softmax_scores_`):

* it is the backend taken under ``no_grad`` (and only when nothing needs a graph);
* it equals the explicit path (outputs 1e-5, weights 1e-6, float32) for every dot-product
  similarity, with and without key padding, causal, fully padded rows, all three position slots,
  ``qkv_proj=False`` / ``out_proj=False`` / ``bias=False``;
* it equals ``torch.nn.MultiheadAttention`` with copied weights and the NumPy reference (float64);
* the in-place stage functions equal :func:`qkv.nn.attend.masked_softmax` for general masks and
  biases (tensor and row-block function).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from qkv import reference as ref
from qkv.models.builders import build_attention
from qkv.nn.attend import attend
from qkv.nn.backends import inplace
from qkv.nn.backends.inplace import dot_scores_, softmax_scores_
from qkv.nn.masks import causal_mask
from qkv.nn.offset_bias import OffsetBias
from qkv.nn.positional import ALiBiBias, RelativePositionBias, RotaryEmbedding
from qkv.nn.similarity import build_similarity
from qkv.nn.stages import masked_softmax

DOT_FAMILY = ("dot", "scaled_dot", "bilinear", "cosine")
B, T, C, NH = 5, 7, 24, 3  # distinct sizes; head dim 8
DH = C // NH



def _pad(seed=0, empty_row=None):
    g = torch.Generator().manual_seed(seed)
    pad = torch.rand(B, T, generator=g) > 0.35
    pad[:, 1] = True
    pad[0] = True  # one sequence unpadded
    if empty_row is not None:
        pad[empty_row] = False  # every key of this sequence is padding
    return pad


def _twins(seed=0, dtype=torch.float32, **kwargs):
    """The same weights in a backend="auto" module (low-memory weights) and a backend="explicit" one."""
    torch.manual_seed(seed)
    ours = build_attention(C, NH, **kwargs).to(dtype)
    with torch.no_grad():  # make every parameter count (biases start at 0, bilinear at I/√D)
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    explicit = build_attention(C, NH, backend="explicit", **kwargs).to(dtype)
    explicit.load_state_dict(ours.state_dict())
    return ours, explicit


class _Spy:
    """Counts runs of the in-place weights backend."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = inplace.InplaceBackend.run

        def wrapped(backend, *args, **kwargs):
            self.calls += 1
            return real(backend, *args, **kwargs)

        monkeypatch.setattr(inplace.InplaceBackend, "run", wrapped)


# ---------------------------------------------------------------------------------------------
# path choice


def test_chosen_under_no_grad_with_weights_and_only_then(monkeypatch):
    spy = _Spy(monkeypatch)
    mha = build_attention(C, NH)
    x = torch.randn(B, T, C)

    def chosen(mod=mha, grad=False, **kw):
        before = spy.calls
        with torch.set_grad_enabled(grad):
            mod(x, **kw)
        return spy.calls == before + B  # one call per batch row, each writing into the one weights tensor

    assert chosen(need_weights=True)  # no_grad
    assert not chosen(need_weights=False)  # the fused kernel
    assert not chosen(need_weights=True, grad=True)  # parameters require grad: a graph is wanted
    frozen = build_attention(C, NH).requires_grad_(False)
    assert chosen(frozen, need_weights=True, grad=True)  # grad mode on, but nothing requires grad
    assert not chosen(build_attention(C, NH, backend="explicit"), need_weights=True)
    assert not chosen(build_attention(C, NH, backend="chunked"), need_weights=True)
    assert not chosen(build_attention(C, NH, similarity="additive"), need_weights=True)
    dropping = build_attention(C, NH, dropout=0.5)
    assert not chosen(dropping.train(), need_weights=True)  # the output sees dropped weights
    assert chosen(dropping.eval(), need_weights=True)


def test_no_grad_weights_never_take_the_explicit_backends(monkeypatch):
    """Under no_grad the weights backend makes no (B,H,T,T) tensor besides the weights: the
    explicit and chunked backends (which make scores and weights apart) never run."""
    from qkv.nn.backends import chunked, explicit

    def boom(*args, **kwargs):
        raise AssertionError("an explicit backend ran for no-grad weights")

    monkeypatch.setattr(explicit.ExplicitBackend, "run", boom)
    monkeypatch.setattr(chunked.ChunkedBackend, "run", boom)
    with torch.no_grad():
        res = build_attention(C, NH)(torch.randn(B, T, C), _pad(), need_weights=True)
    assert res.weights.shape == (B, NH, T, T)


# ---------------------------------------------------------------------------------------------
# equal to the explicit path


@pytest.mark.parametrize("name", DOT_FAMILY)
@pytest.mark.parametrize("padded", [False, True], ids=["no_pad", "pad"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_equals_explicit_path(name, padded, causal):
    ours, explicit = _twins(1, similarity=name)
    x = torch.randn(B, T, C)
    pad = _pad(1, empty_row=3) if padded else None
    with torch.no_grad():
        got = ours(x, pad, causal=causal, need_weights=True)
        want = explicit(x, pad, causal=causal, need_weights=True)
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-6)
    assert not got.weights.isnan().any() and not got.output.isnan().any()
    if padded:  # a sequence with no key: zero weights, output = the output map's bias
        assert (got.weights[3] == 0).all()
        torch.testing.assert_close(got.output[3], ours.out_proj.bias.expand(T, C), rtol=0, atol=0)


def _slots():
    return {
        "rotary": dict(qk_transform=RotaryEmbedding(DH)),
        "relative": dict(score_bias=RelativePositionBias(NH, max_distance=3)),
        "alibi": dict(score_bias=ALiBiBias(NH)),
        "no_qkv_proj": dict(qkv_proj=False),
        "no_out_proj": dict(out_proj=False),
        "no_bias": dict(bias=False),
        "no_maps_cosine": dict(qkv_proj=False, out_proj=False, similarity="cosine"),
    }


@pytest.mark.parametrize("slot", list(_slots()))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_position_slots_and_ablations_equal_explicit_path(slot, causal):
    ours, explicit = _twins(2, **_slots()[slot])
    x = torch.randn(B, T, C)
    pad = _pad(2)
    with torch.no_grad():
        got = ours(x, pad, causal=causal, need_weights=True)
        want = explicit(x, pad, causal=causal, need_weights=True)
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("qkv_proj", [True, False])
@pytest.mark.parametrize("batched_pos", [False, True], ids=["pos_TC", "pos_BTC"])
def test_qk_pos_equals_explicit_path(qkv_proj, batched_pos):
    ours, explicit = _twins(3, qkv_proj=qkv_proj)
    x = torch.randn(B, T, C)
    pos = torch.randn(B, T, C) if batched_pos else torch.randn(T, C)
    with torch.no_grad():
        got = ours(x, _pad(3), qk_pos=pos, need_weights=True)
        want = explicit(x, _pad(3), qk_pos=pos, need_weights=True)
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# independent references


@pytest.mark.parametrize("padded", [False, True], ids=["no_pad", "pad"])
def test_equals_torch_multihead_attention(padded):
    torch.manual_seed(4)
    theirs = nn.MultiheadAttention(C, NH, batch_first=True).eval()
    with torch.no_grad():  # torch zero-initialises the biases; make them count
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = build_attention(C, NH).eval()
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(theirs.in_proj_weight)  # rows [q; k; v] in both
        ours.qkv_proj.bias.copy_(theirs.in_proj_bias)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    x = torch.randn(B, T, C)
    pad = _pad(4) if padded else None
    with torch.no_grad():
        got = ours(x, pad, need_weights=True)
        want, want_w = theirs(x, x, x, key_padding_mask=None if pad is None else ~pad,
                              need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got.output, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.weights, want_w, rtol=0, atol=1e-6)


def test_float64_equals_numpy_reference():
    """MhSa[X] = Ω_c [Sa_1[X]; …; Sa_H[X]] + β_c per sequence, and each head's Softmax[KᵀQ/√D]."""
    mha, _ = _twins(5, dtype=torch.float64)
    x = torch.randn(B, T, C, dtype=torch.float64)
    with torch.no_grad():
        res = mha(x, need_weights=True)
    W, bias = mha.qkv_proj.weight.detach().numpy(), mha.qkv_proj.bias.detach().numpy()
    omega_c, beta_c = mha.out_proj.weight.detach().numpy(), mha.out_proj.bias.detach().numpy()[:, None]
    heads = []
    for h in range(NH):
        q, k, v = (slice(base + h * DH, base + (h + 1) * DH) for base in (0, C, 2 * C))
        heads.append((W[v], bias[v][:, None], W[q], bias[q][:, None], W[k], bias[k][:, None]))
    for b in range(B):
        X = x[b].numpy().T  # (C, T), one column per token
        want = ref.multihead_self_attention(X, heads, omega_c) + beta_c
        np.testing.assert_allclose(res.output[b].numpy().T, want, rtol=0, atol=1e-10)
        for h, (om_v, be_v, om_q, be_q, om_k, be_k) in enumerate(heads):
            Q, K = om_q @ X + be_q, om_k @ X + be_k  # (D, T)
            A = ref.softmax_cols(K.T @ Q / math.sqrt(DH))  # (keys, queries)
            np.testing.assert_allclose(res.weights[b, h].numpy(), A.T, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# the in-place stage functions


@pytest.mark.parametrize("mask_shape", [None, (B, 1, 1, T), (B, NH, T, T), (1, NH, 1, T), (T, T)])
@pytest.mark.parametrize("bias_kind", [None, "tensor", "function", "offset"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_stage_functions_equal_masked_softmax(mask_shape, bias_kind, causal):
    g = torch.Generator().manual_seed(6)
    sim = build_similarity("cosine", n_heads=NH, d_head=DH)
    q, k = torch.randn(B, NH, T, DH, generator=g), torch.randn(B, NH, T, DH, generator=g)
    mask = None if mask_shape is None else torch.rand(*mask_shape, generator=g) > 0.4
    if mask is not None:
        mask[..., 0, :] = False  # some fully masked rows
    dense = torch.randn(1, NH, T, T, generator=g, dtype=torch.float64)  # dtype follows the scores
    bias = {None: None, "tensor": dense, "function": lambda a, e: dense[:, :, a:e],
            "offset": OffsetBias(torch.randn(NH, 5, generator=g), torch.arange(2 * T - 1) % 5, T, T)}[bias_kind]
    scores = torch.full((B, NH, T, T), float("nan"))  # old contents must not matter
    dot_scores_(scores, q, k, sim)
    softmax_scores_(scores, bias=bias, mask=None if mask is None else mask.reshape(
        (1,) * (4 - mask.dim()) + mask.shape), causal=causal, block=NH * T * 2)  # 2 rows per block
    want = sim.scores(q, k)
    if bias is not None:
        want = want + (bias.dense() if isinstance(bias, OffsetBias) else dense).to(want.dtype)
    m = mask
    if causal:
        m = causal_mask(T) if m is None else m & causal_mask(T)
    want = masked_softmax(want, m)
    torch.testing.assert_close(scores, want, rtol=0, atol=1e-6)
    assert not scores.isnan().any()


def test_float16_weights_stay_finite_where_the_scores_overflow_float16():
    """Scores beyond float16's range (65504): ``auto`` with weights takes a backend that computes them
    in float32 (the in-place one declares no float16), as the fused kernel does without weights."""
    torch.manual_seed(0)
    mha = build_attention(32, 2).half().eval()
    x = torch.randn(2, 6, 32).half() * 500
    with torch.no_grad():
        fused, exact = mha(x), mha(x, need_weights=True)
    assert torch.isfinite(fused.output).all() and torch.isfinite(exact.output).all()
    assert torch.isfinite(exact.weights).all()
    torch.testing.assert_close(exact.output.float(), fused.output.float(), atol=0.1, rtol=0.02)
    q = torch.randn(1, 2, 4, 16).half() * 300
    with pytest.raises(ValueError, match="the inplace backend does not run dtype float16"):
        attend(q, q, q, similarity=build_similarity("scaled_dot", n_heads=2, d_head=16), need_weights=True,
               backend="inplace")
