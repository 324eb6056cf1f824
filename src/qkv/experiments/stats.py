"""The grids' extra statistics: self-attention share, softmax saturation, early gradient norms.

Legend: L layers, B blocks, H heads, T tokens (queries = keys), C model width.

All attention statistics are means over layers, heads and *real* query positions (padding
excluded) of exact attention weights read from the encoder's output (``output_attentions=True``):

* ``self_share`` — the weight a token puts on its own key, ``a[i, i]``; ``self_top1`` — the share
  of queries whose largest weight is on themselves; ``chance`` — ``1/n`` (n real tokens in the
  block), the self share of uniform attention. Without Q/K maps a token's query *is* its key, and
  ``qᵀq ≥ qᵀk`` whenever ``‖k‖ ≤ ‖q‖``: the argument that such attention looks mostly at itself.
* ``max_weight`` — ``maxⱼ a[i, j]`` (1 = a saturated, one-hot softmax) and ``entropy`` —
  ``−Σⱼ a[i, j] log a[i, j]`` in nats (0 = saturated, log n = uniform).

:class:`EarlyStats` is a ``pretrain(on_backward=…)`` hook: on the first steps it records the total
gradient norm (before clipping), the gradient norm of the query and key maps (the only parameters
whose gradient passes through the softmax alone; saturation shrinks it), and the attention
statistics of a fixed held-out batch, into a JSON file in the run folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from qkv._fs import atomic_write_text
from qkv.analysis.heads import HeadAccumulator
from qkv.analysis.specialisation import specialised_heads
from qkv.models.kinds import encoder_of

__all__ = ["attention_summary", "head_summary", "encoder_attentions", "grad_norms", "EarlyStats"]


def attention_summary(attentions: Sequence[Tensor], mask: Tensor) -> dict:
    """Self share, self top-1, chance, max weight and entropy of self-attention weights.

    Args:
        attentions: L tensors ``(B,H,T,T)`` (rows: queries, columns: keys).
        mask: ``(B,T)`` bool, True at real tokens.

    Returns:
        ``{"self_share", "self_top1", "chance", "max_weight", "entropy", "self_share_by_layer"}``
        (floats; the last a list of L floats).
    """
    w = torch.stack([a.detach().float().cpu() for a in attentions])  # L × (B,H,T,T) -> (L,B,H,T,T)
    L, B, H, T, S = w.shape
    if T != S:
        raise ValueError(f"self-attention weights must be square, got (T, S) = ({T}, {S})")
    m = mask.bool().cpu()  # (B,T)
    q = m[None, :, None, :].expand(L, B, H, T).float()  # (L,B,H,T): 1 at real queries
    diag = w.diagonal(dim1=-2, dim2=-1)  # (L,B,H,T,T) -> (L,B,H,T)
    top1 = (w.argmax(-1) == torch.arange(T)).float()  # (L,B,H,T)
    max_w = w.amax(-1)  # (L,B,H,T)
    entropy = -(w * w.clamp_min(1e-30).log()).sum(-1)  # (L,B,H,T); 0·log 0 = 0
    n = m.sum(-1).clamp_min(1).float()  # (B,) real tokens per block
    per_query_chance = (m.float() / n[:, None])  # (B,T): 1/n at real queries

    def mean(x: Tensor) -> float:
        return float((x * q).sum() / q.sum())

    by_layer = ((diag * q).sum((1, 2, 3)) / q.sum((1, 2, 3))).tolist()  # (L,)
    return {"self_share": mean(diag), "self_top1": mean(top1),
            "chance": float(per_query_chance.sum() / m.sum().clamp_min(1)),
            "max_weight": mean(max_w), "entropy": mean(entropy), "self_share_by_layer": by_layer}


def head_summary(attentions: Sequence[Tensor], input_ids: Tensor, mask: Tensor, *, cls_id: int, sep_id: int,
                 threshold: float = 0.3) -> dict:
    """Whether the heads specialised (the ``heads`` statistic): the per-head statistics of
    :mod:`qkv.analysis.heads` over the same weights :func:`attention_summary` reads.

    Args:
        attentions: L tensors ``(B,H,T,T)`` of unmasked blocks ``input_ids (B,T)``.
        mask: ``(B,T)`` bool, True at real tokens.

    Returns ``{"max_prev_share", "max_next_share", "specialised_heads", "head_entropy",
    "uniform_entropy"}``: the largest share any head puts on the previous / next token (uniform
    attention over a 128-token block: ≈ 0.008), how many heads put ≥ ``threshold`` of their attention
    on one place (previous, next, itself, ``[CLS]``), the mean entropy of every head's attention and
    that of uniform attention (log n), both in nats.
    """
    acc = HeadAccumulator(cls_id, sep_id)
    weights = torch.stack([a.detach().float().cpu() for a in attentions])  # L × (B,H,T,T) -> (L,B,H,T,T)
    acc.update(weights, mask.cpu(), input_ids.cpu())
    stats = acc.result()
    return {"max_prev_share": float(stats.prev_share.max()), "max_next_share": float(stats.next_share.max()),
            "specialised_heads": len(specialised_heads(stats, threshold=threshold)),
            "head_entropy": float(stats.entropy.mean()), "uniform_entropy": float(stats.uniform_entropy)}


@torch.no_grad()
def encoder_attentions(model: nn.Module, input_ids: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
    """Every layer's ``(B,H,T,T)`` attention weights of a qkv model (masked-LM or encoder), in
    eval mode (restored afterwards), without running the vocabulary head."""
    encoder = encoder_of(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        out = encoder(input_ids.to(device), mask.to(device), output_attentions=True)
    finally:
        model.train(was_training)
    return out.attentions


def _qk_parts(model: nn.Module):
    """``(weight, bias, rows)`` of every fused Q/K/V map: rows ``[0:C+G·D]`` are the Q and K maps
    (G key/value heads of width D; ``2C`` when G = H)."""
    for module in model.modules():
        proj = getattr(module, "qkv_proj", None)
        d_model = getattr(module, "d_model", None)
        if isinstance(proj, nn.Linear) and isinstance(d_model, int):
            kv_width = getattr(module, "n_kv_heads", 1) * getattr(module, "d_head", d_model)  # G·D
            yield proj.weight, proj.bias, getattr(module, "qk_rows", d_model + kv_width)


def grad_norms(model: nn.Module) -> dict:
    """``{"grad_norm": ‖∇θ‖ over all parameters, "qk_grad_norm": ‖∇‖ of the Q and K maps}`` (the
    latter NaN for a model without Q/K maps). Read after ``backward()``, before clipping."""
    total = sum(float(p.grad.detach().double().pow(2).sum())
                for p in model.parameters() if p.grad is not None)
    qk, found = 0.0, False
    for weight, bias, rows in _qk_parts(model):
        for t in (weight, bias):
            if t is not None and t.grad is not None:
                qk += float(t.grad[:rows].detach().double().pow(2).sum())
                found = True
    return {"grad_norm": math.sqrt(total), "qk_grad_norm": math.sqrt(qk) if found else float("nan")}


class EarlyStats:
    """``pretrain(on_backward=…)`` hook recording gradient norms and attention saturation on the
    first ``n_steps`` steps into ``path`` (``{"<step>": {...}}``; a resumed run rewrites the same
    values for the steps it repeats).

    Args:
        path: the JSON file (inside the run folder, which exists once training runs).
        input_ids, mask: ``(B,T)`` a fixed held-out probe batch.
        n_steps: steps 1..n_steps are recorded.
    """

    def __init__(self, path: Path, input_ids: Tensor, mask: Tensor, n_steps: int):
        self.path, self.input_ids, self.mask, self.n_steps = Path(path), input_ids, mask, n_steps
        self.records: dict[str, dict] | None = None

    def load(self) -> dict[str, dict]:
        if self.path.is_file():
            return json.loads(self.path.read_text(encoding="utf-8"))
        return {}

    def __call__(self, step: int, model: nn.Module) -> None:
        if step > self.n_steps:
            return
        if self.records is None:
            self.records = self.load()
        rec = grad_norms(model)
        summary = attention_summary(encoder_attentions(model, self.input_ids, self.mask), self.mask)
        rec.update({k: summary[k] for k in ("max_weight", "entropy", "self_share")})
        self.records[str(step)] = rec
        atomic_write_text(self.path, json.dumps(self.records, indent=1))

    def summary(self) -> dict:
        """Means over the recorded steps: ``max_weight_early``, ``entropy_early``,
        ``grad_norm_early``, ``qk_grad_norm_early`` and ``early_steps`` (how many were recorded)."""
        records = self.load()
        out = {"early_steps": len(records)}
        for key in ("max_weight", "entropy", "grad_norm", "qk_grad_norm"):
            values = [r[key] for r in records.values()]
            out[f"{key}_early"] = sum(values) / len(values) if values else float("nan")
        return out
