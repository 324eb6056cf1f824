"""Ablation equals zeroing a head's output by hand; patching every head restores the clean output;
importance is Michel et al.'s expected absolute gate gradient; pruning follows the importance order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from interp_support import batch, classifier

from qkv.analysis.hooked import Batch, call, run_with_cache
from qkv.analysis.interventions import (ablated, ablation_effects, classification_metrics, head_importance,
                                        head_means, patched, patching_effects, pruning_curve)
from qkv.nn.hooks import hooks


def _last_layer_by_hand(model, x, mask, head, replacement):
    """Layer 1 (post-LN) of the tiny classifier from its input x, head ``head``'s output replaced."""
    layer = model.encoder.layers[1]
    att = layer.attention
    W, b = att.qkv_proj.weight, att.qkv_proj.bias
    B, T, C = x.shape
    q, k, v = ((x @ W[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C]).view(B, T, 3, 8).transpose(1, 2) for i in range(3))
    s = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~mask[:, None, None, :], float("-inf"))
    heads = s.softmax(-1) @ v  # (B,H,T,D)
    heads[:, head] = replacement
    a = heads.transpose(1, 2).reshape(B, T, C) @ att.out_proj.weight.T + att.out_proj.bias
    h = layer.norm1(x + a)
    return layer.norm2(h + layer.feed_forward(h))


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablating_a_head_equals_replacing_its_output_by_hand(mode):
    model, b = classifier(), batch()
    _, kept = run_with_cache(model, b, ["encoder.layers.1.resid_pre"])
    means = head_means(model, [b]) if mode == "mean" else None
    with torch.no_grad(), ablated(model, [(1, 2)], means=means):
        got = call(model, b).last_hidden_state
    with torch.no_grad():
        fill = 0.0 if means is None else means[1, 2][None, None, :]
        want = _last_layer_by_hand(model, kept["encoder.layers.1.resid_pre"], b.attention_mask, 2, fill)
    real = b.attention_mask
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)


def test_head_means_average_the_real_tokens():
    model, b = classifier(), batch()
    _, kept = run_with_cache(model, b, ["encoder.layers.0.attention.heads"])
    heads = kept["encoder.layers.0.attention.heads"]  # (B,H,T,D)
    want = heads.transpose(1, 2)[b.attention_mask].mean(0)  # (N,H,D) -> (H,D)
    torch.testing.assert_close(head_means(model, [b])[0], want, atol=1e-6, rtol=0)


def test_patching_every_head_restores_the_clean_output_exactly():
    model, clean = classifier(), batch()
    ids = clean.input_ids.clone()
    ids[:, 2] = 50  # a different token at position 2 of every text
    corrupted = Batch(ids, clean.attention_mask)
    heads_names = [f"encoder.layers.{i}.attention.heads" for i in range(2)]
    with torch.no_grad():
        with hooks(model, {n: (lambda t, name: None) for n in heads_names}):  # the same (staged) path
            want = call(model, clean).logits
        plain = call(model, corrupted).logits
        with patched(model, clean):
            got = call(model, corrupted).logits
    assert not torch.allclose(plain, want, atol=1e-3)
    assert torch.equal(got, want)  # [CLS]'s stream sees the changed token only through attention
    torch.testing.assert_close(got, call(model, clean).logits, atol=1e-5, rtol=0)


def test_patching_effects_score_each_head():
    model, clean = classifier(), batch(n=1)
    ids = clean.input_ids.clone()
    ids[0, 3] = 60
    corrupted = Batch(ids, clean.attention_mask)
    label = int(call(model, clean).logits.argmax())
    effects = patching_effects(model, clean, corrupted, lambda out: float(out.logits.softmax(-1)[0, label]))
    assert effects.shape == (2, 3) and np.isfinite(effects).all()
    with pytest.raises(ValueError, match="same metric"):
        patching_effects(model, clean, clean, lambda out: 0.0)


def test_importance_is_the_expected_absolute_gate_gradient():
    model, b = classifier(dtype=torch.float64), batch()
    labels = torch.tensor([0, 2, 1])
    per_text = lambda out, bb: F.cross_entropy(out.logits, labels, reduction="none")  # noqa: E731
    got = head_importance(model, [b], per_text, normalize=False)
    eps = 1e-6
    want = np.zeros((2, 3))
    for layer in range(2):
        for head in range(3):
            def scaled(s):
                def fn(t, name):
                    t = t.clone()
                    t[:, head] *= s
                    return t
                with torch.no_grad(), hooks(model, {f"encoder.layers.{layer}.attention.heads": fn}):
                    return per_text(call(model, b), b)
            grad = (scaled(1 + eps) - scaled(1 - eps)) / (2 * eps)  # (B,) per-text dL/dξ
            want[layer, head] = grad.abs().mean()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
    normed = head_importance(model, [b], per_text)
    np.testing.assert_allclose(np.linalg.norm(normed, axis=1), 1.0)


def test_pruning_follows_increasing_importance_and_ablation_effects_measure_each_head():
    model, b = classifier(), batch()
    labels = torch.tensor([0, 2, 1])
    evaluate = classification_metrics([(b, labels)])
    importance = 5 - np.arange(6, dtype=float).reshape(2, 3)  # L1H2 least important, then L1H1, …
    steps = pruning_curve(model, importance, evaluate, fractions=(0.0, 0.5, 1.0))
    assert [len(s.pruned) for s in steps] == [0, 3, 5]  # one head always kept
    assert steps[1].pruned == [(1, 2), (1, 1), (1, 0)]
    assert steps[0].metrics == evaluate(model)
    eff = ablation_effects(model, evaluate)
    assert eff.effects["loss"].shape == (2, 3) and eff.mode == "zero"
    with ablated(model, [(0, 1)]):
        assert evaluate(model)["loss"] - eff.base["loss"] == pytest.approx(eff.effects["loss"][0, 1])
    top = eff.ranked("loss")
    assert top[0][0].startswith("L") and "H" in top[0][0]
    with pytest.raises(ValueError, match=r"head \(2, 0\) does not exist"):
        with ablated(model, [(2, 0)]):
            pass
