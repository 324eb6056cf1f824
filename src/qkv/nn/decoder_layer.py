"""The decoder layer: causal self-attention, cross-attention over the encoder, a feed-forward network.

Legend: B batch, T decoder length, S encoder length, C model width, H heads.

Post-LN (the textbook's order, Prince §12.8, three sublayers as :class:`~qkv.nn.layer.TransformerLayer`)::

    h₁ = Norm₁(x  + Dropout(SelfAttention(x, causal)))
    h₂ = Norm₂(h₁ + Dropout(CrossAttention(h₁, memory)))
    y  = Norm₃(h₂ + Dropout(FFN(h₂)))

Pre-LN::

    h₁ = x  + Dropout(SelfAttention(Norm₁(x), causal))
    h₂ = h₁ + Dropout(CrossAttention(Norm₂(h₁), memory))
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
        self_attention: a :class:`~qkv.nn.attention.MultiHeadAttention` (called with ``causal=True``).
        cross_attention: a :class:`~qkv.nn.cross_attention.CrossAttention`.
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

    def forward(self, x: Tensor, memory: Tensor | None, padding_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, *, need_weights: bool = False, qk_pos: Tensor | None = None,
                memory_kv: tuple[Tensor, Tensor] | None = None) -> DecoderLayerOutput:
        """Apply the layer.

        Args:
            x: ``(B,T,C)`` decoder states.
            memory: ``(B,S,E)`` encoder output (``None`` allowed with ``memory_kv``).
            padding_mask: ``(B,T)`` boolean decoder key padding mask, True = real token.
            memory_mask: ``(B,S)`` source padding mask, True = real token.
            need_weights: also return both attention maps.
            qk_pos: ``(T,C)`` positions added to the self-attention's query and key inputs only.
            memory_kv: precomputed memory keys/values (:meth:`CrossAttention.project_memory`).

        Returns:
            :class:`DecoderLayerOutput`.
        """
        pre = self.pre_norm

        def sub(inp: Tensor, fn, norm: nn.Module):
            out = fn(norm(inp) if pre else inp)
            y = inp + self.dropout(out)
            return y if pre else norm(y)

        sa: list = []
        ca: list = []

        def self_fn(h):
            sa.append(self.self_attention(h, padding_mask, causal=True, need_weights=need_weights, qk_pos=qk_pos))
            return sa[0].output

        def cross_fn(h):
            ca.append(self.cross_attention(h, memory, memory_mask, need_weights=need_weights, memory_kv=memory_kv))
            return ca[0].output

        h = sub(x, self_fn, self.norm1)
        h = sub(h, cross_fn, self.norm2)
        y = sub(h, self.feed_forward, self.norm3)
        return DecoderLayerOutput(y, sa[0].weights, ca[0].weights)
