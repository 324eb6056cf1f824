"""The staged attention core: similarity → bias → mask → softmax → dropout → weights·V.

Legend: B batch, H heads, T query length, S key length, D head dim (q, k), E value head dim.

:func:`attend` is pure (no state) and has three execution paths that give the same numbers:

* ``"sdpa"`` — ``torch.nn.functional.scaled_dot_product_attention`` on the similarity's dot-product
  form (``similarity.as_dot``); additive score biases go in as its float ``attn_mask``. Cannot
  return weights. On CPU, torch runs a flash kernel here whose memory is linear in T.
* ``"explicit"`` — scores materialised as ``(B,H,T,S)``; can return the weights.
* ``"chunked"`` — the explicit path over blocks of queries, so that work memory is
  ``O(B·H·chunk·S)``; under autograd each block is recomputed in backward (activation
  checkpointing), so training memory stays bounded too.

Two in-place stage functions serve :class:`~qkv.nn.attention.MultiHeadAttention`'s low-memory
weights path (no autograd), which never makes a score-sized tensor besides the returned weights:
:func:`dot_scores_` (similarity, the GEMM writing into a given buffer) and :func:`softmax_scores_`
(+ bias → mask → softmax in that buffer).

``path="auto"`` picks sdpa when the similarity has a dot-product form and weights are not wanted,
otherwise explicit when the score tensor is small and chunked when it is not.

An offset bias (:class:`~qkv.nn.blockwise.OffsetBias`: relative, T5, ALiBi positions) is never made
dense on the sdpa path: :func:`~qkv.nn.blockwise.offset_attention` runs it on the flash kernel,
learned-table gradient included. ``"auto"`` sends a small learned one to the explicit path (faster
there), and one with a causal mask, a mask over queries or dropout to the chunked path.

Masks: boolean, broadcastable to ``(B,H,T,S)``, True = may attend. A query whose keys are all
masked gets an output of zeros and weights of zeros on every path — never NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from qkv.nn.blockwise import OffsetBias, offset_attention, offset_fast_ok
from qkv.nn.masks import check_mask

__all__ = ["attend", "AttendOutput", "PATHS", "DEFAULT_BUDGET", "dot_scores_", "softmax_scores_"]

PATHS = ("auto", "sdpa", "explicit", "chunked")
#: Elements of score work memory one explicit block may use (2**24 floats = 64 MiB in float32).
DEFAULT_BUDGET = 2**24

#: A score bias: a tensor broadcastable to (B,H,T,S), or a function ``(start, stop) -> tensor``
#: broadcastable to (B,H,stop-start,S) that computes the rows of a block of queries on demand.
Bias = Tensor | Callable[[int, int], Tensor]


@dataclass
class AttendOutput:
    """Result of :func:`attend`.

    Attributes:
        output: ``(B,H,T,E)`` attended values.
        weights: ``(B,H,T,S)`` attention weights before dropout, or ``None`` unless requested.
    """

    output: Tensor
    weights: Tensor | None = None


def _check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B,H,len,dim), got {shape}")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"q, k, v must share (B,H); got {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, "
            f"{tuple(v.shape[:2])}"
        )
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length S, got {k.shape[2]} and {v.shape[2]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head dim, got {q.shape[3]} and {k.shape[3]}")


def _rows(t: Tensor | None, start: int, stop: int) -> Tensor | None:
    """Rows [start, stop) of a 4-D tensor broadcastable along T (dim 2)."""
    if t is None or t.shape[2] == 1:
        return t
    return t[:, :, start:stop]  # (B?,H?,T,S) -> (B?,H?,stop-start,S)


def _bias_rows(bias: Bias | None, start: int, stop: int) -> Tensor | None:
    if bias is None:
        return None
    if callable(bias) and not isinstance(bias, Tensor):
        return bias(start, stop)
    return _rows(bias, start, stop)


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last dim with masked entries exactly 0 and fully-masked rows all 0."""
    if mask is None:
        return scores.softmax(dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    row_ok = mask.any(dim=-1, keepdim=True)  # (...,T,1)
    scores = scores.masked_fill(~row_ok, 0.0)  # a row with no key would be all -inf → NaN
    return scores.softmax(dim=-1).masked_fill(~row_ok, 0.0)


def dot_scores_(scores: Tensor, q: Tensor, k: Tensor, similarity) -> Tensor:
    """In place: write a dot-product similarity's scores of ``q``, ``k`` into ``scores``.

    The first stage of the low-memory weights path of :class:`~qkv.nn.attention.MultiHeadAttention`:
    the GEMM writes straight into ``scores`` (e.g. a batch row of the returned weights), so no other
    score-sized tensor exists. Same numbers as ``similarity.scores`` (``scale`` is the GEMM's alpha).

    Args:
        scores: ``(B,H,T,S)`` contiguous output; its old contents are ignored.
        q: ``(B,H,T,D)``. k: ``(B,H,S,D)``.
        similarity: a similarity with a dot-product form (``as_dot``).
    """
    qd, kd, scale = similarity.as_dot(q, k)  # (B,H,T,D'), (B,H,S,D')
    B, H, T, S = scores.shape
    s3 = scores.view(B * H, T, S)  # (B,H,T,S) -> (B·H,T,S), a view
    qd = qd.reshape(B * H, T, qd.shape[-1])  # (B,H,T,D') -> (B·H,T,D')
    kt = kd.reshape(B * H, S, kd.shape[-1]).transpose(1, 2)  # (B,H,S,D') -> (B·H,S,D') -> (B·H,D',S)
    s3.baddbmm_(qd, kt, beta=0.0, alpha=float(scale))  # (B·H,T,D')(B·H,D',S) -> (B·H,T,S)
    return scores


def softmax_scores_(scores: Tensor, *, bias: Bias | None, mask: Tensor | None, causal: bool,
                    block: int = 2**20) -> Tensor:
    """In place: scores → + bias → mask → softmax, the explicit path's stages on ``(B,H,T,S)``.

    No tensor of the size of ``scores`` is made: the bias goes in by blocks of query rows
    (``block`` elements of bias at a time, so a row-block bias is never made whole), mask and
    softmax go one batch row at a time. Same numbers as :func:`masked_softmax` (fully masked rows
    are zeros).

    Args:
        scores: ``(B,H,T,S)``, overwritten with the weights.
        bias: as for :func:`attend` (a tensor already 4-D, or a row-block function).
        mask: boolean, 4-D broadcastable to ``(B,H,T,S)``; True = may attend.
        causal: also forbid keys after the query (aligned at the end when S > T).
    """
    B, H, T, S = scores.shape
    if isinstance(bias, Tensor):
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))  # left-pad to 4-D
    if bias is not None:
        rows = max(1, block // (H * S))
        for start in range(0, T, rows):
            stop = min(T, start + rows)
            b = _bias_rows(bias, start, stop).to(scores.dtype)  # (B?,H?,t,S)
            scores[:, :, start:stop] += b  # (B,H,t,S) += (B?,H?,t,S), in place
    for i in range(B):
        w = scores[i : i + 1]  # (1,H,T,S) view
        m = None if mask is None else mask[i : i + 1] if mask.shape[0] > 1 else mask  # (1?,H?,T?,S?)
        m = _block_mask(m, causal, 0, T, T, S, scores.device)
        if m is None:
            torch.softmax(w, dim=-1, out=w)
            continue
        w.masked_fill_(~m, float("-inf"))
        row_ok = m.any(dim=-1, keepdim=True)  # (1?,H?,T?,1)
        w.masked_fill_(~row_ok, 0.0)  # a row with no key would be all -inf → NaN
        torch.softmax(w, dim=-1, out=w)
        w.masked_fill_(~row_ok, 0.0)
    return scores


def _explicit_block(q, k, v, similarity, bias, mask, dropout_p):
    half = q.dtype in (torch.float16, torch.bfloat16) and getattr(similarity, "has_dot_form", False)
    if half:  # scores and softmax in float32, as the fused kernel does: qᵀk may overflow float16
        qd, kd, scale = similarity.as_dot(q, k)
        scores = (qd.float() * scale) @ kd.float().transpose(-2, -1)  # (B,H,t,S) float32
    else:
        scores = similarity.scores(q, k)  # (B,H,t,S)
    if bias is not None:
        scores = scores + bias.to(q.dtype).to(scores.dtype)  # as on the sdpa path: the bias follows q's dtype
    weights = masked_softmax(scores, mask)  # (B,H,t,S)
    if half:
        weights = weights.to(q.dtype)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights  # (B,H,t,S)(B,H,S,E) -> (B,H,t,E)


def _block_mask(mask: Tensor | None, causal: bool, start: int, stop: int, t: int, s: int, device):
    m = _rows(mask, start, stop)
    if causal:
        rows = torch.arange(start, stop, device=device)[:, None] + (s - t)  # (t,1)
        c = rows >= torch.arange(s, device=device)  # (t,1) vs (S,) -> (t,S), rows of causal_mask
        m = c if m is None else m & c
    return m


def _sdpa(q, k, v, similarity, bias, mask, causal, dropout_p):
    qd, kd, scale = similarity.as_dot(q, k)
    t, s = q.shape[2], k.shape[2]
    if causal and mask is None and bias is None and t == s:
        return F.scaled_dot_product_attention(qd, kd, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    m = _block_mask(mask, causal, 0, t, t, s, q.device)
    row_ok = None
    if m is not None:
        row_ok = m.any(dim=-1, keepdim=True)  # (B?,H?,T?,1)
        m = m | ~row_ok  # a row with no key attends everywhere; its output is zeroed below
    attn_mask = m
    if bias is not None:
        b = _bias_rows(bias, 0, t).to(qd.dtype)
        attn_mask = b if m is None else b.masked_fill(~m, float("-inf"))
    out = F.scaled_dot_product_attention(qd, kd, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    if row_ok is not None:
        out = out * row_ok  # (B,H,T,E) * (B?,H?,T?,1)
    return out


def _checkpointed_block(q, k, v, similarity, bias, start, stop, mask, dropout_p):
    """:func:`_explicit_block` that makes its own bias rows, so that checkpointing keeps none."""
    return _explicit_block(q, k, v, similarity, _bias_rows(bias, start, stop), mask, dropout_p)


def _chunked(q, k, v, similarity, bias, mask, causal, dropout_p, need_weights, chunk):
    B, H, T, _ = q.shape
    S = k.shape[2]
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or any(
        p.requires_grad for p in similarity.parameters()) or bool(getattr(bias, "requires_grad", False)))
    outs: list[Tensor] = []
    # Without autograd, blocks are written into one preallocated output: keeping thousands of small
    # block tensors alive between large temporaries fragments the heap (RSS grew ~1 MiB per block).
    out_all = None if grad else v.new_empty(B, H, T, v.shape[3])  # (B,H,T,E)
    weight_blocks: list[Tensor] = []
    weights = None
    if need_weights and not grad:
        weights = q.new_empty(B, H, T, S)  # filled block by block: no (B,H,T,S) copies
    for start in range(0, T, chunk):
        stop = min(T, start + chunk)
        qc = q[:, :, start:stop]  # (B,H,t,D)
        m = _block_mask(mask, causal, start, stop, T, S, q.device)
        if grad and not need_weights:
            out, _ = checkpoint(_checkpointed_block, qc, k, v, similarity, bias, start, stop, m, dropout_p,
                                use_reentrant=False)
        else:
            out, w = _explicit_block(qc, k, v, similarity, _bias_rows(bias, start, stop), m, dropout_p)
            if weights is not None:
                weights[:, :, start:stop] = w
            elif need_weights:
                weight_blocks.append(w)
        if out_all is not None:
            out_all[:, :, start:stop] = out  # (B,H,t,E) into rows [start, stop) of (B,H,T,E)
        else:
            outs.append(out)
    if weight_blocks:
        weights = torch.cat(weight_blocks, dim=2)  # blocks of (B,H,t,S) -> (B,H,T,S)
    if out_all is not None:
        return out_all, weights
    return torch.cat(outs, dim=2), weights  # blocks of (B,H,t,E) -> (B,H,T,E)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    similarity,
    bias: Bias | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    path: str = "auto",
    chunk_size: int | None = None,
    budget: int = DEFAULT_BUDGET,
) -> AttendOutput:
    """Attention of queries over keys/values, staged as similarity → bias → mask → softmax → mix.

    Args:
        q: ``(B,H,T,D)`` queries.
        k: ``(B,H,S,D)`` keys.
        v: ``(B,H,S,E)`` values.
        similarity: a similarity module (see :mod:`qkv.nn.similarity`).
        bias: additive score bias, a tensor broadcastable to ``(B,H,T,S)`` or a function
            ``(start, stop) -> (B?,H?,stop-start,S)`` giving the rows of a block of queries.
        mask: boolean, broadcastable to ``(B,H,T,S)``; True = may attend.
        causal: also forbid keys after the query (aligned at the end when S > T).
        dropout_p: dropout on the attention weights (pass 0 in eval mode).
        need_weights: also return the ``(B,H,T,S)`` weights (before dropout).
        path: ``"auto"``, ``"sdpa"``, ``"explicit"`` or ``"chunked"``.
        chunk_size: queries per block on the chunked path (default: sized from ``budget``).
        budget: elements of score work memory per block used to size chunks and pick a path.

    Returns:
        :class:`AttendOutput` with ``output (B,H,T,E)`` and ``weights (B,H,T,S) | None``.
    """
    _check_inputs(q, k, v)
    B, H, T, _ = q.shape
    S = k.shape[2]
    if path not in PATHS:
        raise ValueError(f"unknown attention path {path!r}; allowed: {', '.join(PATHS)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if mask is not None:
        mask = check_mask(mask, (B, H, T, S))
    if isinstance(bias, Tensor):
        if not bias.is_floating_point():
            raise ValueError(f"bias must be a floating-point tensor, got {bias.dtype}")
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))  # left-pad to 4-D
    has_dot = getattr(similarity, "has_dot_form", False)
    cost = int(getattr(similarity, "cost_per_score", 1))
    small = B * H * T * S * cost <= budget
    if isinstance(bias, OffsetBias) and path in ("auto", "sdpa") and has_dot and not need_weights:
        # flash kernel, no (H,T,S) tensor; "auto" keeps small learned biases on the explicit path,
        # which is faster there than the kernel plus the table-gradient passes
        explicit_is_cheaper = path == "auto" and small and bias.requires_grad
        if offset_fast_ok(q, v, bias, mask, causal, dropout_p) and not explicit_is_cheaper:
            out = offset_attention(q, k, v, similarity=similarity, bias=bias, mask=mask, budget=budget)
            return AttendOutput(out)
        if path == "auto" and (bias.requires_grad or H * T * S > budget):
            path = "explicit" if small else "chunked"  # neither SDPA's math path nor a dense mask
    if path == "auto":
        path = "sdpa" if (has_dot and not need_weights) else ("explicit" if small else "chunked")
    if path == "sdpa":
        if not has_dot:
            raise ValueError(
                f"similarity {getattr(similarity, 'name', similarity)!r} has no dot-product form; "
                "use path 'explicit' or 'chunked'"
            )
        if need_weights:
            raise ValueError("the sdpa path cannot return weights; use path 'explicit' or 'chunked'")
        return AttendOutput(_sdpa(q, k, v, similarity, bias, mask, causal, dropout_p))
    if path == "explicit":
        m = _block_mask(mask, causal, 0, T, T, S, q.device)
        out, w = _explicit_block(q, k, v, similarity, _bias_rows(bias, 0, T), m, dropout_p)
        return AttendOutput(out, w if need_weights else None)
    if chunk_size is None:
        chunk_size = max(1, budget // max(1, B * H * S * cost))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    out, w = _chunked(q, k, v, similarity, bias, mask, causal, dropout_p, need_weights, chunk_size)
    return AttendOutput(out, w)
