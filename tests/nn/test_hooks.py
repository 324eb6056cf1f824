"""Hook points on the one attention module and the layer: unused hooks change nothing, read values equal the
model's own, replacements act where they should, and the refusals are one clear line."""

from __future__ import annotations

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_causal_lm, build_encoder, build_encoder_decoder, build_masked_lm
from qkv.nn.hooks import ATTENTION_POINTS, LAYER_POINTS, TAPPED, hook_points, hooks
from qkv.nn.packed import PackedBatch

VARIANTS = {
    "post-LN learned": dict(),
    "pre-LN relative-alibi": dict(norm="pre", position="relative-alibi"),
    "rope, 1 kv head": dict(position="rope", n_kv_heads=1),
    "t5 bias, window 3": dict(position="t5", local_window=3),
    "additive": dict(similarity="additive"),
}


def _encoder(**overrides):
    torch.manual_seed(0)
    return build_encoder(ModelConfig.preset("tiny", dropout=0.0, **overrides)).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (5, 7), generator=g)
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[3, 3:] = False
    return ids, mask


def _read_all(model):
    """A read-only hook on every point; returns the table and what it saw."""
    seen = {}

    def keep(t, name):
        seen[name] = t.detach().clone()

    return {name: keep for name in hook_points(model)}, seen


