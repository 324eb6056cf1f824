"""The explicit backend: the staged core on materialised ``(B,H,T,S)`` scores; returns the weights.

Legend: B batch, H heads, T query length, S key length. Keys and values may have fewer heads
(grouped-query attention, see :func:`~qkv.nn.stages.staged_attention`); a sliding window is a
``(T,S)`` band in the mask.
"""

from __future__ import annotations

from qkv.nn.backends.base import AttendCall, Backend, Features, Supports
from qkv.nn.stages import AttendOutput, bias_rows, block_mask, staged_attention

__all__ = ["ExplicitBackend"]


class ExplicitBackend(Backend):
    """:func:`~qkv.nn.stages.staged_attention` over all queries at once."""

    supports = Supports(weights=True, any_similarity=True, window=True, grouped_kv=True, memory="scores")

    def speed(self, f: Features) -> float:
        return 3.0

    def run(self, call: AttendCall) -> AttendOutput:
        _, _, T, S = call.shape
        m = block_mask(call.mask, call.causal, 0, T, T, S, call.q.device, window=call.window)  # (B?,H?,T?,S)
        out, w = staged_attention(call.q, call.k, call.v, call.similarity, bias_rows(call.bias, 0, T), m,
                                  call.dropout_p)
        return AttendOutput(out, call.put_weights(w))
