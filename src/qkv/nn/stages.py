"""The stages of attention, as the textbook writes them: similarity → bias → mask → softmax →
dropout → weights·V.

Legend: B batch, H heads, T query length, S key length, D head dim (q, k), E value head dim,
G key/value heads (grouped-query attention: G divides H, query head h reads key/value head
h // (H/G); G = H is plain multi-head attention).

:func:`staged_attention` is the whole computation on materialised ``(B,H,T,S)`` scores — the
reference every backend in :mod:`qkv.nn.backends` is tested against. The helpers take rows of a
mask or a bias for a block of queries (the chunked and in-place backends work block by block).

Masks: boolean, broadcastable to ``(B,H,T,S)``, True = may attend. A query whose keys are all
masked gets weights of zeros and an output of zeros — never NaN. A sliding ``window`` W lets query
i see key j iff ``|i - j| ≤ W // 2`` (query positions aligned with the last keys when S > T).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["AttendOutput", "Bias", "staged_attention", "masked_softmax", "rows", "bias_rows",
           "block_mask", "window_keys", "expand_kv", "dot_scores", "mix"]

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


def block_mask(mask: Tensor | None, causal: bool, start: int, stop: int, t: int, s: int, device, *,
               window: int | None = None, keys: tuple[int, int] | None = None) -> Tensor | None:
    """Rows [start, stop) of ``mask`` AND'ed with the causal mask and the sliding-window band.

    Args:
        mask: ``None`` or a 4-D boolean mask broadcastable to ``(B,H,T,S)``.
        causal: forbid keys after the query (aligned at the end when S > T).
        start, stop: the block's query rows. t, s: T and S of the whole call.
        window: ``None``, or W: query i sees key j iff ``|i + (S-T) - j| ≤ W // 2``.
        keys: only key columns ``[lo, hi)`` (the band of a windowed block), default all S.

    Returns:
        ``(B?,H?,stop-start,hi-lo)`` boolean, or ``None`` when nothing is masked.
    """
    m = rows(mask, start, stop)
    lo, hi = keys if keys is not None else (0, s)
    if m is not None and keys is not None and m.shape[3] > 1:
        m = m[..., lo:hi]  # (B?,H?,t,S) -> (B?,H?,t,hi-lo)
    if causal or window is not None:
        r = torch.arange(start, stop, device=device)[:, None] + (s - t)  # (t,1) query rows in key positions
        c = torch.arange(lo, hi, device=device)  # (S',)
        band = (r >= c) if causal else None  # (t,S'), rows of causal_mask
        if window is not None:
            near = (r - c).abs() <= window // 2  # (t,S'), rows of window_mask
            band = near if band is None else band & near
        m = band if m is None else m & band
    return m


def window_keys(start: int, stop: int, t: int, s: int, window: int) -> tuple[int, int]:
    """Key columns ``[lo, hi)`` a window W lets query rows [start, stop) see (aligned as in :func:`block_mask`)."""
    half = window // 2
    return max(0, start + (s - t) - half), min(s, stop - 1 + (s - t) + half + 1)


def expand_kv(x: Tensor, n_heads: int) -> Tensor:
    """Keys or values of G heads for H query heads: ``(B,G,S,E)`` → ``(B,H,S,E)``, head h = x[:, h // (H/G)].

    transformers' ``repeat_kv``; a copy when G < H (a view when G = H). Only for similarities
    without a dot-product form: the dot-product paths group the queries instead (:func:`dot_scores`).
    """
    B, G, S, E = x.shape
    if G == n_heads:
        return x
    g = n_heads // G
    return x[:, :, None].expand(B, G, g, S, E).reshape(B, n_heads, S, E)  # (B,G,1,S,E) -> (B,G,g,S,E) -> (B,H,S,E)


def dot_scores(q: Tensor, k: Tensor) -> Tensor:
    """``q kᵀ`` for H query heads and G key heads, k never copied: ``(B,H,T,D), (B,G,S,D)`` → ``(B,H,T,S)``.

    The g = H/G query heads of a group become g·T rows against their group's keys.
    """
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    if G == H:
        return q @ k.transpose(-2, -1)  # (B,H,T,D)(B,H,D,S) -> (B,H,T,S)
    qg = q.reshape(B, G, H // G * T, D)  # (B,H,T,D) -> (B,G,g·T,D)
    return (qg @ k.transpose(-2, -1)).view(B, H, T, S)  # (B,G,g·T,D)(B,G,D,S) -> (B,G,g·T,S) -> (B,H,T,S)


def mix(weights: Tensor, v: Tensor) -> Tensor:
    """``weights · V`` for H query heads and G value heads, v never copied.

    ``(B,H,T,S), (B,G,S,E)`` → ``(B,H,T,E)``.
    """
    B, H, T, S = weights.shape
    G, E = v.shape[1], v.shape[3]
    if G == H:
        return weights @ v  # (B,H,T,S)(B,H,S,E) -> (B,H,T,E)
    wg = weights.reshape(B, G, H // G * T, S)  # (B,H,T,S) -> (B,G,g·T,S)
    return (wg @ v).view(B, H, T, E)  # (B,G,g·T,S)(B,G,S,E) -> (B,G,g·T,E) -> (B,H,T,E)


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

    With G < H key/value heads a dot-product similarity's ``as_dot`` gets the G-head keys (every
    built-in one treats q and k separately) and the queries are grouped (:func:`dot_scores`); a
    similarity without one gets keys and values expanded to H heads (:func:`expand_kv`).

    Args:
        q: ``(B,H,T,D)``. k: ``(B,G,S,D)``. v: ``(B,G,S,E)``.
        similarity: a similarity module (:mod:`qkv.nn.similarity`).
        bias: ``None`` or a float tensor broadcastable to ``(B,H,T,S)`` (cast to q's dtype).
        mask: ``None`` or a boolean mask broadcastable to ``(B,H,T,S)``; True = may attend.
        dropout_p: dropout on the weights (the returned weights are before dropout).

    Returns:
        ``(output (B,H,T,E), weights (B,H,T,S))``.
    """
    grouped = k.shape[1] != q.shape[1]
    dot = getattr(similarity, "has_dot_form", False)
    if grouped and not dot:
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])  # (B,G,S,·) -> (B,H,S,·)
        grouped = False
    half = q.dtype in (torch.float16, torch.bfloat16) and dot
    if half or grouped:
        qd, kd, scale = similarity.as_dot(q, k)
        if half:
            qd, kd = qd.float(), kd.float()
        scores = dot_scores(qd * scale, kd)  # (B,H,T,S), float32 in half precision
    else:
        scores = similarity.scores(q, k)  # (B,H,T,S)
    if bias is not None:
        scores = scores + bias.to(q.dtype).to(scores.dtype)  # as on the sdpa path: the bias follows q's dtype
    weights = masked_softmax(scores, mask)  # (B,H,T,S)
    if half:
        weights = weights.to(q.dtype)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return mix(dropped, v), weights  # (B,H,T,S)(B,G,S,E) -> (B,H,T,E)
