"""The stages of attention, as the textbook writes them: similarity → bias → mask → softmax →
dropout → weights·V.

Legend: B batch, H heads, T query length, S key length, D head dim (q, k), E value head dim.

:func:`staged_attention` is the whole computation on materialised ``(B,H,T,S)`` scores — the
reference every backend in :mod:`qkv.nn.backends` is tested against. The helpers take rows of a
mask or a bias for a block of queries (the chunked and in-place backends work block by block).

Masks: boolean, broadcastable to ``(B,H,T,S)``, True = may attend. A query whose keys are all
masked gets weights of zeros and an output of zeros — never NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["AttendOutput", "Bias", "staged_attention", "masked_softmax", "rows", "bias_rows",
           "block_mask"]

#: A score bias: a tensor broadcastable to (B,H,T,S), or a function ``(start, stop) -> tensor``
#: broadcastable to (B,H,stop-start,S) that computes the rows of a block of queries on demand.
Bias = Tensor | Callable[[int, int], Tensor]


@dataclass
class AttendOutput:
    """Result of :func:`qkv.nn.attend.attend` and of every backend.

    Attributes:
        output: ``(B,H,T,E)`` attended values.
        weights: ``(B,H,T,S)`` attention weights before dropout, or ``None`` unless requested.
    """

    output: Tensor
    weights: Tensor | None = None


def rows(t: Tensor | None, start: int, stop: int) -> Tensor | None:
    """Rows [start, stop) of a 4-D tensor broadcastable along T (dim 2)."""
    if t is None or t.shape[2] == 1:
        return t
    return t[:, :, start:stop]  # (B?,H?,T,S) -> (B?,H?,stop-start,S)


def bias_rows(bias: Bias | None, start: int, stop: int) -> Tensor | None:
    """Rows [start, stop) of a bias tensor or row-block function: ``(B?,H?,stop-start,S)``."""
    if bias is None:
        return None
    if callable(bias) and not isinstance(bias, Tensor):
        return bias(start, stop)
    return rows(bias, start, stop)


def block_mask(mask: Tensor | None, causal: bool, start: int, stop: int, t: int, s: int, device):
    """Rows [start, stop) of ``mask`` AND'ed with the causal mask (aligned at the end when S > T)."""
    m = rows(mask, start, stop)
    if causal:
        r = torch.arange(start, stop, device=device)[:, None] + (s - t)  # (t,1)
        c = r >= torch.arange(s, device=device)  # (t,1) vs (S,) -> (t,S), rows of causal_mask
        m = c if m is None else m & c
    return m


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last dim with masked entries exactly 0 and fully-masked rows all 0."""
    if mask is None:
        return scores.softmax(dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    row_ok = mask.any(dim=-1, keepdim=True)  # (...,T,1)
    scores = scores.masked_fill(~row_ok, 0.0)  # a row with no key would be all -inf → NaN
    return scores.softmax(dim=-1).masked_fill(~row_ok, 0.0)


def staged_attention(q: Tensor, k: Tensor, v: Tensor, similarity, bias: Tensor | None,
                     mask: Tensor | None, dropout_p: float) -> tuple[Tensor, Tensor]:
    """similarity → + bias → mask → softmax → dropout → mix, on materialised scores.

    In float16 / bfloat16 a dot-product similarity's scores and softmax are computed in float32
    (as the fused kernel does: qᵀk may overflow float16); the weights come back in q's dtype.

    Args:
        q: ``(B,H,T,D)``. k: ``(B,H,S,D)``. v: ``(B,H,S,E)``.
        similarity: a similarity module (:mod:`qkv.nn.similarity`).
        bias: ``None`` or a float tensor broadcastable to ``(B,H,T,S)`` (cast to q's dtype).
        mask: ``None`` or a boolean mask broadcastable to ``(B,H,T,S)``; True = may attend.
        dropout_p: dropout on the weights (the returned weights are before dropout).

    Returns:
        ``(output (B,H,T,E), weights (B,H,T,S))``.
    """
    half = q.dtype in (torch.float16, torch.bfloat16) and getattr(similarity, "has_dot_form", False)
    if half:
        qd, kd, scale = similarity.as_dot(q, k)
        scores = (qd.float() * scale) @ kd.float().transpose(-2, -1)  # (B,H,T,D')(B,H,D',S) -> (B,H,T,S) float32
    else:
        scores = similarity.scores(q, k)  # (B,H,T,S)
    if bias is not None:
        scores = scores + bias.to(q.dtype).to(scores.dtype)  # as on the sdpa path: the bias follows q's dtype
    weights = masked_softmax(scores, mask)  # (B,H,T,S)
    if half:
        weights = weights.to(q.dtype)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights  # (B,H,T,S)(B,H,S,E) -> (B,H,T,E)
