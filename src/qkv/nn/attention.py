"""Multi-head self-attention: projections and head split/merge around :func:`attend`.

Legend: B batch, T query length, S key length, H heads, D head dim, C model width (= H·D).

``MultiHeadAttention`` owns only the maps (a fused Q/K/V projection and the output map) and the
reshapes; the attention itself — similarity, bias, mask, softmax, mixing — is :func:`attend`.
Position information plugs in through three slots (see :mod:`qkv.nn.positional`): ``qk_pos``
added to the input of the query and key maps only, a ``qk_transform`` of per-head q and k
(rotary), and a ``score_bias`` module giving an additive score bias (relative, T5, ALiBi).

Weights without autograd (``need_weights=True`` under ``no_grad``, or nothing requiring grad;
``path="auto"``, a dot-product similarity, no dropout in effect) take a low-memory path: the
returned ``(B,H,T,T)`` weights are allocated once and every stage of :func:`attend` runs in place
in them (:func:`~qkv.nn.attend.dot_scores_`, :func:`~qkv.nn.attend.softmax_scores_`), with the
projections done one batch row at a time into a ``(T,2C)`` scratch buffer and each head's output
summed into the output map in place. Same numbers as the explicit path; all three position slots
work there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.nn.attend import PATHS, AttendOutput, attend, dot_scores_, softmax_scores_
from qkv.nn.masks import key_padding_mask
from qkv.nn.similarity import SIMILARITIES, build_similarity

__all__ = ["MultiHeadAttention", "AttentionOutput", "attend", "AttendOutput"]


@dataclass
class AttentionOutput:
    """Result of :class:`MultiHeadAttention`.

    Attributes:
        output: ``(B,T,C)``.
        weights: ``(B,H,T,S)`` per-head attention weights (before dropout), or ``None``.
    """

    output: Tensor
    weights: Tensor | None = None


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with a pluggable similarity.

    Args:
        d_model: model width C.
        n_heads: number of heads H; must divide ``d_model``.
        similarity: a name registered in :data:`qkv.nn.similarity.SIMILARITIES`.
        similarity_kwargs: extra keyword arguments for the similarity (e.g. ``temperature``).
        qkv_proj: learn Q/K/V maps (one fused ``C → 3C`` linear: rows ``[0:C]`` queries,
            ``[C:2C]`` keys, ``[2C:3C]`` values). ``False`` attends on the embeddings themselves:
            queries = keys = values = X split into heads.
        out_proj: apply the output map Ω_c to the concatenated heads.
        bias: biases in the linear maps.
        dropout: dropout on the attention weights (0 keeps the fused kernel on CPU).
        qk_transform: optional module ``(q, k) -> (q, k)`` on ``(B,H,T,D)`` tensors (e.g. rotary).
        score_bias: optional module ``(T, S) -> bias`` giving an additive score bias accepted by
            :func:`attend` (a tensor broadcastable to ``(B,H,T,S)`` or a row-block function).
        path: attention path for :func:`attend` (``"auto"`` picks).
        chunk_size: queries per block on the chunked path.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        similarity: str = "scaled_dot",
        similarity_kwargs: dict | None = None,
        qkv_proj: bool = True,
        out_proj: bool = True,
        bias: bool = True,
        dropout: float = 0.0,
        qk_transform: nn.Module | None = None,
        score_bias: nn.Module | None = None,
        path: str = "auto",
        chunk_size: int | None = None,
    ):
        super().__init__()
        if not isinstance(d_model, int) or d_model < 1:
            raise ValueError(f"d_model must be a positive int, got {d_model!r}")
        if not isinstance(n_heads, int) or n_heads < 1:
            raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; choose n_heads among "
                f"the divisors of d_model: {[h for h in range(1, d_model + 1) if d_model % h == 0]}"
            )
        if similarity not in SIMILARITIES:
            raise ValueError(
                f"unknown similarity {similarity!r}; allowed: {', '.join(sorted(SIMILARITIES))}"
            )
        if path not in PATHS:
            raise ValueError(f"unknown attention path {path!r}; allowed: {', '.join(PATHS)}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout, self.path, self.chunk_size = dropout, path, chunk_size
        self.similarity = build_similarity(
            similarity, n_heads=n_heads, d_head=self.d_head, **(similarity_kwargs or {})
        )
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias) if qkv_proj else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias) if out_proj else None
        self.qk_transform = qk_transform
        self.score_bias = score_bias

    def _check_x(self, x: Tensor) -> None:
        if not isinstance(x, Tensor) or x.dim() != 3:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a 3-D tensor (B, T, C={self.d_model}), got {shape}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has width C={x.shape[-1]}, but this layer has d_model={self.d_model}")

    def _project(self, x: Tensor, qk_pos: Tensor | None):
        B, T, C = x.shape
        H, D = self.n_heads, self.d_head
        if self.qkv_proj is None:
            v = x.view(B, T, H, D).transpose(1, 2)  # (B,T,C) -> (B,T,H,D) -> (B,H,T,D)
            if qk_pos is None:
                return v, v, v
            qk = (x + qk_pos).view(B, T, H, D).transpose(1, 2)  # (B,T,C) -> (B,H,T,D)
            return qk, qk, v
        qkv = self.qkv_proj(x)  # (B,T,C) -> (B,T,3C)
        if qk_pos is not None:  # Ω_q(X+Π) = Ω_q X + Ω_q Π, keys likewise; values see X only
            pos = F.linear(qk_pos, self.qkv_proj.weight[: 2 * C])  # (…,T,C) -> (…,T,2C)
            qkv = _cat_last(qkv[..., : 2 * C] + pos, qkv[..., 2 * C :])  # (B,T,3C)
        # split on the (B,T,3,H,D) view, then transpose each: the same views as a permute to
        # (3,B,H,T,D), but the backward stacks the three gradients in place of (B,T,3C) in one
        # contiguous copy (a permuted stack costs a second, strided copy)
        parts = qkv.view(B, T, 3, H, D).unbind(2)  # (B,T,3C) -> 3 × (B,T,H,D)
        q, k, v = (t.transpose(1, 2) for t in parts)  # 3 × (B,H,T,D)
        return q, k, v

    # ------------------------------------------------------------------------------------------
    # need_weights without autograd: the returned weights are the only (B,H,T,T) tensor

    def _low_memory_weights_ok(self, x: Tensor, qk_pos: Tensor | None) -> bool:
        """Path "auto", a dot-product similarity, no dropout in effect, nothing that needs a graph."""
        if self.path != "auto" or not getattr(self.similarity, "has_dot_form", False):
            return False
        if (self.training and self.dropout > 0) or x.shape[0] == 0 or x.shape[1] == 0:
            return False
        if not torch.is_grad_enabled():
            return True
        return not any(t.requires_grad for t in (x, qk_pos, *self.parameters()) if t is not None)

    def _project_qk(self, x: Tensor, qk_pos: Tensor | None, out: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys of one batch row (rows ``[0:2C]`` of the fused map), written into
        ``out (T,2C)``: 2 × ``(1,H,T,D)`` views. ``x (T,C)``; ``qk_pos (T,C)`` or ``None``."""
        T, C = x.shape
        H, D = self.n_heads, self.d_head
        if self.qkv_proj is None:
            qk = x if qk_pos is None else x + qk_pos  # (T,C)
            qk = qk.view(1, T, H, D).transpose(1, 2)  # (T,C) -> (1,T,H,D) -> (1,H,T,D)
            return qk, qk
        w, b = self.qkv_proj.weight[: 2 * C], self.qkv_proj.bias
        _linear_into(out, x, w, None if b is None else b[: 2 * C])  # (T,C) -> (T,2C)
        if qk_pos is not None:  # Ω_q(X+Π) = Ω_q X + Ω_q Π, keys likewise (as in _project)
            out.add_(F.linear(qk_pos, w))  # (T,2C) += (T,2C)
        qk = out.view(1, T, 2, H, D).permute(2, 0, 3, 1, 4)  # (T,2C) -> (1,T,2,H,D) -> (2,1,H,T,D)
        q, k = qk.unbind(0)  # 2 × (1,H,T,D)
        return q, k

    def _project_v(self, x: Tensor, out: Tensor) -> Tensor:
        """Values of one batch row (rows ``[2C:3C]``) into ``out``: ``(T,C) -> (T,C)``, head h in
        columns ``h·D … (h+1)·D-1``."""
        if self.qkv_proj is None:
            return x
        C, b = self.d_model, self.qkv_proj.bias
        return _linear_into(out, x, self.qkv_proj.weight[2 * C :], None if b is None else b[2 * C :])

    def _low_memory_weights(self, x: Tensor, mask: Tensor | None, causal: bool,
                            qk_pos: Tensor | None) -> AttentionOutput:
        """need_weights without autograd, with no ``(B,H,T,T)`` tensor besides the returned weights.

        The stages of :func:`attend`, in place in the returned weights: similarity (one batch row
        at a time, the GEMM writing into the weights) ─▶ + bias ─▶ mask ─▶ softmax; then mixing
        per (batch row, head), each head's ``(T,D)`` output going through its slice of the output
        map and summed in place. Projections go into one reused ``(T,2C)`` scratch buffer (no
        per-row allocations to fragment the heap): work memory is O(T·C) beyond weights and output.
        """
        B, T, C = x.shape
        H, D = self.n_heads, self.d_head
        work = x.new_empty(T * 2 * C)  # scratch: q|k of a row (T,2C), later v (T,C) and o (T,D)
        weights = None
        for i in range(B):  # similarity, batch row i
            pos = qk_pos if qk_pos is None or qk_pos.dim() == 2 else qk_pos[min(i, len(qk_pos) - 1)]  # (T,C)
            q, k = self._project_qk(x[i], pos, work.view(T, 2 * C))  # 2 × (1,H,T,D)
            if self.qk_transform is not None:
                q, k = self.qk_transform(q, k)
            if weights is None:
                weights = q.new_empty(B, H, T, T)  # (B,H,T,S)
            dot_scores_(weights[i : i + 1], q, k, self.similarity)  # into (1,H,T,S)
        bias = self.score_bias(T, T) if self.score_bias is not None else None
        softmax_scores_(weights, bias=bias, mask=mask, causal=causal)  # + bias ─▶ mask ─▶ softmax
        out = weights.new_empty(B, T, C)  # (B,T,C)
        w_o = None if self.out_proj is None else self.out_proj.weight  # (C,C)
        v_buf, o = work[: T * C].view(T, C), work[T * C : T * C + T * D].view(T, D)
        for i in range(B):  # mix and merge, batch row i
            v = self._project_v(x[i], v_buf)  # (T,C) -> (T,C)
            out_i = out[i]  # (T,C) view
            if w_o is not None and self.out_proj.bias is not None:
                out_i.copy_(self.out_proj.bias)  # (C,) -> (T,C), the output map's bias once
            elif w_o is not None:
                out_i.zero_()
            for h in range(H):
                cols = slice(h * D, (h + 1) * D)
                torch.mm(weights[i, h], v[:, cols], out=o)  # (T,S)(S,D) -> (T,D)
                if w_o is None:
                    out_i[:, cols] = o  # merge heads: (T,D) into columns of (T,C)
                else:
                    out_i.addmm_(o, w_o[:, cols].t())  # += (T,D)(D,C): head h's share of Ω_c
        return AttentionOutput(out, weights)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        *,
        causal: bool = False,
        need_weights: bool = False,
        qk_pos: Tensor | None = None,
    ) -> AttentionOutput:
        """Self-attention of ``x``.

        Args:
            x: ``(B,T,C)`` input.
            padding_mask: ``(B,T)`` boolean key padding mask, True = real token.
            causal: each query attends only to itself and earlier keys.
            need_weights: also return the exact ``(B,H,T,T)`` weights.
            qk_pos: ``(T,C)`` or ``(B,T,C)`` positions added to the input of the query and key
                maps only (the textbook's variant), never to the values.

        Returns:
            :class:`AttentionOutput` with ``output (B,T,C)`` and ``weights (B,H,T,T) | None``.
        """
        self._check_x(x)
        B, T, C = x.shape
        mask = None if padding_mask is None else key_padding_mask(padding_mask, batch=B, length=T)
        if qk_pos is not None and (qk_pos.shape[-2:] != (T, C) or qk_pos.dim() not in (2, 3)):
            raise ValueError(f"qk_pos must be (T,C) = ({T},{C}) or (B,T,C), got {tuple(qk_pos.shape)}")
        if need_weights and self._low_memory_weights_ok(x, qk_pos):
            return self._low_memory_weights(x, mask, causal, qk_pos)
        q, k, v = self._project(x, qk_pos)  # 3 × (B,H,T,D)
        if self.qk_transform is not None:
            q, k = self.qk_transform(q, k)
        bias = self.score_bias(T, T) if self.score_bias is not None else None
        res = attend(
            q, k, v,
            similarity=self.similarity,
            bias=bias,
            mask=mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
            path=self.path,
            chunk_size=self.chunk_size,
        )
        out = res.output.transpose(1, 2).reshape(B, T, C)  # (B,H,T,D) -> (B,T,H,D) -> (B,T,C)
        if self.out_proj is not None:
            out = self.out_proj(out)  # (B,T,C) -> (B,T,C)
        return AttentionOutput(out, res.weights)


def _linear_into(out: Tensor, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """``out ← x wᵀ + b`` without allocating: ``x (T,C)``, ``w (C',C)`` -> ``out (T,C')``."""
    if b is None:
        return torch.mm(x, w.t(), out=out)  # (T,C)(C,C') -> (T,C')
    return torch.addmm(b, x, w.t(), out=out)  # (C',) + (T,C)(C,C') -> (T,C')


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    """Concatenate along the last dim, broadcasting the leading dims of ``a`` and ``b``."""
    shape = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return torch.cat([a.expand(*shape, a.shape[-1]), b.expand(*shape, b.shape[-1])], dim=-1)
