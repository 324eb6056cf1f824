"""The transformer layer: self-attention and a feed-forward network, each with residual and norm.

Legend: B batch, T length, C model width, F feed-forward width, H heads.

Post-LN (the textbook's and BERT's order)::

    h = LayerNorm(x + Dropout(Attention(x)))
    y = LayerNorm(h + Dropout(FFN(h)))

Pre-LN::

    h = x + Dropout(Attention(LayerNorm(x)))
    y = h + Dropout(FFN(LayerNorm(h)))

Dropout sits where BERT puts it: on each sublayer's output before the residual sum (and, inside
attention, optionally on the weights). None after the feed-forward activation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "FeedForward", "TransformerLayer", "LayerOutput"]

#: Feed-forward non-linearities by name (``gelu`` is the exact erf form used by BERT).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation function registered as ``name``."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; allowed: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``linear2(act(linear1(x)))``.

    Args:
        d_model: model width C.
        d_ff: hidden width F.
        activation: a name in :data:`ACTIVATIONS`.
        bias: biases in both linear maps.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.activation_name = activation
        self.activation = get_activation(activation)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(…,C)`` → ``(…,C)``."""
        return self.linear2(self.activation(self.linear1(x)))  # (…,C) -> (…,F) -> (…,C)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}"


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
        attention: a self-attention module with the signature of
            :class:`qkv.nn.attention.MultiHeadAttention` (``(x, padding_mask, need_weights=,
            qk_pos=) -> AttentionOutput``).
        feed_forward: a module ``(B,T,C) -> (B,T,C)``, e.g. :class:`FeedForward`.
        d_model: model width C (for the LayerNorms).
        norm: ``"post"`` (BERT) or ``"pre"``.
        dropout: dropout on each sublayer output before the residual sum.
        layer_norm_eps: LayerNorm epsilon.
    """

    def __init__(
        self,
        attention: nn.Module,
        feed_forward: nn.Module,
        *,
        d_model: int,
        norm: str = "post",
        dropout: float = 0.1,
        layer_norm_eps: float = 1e-12,
    ):
        super().__init__()
        if norm not in ("post", "pre"):
            raise ValueError(f"unknown norm placement {norm!r}; allowed: post, pre")
        self.attention = attention
        self.feed_forward = feed_forward
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)  # attention sublayer
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)  # feed-forward sublayer
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        qk_pos: Tensor | None = None,
    ) -> LayerOutput:
        """Apply the layer.

        Args:
            x: ``(B,T,C)``.
            padding_mask: ``(B,T)`` boolean, True = real token.
            need_weights: also return the exact ``(B,H,T,T)`` attention weights (explicit path).
            qk_pos: ``(T,C)`` positions added to the query and key inputs only.

        Returns:
            :class:`LayerOutput` with ``output (B,T,C)``.
        """
        if self.pre_norm:
            att = self.attention(self.norm1(x), padding_mask, need_weights=need_weights, qk_pos=qk_pos)
            h = x + self.dropout(att.output)
            y = h + self.dropout(self.feed_forward(self.norm2(h)))
        else:
            att = self.attention(x, padding_mask, need_weights=need_weights, qk_pos=qk_pos)
            h = self.norm1(x + self.dropout(att.output))
            y = self.norm2(h + self.dropout(self.feed_forward(h)))
        return LayerOutput(y, att.weights)
