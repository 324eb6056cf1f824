"""Rollout and flow against hand-computed graphs and a generic max-flow solver; value norms against a hand loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.analysis.attribution import attention_flow, attention_rollout, value_norm_weights, value_norms
from qkv.analysis.hooked import Batch, run_with_cache
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder

# two layers, two tokens, one head: A0 then A1 (rows: queries)
A0 = [[1.0, 0.0], [0.5, 0.5]]
A1 = [[0.2, 0.8], [1.0, 0.0]]


def _maps():
    return [torch.tensor([[a]]) for a in (A0, A1)]  # L × (B=1,H=1,T=2,T=2)


def test_rollout_by_hand():
    # A' = 0.5 A + 0.5 I: A'0 = [[1, 0], [.25, .75]], A'1 = [[.6, .4], [.5, .5]]; R = A'1 A'0
    want = torch.tensor([[[0.7, 0.3], [0.625, 0.375]]], dtype=torch.float64)
    torch.testing.assert_close(attention_rollout(_maps()), want)
    raw = torch.tensor(A1, dtype=torch.float64) @ torch.tensor(A0, dtype=torch.float64)
    torch.testing.assert_close(attention_rollout(_maps(), residual=False)[0], raw)
    per_layer = attention_rollout(_maps(), all_layers=True)
    assert per_layer.shape == (2, 1, 2, 2)
    torch.testing.assert_close(per_layer[0, 0], torch.tensor([[1.0, 0.0], [0.25, 0.75]], dtype=torch.float64))


def test_flow_by_hand():
    # from (2,0): to (0,0) 0.6 via (1,0) + min(.4,.25) via (1,1) = .85; to (0,1) only via (1,1): min(.4,.75) = .4
    # from (2,1): to (0,0) min(.5,1) + min(.5,.25) = .75; to (0,1) min(.5,.75) = .5
    want = torch.tensor([[[0.85, 0.4], [0.75, 0.5]]], dtype=torch.float64)
    torch.testing.assert_close(attention_flow(_maps()), want, atol=1e-7, rtol=0)
    torch.testing.assert_close(attention_flow(_maps(), queries=[1]), want[:, 1:], atol=1e-7, rtol=0)
    normed = attention_flow(_maps(), normalize=True)
    torch.testing.assert_close(normed.sum(-1), torch.ones(1, 2, dtype=torch.float64))
    one_layer = attention_flow(_maps(), all_layers=True)[0, 0]  # through layer 0 alone: A'0 itself
    torch.testing.assert_close(one_layer, torch.tensor([[1.0, 0.0], [0.25, 0.75]], dtype=torch.float64), atol=1e-7,
                               rtol=0)
    with pytest.raises(ValueError, match="queries must be positions"):
        attention_flow(_maps(), queries=[2])


def test_flow_equals_networkx_max_flow_on_random_weights():
    nx = pytest.importorskip("networkx")
    g = torch.Generator().manual_seed(0)
    L, B, H, T = 3, 2, 2, 5
    weights = [torch.softmax(3 * torch.randn(B, H, T, T, generator=g), -1) for _ in range(L)]
    ours = attention_flow(weights)
    a = torch.stack(weights).double().mean(2)  # (L,B,T,T)
    a = 0.5 * a + 0.5 * torch.eye(T, dtype=torch.float64)
    a = a / a.sum(-1, keepdim=True)
    for b in range(B):
        graph = nx.DiGraph()
        for layer in range(L):
            for i in range(T):
                for j in range(T):
                    graph.add_edge((layer + 1, i), (layer, j), capacity=float(a[layer, b, i, j]))
        for i in range(T):
            for j in range(T):
                want = nx.maximum_flow_value(graph, (L, i), (0, j))
                assert ours[b, i, j].item() == pytest.approx(want, abs=1e-6)


def test_value_norms_against_a_hand_loop():
    torch.manual_seed(0)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0, n_kv_heads=1)).eval()  # post-LN: input = resid_pre
    ids = torch.randint(1, 97, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    batch = Batch(ids, mask)
    norms = value_norms(enc, batch)
    _, kept = run_with_cache(enc, batch, ["layers.1.resid_pre", "layers.1.attention.weights"])
    x, alpha = kept["layers.1.resid_pre"].double(), kept["layers.1.attention.weights"].double()
    att = enc.layers[1].attention
    W, bias = att.qkv_proj.weight.double(), att.qkv_proj.bias.double()
    C, H, D = 24, 3, 8
    v_rows = slice(C + D, C + 2 * D)  # one key/value head: rows C … C+D keys, then D values
    wo = att.out_proj.weight.double()
    for b in range(2):
        for h in range(H):
            for i in range(6):
                for j in range(6):
                    v = x[b, j] @ W[v_rows].T + bias[v_rows]  # the one value head every query head reads
                    f = v @ wo[:, h * D:(h + 1) * D].T
                    want = (alpha[b, h, i, j] * f).norm()
                    assert norms[1].per_head[b, h, i, j].item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
                    assert norms[1].f_norms[b, h, j].item() == pytest.approx(f.norm().item(), rel=1e-5, abs=1e-7)
    for b in range(2):
        for i in range(6):
            for j in range(6):
                total = sum(alpha[b, h, i, j] * ((x[b, j] @ W[v_rows].T + bias[v_rows]) @ wo[:, h * D:(h + 1) * D].T)
                            for h in range(H))
                assert norms[1].summed[b, i, j].item() == pytest.approx(total.norm().item(), rel=1e-5, abs=1e-7)


def test_value_norms_without_an_output_map_concatenate_the_heads():
    alpha = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    v = torch.randn(1, 2, 3, 4)
    out = value_norm_weights(alpha, v, None)
    want = torch.stack([torch.cat([alpha[0, h, 1, j] * v[0, h, j] for h in range(2)]).norm() for j in range(3)])
    torch.testing.assert_close(out.summed[0, 1], want.double())
    np.testing.assert_allclose(out.f_norms[0].numpy(), v[0].norm(dim=-1).double().numpy())
