"""Attention statistics on cases where the answer is known, and gradient norms against torch's own."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qkv.experiments.stats import attention_summary, encoder_attentions, grad_norms
from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm


def _mask(lengths, T):
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B,T)


def test_identity_and_uniform_weights_give_the_extremes():
    L, B, H, T = 2, 3, 4, 6
    mask = _mask([6, 4, 2], T)
    eye = torch.eye(T).expand(B, H, T, T)
    s = attention_summary([eye] * L, mask)
    assert (s["self_share"], s["self_top1"], s["max_weight"], s["entropy"]) == (1.0, 1.0, 1.0, 0.0)
    uniform = mask[:, None, None, :].float().expand(B, H, T, T)
    uniform = uniform / uniform.sum(-1, keepdim=True)  # each query spreads over its block's real keys
    s = attention_summary([uniform] * L, mask)
    per_query = [1 / 6] * 6 + [1 / 4] * 4 + [1 / 2] * 2  # the 12 real queries
    assert s["self_share"] == pytest.approx(np.mean(per_query))
    assert s["chance"] == pytest.approx(np.mean(per_query))
    assert s["max_weight"] == pytest.approx(np.mean(per_query))
    assert s["entropy"] == pytest.approx(np.mean([math.log(1 / p) for p in per_query]))
    assert s["self_share_by_layer"] == pytest.approx([np.mean(per_query)] * L)


def test_summary_matches_a_loop_over_real_queries():
    g = torch.Generator().manual_seed(0)
    L, B, H, T = 3, 2, 5, 7
    mask = _mask([7, 5], T)
    atts = [torch.softmax(torch.randn(B, H, T, T, generator=g) * 2 - (~mask[:, None, None, :]) * 1e9, -1)
            for _ in range(L)]
    s = attention_summary(atts, mask)
    w = np.stack([a.numpy() for a in atts]).astype(np.float64)
    self_w, top, mx, ent = [], [], [], []
    for li in range(L):
        for b in range(B):
            n = int(mask[b].sum())
            for h in range(H):
                for i in range(n):
                    row = w[li, b, h, i, :n]
                    self_w.append(row[i])
                    top.append(float(np.argmax(row) == i))
                    mx.append(row.max())
                    ent.append(-(row * np.log(row)).sum())
    assert s["self_share"] == pytest.approx(np.mean(self_w), rel=1e-5)
    assert s["self_top1"] == pytest.approx(np.mean(top))
    assert s["max_weight"] == pytest.approx(np.mean(mx), rel=1e-5)
    assert s["entropy"] == pytest.approx(np.mean(ent), rel=1e-5)


def _tiny(**model):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", n_layers=1, dropout=0.0, position="none", **model)
    return build_masked_lm(cfg).eval()


def test_attention_on_raw_embeddings_looks_at_itself():
    # Without Q/K maps, q = k = x: a token's score with itself is ‖x‖², above its score with any other
    # token; unscaled, the softmax puts nearly all weight there. With learned maps at initialisation
    # (weights ~ N(0, 0.02²)) scores are ~0 and attention is near uniform: self share ≈ 1/n.
    ids = torch.tensor([[2, 11, 23, 35, 47, 59, 71], [5, 17, 29, 41, 53, 0, 0]])
    mask = ids != 0
    raw = _tiny(qkv_proj=False, similarity="dot")
    with torch.no_grad():
        raw.encoder.embeddings.tokens.weight.normal_(0.0, 1.0)
    s_raw = attention_summary(encoder_attentions(raw, ids, mask), mask)
    assert s_raw["self_share"] > 0.9 and s_raw["self_top1"] > 0.9, s_raw
    proj = _tiny(similarity="dot")
    s_proj = attention_summary(encoder_attentions(proj, ids, mask), mask)
    assert abs(s_proj["self_share"] - s_proj["chance"]) < 0.02, s_proj
    assert s_raw["entropy"] < 0.5 < s_proj["entropy"]


def test_grad_norms_total_matches_torch_and_qk_rows_are_the_first_two_thirds():
    model = _tiny()
    model.train()
    ids = torch.tensor([[2, 11, 23, 35, 47]])
    labels = torch.full_like(ids, -100)
    labels[0, 2] = 23
    model(ids, labels=labels).loss.backward()
    g = grad_norms(model)
    params = [p for p in model.parameters() if p.grad is not None]
    expected = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
    assert g["grad_norm"] == pytest.approx(expected, rel=1e-5)
    C = 24  # tiny's d_model
    qk = [t.grad[: 2 * C] for n, t in model.named_parameters() if "qkv_proj" in n]
    assert len(qk) == 2  # weight and bias of the one layer
    expected = math.sqrt(sum(float((x.double() ** 2).sum()) for x in qk))
    assert g["qk_grad_norm"] == pytest.approx(expected, rel=1e-6)
    assert math.isnan(grad_norms(_tiny(qkv_proj=False))["qk_grad_norm"])


def test_qk_grad_norm_rows_follow_grouped_key_value_heads():
    model = _tiny(n_kv_heads=1)  # C = 24, H heads of D = 24/H: Q rows C, K rows D (then V rows D)
    model.train()
    ids = torch.tensor([[2, 11, 23, 35, 47]])
    labels = torch.full_like(ids, -100)
    labels[0, 2] = 23
    model(ids, labels=labels).loss.backward()
    att = model.encoder.layers[0].attention
    rows = 24 + att.d_head
    assert att.qkv_proj.weight.shape[0] == 24 + 2 * att.d_head
    qk = [t.grad[:rows] for n, t in model.named_parameters() if "qkv_proj" in n]
    expected = math.sqrt(sum(float((x.double() ** 2).sum()) for x in qk))
    assert grad_norms(model)["qk_grad_norm"] == pytest.approx(expected, rel=1e-6)


def _loop_shares(attentions, mask, offset):
    """Per (layer, head): mean weight a[i, i+offset] over queries i whose i+offset is a real token."""
    m = mask.numpy()
    out = []
    for a in attentions:  # (B,H,T,T)
        a = a.numpy()
        B, H, T, _ = a.shape
        per_head = []
        for h in range(H):
            vals = [a[b, h, i, i + offset] for b in range(B) for i in range(T)
                    if m[b, i] and 0 <= i + offset < T and m[b, i + offset]]
            per_head.append(np.mean(vals))
        out.append(per_head)
    return np.array(out)  # (L,H)


def test_head_summary_matches_a_loop_and_counts_self_heads():
    from qkv.experiments.stats import head_summary

    ids = torch.tensor([[2, 11, 23, 35, 47, 59, 71], [2, 17, 29, 41, 53, 0, 0]])
    mask = ids != 0
    torch.manual_seed(1)
    model = build_masked_lm(ModelConfig.preset("tiny", n_layers=2, dropout=0.0, position="alibi")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # not uniform: the shares differ between heads
    att = encoder_attentions(model, ids, mask)
    s = head_summary(att, ids, mask, cls_id=2, sep_id=3)
    assert s["max_prev_share"] == pytest.approx(_loop_shares(att, mask, -1).max(), abs=1e-6)
    assert s["max_next_share"] == pytest.approx(_loop_shares(att, mask, +1).max(), abs=1e-6)
    assert s["uniform_entropy"] == pytest.approx(np.mean([math.log(7)] * 7 + [math.log(5)] * 5), abs=1e-6)

    raw = _tiny(qkv_proj=False, similarity="dot")  # every head looks at itself (the test above)
    with torch.no_grad():
        raw.encoder.embeddings.tokens.weight.normal_(0.0, 1.0)
    r = head_summary(encoder_attentions(raw, ids, mask), ids, mask, cls_id=2, sep_id=3)
    assert r["specialised_heads"] == raw.config.attention.n_heads and r["head_entropy"] < 0.5, r
