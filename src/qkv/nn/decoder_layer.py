"""The decoder layer: causal self-attention, cross-attention over the encoder, a feed-forward network.

Legend: B batch, T decoder length, S encoder length, C model width, H heads.

Post-LN (the textbook's order, Prince §12.8, three sublayers as :class:`~qkv.nn.layer.TransformerLayer`)::

    h₁ = Norm₁(x  + Dropout(SelfAttention(x, causal)))
    h₂ = Norm₂(h₁ + Dropout(CrossAttention(h₁, context)))
    y  = Norm₃(h₂ + Dropout(FFN(h₂)))

Pre-LN::

    h₁ = x  + Dropout(SelfAttention(Norm₁(x), causal))
    h₂ = h₁ + Dropout(CrossAttention(Norm₂(h₁), context))
    y  = h₂ + Dropout(FFN(Norm₃(h₂)))
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

__all__ = ["DecoderLayer", "DecoderLayerOutput"]


@dataclass
class DecoderLayerOutput:
    """Result of :class:`DecoderLayer`.

    Attributes:
        output: ``(B,T,C)``.
        self_attention_weights: ``(B,H,T,T)`` causal self-attention weights when requested, else ``None``.
        cross_attention_weights: ``(B,H,T,S)`` weights over the memory when requested, else ``None``.
    """

    output: Tensor
    self_attention_weights: Tensor | None = None
    cross_attention_weights: Tensor | None = None


class DecoderLayer(nn.Module):
    """One decoder layer around given attention, cross-attention and feed-forward modules.

    Args:
        self_attention: a self-attention :class:`~qkv.nn.attention.MultiHeadAttention` (called causal).
        cross_attention: a cross-attention :class:`~qkv.nn.attention.MultiHeadAttention`.
        feed_forward: a module ``(…,C) -> (…,C)``.
        norm1, norm2, norm3: the norms of the three sublayers (``norm1`` may be ``nn.Identity()`` pre-LN).
        norm: ``"post"`` or ``"pre"``.
        dropout: dropout on each sublayer output before the residual sum.
    """

    def __init__(self, self_attention: nn.Module, cross_attention: nn.Module, feed_forward: nn.Module, *,
                 norm1: nn.Module, norm2: nn.Module, norm3: nn.Module, norm: str = "post", dropout: float = 0.1):
        super().__init__()
        if norm not in ("post", "pre"):
            raise ValueError(f"unknown norm placement {norm!r}; allowed: post, pre")
        if norm == "post" and isinstance(norm1, nn.Identity):
            raise ValueError("norm1=nn.Identity() needs norm='pre': a post-LN layer must normalise its residual sum")
        self.self_attention, self.cross_attention, self.feed_forward = self_attention, cross_attention, feed_forward
        self.norm1, self.norm2, self.norm3 = norm1, norm2, norm3
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"

    def forward(self, x: Tensor, context, padding_mask: Tensor | None = None, context_mask: Tensor | None = None, *,
                need_weights: bool = False, qk_pos: Tensor | None = None, cache=None) -> DecoderLayerOutput:
        """Apply the layer.

        Args:
            x: ``(B,T,C)`` decoder states.
            context: ``(B,S,E)`` encoder output, or its keys and values
                (:meth:`~qkv.nn.attention.MultiHeadAttention.project_context`, computed once per source).
            padding_mask: ``(B,T)`` boolean decoder key padding mask, True = real token (``(B,S')``
                over every cached position with ``cache``).
            context_mask: ``(B,S)`` source padding mask, True = real token.
            need_weights: also return both attention maps.
            qk_pos: ``(T,C)`` positions added to the self-attention's query and key inputs only.
            cache: the self-attention's :class:`~qkv.nn.kv_cache.LayerCache` (incremental decoding).

        Returns:
            :class:`DecoderLayerOutput`.
        """
        own = dict(causal=True, need_weights=need_weights, qk_pos=qk_pos, cache=cache)
        drop = self.dropout
        if self.pre_norm:
            s = self.self_attention(self.norm1(x), padding_mask, **own)
            h = x + drop(s.output)                                       # h₁ = x + SelfAtt(Norm₁(x))
            c = self.cross_attention(self.norm2(h), context_mask, context=context, need_weights=need_weights)
            h = h + drop(c.output)                                       # h₂ = h₁ + CrossAtt(Norm₂(h₁))
            return DecoderLayerOutput(h + drop(self.feed_forward(self.norm3(h))), s.weights, c.weights)
        s = self.self_attention(x, padding_mask, **own)
        h = self.norm1(x + drop(s.output))                               # h₁ = Norm₁(x + SelfAtt(x))
        c = self.cross_attention(h, context_mask, context=context, need_weights=need_weights)
        h = self.norm2(h + drop(c.output))                               # h₂ = Norm₂(h₁ + CrossAtt(h₁))
        return DecoderLayerOutput(self.norm3(h + drop(self.feed_forward(h))), s.weights, c.weights)
