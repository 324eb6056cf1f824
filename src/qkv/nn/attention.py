"""Multi-head attention, as the textbook writes it: self-attention, and cross-attention over a context.

Legend: B batch, T query length, S key length, H heads, G key/value heads, D head dim,
C model width (= H·D), E context width, N packed tokens.

One module for both (``forward(x, context=None, …)``). ``MultiHeadAttention`` is given its parts
and composes them::

    q, k, v = X Ω_q, X Ω_k, X Ω_v        self: one fused C → C + 2·G·D map (H query heads, G
                                         key/value heads: grouped-query attention when G < H)
    q       = X Ω_q;  k, v = Y Ω_k, Y Ω_v    cross (context Y): a C → C query map and one fused
                                         E → 2·G·D key/value map (Prince Fig. 12.13)
    q, k    = qk_norm(q, k)              each head's q and k normalised over D, optional
    q, k    = transform(q, k)            position transform of q and k (rotary), optional (self only)
    bias    = score_bias(T, S)           additive score bias (relative, T5, ALiBi), optional (self only)
    o       = backend.run(q, k, v, …)    similarity → bias → mask (padding, causal, window)
                                         → softmax → dropout → mix
    out     = merge(o) Ω_o               concatenate the heads, output map

The backend is a :class:`~qkv.nn.attend.BackendPlan` resolved once when the module is built
(:mod:`qkv.nn.backends`); each call goes from :meth:`MultiHeadAttention.forward` straight to the
backend it picks. No positions enter cross-attention: queries and keys live in different sequences,
so each side carries its own positions from its own self-attention; a context's keys and values are
the same for every decoding step (:meth:`MultiHeadAttention.project_context` computes them once).
Positions added only where queries and keys are computed (``qk_pos``) enter the projection:
Ω_q(X+Π) = Ω_q X + Ω_q Π. :func:`qkv.models.builders.build_attention` makes one from plain options.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.nn.attend import DEFAULT_BUDGET, BackendPlan, attend_call
from qkv.nn.attention_parts import check_input, check_parts
from qkv.nn.hooks import ATTENTION_POINTS, TAPPED, refuse_packed, tapped_attention
from qkv.nn.kv_cache import LayerCache, end_aligned_bias
from qkv.nn.masks import key_padding_mask
from qkv.nn.packed import first_sequences, run_view, runs_by_length
from qkv.nn.positional import RotaryEmbedding

__all__ = ["MultiHeadAttention", "AttentionOutput", "ContextKV"]


@dataclass
class AttentionOutput:
    """Result of :class:`MultiHeadAttention`.

    Attributes:
        output: ``(B,T,C)`` (``(N,C)`` from :meth:`MultiHeadAttention.forward_packed`).
        weights: ``(B,H,T,S)`` per-head attention weights (before dropout), or ``None``.
    """

    output: Tensor
    weights: Tensor | None = None


@dataclass(frozen=True)
class ContextKV:
    """A context's keys and values, projected once (:meth:`MultiHeadAttention.project_context`).

    Attributes:
        k: ``(B,G,S,D)`` keys (qk-norm applied). v: ``(B,G,S,D)`` values.
    """

    k: Tensor
    v: Tensor


class MultiHeadAttention(nn.Module):
    """Multi-head attention composed of the parts it is given: self-attention, or cross-attention
    over a context when it is given ``q_proj`` and ``kv_proj``.

    Args:
        d_model: model width C.
        n_heads: number of heads H; must divide ``d_model``.
        similarity: a similarity module (:mod:`qkv.nn.similarity`), built for H heads of width D.
        qkv_proj: self-attention's fused Q/K/V map, an ``nn.Linear(C, C + 2·G·D)`` (rows ``[0:C]``
            queries, then ``G·D`` keys, then ``G·D`` values; ``(C, 3C)`` when G = H), or ``None``:
            attend on the embeddings themselves (queries = keys = values = X split into heads; needs G = H).
        q_proj: cross-attention's query map, ``nn.Linear(C, C)``; given together with ``kv_proj``.
        kv_proj: cross-attention's fused key/value map of the context, ``nn.Linear(E, 2·G·D)`` (rows
            ``[0:G·D]`` keys, then values).
        out_proj: the output map Ω_o, an ``nn.Linear(C, C)``, or ``None``.
        shared_qk: keys are the queries (one map Ω_q = Ω_k, so the score ``(Ω_q x_i)·(Ω_q x_j)`` is
            symmetric): ``qkv_proj`` is then ``nn.Linear(C, 2C)``, rows ``[0:C]`` queries = keys, then
            values; needs G = H.
        n_kv_heads: key/value heads G (must divide H; query head h reads key/value head
            h // (H/G), Ainslie et al. 2023; 1 = multi-query attention, Shazeer 2019); ``None`` = H.
        qk_norm: optional module ``(q, k) -> (q, k)`` normalising each head's q and k over D
            (:class:`~qkv.nn.qk_norm.QKNorm`), applied before ``qk_transform``.
        qk_transform: optional module ``(q, k) -> (q, k)`` on ``(B,H,T,D)`` tensors (e.g. rotary); self only.
        score_bias: optional module ``(T, S) -> bias`` giving an additive score bias accepted by
            :func:`~qkv.nn.attend.attend`; self only.
        dropout: dropout on the attention weights (0 keeps the fused kernel on CPU).
        window: sliding-window (local) attention: a query sees the keys within ``window // 2``
            positions either side (ModernBERT's ``local_attention``); ``None`` = global; self only.
        backend: a :class:`~qkv.nn.attend.BackendPlan`, or the name of one (``"auto"`` or a
            registered backend), resolved here once.
        chunk_size: queries per block on the chunked backend.

    Hook points (:mod:`qkv.nn.hooks`): ``q``, ``k``, ``v``, ``scores``, ``weights``, ``heads``, ``out``.
    """

    hook_points = ATTENTION_POINTS

    def __init__(self, d_model: int, n_heads: int, *, similarity: nn.Module, qkv_proj: nn.Linear | None = None,
                 q_proj: nn.Linear | None = None, kv_proj: nn.Linear | None = None,
                 out_proj: nn.Linear | None = None, n_kv_heads: int | None = None, shared_qk: bool = False,
                 qk_norm: nn.Module | None = None, qk_transform: nn.Module | None = None,
                 score_bias: nn.Module | None = None, window: int | None = None, dropout: float = 0.0,
                 backend: BackendPlan | str = "auto", chunk_size: int | None = None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.cross = check_parts(d_model, n_heads, n_kv_heads, qkv_proj=qkv_proj, q_proj=q_proj,
                                 kv_proj=kv_proj, out_proj=out_proj, shared_qk=shared_qk,
                                 qk_transform=qk_transform, score_bias=score_bias, window=window, dropout=dropout)
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.n_kv_heads, self.window, self.shared_qk = n_kv_heads, window, shared_qk
        self.similarity, self.qkv_proj, self.out_proj = similarity, qkv_proj, out_proj
        if self.cross:
            self.q_proj, self.kv_proj = q_proj, kv_proj
            self.d_context = kv_proj.weight.shape[1]
        self.qk_norm, self.qk_transform, self.score_bias = qk_norm, qk_transform, score_bias
        self.dropout, self.chunk_size = dropout, chunk_size
        self.backend = backend if isinstance(backend, BackendPlan) else BackendPlan(backend)

    @property
    def qk_rows(self) -> int:
        """Rows of the fused map that are the query and key maps: ``C + G·D`` (``C`` with shared_qk)."""
        return self.d_model if self.shared_qk else self.d_model + self.n_kv_heads * self.d_head

    def project(self, x: Tensor, qk_pos: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values split into heads: ``(B,T,C)`` → ``(B,H,T,D)``, 2 × ``(B,G,T,D)``.

        ``qk_pos`` (``(T,C)`` or ``(B,T,C)``) is added to the input of the query and key maps only.
        """
        B, T, C = x.shape
        H, G, D = self.n_heads, self.n_kv_heads, self.d_head
        if self.qkv_proj is None:
            v = x.view(B, T, H, D).transpose(1, 2)  # (B,T,C) -> (B,T,H,D) -> (B,H,T,D)
            if qk_pos is None:
                return v, v, v
            qk = (x + qk_pos).view(B, T, H, D).transpose(1, 2)  # (B,T,C) -> (B,H,T,D)
            return qk, qk, v
        qkv = self.qkv_proj(x)  # (B,T,C) -> (B,T,C+2GD), or (B,T,2C) with shared_qk
        qk = self.qk_rows  # query and key rows of the fused map
        if qk_pos is not None:  # Ω_q(X+Π) = Ω_q X + Ω_q Π, keys likewise; values see X only
            w = self.qkv_proj.weight[:qk]  # (C+GD,C); a bfloat16 inference map holds it in bfloat16
            pos = F.linear(qk_pos.to(w.dtype), w)  # (…,T,C) -> (…,T,C+GD)
            qkv = _cat_last(qkv[..., :qk] + pos, qkv[..., qk:])  # (B,T,C+2GD)
        if self.shared_qk:
            q, v = (t.transpose(1, 2) for t in qkv.view(B, T, 2, H, D).unbind(2))  # (B,T,2C) -> 2 × (B,H,T,D)
            return q, q, v  # keys are the queries
        if G == H:
            # split on the (B,T,3,H,D) view, then transpose each: the backward stacks the three
            # gradients in place of (B,T,3C) in one contiguous copy (a permuted stack costs two)
            parts = qkv.view(B, T, 3, H, D).unbind(2)  # (B,T,3C) -> 3 × (B,T,H,D)
        else:
            q, k, v = qkv.split([C, G * D, G * D], dim=-1)  # (B,T,C+2GD) -> (B,T,C), 2 × (B,T,GD)
            parts = (q.unflatten(-1, (H, D)), k.unflatten(-1, (G, D)), v.unflatten(-1, (G, D)))  # (B,T,H|G,D)
        q, k, v = (t.transpose(1, 2) for t in parts)  # (B,H,T,D), 2 × (B,G,T,D)
        return q, k, v

    def project_context(self, context: Tensor) -> ContextKV:
        """Keys and values of a context (cross-attention): ``(B,S,E)`` → 2 × ``(B,G,S,D)``, k-norm applied.

        Computed once per source while generating, and passed back as ``context=``.
        """
        if not self.cross:
            raise ValueError("this attention was built for self-attention (a fused Q/K/V map); build it with "
                             "q_proj and kv_proj for cross-attention")
        if not isinstance(context, Tensor) or context.dim() != 3 or context.shape[-1] != self.d_context:
            got = tuple(context.shape) if isinstance(context, Tensor) else type(context).__name__
            raise ValueError(f"context must be a (B, S, E={self.d_context}) tensor, got {got}")
        G, D = self.n_kv_heads, self.d_head
        kv = self.kv_proj(context)  # (B,S,E) -> (B,S,2GD)
        k, v = kv.unflatten(-1, (2, G, D)).unbind(2)  # (B,S,2GD) -> (B,S,2,G,D) -> 2 × (B,S,G,D)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B,S,G,D) -> (B,G,S,D)
        if self.qk_norm is not None:
            k = self.qk_norm.k_norm(k)
        return ContextKV(k, v)

    def _positioned(self, q: Tensor, k: Tensor):
        """qk-norm and the position transform of q and k, and the score bias: ``(q, k, bias)``."""
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)  # (B,H,T,D), (B,G,S,D) over D
        if self.qk_transform is not None:
            q, k = self.qk_transform(q, k)
        bias = self.score_bias(q.shape[2], k.shape[2]) if self.score_bias is not None else None
        return q, k, bias

    def _call(self, q, k, v, bias, mask, causal: bool, need_weights: bool = False, weights_out=None):
        """The :class:`~qkv.nn.backends.base.AttendCall` of this module for ``q``, ``k``, ``v``."""
        return attend_call(q, k, v, self.similarity, bias, mask, causal, self.dropout if self.training else 0.0,
                           need_weights, self.chunk_size, DEFAULT_BUDGET, weights_out, self.window)

    def _out(self, o: Tensor) -> Tensor:
        """Merge heads and apply the output map: ``(B,H,T,D)`` → ``(B,T,C)``."""
        B, H, T, D = o.shape
        out = o.transpose(1, 2).reshape(B, T, H * D)  # (B,H,T,D) -> (B,T,H,D) -> (B,T,C)
        return self.out_proj(out) if self.out_proj is not None else out  # (B,T,C) -> (B,T,C)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, *, context: Tensor | ContextKV | None = None,
                causal: bool = False, need_weights: bool = False, qk_pos: Tensor | None = None,
                cache: LayerCache | None = None) -> AttentionOutput:
        """Self-attention of ``x``, or (a module built for it) cross-attention of ``x`` over ``context``.

        Args:
            x: ``(B,T,C)`` input (the queries).
            padding_mask: the key padding mask, True = real token: ``(B,T)`` over ``x`` for
                self-attention, ``(B,S)`` over the context for cross-attention.
            context: cross-attention only: ``(B,S,E)`` context (an encoder's output), or its keys and
                values from :meth:`project_context`.
            causal: each query attends only to itself and earlier keys.
            need_weights: also return the exact ``(B,H,T,S)`` weights.
            qk_pos: ``(T,C)`` or ``(B,T,C)`` positions added to the input of the query and key
                maps only (the textbook's variant), never to the values.
            cache: a :class:`~qkv.nn.kv_cache.LayerCache` holding the keys and values of the S-T
                earlier positions (incremental decoding): only the T new tokens are projected,
                their keys and values appended, and their queries attend over all S keys (causal
                aligned at the end); ``padding_mask`` is then ``(B,S)``. No weights.

        Returns:
            :class:`AttentionOutput` with ``output (B,T,C)`` and ``weights (B,H,T,S) | None``.
        """
        check_input(x, qk_pos, self.d_model)
        if TAPPED and id(self) in TAPPED:  # hooks attached (qkv.nn.hooks): the staged path that runs them
            return AttentionOutput(*tapped_attention(self, x, padding_mask, context=context, causal=causal,
                                                     need_weights=need_weights, qk_pos=qk_pos, cache=cache))
        if self.cross or context is not None:
            return self._forward_cross(x, context, padding_mask, need_weights)
        if cache is not None:
            if need_weights:
                raise ValueError("need_weights is not available with a cache; run without cache= to get weights")
            return self._forward_cached(x, padding_mask, causal, qk_pos, cache)
        B, T, _ = x.shape
        mask = None if padding_mask is None else key_padding_mask(padding_mask, batch=B, length=T)
        if need_weights and B * T > 0:
            return self._forward_with_weights(x, mask, causal, qk_pos)
        q, k, v = self.project(x, qk_pos)  # (B,H,T,D), 2 × (B,G,T,D)
        q, k, bias = self._positioned(q, k)
        res = self.backend.run(self._call(q, k, v, bias, mask, causal, need_weights))
        return AttentionOutput(self._out(res.output), res.weights)

    def _forward_cross(self, x: Tensor, context, padding_mask: Tensor | None, need_weights: bool) -> AttentionOutput:
        """Queries from ``x`` over the context's keys and values (see :meth:`forward`)."""
        q, k, v, mask = self.cross_inputs(x, context, padding_mask)
        res = self.backend.run(self._call(q, k, v, None, mask, False, need_weights))
        return AttentionOutput(self._out(res.output), res.weights)

    def cross_inputs(self, x: Tensor, context, padding_mask: Tensor | None):
        """Cross-attention's checked inputs: ``q (B,H,T,D)``, ``k, v (B,G,S,D)`` and the mask ``(B,1,1,S)`` or ``None``."""
        if context is None:
            raise ValueError("cross-attention needs context=: a (B,S,E) tensor or project_context(...) of one")
        kv = context if isinstance(context, ContextKV) else self.project_context(context)
        B, T, C = x.shape
        S = kv.k.shape[2]
        if kv.k.shape[0] != B:
            raise ValueError(f"context has batch {kv.k.shape[0]}, but x has batch {B}")
        mask = None
        if padding_mask is not None:
            if tuple(padding_mask.shape) != (B, S):
                raise ValueError(f"the context's padding mask must have shape (B, S) = ({B}, {S}), "
                                 f"got {tuple(padding_mask.shape)}")
            keep = padding_mask.bool()
            if not bool(keep.all()):
                mask = keep[:, None, None, :]  # (B,S) -> (B,1,1,S)
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B,T,C) -> (B,H,T,D)
        if self.qk_norm is not None:
            q = self.qk_norm.q_norm(q)
        return q, kv.k, kv.v, mask

    def _forward_cached(self, x: Tensor, padding_mask: Tensor | None, causal: bool, qk_pos: Tensor | None,
                        cache: LayerCache) -> AttentionOutput:
        """T new tokens after the cache's S-T: project them, append their keys and values, attend.

        Positions: the built-in rotary embedding rotates the new q and k at their own positions
        (the cache keeps rotated keys); another ``qk_transform`` gets (q, all S keys) each step,
        the cache keeping keys before the transform; a score bias is the module's ``S × S`` bias
        cut to the last T query rows (:func:`~qkv.nn.kv_cache.end_aligned_bias`).
        """
        B, T, _ = x.shape
        start = cache.length
        q, k, v = self.project(x, qk_pos)  # (B,H,T,D), 2 × (B,G,T,D)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)  # over D, position-free
        rope = type(self.qk_transform) is RotaryEmbedding
        if rope:
            q, k = self.qk_transform.rotate(q, start), self.qk_transform.rotate(k, start)  # at start … start+T-1
        k, v = cache.append(k, v)  # (B,G,S,D), (B,G,S,D) views of the cache
        if self.qk_transform is not None and not rope:
            q, k = self.qk_transform(q, k)  # queries aligned with the last keys
        S = k.shape[2]
        bias = None if self.score_bias is None else end_aligned_bias(self.score_bias(S, S), T, S)
        mask = None if padding_mask is None else key_padding_mask(padding_mask, batch=B, length=S)  # (B,1,1,S)
        res = self.backend.run(self._call(q, k, v, bias, mask, causal and T > 1))
        return AttentionOutput(self._out(res.output))

    def _forward_with_weights(self, x: Tensor, mask: Tensor | None, causal: bool,
                              qk_pos: Tensor | None) -> AttentionOutput:
        """One batch row at a time, each row's weights written into the one returned ``(B,H,T,T)``
        tensor and its output into the ``(B,T,C)`` result: beside those, only one row's
        projections (``(1,T,3C)``, freed before its output map) and outputs exist."""
        B, T, _ = x.shape
        weights = out = None
        for i in range(B):
            pos = qk_pos if qk_pos is None or qk_pos.dim() == 2 else qk_pos[i : i + 1]  # (T,C) | (1,T,C)
            q, k, v = self.project(x[i : i + 1], pos)  # (1,H,T,D), 2 × (1,G,T,D)
            if weights is None:
                weights = q.new_empty(B, self.n_heads, T, T)  # (B,H,T,T), in q's dtype
            m = None if mask is None else mask[i : i + 1]  # (1,1,1,T)
            q, k, bias = self._positioned(q, k)
            o = self.backend.run(self._call(q, k, v, bias, m, causal, True, weights[i : i + 1])).output  # (1,H,T,D)
            del q, k, v  # the row's projections go before its output map runs
            row = self._out(o)  # (1,T,C)
            if out is None:
                out = row.new_empty(B, *row.shape[1:])  # (B,T,C), in the output map's dtype
            out[i : i + 1] = row
        return AttentionOutput(out, weights)

    def forward_packed(self, x: Tensor, lengths: list[int], qk_pos: Tensor | None = None, *,
                       causal: bool = False, need_weights: bool = False) -> AttentionOutput:
        """Self-attention of packed sequences: no padded position is computed.

        The maps run once over all N real tokens; the attention core runs on each sequence on its
        own, unmasked; consecutive sequences of equal length go in one call (views, no copies).

        Args:
            x: ``(N,C)``, the tokens of several sequences back to back (N = Σ lengths).
            lengths: the length of each sequence; a token attends only within its own sequence.
            qk_pos: ``(T,C)`` query/key positions; sequence i uses rows ``[0, lengths[i])``.
            causal: a token attends only to itself and the earlier tokens of its sequence.
            need_weights: also return the exact weights, ``(B,H,T,T)`` with B = len(lengths) and
                T = max(lengths): sequence i's ``(H,n,n)`` maps in the top-left corner, zeros elsewhere
                (the layout :meth:`forward` gives a right-padded batch, zeros at padded keys).

        Returns:
            :class:`AttentionOutput` with ``output (N,C)``; what :meth:`forward` gives at the real
            positions of the right-padded batch (up to float rounding).
        """
        N, C = x.shape
        if TAPPED and id(self) in TAPPED:
            refuse_packed(self)
        if sum(lengths) != N:
            raise ValueError(f"lengths sum to {sum(lengths)}, but x has {N} rows")
        pos = None if qk_pos is None else torch.cat([qk_pos[:n] for n in lengths])[None]  # (1,N,C)
        q, k, v = (t[0] for t in self.project(x[None], pos))  # (H,N,D), 2 × (G,N,D)
        H, D = self.n_heads, self.d_head
        o = q.new_empty(N, H, D)  # merged-heads layout: o.view(N,C) is the concatenation of the heads
        weights = q.new_zeros(len(lengths), H, max(lengths, default=0), max(lengths, default=0)) \
            if need_weights else None  # (B,H,T,T)
        first = first_sequences(lengths) if need_weights else None  # packed row -> its sequence's index
        for start, m, n in runs_by_length(lengths):  # m consecutive sequences of length n
            qs, ks, vs = (run_view(t, start, m, n) for t in (q, k, v))  # (m,H,n,D), 2 × (m,G,n,D) views
            qs, ks, bias = self._positioned(qs, ks)
            att = self.backend.run(self._call(qs, ks, vs, bias, None, causal, need_weights))
            o[start : start + m * n].view(m, n, H, D).copy_(att.output.transpose(1, 2))  # (m,n,H,D) rows of o
            if weights is not None:
                i = first[start]
                weights[i : i + m, :, :n, :n] = att.weights  # (m,H,n,n) into sequences i … i+m-1
        merged = o.view(N, H * D)  # (N,H,D) -> (N,C), no copy
        out = self.out_proj(merged) if self.out_proj is not None else merged  # (N,C)
        return AttentionOutput(out, weights)

    def extra_repr(self) -> str:
        kv = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else ""
        window = f", window={self.window}" if self.window is not None else ""
        cross = f", cross (context width {self.d_context})" if self.cross else ""
        return f"d_model={self.d_model}, n_heads={self.n_heads}{kv}{window}{cross}, backend={self.backend!r}"


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    """Concatenate along the last dim, broadcasting the leading dims of ``a`` and ``b``."""
    shape = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return torch.cat([a.expand(*shape, a.shape[-1]), b.expand(*shape, b.shape[-1])], dim=-1)
