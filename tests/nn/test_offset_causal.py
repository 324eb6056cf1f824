"""A causal call with an offset bias folds the mask into the bias (OffsetBias.causal): the same
numbers, gradients included, as the dense bias with a boolean causal mask, on every backend."""

import pytest
import torch

from qkv.nn.attend import attend
from qkv.nn.position_bias import ALiBiBias, RelativePositionBias, T5RelativeBias
from qkv.nn.similarity import build_similarity

H, D = 3, 8


def _dense_reference(q, k, v, bias, sim):
    """Scores + dense bias, keys after the (end-aligned) query set to −∞, softmax, mix — by hand."""
    T, S = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2) / D**0.5 + bias.dense()  # (B,H,T,D)(B,H,D,S) -> (B,H,T,S)
    allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)  # (T,S)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("module", [RelativePositionBias(H, 6), RelativePositionBias(H, 6, init="alibi"),
                                    T5RelativeBias(H, 8, 16), ALiBiBias(H)], ids=["relative", "relative-alibi",
                                                                                   "t5", "alibi"])
@pytest.mark.parametrize("backend", ["auto", "explicit", "chunked", "sdpa"])
@pytest.mark.parametrize("T,S", [(11, 11), (4, 11), (1, 9)])
def test_folded_causal_bias_equals_masked_dense_bias(module, backend, T, S):
    torch.manual_seed(0)
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    q = torch.randn(2, H, T, D, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, H, S, D, dtype=torch.float64, requires_grad=True) for _ in range(2))
    module = module.double()
    got = attend(q, k, v, similarity=sim, bias=module(T, S) if T == S else _end_aligned(module, T, S),
                 causal=True, backend=backend, chunk_size=3).output
    want = _dense_reference(q, k, v, module(T, S) if T == S else _end_aligned(module, T, S), sim)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    params = [q, k, v] + list(module.parameters())
    g1 = torch.autograd.grad(got.square().sum(), params)
    g2 = torch.autograd.grad(want.square().sum(), params)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def _end_aligned(module, T, S):
    """The T×S bias of queries at positions S-T … S-1 (what a KV cache attends with)."""
    from qkv.nn.offset_bias import OffsetBias

    full = module(S, S)
    return OffsetBias(full.table, full.index[: S + T - 1], T, S)


def test_fold_marks_every_later_key():
    bias = ALiBiBias(2)(3, 5).causal()
    dense = bias.dense()[0]  # (H,T,S)
    allowed = torch.arange(5)[None, :] <= torch.arange(3)[:, None] + 2
    assert torch.isinf(dense[:, ~allowed]).all() and torch.isfinite(dense[:, allowed]).all()
