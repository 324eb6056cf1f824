"""The transformer layer: self-attention and a feed-forward network, each with residual and norm.

Legend: B batch, T length, C model width, F feed-forward width, H heads.

Post-LN (the textbook's and BERT's order)::

    h = Norm₁(x + Dropout(Attention(x)))
    y = Norm₂(h + Dropout(FFN(h)))

Pre-LN::

    h = x + Dropout(Attention(Norm₁(x)))
    y = h + Dropout(FFN(Norm₂(h)))

The norms are given (a LayerNorm, with or without β, or an RMSNorm; see :mod:`qkv.nn.norms`); a
pre-LN layer may take ``nn.Identity()`` as ``Norm₁`` when its input is already normalised
(ModernBERT's first layer).

The feed-forward block is given too (:mod:`qkv.nn.feed_forward`: plain or gated).

Dropout sits where BERT puts it: on each sublayer's output before the residual sum (and, inside
attention, optionally on the weights). None after the feed-forward activation.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from qkv.nn.hooks import LAYER_POINTS, TAPPED, refuse_packed, tapped_layer

__all__ = ["TransformerLayer", "LayerOutput"]


@dataclass
class LayerOutput:
    """Result of :class:`TransformerLayer`.

    Attributes:
        output: ``(B,T,C)``.
        attention_weights: ``(B,H,T,T)`` exact attention weights when requested, else ``None``.
    """

    output: Tensor
    attention_weights: Tensor | None = None


class TransformerLayer(nn.Module):
    """One encoder layer around a given attention module and feed-forward module.

    Args:
        attention: a self-attention module with the interface of
            :class:`qkv.nn.attention.MultiHeadAttention` (``forward(x, padding_mask, need_weights=,
            qk_pos=) -> AttentionOutput`` and ``forward_packed(x, lengths, qk_pos, causal=, need_weights=)``).
        feed_forward: a module ``(…,C) -> (…,C)``, e.g. :class:`FeedForward`.
        norm1: the attention sublayer's norm, ``(…,C) -> (…,C)`` (``nn.Identity()`` allowed
            pre-LN only: the input is then used as it comes).
        norm2: the feed-forward sublayer's norm.
        norm: ``"post"`` (BERT) or ``"pre"``, chosen here once.
        dropout: dropout on each sublayer output before the residual sum.

    Hook points (:mod:`qkv.nn.hooks`): ``resid_pre``, ``attn_out``, ``resid_mid``, ``ffn_out``, ``resid_post``.
    """

    hook_points = LAYER_POINTS

    def __init__(
        self,
        attention: nn.Module,
        feed_forward: nn.Module,
        *,
        norm1: nn.Module,
        norm2: nn.Module,
        norm: str = "post",
        dropout: float = 0.1,
    ):
        super().__init__()
        if norm not in ("post", "pre"):
            raise ValueError(f"unknown norm placement {norm!r}; allowed: post, pre")
        if norm == "post" and isinstance(norm1, nn.Identity):
            raise ValueError("norm1=nn.Identity() needs norm='pre': a post-LN layer must normalise its "
                             "residual sum")
        self.attention = attention
        self.feed_forward = feed_forward
        self.norm1 = norm1  # attention sublayer
        self.norm2 = norm2  # feed-forward sublayer
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"  # chosen once: the two forms below

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, *, need_weights: bool = False,
                qk_pos: Tensor | None = None, causal: bool = False, cache=None) -> LayerOutput:
        """Apply the layer.

        Args:
            x: ``(B,T,C)``.
            padding_mask: ``(B,T)`` boolean, True = real token.
            need_weights: also return the exact ``(B,H,T,T)`` attention weights.
            qk_pos: ``(T,C)`` positions added to the query and key inputs only.
            causal: each query attends only to itself and earlier keys (a decoder layer).
            cache: the attention's :class:`~qkv.nn.kv_cache.LayerCache` (incremental decoding:
                ``x`` holds the new positions only, ``padding_mask`` is ``(B,S)`` over all keys).

        Returns:
            :class:`LayerOutput` with ``output (B,T,C)``.
        """
        attend = dict(qk_pos=qk_pos, causal=causal, need_weights=need_weights, cache=cache)
        if TAPPED and id(self) in TAPPED:  # hooks attached (qkv.nn.hooks): the same sums, with the hooks between
            return LayerOutput(*tapped_layer(self, x, padding_mask, attend))
        if self.pre_norm:
            a = self.attention(self.norm1(x), padding_mask, **attend)
            h = _residual(self.dropout(a.output), x)                              # h = x + Att(Norm₁(x))
            return LayerOutput(_residual(self.dropout(self.feed_forward(self.norm2(h))), h), a.weights)
        a = self.attention(x, padding_mask, **attend)
        h = self.norm1(_residual(self.dropout(a.output), x))                      # h = Norm₁(x + Att(x))
        return LayerOutput(self.norm2(_residual(self.dropout(self.feed_forward(h)), h)), a.weights)

    def forward_packed(self, x: Tensor, lengths: list[int], *, qk_pos: Tensor | None = None,
                       causal: bool = False, need_weights: bool = False) -> LayerOutput:
        """The layer on packed sequences, without padding.

        Args:
            x: ``(N,C)``, the real tokens of several sequences back to back (N = Σ lengths).
            lengths: the length of each sequence; a token attends only within its own sequence.
            qk_pos: ``(T,C)`` positions added to the query and key inputs only; sequence i uses
                rows ``[0, lengths[i])``.
            causal: a token attends only to itself and the earlier tokens of its sequence.
            need_weights: also return the exact weights, ``(B,H,T,T)`` zero-padded (see
                :meth:`MultiHeadAttention.forward_packed <qkv.nn.attention.MultiHeadAttention.forward_packed>`).

        Returns:
            :class:`LayerOutput` with ``output (N,C)``: for each sequence, what :meth:`forward` gives
            at its real positions when it is right-padded in a batch with a padding mask (up to
            float rounding).
        """
        if TAPPED and id(self) in TAPPED:
            refuse_packed(self)
        attend = dict(causal=causal, need_weights=need_weights)
        if self.pre_norm:
            a = self.attention.forward_packed(self.norm1(x), lengths, qk_pos, **attend)
            h = _residual(self.dropout(a.output), x)
            return LayerOutput(_residual(self.dropout(self.feed_forward(self.norm2(h))), h), a.weights)
        a = self.attention.forward_packed(x, lengths, qk_pos, **attend)
        h = self.norm1(_residual(self.dropout(a.output), x))
        return LayerOutput(self.norm2(_residual(self.dropout(self.feed_forward(h)), h)), a.weights)


def _residual(out: Tensor, x: Tensor) -> Tensor:
    """``x + out``; written into ``out`` (a fresh sublayer output) when no graph keeps it, it does
    not share memory with ``x``, and the types allow (a bfloat16 sublayer output under autocast
    promotes as usual)."""
    if (not out.requires_grad and out.dtype == x.dtype and out.shape == x.shape
            and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()):
        return out.add_(x)
    return x + out
