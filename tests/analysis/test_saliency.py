"""Input attributions checked independently: input × gradient against a finite difference along the input,
integrated gradients' completeness, leave-one-out against a loop of edited texts, attention × gradient
against a finite difference of one weight."""

from __future__ import annotations

import pytest
import torch
from interp_support import batch, classifier

from qkv.analysis.hooked import Batch, call
from qkv.analysis.saliency import (attention_x_gradient, class_logit, class_probability, input_x_gradient,
                                   integrated_gradients, leave_one_out)
from qkv.nn.hooks import hooks

LABELS = torch.tensor([0, 2, 1])


def _target_with(model, b, target, name, fn):
    with torch.no_grad(), hooks(model, {name: fn}):
        return target(call(model, b), torch.arange(len(b)))


def test_input_x_gradient_is_the_derivative_along_the_input():
    model, b = classifier(dtype=torch.float64), batch()
    target = class_probability(LABELS)
    scores = input_x_gradient(model, b, target)
    assert scores.shape == (3, 7) and torch.all(scores[1, 5:] == 0)
    eps = 1e-6
    up = _target_with(model, b, target, "encoder.layers.0.resid_pre", lambda t, n: t * (1 + eps))
    down = _target_with(model, b, target, "encoder.layers.0.resid_pre", lambda t, n: t * (1 - eps))
    torch.testing.assert_close(scores.sum(-1), (up - down) / (2 * eps), rtol=1e-5, atol=1e-9)


def test_integrated_gradients_are_complete():
    model, b = classifier(dtype=torch.float64), batch()
    ig = integrated_gradients(model, b, class_logit(LABELS), steps=64)
    assert ig.scores.shape == (3, 7)
    assert torch.all(ig.gap.abs() <= 0.01 * (ig.target - ig.baseline_target).abs() + 1e-6)
    coarse = integrated_gradients(model, b, class_logit(LABELS), steps=2)
    assert coarse.gap.abs().sum() >= ig.gap.abs().sum()
    with pytest.raises(ValueError, match="steps must be"):
        integrated_gradients(model, b, class_logit(LABELS), steps=0)


def test_leave_one_out_against_edited_texts():
    model, b = classifier(), batch()
    target = class_probability(LABELS)
    got = leave_one_out(model, b, target, replacement_id=1)
    assert torch.all(got[1, 5:] == 0)
    with torch.no_grad():
        for i in range(3):
            one = b.row(i)
            y = target(call(model, one), torch.tensor([i]))[0]
            for t in range(one.input_ids.shape[1]):
                ids = one.input_ids.clone()
                ids[0, t] = 1
                y_t = target(call(model, Batch(ids, one.attention_mask)), torch.tensor([i]))[0]
                assert got[i, t].item() == pytest.approx((y - y_t).item(), abs=1e-6)


def test_attention_x_gradient_against_a_finite_difference():
    model, b = classifier(dtype=torch.float64), batch()
    target = class_probability(LABELS)
    maps = attention_x_gradient(model, b, target)
    assert len(maps) == 2 and maps[0].shape == (3, 3, 7, 7)
    eps, (h, i, j) = 1e-6, (1, 0, 4)
    name = "encoder.layers.0.attention.weights"
    w = {}

    def nudge(s):
        def fn(t, n):
            t = t.clone()
            w["a"] = t[:, h, i, j].clone()
            t[:, h, i, j] += s
            return t
        return fn
    grad = (_target_with(model, b, target, name, nudge(eps)) - _target_with(model, b, target, name, nudge(-eps))) \
        / (2 * eps)  # (B,) dy/dA[h,i,j], other weights fixed
    torch.testing.assert_close(maps[0][:, h, i, j], w["a"] * grad, rtol=1e-5, atol=1e-10)


def test_a_target_must_give_one_number_per_text():
    model, b = classifier(), batch()
    with pytest.raises(ValueError, match="one number per text"):
        input_x_gradient(model, b, lambda out, texts: out.logits)
