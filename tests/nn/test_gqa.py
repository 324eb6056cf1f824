"""Grouped-query / multi-query attention (``n_kv_heads`` G < H) and qk-norm.

* ``MultiHeadAttention(n_kv_heads=G)`` against the NumPy textbook reference (``qkv.reference``,
  float64) with each group's Ω_k, Ω_v shared by its H/G query heads (head h uses group h // (H/G));
* every backend against ``explicit`` with G < H (similarities, masks, a bias, weights, gradients);
* GQA + RoPE against transformers' ``LlamaAttention``, qk-norm + GQA + RoPE against
  ``Qwen3Attention`` (copied weights, a bidirectional additive mask with padding), 1e-5;
* qk-norm (layernorm, rmsnorm, with and without scale) against the formulas written out;
* the exact-weights path, query/key positions, the packed path; bad sizes give one clear line.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from qkv import reference as ref
from qkv.models.builders import build_attention
from qkv.nn.attend import BackendPlan, attend
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.positional import ALiBiBias, RotaryEmbedding
from qkv.nn.qk_norm import build_qk_norm
from qkv.nn.similarity import build_similarity

B, T, C, H, D = 3, 7, 48, 6, 8


def _rows(attn, g, h, d):
    """Row slices of the fused map for query head h (group h // (H/G)): q, k, v."""
    C_, G = attn.d_model, attn.n_kv_heads
    grp = h // (attn.n_heads // G)
    return (slice(h * d, (h + 1) * d), slice(C_ + grp * d, C_ + (grp + 1) * d),
            slice(C_ + G * d + grp * d, C_ + G * d + (grp + 1) * d))


@pytest.mark.parametrize("g", [1, 2, 3, 6])
def test_grouped_attention_matches_numpy_reference(g):
    torch.manual_seed(g)
    attn = build_attention(C, H, n_kv_heads=g, backend="explicit").double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    W, bv = attn.qkv_proj.weight.detach().numpy(), attn.qkv_proj.bias.detach().numpy()
    assert W.shape == (C + 2 * g * D, C)
    heads = []
    for h in range(H):
        rq, rk, rv = _rows(attn, g, h, D)
        heads.append((W[rv], bv[rv][:, None], W[rq], bv[rq][:, None], W[rk], bv[rk][:, None]))
    x = torch.randn(B, T, C, dtype=torch.float64)
    with torch.no_grad():
        got = attn(x).output.numpy()
    for i in range(B):
        X = x[i].numpy().T  # (C, N): one column per token
        oc, bc = attn.out_proj.weight.detach().numpy(), attn.out_proj.bias.detach().numpy()
        want = ref.multihead_self_attention(X, heads, oc) + bc[:, None]
        np.testing.assert_allclose(got[i].T, want, atol=1e-10)


SIMS = ("dot", "scaled_dot", "bilinear", "cosine", "additive")


def _qkv(seed=0, g=2, t=T, s=9, d=D, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, t, d, generator=gen, dtype=dtype), torch.randn(B, g, s, d, generator=gen, dtype=dtype),
            torch.randn(B, g, s, d + 1, generator=gen, dtype=dtype))


