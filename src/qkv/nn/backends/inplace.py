"""The in-place weights backend: the returned weights are the only ``(B,H,T,S)`` tensor.

Legend: B batch, H heads, T query length, S key length, D head dim, E value head dim, G key/value heads.

For weights without autograd (analysis, the attention viewer): the weights are allocated once and
every stage runs in them — the similarity's GEMM writes each batch row's scores straight into them
(:func:`dot_scores_`), then + bias → mask → softmax in place (:func:`softmax_scores_`: the bias by
blocks of query rows, so a row-block bias is never made whole), then weights·V. Same numbers as the
explicit backend. Needs a dot-product similarity, no autograd and no dropout. With G < H key/value
heads (grouped-query attention) the g = H/G query heads of a group are g·T rows of one GEMM against
their group's keys (views of the weights, no copy of k or v); a sliding window is a band in the mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.nn.backends.base import AttendCall, Backend, Features, Supports
from qkv.nn.stages import AttendOutput, Bias, bias_rows, block_mask, mix

__all__ = ["InplaceBackend", "dot_scores_", "softmax_scores_"]


def dot_scores_(scores: Tensor, q: Tensor, k: Tensor, similarity) -> Tensor:
    """In place: write a dot-product similarity's scores of ``q``, ``k`` into ``scores``.

    Same numbers as ``similarity.scores`` (``scale`` is the GEMM's alpha).

    Args:
        scores: ``(B,H,T,S)`` contiguous output; its old contents are ignored.
        q: ``(B,H,T,D)``. k: ``(B,G,S,D)`` (G divides H).
        similarity: a similarity with a dot-product form (``as_dot``).
    """
    qd, kd, scale = similarity.as_dot(q, k)  # (B,H,T,D'), (B,G,S,D')
    B, H, T, S = scores.shape
    G = kd.shape[1]
    s3 = scores.view(B * G, H // G * T, S)  # (B,H,T,S) -> (B·G,g·T,S), a view
    qd = qd.reshape(B * G, H // G * T, qd.shape[-1])  # (B,H,T,D') -> (B·G,g·T,D')
    kt = kd.reshape(B * G, S, kd.shape[-1]).transpose(1, 2)  # (B,G,S,D') -> (B·G,S,D') -> (B·G,D',S)
    s3.baddbmm_(qd, kt, beta=0.0, alpha=float(scale))  # (B·G,g·T,D')(B·G,D',S) -> (B·G,g·T,S)
    return scores


def softmax_scores_(scores: Tensor, *, bias: Bias | None, mask: Tensor | None, causal: bool,
                    block: int = 2**20, window: int | None = None) -> Tensor:
    """In place: scores → + bias → mask → softmax on ``(B,H,T,S)``.

    The bias goes in by blocks of query rows (``block`` elements of bias at a time), mask and
    softmax one batch row at a time. Same numbers as :func:`~qkv.nn.stages.masked_softmax` (fully
    masked rows are zeros).

    Args:
        scores: ``(B,H,T,S)``, overwritten with the weights.
        bias: a tensor broadcastable to ``(B,H,T,S)`` or a row-block function.
        mask: boolean, 4-D broadcastable to ``(B,H,T,S)``; True = may attend.
        causal: also forbid keys after the query (aligned at the end when S > T).
        window: ``None`` or a sliding window W (``|i - j| ≤ W // 2``).
    """
    B, H, T, S = scores.shape
    if isinstance(bias, Tensor):
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))  # left-pad to 4-D
    if bias is not None:
        n = max(1, block // (H * S))
        for start in range(0, T, n):
            stop = min(T, start + n)
            b = bias_rows(bias, start, stop).to(scores.dtype)  # (B?,H?,t,S)
            scores[:, :, start:stop] += b  # (B,H,t,S) += (B?,H?,t,S), in place
    for i in range(B):
        w = scores[i : i + 1]  # (1,H,T,S) view
        m = None if mask is None else mask[i : i + 1] if mask.shape[0] > 1 else mask  # (1?,H?,T?,S?)
        m = block_mask(m, causal, 0, T, T, S, scores.device, window=window)
        if m is None:
            torch.softmax(w, dim=-1, out=w)
            continue
        w.masked_fill_(~m, float("-inf"))
        row_ok = m.any(dim=-1, keepdim=True)  # (1?,H?,T?,1)
        w.masked_fill_(~row_ok, 0.0)  # a row with no key would be all -inf → NaN
        torch.softmax(w, dim=-1, out=w)
        w.masked_fill_(~row_ok, 0.0)
    return scores


class InplaceBackend(Backend):
    """Weights filled in place (see the module docstring)."""

    # float16 is left out: the scores are written into the (B,H,T,S) weights before the softmax, and
    # float16's range (65504) overflows where the other backends compute them in float32
    supports = Supports(weights=True, window=True, window_as_mask=True, dropout=False, autograd=False,
                        grouped_kv=True, empty=False, dtypes=("float32", "float64", "bfloat16"), memory="blocks")

    def speed(self, f: Features) -> float:
        # the weights' own memory only; without a wish for weights it makes them for nothing
        return 1.0 if f.need_weights else 9.0

    def run(self, call: AttendCall) -> AttendOutput:
        B, H, T, S = call.shape
        weights = call.weights_out if call.weights_out is not None else call.q.new_empty(B, H, T, S)  # the only score-sized tensor
        for i in range(B):  # one batch row at a time: the similarity's temporaries stay (1,H,·,D)
            dot_scores_(weights[i : i + 1], call.q[i : i + 1], call.k[i : i + 1], call.similarity)
        softmax_scores_(weights, bias=call.bias, mask=call.mask, causal=call.causal, window=call.window)
        return AttendOutput(mix(weights, call.v), weights)  # (B,H,T,S)(B,G,S,E) -> (B,H,T,E)