def test_hook_points_are_named_by_module_path():
    enc = _encoder()
    names = hook_points(enc)
    assert names[:len(LAYER_POINTS)] == [f"layers.0.{p}" for p in LAYER_POINTS]
    assert names[len(LAYER_POINTS):len(LAYER_POINTS) + len(ATTENTION_POINTS)] == \
        [f"layers.0.attention.{p}" for p in ATTENTION_POINTS]
    assert len(names) == 2 * (len(LAYER_POINTS) + len(ATTENTION_POINTS))
    mlm = build_masked_lm(ModelConfig.preset("tiny"))
    assert "encoder.layers.1.attention.weights" in hook_points(mlm)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_unused_hooks_change_nothing(variant):
    enc = _encoder(**VARIANTS[variant])
    ids, mask = _batch()
    with torch.no_grad():
        plain = enc(ids, mask).last_hidden_state
        with hooks(enc, {}):
            assert torch.equal(enc(ids, mask).last_hidden_state, plain)
        layer_points = {n: (lambda t, name: None) for n in hook_points(enc) if ".attention." not in n}
        with hooks(enc, layer_points):  # the layers' hooked path: the same operations, bit for bit
            assert torch.equal(enc(ids, mask).last_hidden_state, plain)
        table, seen = _read_all(enc)
        with hooks(enc, table):  # attention staged explicitly: the numbers up to float rounding
            hooked = enc(ids, mask, output_attentions=True)
        torch.testing.assert_close(hooked.last_hidden_state, plain, atol=2e-5, rtol=0)
    assert not TAPPED
    ref = enc(ids, mask, output_attentions=True, output_hidden_states=True)
    for i in range(2):
        torch.testing.assert_close(seen[f"layers.{i}.attention.weights"], ref.attentions[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(hooked.attentions[i], ref.attentions[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(seen[f"layers.{i}.resid_pre"], ref.hidden_states[i], atol=2e-5, rtol=0)
    # the last hidden state of a pre-LN stack has the final norm applied; layer 0's output does not
    torch.testing.assert_close(seen["layers.0.resid_post"], ref.hidden_states[1], atol=2e-5, rtol=0)
    w = seen["layers.1.attention.weights"]
    assert w.shape == (5, 3, 7, 7) and torch.all(w[1, :, :, 5:] == 0)


def test_read_values_follow_the_textbook():
    """q, k, v, scores, weights, heads and out of layer 0 against a transcription of the equations."""
    enc = _encoder()
    ids, mask = _batch()
    table, seen = _read_all(enc)
    with torch.no_grad(), hooks(enc, table):
        enc(ids, mask)
    att = enc.layers[0].attention
    x = seen["layers.0.resid_pre"]
    W, b = att.qkv_proj.weight, att.qkv_proj.bias
    C, H, D = 24, 3, 8
    q, k, v = ((x @ W[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C]).view(5, 7, H, D).transpose(1, 2) for i in range(3))
    scores = (q @ k.transpose(-1, -2)) / D ** 0.5
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    weights = scores.softmax(-1)
    heads = weights @ v
    out = heads.transpose(1, 2).reshape(5, 7, C) @ att.out_proj.weight.T + att.out_proj.bias
    for name, want in (("q", q), ("k", k), ("v", v), ("scores", scores), ("weights", weights), ("heads", heads),
                       ("out", out)):
        torch.testing.assert_close(seen[f"layers.0.attention.{name}"], want, atol=1e-5, rtol=0, msg=name)


def test_replacing_a_tensor_acts_downstream_and_gradients_flow():
    enc = _encoder(norm="pre")
    ids, mask = _batch()
    zero_post = {"layers.1.resid_post": lambda t, name: torch.zeros_like(t)}
    with hooks(enc, zero_post):
        out = enc(ids, mask).last_hidden_state
    torch.testing.assert_close(out, enc.final_norm(torch.zeros_like(out)))  # pre-LN: the final norm follows
    gate = torch.ones(3, requires_grad=True)
    with hooks(enc, {"layers.0.attention.heads": lambda t, name: t * gate[None, :, None, None]}):
        loss = enc(ids, mask).last_hidden_state.square().sum()
    (grad,) = torch.autograd.grad(loss, gate)
    assert grad.shape == (3,) and torch.all(grad != 0)


def test_transformer_lens_names_are_accepted():
    mlm = build_masked_lm(ModelConfig.preset("tiny", dropout=0.0)).eval()
    ids, mask = _batch()
    got = {}
    table = {"blocks.1.attn.hook_pattern": lambda t, n: got.setdefault(n, t),
             "blocks.0.hook_resid_post": lambda t, n: got.setdefault(n, t)}
    with torch.no_grad(), hooks(mlm, table):
        mlm(ids, mask)
    ref = mlm.encoder(ids, mask, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(got["blocks.1.attn.hook_pattern"], ref.attentions[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["blocks.0.hook_resid_post"], ref.hidden_states[1], atol=1e-5, rtol=0)


def test_cross_attention_and_a_causal_stack_have_hook_points():
    torch.manual_seed(0)
    model = build_encoder_decoder(ModelConfig.preset("tiny", dropout=0.0)).eval()
    names = hook_points(model)
    cross = next(n for n in names if "cross" in n and n.endswith(".weights"))
    src, tgt = torch.randint(1, 97, (2, 6)), torch.randint(1, 97, (2, 5))
    got = {}
    with torch.no_grad(), hooks(model, {cross: lambda t, n: got.setdefault("w", t)}):
        out = model(src, decoder_input_ids=tgt, output_attentions=True)
    assert got["w"].shape == (2, 3, 5, 6)
    torch.testing.assert_close(got["w"], out.cross_attentions[0], atol=1e-5, rtol=0)
    lm = build_causal_lm(ModelConfig.preset("tiny", dropout=0.0)).eval()
    with torch.no_grad(), hooks(lm, {"decoder.layers.0.attention.weights": lambda t, n: got.setdefault("c", t)}):
        lm(tgt)
    assert torch.all(got["c"].triu(1) == 0)


def test_refusals_are_one_clear_line():
    enc = _encoder()
    ids, mask = _batch()
    with pytest.raises(ValueError, match=r"unknown hook point 'layers.0.attention.nope'.*hook_points\(model\)"):
        with hooks(enc, {"layers.0.attention.nope": lambda t, n: None}):
            pass
    with pytest.raises(ValueError, match="unknown hook point 'layers.9.resid_pre' \\(no module 'layers.9'\\)"):
        with hooks(enc, {"layers.9.resid_pre": lambda t, n: None}):
            pass
    with pytest.raises(ValueError, match="must be a function"):
        with hooks(enc, {"layers.0.resid_pre": 3}):
            pass
    with pytest.raises(ValueError, match=r"returned \(2,\); return None or a tensor of shape"):
        with hooks(enc, {"layers.0.attn_out": lambda t, n: torch.zeros(2)}):
            enc(ids, mask)
    with hooks(enc, {"layers.0.resid_pre": lambda t, n: None}):
        with pytest.raises(ValueError, match="already hooked"):
            with hooks(enc, {"layers.0.resid_post": lambda t, n: None}):
                pass
        with pytest.raises(ValueError, match="hooks run on the padded path"):
            enc.forward_packed(PackedBatch.from_padded(ids, mask))
    assert not TAPPED