def _expanded(k, h=H):
    """k with its G heads repeated for H query heads, by index (transformers' repeat_kv convention)."""
    return k[:, [i // (h // k.shape[1]) for i in range(h)]]


@pytest.mark.parametrize("name", SIMS)
@pytest.mark.parametrize("g", [1, 3])
def test_grouped_explicit_equals_expanded_heads(name, g):
    q, k, v = _qkv(g=g)
    sim = build_similarity(name, n_heads=H, d_head=D)
    keep = torch.rand(B, 1, 1, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    want = attend(q, _expanded(k), _expanded(v), similarity=sim, mask=keep, backend="explicit", need_weights=True)
    got = attend(q, k, v, similarity=sim, mask=keep, backend="explicit", need_weights=True)
    torch.testing.assert_close(got.output, want.output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.weights, want.weights, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", SIMS)
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "inplace"])
@pytest.mark.parametrize("g", [1, 2])
def test_every_backend_matches_explicit_with_grouped_keys(name, backend, g):
    sim = build_similarity(name, n_heads=H, d_head=D)
    if not sim.has_dot_form and backend in ("sdpa", "inplace"):
        pytest.skip("needs a dot-product form")
    q, k, v = _qkv(g=g)
    keep = torch.ones(B, 1, 1, 9, dtype=torch.bool)
    keep[1, ..., 5:] = False
    for kw in ({}, {"mask": keep}, {"causal": True}, {"bias": torch.randn(H, T, 9)}):
        need = backend != "sdpa"
        with torch.no_grad():  # the inplace backend runs without autograd (learned similarities too)
            want = attend(q, k, v, similarity=sim, backend="explicit", need_weights=True, **kw)
            got = attend(q, k, v, similarity=sim, backend=backend, need_weights=need, chunk_size=3, **kw)
        torch.testing.assert_close(got.output, want.output, atol=1e-5, rtol=1e-5)
        if need:
            torch.testing.assert_close(got.weights, want.weights, atol=1e-6, rtol=1e-6)


def test_sdpa_without_the_kernels_enable_gqa_expands_keys(monkeypatch):
    from qkv.nn.backends import sdpa

    monkeypatch.setattr(sdpa, "KERNEL_GQA", False)  # as on torch < 2.5
    q, k, v = _qkv(g=2)
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    want = attend(q, k, v, similarity=sim, backend="explicit", causal=True)
    got = attend(q, k, v, similarity=sim, backend="sdpa", causal=True)
    torch.testing.assert_close(got.output, want.output, atol=1e-5, rtol=1e-5)


def test_offset_flash_with_grouped_keys_matches_explicit():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, T, D, generator=gen) for h in (H, 2, 2))
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    bias = ALiBiBias(H)(T, T)
    want = attend(q, k, v, similarity=sim, bias=bias, backend="explicit")
    got = attend(q, k, v, similarity=sim, bias=bias, backend="offset_flash")
    torch.testing.assert_close(got.output, want.output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_grouped_gradients_match_explicit(backend):
    q, k, v = _qkv(g=2, seed=3)
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    grads = {}
    for path in ("explicit", backend):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = attend(qq, kk, vv, similarity=sim, backend=path, chunk_size=2).output
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads[path] = (qq.grad, kk.grad, vv.grad)
    assert grads["explicit"][1].shape == k.shape  # gradients land on the G-head keys
    for got, want in zip(grads[backend], grads["explicit"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _hf_quiet():
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _bidirectional_mask(keep):
    """transformers' 4-D additive mask: 0 where a key may be seen, the dtype's minimum elsewhere."""
    return torch.zeros(keep.shape[0], 1, T, T).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)


def _padding():
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[1, 5:] = False
    return keep


def _copy_qkv(ours, hf):
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.qkv_proj.bias.copy_(torch.cat([hf.q_proj.bias, hf.k_proj.bias, hf.v_proj.bias]))
        ours.out_proj.load_state_dict(hf.o_proj.state_dict())


@pytest.mark.parametrize("g", [1, 2])
def test_grouped_rope_matches_transformers_llama_attention(g):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    _hf_quiet()
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=C, num_attention_heads=H, num_key_value_heads=g, head_dim=D, attention_bias=True,
                      rope_theta=500.0, attn_implementation="eager", vocab_size=97)
    hf = LlamaAttention(cfg, layer_idx=0).eval()
    ours = build_attention(C, H, n_kv_heads=g, qk_transform=RotaryEmbedding(D, 500.0)).eval()
    _copy_qkv(ours, hf)
    x, keep = torch.randn(B, T, C), _padding()
    pos = LlamaRotaryEmbedding(cfg)(x, torch.arange(T)[None].expand(B, T))
    with torch.no_grad():
        want = hf(x, position_embeddings=pos, attention_mask=_bidirectional_mask(keep))[0]
        for need in (False, True):
            got = ours(x, keep, need_weights=need).output
            torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("g", [1, 3, 6])
def test_qk_norm_grouped_rope_matches_transformers_qwen3_attention(g):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

    _hf_quiet()
    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=C, num_attention_heads=H, num_key_value_heads=g, head_dim=D, attention_bias=True,
                      rope_theta=1000.0, rms_norm_eps=1e-6, attn_implementation="eager", vocab_size=97)
    hf = Qwen3Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():  # move the norms' scales off 1
        hf.q_norm.weight.uniform_(0.5, 1.5)
        hf.k_norm.weight.uniform_(0.5, 1.5)
    ours = build_attention(C, H, n_kv_heads=g, qk_norm="rmsnorm", qk_norm_eps=1e-6,
                           qk_transform=RotaryEmbedding(D, 1000.0)).eval()
    _copy_qkv(ours, hf)
    with torch.no_grad():
        ours.qk_norm.q_norm.weight.copy_(hf.q_norm.weight)
        ours.qk_norm.k_norm.weight.copy_(hf.k_norm.weight)
    x, keep = torch.randn(B, T, C), _padding()
    pos = Qwen3RotaryEmbedding(cfg)(x, torch.arange(T)[None].expand(B, T))
    with torch.no_grad():
        want = hf(x, position_embeddings=pos, attention_mask=_bidirectional_mask(keep))[0]
        for backend in ("auto", "explicit", "chunked"):
            ours.backend = BackendPlan(backend)  # the same module on another backend (tests only)
            for need in (False, True):
                got = ours(x, keep, need_weights=need).output
                torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("scale", [True, False])
