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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "FEED_FORWARDS", "FeedForward", "TransformerLayer", "LayerOutput"]

#: Feed-forward non-linearities by name (``gelu`` is the exact erf form used by BERT).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}

#: Feed-forward forms: ``mlp`` = ``W₂ act(W₁ x)``; ``glu`` = gated, ``W₂ (act(W x) ⊙ V x)``.
FEED_FORWARDS = ("mlp", "glu")


#: The same non-linearities written into their input (used without autograd, to save a copy).
_INPLACE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_tanh": partial(torch.ops.aten.gelu_, approximate="tanh"),
    "relu": torch.relu_,
    "silu": partial(F.silu, inplace=True),
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
        self._activation_ = _INPLACE_ACTIVATIONS.get(activation)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(…,C)`` → ``(…,C)``."""
        h = self.linear1(x)  # (…,C) -> (…,F)
        return self.linear2(self._activate(h))  # (…,F) -> (…,C)

    def _activate(self, h: Tensor) -> Tensor:
        """The activation, written into ``h`` when no graph keeps ``h`` (saves a copy)."""
        if self._activation_ is not None and not h.requires_grad:
            return self._activation_(h)
        return self.activation(h)

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
        attention: a self-attention module with the interface of
            :class:`qkv.nn.attention.MultiHeadAttention` (``forward(x, padding_mask, need_weights=,
            qk_pos=) -> AttentionOutput`` and ``forward_packed(x, lengths, qk_pos)``).
        feed_forward: a module ``(…,C) -> (…,C)``, e.g. :class:`FeedForward`.
        d_model: model width C (for the LayerNorms).
        norm: ``"post"`` (BERT) or ``"pre"``, chosen here once.
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
        self._sublayers = self._pre_ln if self.pre_norm else self._post_ln

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
            need_weights: also return the exact ``(B,H,T,T)`` attention weights.
            qk_pos: ``(T,C)`` positions added to the query and key inputs only.

        Returns:
            :class:`LayerOutput` with ``output (B,T,C)``.
        """
        att: list = []

        def attend_fn(h: Tensor) -> Tensor:
            att.append(self.attention(h, padding_mask, need_weights=need_weights, qk_pos=qk_pos))
            return att[0].output

        return LayerOutput(self._sublayers(x, attend_fn), att[0].weights)

    def forward_packed(self, x: Tensor, lengths: list[int], *, qk_pos: Tensor | None = None) -> Tensor:
        """The layer on packed sequences, without padding.

        Args:
            x: ``(N,C)``, the real tokens of several sequences back to back (N = Σ lengths).
            lengths: the length of each sequence; a token attends only within its own sequence.
            qk_pos: ``(T,C)`` positions added to the query and key inputs only; sequence i uses
                rows ``[0, lengths[i])``.

        Returns:
            ``(N,C)``: for each sequence, what :meth:`forward` gives at its real positions when it
            is right-padded in a batch with a padding mask (up to float rounding).
        """
        return self._sublayers(x, lambda h: self.attention.forward_packed(h, lengths, qk_pos).output)

    def _post_ln(self, x: Tensor, attend_fn: Callable[[Tensor], Tensor]) -> Tensor:
        """``h = LN(x + Drop(Att(x)))``, ``y = LN(h + Drop(FFN(h)))``."""
        h = self.norm1(_residual(self.dropout(attend_fn(x)), x))
        return self.norm2(_residual(self.dropout(self.feed_forward(h)), h))

    def _pre_ln(self, x: Tensor, attend_fn: Callable[[Tensor], Tensor]) -> Tensor:
        """``h = x + Drop(Att(LN(x)))``, ``y = h + Drop(FFN(LN(h)))``."""
        h = _residual(self.dropout(attend_fn(self.norm1(x))), x)
        return _residual(self.dropout(self.feed_forward(self.norm2(h))), h)


def _residual(out: Tensor, x: Tensor) -> Tensor:
    """``x + out``; written into ``out`` (a fresh sublayer output) when no graph keeps it, it does
    not share memory with ``x``, and the types allow (a bfloat16 sublayer output under autocast
    promotes as usual)."""
    if (not out.requires_grad and out.dtype == x.dtype and out.shape == x.shape
            and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()):
        return out.add_(x)
    return x + out
