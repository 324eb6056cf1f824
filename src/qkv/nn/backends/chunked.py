"""The chunked backend: the staged core over blocks of queries, memory ``O(B·H·chunk·S)``.

Legend: B batch, H heads, T query length, S key length, E value head dim, t block length.

Under autograd each block is recomputed in backward (activation checkpointing, which replays
dropout), so training memory stays bounded too. Without autograd the blocks are written into one
preallocated output (and weights): keeping thousands of small block tensors alive between large
temporaries fragments the heap (RSS grew ~1 MiB per block).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from qkv.nn.backends import AttendCall, Backend, needs_grad, register_backend
from qkv.nn.stages import AttendOutput, bias_rows, block_mask, staged_attention

__all__ = ["ChunkedBackend", "chunk_length"]


def chunk_length(call: AttendCall) -> int:
    """Queries per block: ``call.chunk_size``, or as many as fit ``call.budget``."""
    if call.chunk_size is not None:
        return call.chunk_size
    B, H, _, S = call.shape
    return max(1, call.budget // max(1, B * H * S * call.cost))


def _checkpointed_block(q, k, v, similarity, bias, start, stop, mask, dropout_p):
    """:func:`staged_attention` that makes its own bias rows, so that checkpointing keeps none."""
    return staged_attention(q, k, v, similarity, bias_rows(bias, start, stop), mask, dropout_p)


@register_backend("chunked", builtin=True)
class ChunkedBackend(Backend):
    """The explicit computation one block of queries at a time (see the module docstring)."""

    def run(self, call: AttendCall) -> AttendOutput:
        q, k, v = call.q, call.k, call.v
        B, H, T, S = call.shape
        chunk, grad, need = chunk_length(call), needs_grad(call), call.need_weights
        outs: list[Tensor] = []
        out_all = None if grad else v.new_empty(B, H, T, v.shape[3])  # (B,H,T,E)
        weights = None  # without autograd: filled block by block (the caller's buffer when given)
        if need and not grad:
            weights = call.weights_out if call.weights_out is not None else q.new_empty(B, H, T, S)
        weight_blocks: list[Tensor] = []
        for start in range(0, T, chunk):
            stop = min(T, start + chunk)
            qc = q[:, :, start:stop]  # (B,H,t,D)
            m = block_mask(call.mask, call.causal, start, stop, T, S, q.device)
            if grad and not need:
                out, _ = checkpoint(_checkpointed_block, qc, k, v, call.similarity, call.bias, start, stop, m,
                                    call.dropout_p, use_reentrant=False)
            else:
                out, w = staged_attention(qc, k, v, call.similarity, bias_rows(call.bias, start, stop), m,
                                          call.dropout_p)
                if weights is not None:
                    weights[:, :, start:stop] = w  # (B,H,t,S) into rows [start, stop)
                elif need:
                    weight_blocks.append(w)
            if out_all is not None:
                out_all[:, :, start:stop] = out  # (B,H,t,E) into rows [start, stop) of (B,H,T,E)
            else:
                outs.append(out)
        if weight_blocks:
            weights = torch.cat(weight_blocks, dim=2)  # blocks of (B,H,t,S) -> (B,H,T,S)
        out = out_all if out_all is not None else torch.cat(outs, dim=2)  # blocks of (B,H,t,E) -> (B,H,T,E)
        return AttendOutput(out, call.put_weights(weights))
