"""The chunked backend: the staged core over blocks of queries, memory ``O(B·H·chunk·S)``.

Legend: B batch, H heads, G key/value heads, T query length, S key length, E value head dim,
t block length, s' keys of a block's band.

Under autograd each block is recomputed in backward (activation checkpointing, which replays
dropout), so training memory stays bounded too. Without autograd the blocks are written into one
preallocated output (and weights): keeping thousands of small block tensors alive between large
temporaries fragments the heap (RSS grew ~1 MiB per block).

With a sliding window W each block of queries sees only the keys of its band (``t + 2·(W//2)``
of them, :func:`~qkv.nn.stages.window_keys`): the block size follows the window, not S, so the
work memory is constant and the whole call's time and memory linear in T. Weights, when asked for, are the full
``(B,H,T,S)`` with zeros outside the band.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from qkv.nn.backends.base import AttendCall, Backend, Features, Supports, needs_grad
from qkv.nn.stages import AttendOutput, bias_rows, block_mask, staged_attention, window_keys

__all__ = ["ChunkedBackend", "chunk_length"]


def chunk_length(call: AttendCall) -> int:
    """Queries per block: ``call.chunk_size``, or as many as fit ``call.budget``.

    With a window W the block's keys are ``t + 2h`` (h = W // 2): t is ``max(64, 2h)`` (a block
    about the window's size wastes at most half its scores outside the band; measured fastest on
    CPU), or less where ``B·H·t·(t + 2h)`` would exceed the budget (per score cost) — whatever S is.
    """
    if call.chunk_size is not None:
        return call.chunk_size
    B, H, _, S = call.shape
    unit = max(1, B * H * call.cost)
    if call.window is not None:
        h = call.window // 2
        fits = math.isqrt(h * h + call.budget // unit) - h  # t² + 2ht ≤ budget / unit
        return max(1, min(fits, max(64, 2 * h)))
    return max(1, call.budget // (unit * max(1, S)))


def _checkpointed_block(q, k, v, similarity, bias, start, stop, keys, mask, dropout_p):
    """:func:`staged_attention` that makes its own bias rows, so that checkpointing keeps none."""
    return staged_attention(q, k, v, similarity, _bias_block(bias, start, stop, keys), mask, dropout_p)


def _bias_block(bias, start: int, stop: int, keys: tuple[int, int] | None):
    """Bias rows [start, stop), restricted to the key columns of a band."""
    b = bias_rows(bias, start, stop)  # (B?,H?,t,S)
    if b is None or keys is None or b.shape[3] == 1:
        return b
    return b[..., keys[0] : keys[1]]  # (B?,H?,t,S) -> (B?,H?,t,s')


class _Parts:
    """q, k, v cut once into pieces of ``chunk`` rows (``torch.split``) for the blocks under autograd.

    A plain slice ``x[:, :, a:b]`` backpropagates through a zero-filled tensor of x's full size, once
    per block — O(T) per block, O(T²) in all. Split pieces get their gradients accumulated piece
    by piece and joined once, so the backward stays linear in T; a block's band of keys is the
    concatenation of the pieces it touches, cut to ``[lo, hi)`` (a slice of a small tensor).
    """

    def __init__(self, call: AttendCall, chunk: int):
        self.chunk = chunk
        self.q = call.q.split(chunk, dim=2)  # pieces (B,H,≤chunk,D)
        self.whole = (call.k, call.v) if call.window is None else None  # every block sees all keys
        self.k, self.v = call.k.split(chunk, dim=2), call.v.split(chunk, dim=2)  # pieces (B,G,≤chunk,·)

    def block(self, start: int, lo: int, hi: int):
        q = self.q[start // self.chunk]
        if self.whole is not None:
            return q, *self.whole  # (B,G,S,·), not cut
        a, b = lo // self.chunk, (hi - 1) // self.chunk + 1  # the pieces band [lo, hi) touches
        off = a * self.chunk

        def band(pieces):
            return torch.cat(pieces[a:b], dim=2)[:, :, lo - off : hi - off]  # (B,G,s',·)

        return q, band(self.k), band(self.v)


class ChunkedBackend(Backend):
    """The explicit computation one block of queries at a time (see the module docstring)."""

    supports = Supports(weights=True, any_similarity=True, window=True, grouped_kv=True, memory="blocks")

    def speed(self, f: Features) -> float:
        # a narrow window: each block visits only its band of keys, less work than any dense band
        return -1.0 if f.window and f.band_narrow else 4.0

    def run(self, call: AttendCall) -> AttendOutput:
        q = call.q
        B, H, T, S = call.shape
        chunk, grad, need = chunk_length(call), needs_grad(call), call.need_weights
        outs: list[Tensor] = []
        out_all = None if grad else call.v.new_empty(B, H, T, call.v.shape[3])  # (B,H,T,E)
        weights = None  # without autograd: filled block by block (the caller's buffer when given)
        if need and not grad:
            weights = call.weights_out if call.weights_out is not None else q.new_empty(B, H, T, S)
            if call.window is not None:
                weights.zero_()  # zeros outside each block's band
        weight_blocks: list[Tensor] = []
        parts = _Parts(call, chunk) if grad else None
        for start in range(0, T, chunk):
            stop = min(T, start + chunk)
            keys = None if call.window is None else window_keys(start, stop, T, S, call.window)
            lo, hi = keys if keys is not None else (0, S)
            if parts is not None:
                qc, k, v = parts.block(start, lo, hi)  # (B,H,t,D), (B,G,s',·)
            else:
                qc, k, v = q[:, :, start:stop], call.k[:, :, lo:hi], call.v[:, :, lo:hi]  # views
            m = block_mask(call.mask, call.causal, start, stop, T, S, q.device, window=call.window, keys=keys)
            if grad and not need:
                out, _ = checkpoint(_checkpointed_block, qc, k, v, call.similarity, call.bias, start, stop, keys, m,
                                    call.dropout_p, use_reentrant=False)
            else:
                out, w = staged_attention(qc, k, v, call.similarity, _bias_block(call.bias, start, stop, keys), m,
                                          call.dropout_p)
                if weights is not None:
                    weights[:, :, start:stop, lo:hi] = w  # (B,H,t,s') into its rows and band
                elif need:
                    weight_blocks.append(F.pad(w, (lo, S - hi)))  # (B,H,t,s') -> (B,H,t,S), zeros off the band
            if out_all is not None:
                out_all[:, :, start:stop] = out  # (B,H,t,E) into rows [start, stop) of (B,H,T,E)
            else:
                outs.append(out)
        if weight_blocks:
            weights = torch.cat(weight_blocks, dim=2)  # blocks of (B,H,t,S) -> (B,H,T,S)
        out = out_all if out_all is not None else torch.cat(outs, dim=2)  # blocks of (B,H,t,E) -> (B,H,T,E)
        return AttendOutput(out, call.put_weights(weights))
