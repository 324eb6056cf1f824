"""How much each input token matters to one output: attention × gradient, leave-one-out (blank-out),
input × gradient and integrated gradients — the last two the non-attention baselines.

Legend: B texts, T padded length, L layers, H heads, C width, m integration steps.

A *target* gives one number per row of the model's output: ``target(output, texts) -> (n,)``, where
``texts (n,)`` says which text of the batch each row is (rows are copies of one text when
leave-one-out perturbs it) — e.g. :func:`class_probability` (the probability of each text's class). Gradients are taken with
:func:`torch.autograd.grad` at hook points (:mod:`qkv.nn.hooks`): the embedding output is the input
of the first layer (``layers.0.resid_pre``), the attention weights are each layer's ``weights``.
Padding positions score 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from qkv.analysis.hooked import Batch, call, layer_paths
from qkv.nn.hooks import hooks

__all__ = ["Target", "class_probability", "class_logit", "attention_x_gradient", "leave_one_out",
           "input_x_gradient", "integrated_gradients", "IntegratedGradients"]

#: ``(output, texts (n,)) -> (n,)``: one number per output row; ``texts[r]`` is the text row r comes from.
Target = Callable[[object, Tensor], Tensor]


def class_probability(labels: Tensor) -> Target:
    """The softmax probability of class ``labels[b]`` for text b (a sequence classifier's ``logits (B,K)``)."""
    def target(out, texts: Tensor) -> Tensor:
        return out.logits.softmax(-1).gather(-1, labels[texts, None])[:, 0]  # (n,K) -> (n,)
    return target


def class_logit(labels: Tensor) -> Target:
    """The logit of class ``labels[b]`` for text b."""
    def target(out, texts: Tensor) -> Tensor:
        return out.logits.gather(-1, labels[texts, None])[:, 0]  # (n,K) -> (n,)
    return target


def _scores(model: nn.Module, batch: Batch, target: Target, texts: Tensor | None = None) -> Tensor:
    texts = torch.arange(len(batch)) if texts is None else texts
    values = target(call(model, batch), texts)
    if not isinstance(values, Tensor) or values.shape != (len(batch),):
        got = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"the target must give one number per text, shape ({len(batch)},), got {got}")
    return values


def attention_x_gradient(model: nn.Module, batch: Batch, target: Target) -> list[Tensor]:
    """Each layer's attention weights times the target's gradient with respect to them, ``A ⊙ ∂y/∂A``.

    Returns:
        L tensors ``(B,H,T,T)`` (average or sum the heads, keep the positive part, as the method one uses asks).
    """
    names = [f"{p}.attention.weights" for p in layer_paths(model)]
    kept: dict[str, Tensor] = {}

    def keep(t: Tensor, name: str) -> None:
        kept[name] = t

    with torch.enable_grad(), hooks(model, {n: keep for n in names}):
        y = _scores(model, batch, target)
        grads = torch.autograd.grad(y.sum(), [kept[n] for n in names], allow_unused=True)
    return [(kept[n] * (torch.zeros_like(kept[n]) if g is None else g)).detach() for n, g in zip(names, grads)]


def _embedding_gradient(model: nn.Module, batch: Batch, target: Target, embedded: Tensor | None = None,
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """``(x (B,T,C), ∂y/∂x (B,T,C), y (B,))`` at the embedding output x (``embedded`` replaces it when given)."""
    name = f"{layer_paths(model)[0]}.resid_pre"
    held: dict[str, Tensor] = {}

    def leaf(t: Tensor, _name: str) -> Tensor:
        held["x"] = (t if embedded is None else embedded).detach().requires_grad_(True)
        return held["x"]

    with torch.enable_grad(), hooks(model, {name: leaf}):
        y = _scores(model, batch, target)
        (grad,) = torch.autograd.grad(y.sum(), held["x"])
    return held["x"].detach(), grad, y.detach()


def input_x_gradient(model: nn.Module, batch: Batch, target: Target) -> Tensor:
    """``Σ_c x_tc ∂y/∂x_tc`` at the embedding output: ``(B,T)``."""
    x, g, _ = _embedding_gradient(model, batch, target)
    return (x * g).sum(-1) * batch.attention_mask  # (B,T,C) -> (B,T)


@dataclass
class IntegratedGradients:
    """Integrated gradients (Sundararajan et al. 2017) at the embedding output.

    Attributes:
        scores: ``(B,T)`` per-token attributions; they sum to about ``target − baseline_target``.
        target: ``(B,)`` the target at the input. baseline_target: ``(B,)`` at the baseline.
        gap: ``(B,)`` ``scores.sum(-1) − (target − baseline_target)`` (completeness; shrinks with more steps).
    """

    scores: Tensor
    target: Tensor
    baseline_target: Tensor
    gap: Tensor


def integrated_gradients(model: nn.Module, batch: Batch, target: Target, *, steps: int = 32,
                         baseline_id: int | None = None) -> IntegratedGradients:
    """Integrated gradients along the straight line from a baseline's embedding output to the input's.

    Args:
        baseline_id: the token every position but each text's first and last real one (``[CLS]``, ``[SEP]``)
            takes in the baseline (default: the model's ``pad_token_id``, else 0); positions and segments stay.
        steps: m midpoint-rule steps.
    """
    if steps < 1:
        raise ValueError(f"steps must be ≥ 1, got {steps}")
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    base_ids = batch.input_ids.clone()
    lengths = batch.attention_mask.sum(-1)
    fill = torch.full_like(base_ids, baseline_id if baseline_id is not None else (pad or 0))
    pos = torch.arange(base_ids.shape[1])[None]
    inner = (pos > 0) & (pos < lengths[:, None] - 1)  # (B,T) all but the first and last real token
    base_ids = torch.where(inner, fill, base_ids)
    baseline = Batch(base_ids, batch.attention_mask, batch.token_type_ids, batch.tokens)
    x0, _, y0 = _embedding_gradient(model, baseline, target)
    x1, _, y1 = _embedding_gradient(model, batch, target)
    total = torch.zeros_like(x1)
    for k in range(steps):
        alpha = (k + 0.5) / steps
        _, g, _ = _embedding_gradient(model, batch, target, x0 + alpha * (x1 - x0))
        total += g
    scores = ((x1 - x0) * total / steps).sum(-1) * batch.attention_mask  # (B,T,C) -> (B,T)
    return IntegratedGradients(scores, y1, y0, scores.sum(-1) - (y1 - y0))


@torch.no_grad()
def leave_one_out(model: nn.Module, batch: Batch, target: Target, *, replacement_id: int) -> Tensor:
    """Blank-out importance: ``y(x) − y(x with token t replaced by replacement_id)`` for every real t, ``(B,T)``.

    Each text runs once per token (its n copies in one batch).
    """
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for b in range(len(batch)):
        one = batch.row(b)
        n = one.input_ids.shape[1]
        y = _scores(model, one, target, torch.tensor([b]))[0]
        ids = one.input_ids.repeat(n, 1)  # (n,n)
        ids[torch.arange(n), torch.arange(n)] = replacement_id
        types = None if one.token_type_ids is None else one.token_type_ids.repeat(n, 1)
        copies = Batch(ids, one.attention_mask.repeat(n, 1), types)
        out[b, :n] = (y - _scores(model, copies, target, torch.full((n,), b))).float()
    return out
