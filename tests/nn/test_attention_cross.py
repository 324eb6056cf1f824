"""Cross-attention (the one MultiHeadAttention built with q_proj and kv_proj) against a literal NumPy loop
(the book's D×N convention), masks, grouped heads, precomputed context keys/values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from qkv.nn.attention import ContextKV, MultiHeadAttention
from qkv.nn.qk_norm import build_qk_norm
from qkv.nn.similarity import build_similarity


def _cross(C=8, H=2, E=6, G=None, qk_norm="none"):
    torch.manual_seed(0)
    G = G or H
    D = C // H
    return MultiHeadAttention(C, H, similarity=build_similarity("scaled_dot", n_heads=H, d_head=D),
                              q_proj=nn.Linear(C, C), kv_proj=nn.Linear(E, 2 * G * D), out_proj=nn.Linear(C, C),
                              n_kv_heads=G, qk_norm=build_qk_norm(qk_norm, D)).eval()


def _numpy_cross(x_dec, x_enc, m: MultiHeadAttention, mask=None):
    """One batch row, heads one by one: for each decoder query n, softmax over encoder keys s."""
    H, G, D = m.n_heads, m.n_kv_heads, m.d_head
    Wq, bq = m.q_proj.weight.detach().double().numpy(), m.q_proj.bias.detach().double().numpy()
    Wkv, bkv = m.kv_proj.weight.detach().double().numpy(), m.kv_proj.bias.detach().double().numpy()
    Wo, bo = m.out_proj.weight.detach().double().numpy(), m.out_proj.bias.detach().double().numpy()
    Xd, Xe = x_dec.double().numpy(), x_enc.double().numpy()  # (T,C), (S,E)
    T, S = Xd.shape[0], Xe.shape[0]
    heads = np.zeros((T, H * D))
    for h in range(H):
        g = h // (H // G)
        Wqh, bqh = Wq[h * D:(h + 1) * D], bq[h * D:(h + 1) * D]
        Wk, bk = Wkv[g * D:(g + 1) * D], bkv[g * D:(g + 1) * D]
        Wv, bv = Wkv[G * D + g * D:G * D + (g + 1) * D], bkv[G * D + g * D:G * D + (g + 1) * D]
        for n in range(T):
            q = Wqh @ Xd[n] + bqh
            scores = []
            for s in range(S):
                k = Wk @ Xe[s] + bk
                scores.append(q @ k / np.sqrt(D) if mask is None or mask[s] else -np.inf)
            scores = np.array(scores)
            w = np.exp(scores - scores.max())
            w /= w.sum()
            heads[n, h * D:(h + 1) * D] = sum(w[s] * (Wv @ Xe[s] + bv) for s in range(S))
    return heads @ Wo.T + bo


@pytest.mark.parametrize("G", [2, 1])
def test_matches_a_numpy_loop(G):
    m = _cross(G=G)
    x, mem = torch.randn(2, 5, 8), torch.randn(2, 7, 6)
    out = m(x, context=mem).output
    for b in range(2):
        np.testing.assert_allclose(out[b].detach().numpy(), _numpy_cross(x[b], mem[b], m), atol=1e-5)


def test_memory_padding_is_never_attended():
    m = _cross()
    x, mem = torch.randn(2, 4, 8), torch.randn(2, 6, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    res = m(x, mask, context=mem, need_weights=True)
    assert res.weights.shape == (2, 2, 4, 6)
    assert torch.all(res.weights[0, :, :, 3:] == 0)
    np.testing.assert_allclose(res.output[0].detach().numpy(), _numpy_cross(x[0], mem[0], m, mask[0]), atol=1e-5)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(2, 2, 4))
    short = m(x[:1], context=mem[:1, :3]).output  # the padded row equals the row without its padding
    torch.testing.assert_close(res.output[:1], short, atol=1e-6, rtol=1e-5)


def test_precomputed_context_kv_gives_the_same_output():
    m = _cross(qk_norm="rmsnorm")
    x, mem = torch.randn(2, 4, 8), torch.randn(2, 6, 6)
    kv = m.project_context(mem)
    assert isinstance(kv, ContextKV) and kv.k.shape == (2, 2, 6, 4)
    torch.testing.assert_close(m(x, context=kv).output, m(x, context=mem).output)


def test_bad_inputs_say_what_to_pass():
    m = _cross()
    with pytest.raises(ValueError, match="context must be"):
        m(torch.randn(1, 3, 8), context=torch.randn(1, 3, 5))
    with pytest.raises(ValueError, match="the context's padding mask must have shape"):
        m(torch.randn(1, 3, 8), torch.ones(1, 3, dtype=torch.bool), context=torch.randn(1, 4, 6))
    with pytest.raises(ValueError, match="needs context="):
        m(torch.randn(1, 3, 8))
    sim = build_similarity("scaled_dot", n_heads=2, d_head=4)
    with pytest.raises(ValueError, match="kv_proj"):
        MultiHeadAttention(8, 2, similarity=sim, q_proj=nn.Linear(8, 8), kv_proj=nn.Linear(6, 7), out_proj=None)
    with pytest.raises(ValueError, match="takes no positions"):
        MultiHeadAttention(8, 2, similarity=sim, q_proj=nn.Linear(8, 8), kv_proj=nn.Linear(6, 8), window=3)
    self_attention = MultiHeadAttention(8, 2, similarity=sim, qkv_proj=nn.Linear(8, 24))
    with pytest.raises(ValueError, match="built for self-attention"):
        self_attention(torch.randn(1, 3, 8), context=torch.randn(1, 4, 8))


def test_one_module_and_one_output_type_for_self_and_cross():
    from qkv.models.builders import build_attention
    from qkv.nn.attention import AttentionOutput

    self_att, cross_att = build_attention(8, 2), build_attention(8, 2, context_width=6)
    assert type(self_att) is type(cross_att) is MultiHeadAttention
    assert isinstance(self_att(torch.randn(1, 3, 8)), AttentionOutput)
    assert isinstance(cross_att(torch.randn(1, 3, 8), context=torch.randn(1, 5, 6)), AttentionOutput)
    assert {n for n, _ in cross_att.named_children()} >= {"q_proj", "kv_proj", "out_proj"}


def test_matches_the_textbook_reference_in_the_book_convention():
    """qkv.reference.multihead_cross_attention (D×N columns; queries from the decoder, keys and values
    from the encoder, Prince Fig. 12.13) with the module's weights split per head; the output map's
    bias β_c is added by hand (the reference's Ω_c has none)."""
    from qkv import reference

    m = _cross(C=8, H=2, E=6).double()
    x, mem = torch.randn(1, 5, 8, dtype=torch.float64), torch.randn(1, 7, 6, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    D, C = m.d_head, 8
    Wq, bq = m.q_proj.weight.detach().numpy(), m.q_proj.bias.detach().numpy()
    Wkv, bkv = m.kv_proj.weight.detach().numpy(), m.kv_proj.bias.detach().numpy()
    heads = []
    for h in range(2):
        rows = slice(h * D, (h + 1) * D)
        vrows = slice(2 * D + h * D, 2 * D + (h + 1) * D)  # values follow the G·D key rows
        heads.append((Wkv[vrows], bkv[vrows][:, None], Wq[rows], bq[rows][:, None], Wkv[rows], bkv[rows][:, None]))
    want = reference.multihead_cross_attention(x[0].numpy().T, mem[0].numpy().T, heads,
                                               m.out_proj.weight.detach().numpy(), enc_mask=mask[0].numpy())
    want = want + m.out_proj.bias.detach().numpy()[:, None]  # (C, N_dec)
    got = m(x, mask, context=mem).output[0].detach().numpy().T  # (T,C) -> (C,T)
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert want.shape == (C, 5)
