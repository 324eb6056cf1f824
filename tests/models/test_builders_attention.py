"""``ModelConfig`` → builders for the attention variants: grouped-query heads, qk-norm, and
sliding-window layers (``layer_types``; format 1's ``global_every`` pattern) and their own RoPE base.

The numbers of each part are tested in tests/nn (test_gqa.py, test_window.py); here: that the
config's fields reach the right modules, and that the built encoder runs every path (fused,
exact weights, packed, backward).
"""

from __future__ import annotations

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder, build_masked_lm
from qkv.nn.norms import RMSNorm
from qkv.nn.packed import PackedBatch
from qkv.nn.positional import RotaryEmbedding
from qkv.nn.qk_norm import QKNorm

BASE = dict(vocab_size=97, d_model=24, n_heads=6, d_ff=40, n_layers=5, max_len=32, position="rope")


def _config(**kw):
    return ModelConfig.from_flat(**{**BASE, **kw})


def test_local_and_global_layers_get_their_windows_and_rope_bases():
    cfg = _config(local_window=6, global_every=3, rope_base=160000.0, local_rope_base=10000.0)
    layers = build_encoder(cfg).layers
    kinds = [cfg.is_local(i) for i in range(5)]
    assert kinds == [False, True, True, False, True]  # ModernBERT: layer i global iff i % 3 == 0
    for layer, local in zip(layers, kinds):
        att = layer.attention
        assert att.window == (6 if local else None)
        assert isinstance(att.qk_transform, RotaryEmbedding)
        assert att.qk_transform.base == (10000.0 if local else 160000.0)
    assert len({id(layer.attention.qk_transform) for layer in layers}) == 5  # one rotary module per layer


def test_local_rope_base_defaults_to_rope_base_and_no_window_means_all_global():
    cfg = _config(local_window=4, global_every=2, rope_base=500.0)
    assert [layer.attention.qk_transform.base for layer in build_encoder(cfg).layers] == [500.0] * 5
    plain = build_encoder(_config())
    assert all(layer.attention.window is None for layer in plain.layers)
    assert all(layer.attention.n_kv_heads == 6 and layer.attention.qk_norm is None for layer in plain.layers)


@pytest.mark.parametrize("g", [1, 2, 3])
def test_n_kv_heads_sizes_the_fused_map(g):
    att = build_encoder(_config(n_kv_heads=g)).layers[0].attention
    assert att.n_kv_heads == g
    assert tuple(att.qkv_proj.weight.shape) == (24 + 2 * g * 4, 24)  # C + 2·G·D rows


@pytest.mark.parametrize("kind,cls", [("layernorm", torch.nn.LayerNorm), ("rmsnorm", RMSNorm)])
@pytest.mark.parametrize("scale", [True, False])
def test_qk_norm_is_built_over_the_head_width(kind, cls, scale):
    enc = build_encoder(_config(qk_norm=kind, qk_norm_scale=scale, layer_norm_eps=1e-6))
    norm = enc.layers[0].attention.qk_norm
    assert isinstance(norm, QKNorm) and isinstance(norm.q_norm, cls) and isinstance(norm.k_norm, cls)
    assert norm.q_norm is not norm.k_norm
    assert (norm.q_norm.weight is not None) == scale
    if scale:
        assert tuple(norm.q_norm.weight.shape) == (4,) and torch.equal(norm.q_norm.weight, torch.ones(4))


def test_modern_attention_encoder_runs_every_path():
    torch.manual_seed(0)
    cfg = _config(n_kv_heads=2, qk_norm="rmsnorm", local_window=4, global_every=3, local_rope_base=1000.0)
    model = build_masked_lm(cfg).eval()
    ids = torch.randint(1, 97, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, 7:] = False
    ids[~mask] = 0
    enc = model.encoder
    with torch.no_grad():
        fast = enc(ids, mask).last_hidden_state
        exact = enc(ids, mask, output_attentions=True)
        packed = enc.forward_packed(PackedBatch.from_padded(ids, mask)).last_hidden_state
    torch.testing.assert_close(exact.last_hidden_state[mask], fast[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed, fast[mask], atol=1e-5, rtol=1e-5)
    far = (torch.arange(11)[:, None] - torch.arange(11)).abs() > 2  # outside the window W // 2 = 2
    assert (exact.attentions[1][:, :, far] == 0).all() and (exact.attentions[0][0][:, far] > 0).all()
    model.train()
    out = model(ids, mask, labels=torch.where(mask, ids, -100))
    out.loss.backward()
    att = model.encoder.layers[1].attention
    assert att.qk_norm.k_norm.weight.grad is not None and att.qkv_proj.weight.grad.abs().sum() > 0