def test_qk_norm_formulas_by_hand(kind, scale):
    norm = build_qk_norm(kind, D, scale=scale, eps=1e-5)
    if scale:
        with torch.no_grad():
            for p in norm.parameters():
                p.uniform_(0.5, 1.5)
    else:
        assert not list(norm.parameters())
    q, k = torch.randn(2, H, T, D, dtype=torch.float64), torch.randn(2, 2, 9, D, dtype=torch.float64)
    norm = norm.double()
    got_q, got_k = norm(q, k)
    for x, got, part in ((q, got_q, norm.q_norm), (k, got_k, norm.k_norm)):
        if kind == "layernorm":
            mu = x.mean(-1, keepdim=True)
            want = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5)
        else:
            want = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5)
        if scale:
            want = want * part.weight + (part.bias if kind == "layernorm" else 0)
        torch.testing.assert_close(got, want)


def test_qk_norm_runs_before_the_rotary_transform():
    torch.manual_seed(0)
    attn = build_attention(C, H, n_kv_heads=2, qk_norm="layernorm", qk_transform=RotaryEmbedding(D)).eval()
    x = torch.randn(2, T, C)
    q, k, v = attn.project(x)
    qn, kn = attn.qk_norm(q, k)
    qr, kr = attn.qk_transform(qn, kn)
    sim = attn.similarity
    want = attend(qr, kr, v, similarity=sim, backend="explicit").output.transpose(1, 2).reshape(2, T, C)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).output, attn.out_proj(want), atol=1e-5, rtol=1e-5)


def test_query_key_positions_with_grouped_heads():
    torch.manual_seed(0)
    attn = build_attention(C, H, n_kv_heads=2).eval()
    x, pos = torch.randn(2, T, C), torch.randn(T, C)
    q, k, v = attn.project(x, pos)
    q2, k2, _ = attn.project(x + pos)
    _, _, v2 = attn.project(x)
    assert k.shape == (2, 2, T, D)
    for got, want in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_weights_path_and_packed_path_with_grouped_heads():
    torch.manual_seed(0)
    attn = build_attention(C, H, n_kv_heads=3, qk_norm="rmsnorm").eval()
    lengths = [7, 7, 3, 5]
    x = torch.randn(len(lengths), 7, C)
    keep = torch.arange(7)[None] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        fast = attn(x, keep).output
        exact = attn(x, keep, need_weights=True)
        packed = attn.forward_packed(x[keep], lengths).output
    torch.testing.assert_close(exact.output, fast, atol=1e-5, rtol=1e-5)
    assert exact.weights.shape == (4, H, 7, 7)
    torch.testing.assert_close(exact.weights.sum(-1), torch.ones(4, H, 7))
    torch.testing.assert_close(packed, fast[keep], atol=1e-5, rtol=1e-5)


def test_bad_grouped_sizes_give_one_clear_line():
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    with pytest.raises(ValueError, match=r"n_kv_heads=4 does not divide n_heads=6; allowed: \[1, 2, 3, 6\]"):
        MultiHeadAttention(C, H, similarity=sim, qkv_proj=torch.nn.Linear(C, 3 * C), out_proj=None, n_kv_heads=4)
    with pytest.raises(ValueError, match=r"qkv_proj must be an nn.Linear with weight \(80, 48\)"):
        MultiHeadAttention(C, H, similarity=sim, qkv_proj=torch.nn.Linear(C, 3 * C), out_proj=None, n_kv_heads=2)
    with pytest.raises(ValueError, match="needs a qkv_proj"):
        MultiHeadAttention(C, H, similarity=sim, qkv_proj=None, out_proj=None, n_kv_heads=2)
    q, k, v = _qkv(g=4)
    with pytest.raises(ValueError, match="which divide q's H"):
        attend(q, k, v, similarity=sim)
    with pytest.raises(ValueError, match="unknown qk_norm 'l2'"):
        build_qk_norm("l2", D)
    assert math.isclose(build_attention(C, H, n_kv_heads=1).qkv_proj.weight.shape[0], C + 2 * D)
