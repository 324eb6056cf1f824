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

__all__ = ["ACTIVATIONS", "FeedForward", "TransformerLayer", "LayerOutput", "packed_attention"]

#: Feed-forward non-linearities by name (``gelu`` is the exact erf form used by BERT).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}


#: The same non-linearities written into their input (used without autograd, to save a copy).
_INPLACE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_tanh": partial(torch.ops.aten.gelu_, approximate="tanh"),
    "relu": torch.relu_,
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
        h = self.linear1(x)  # (…,C) -> (…,F)
        inplace = _INPLACE_ACTIVATIONS.get(self.activation_name)
        if inplace is not None and not torch.is_grad_enabled():
            h = inplace(h)  # no graph to keep h for: activate in place
        else:
            h = self.activation(h)
        return self.linear2(h)  # (…,F) -> (…,C)

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
        weights = []

        def attend_fn(h: Tensor) -> Tensor:
            att = self.attention(h, padding_mask, need_weights=need_weights, qk_pos=qk_pos)
            weights.append(att.weights)
            return att.output

        return LayerOutput(self._sublayers(x, attend_fn), weights[0])

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
        return self._sublayers(x, lambda h: packed_attention(self.attention, h, lengths, qk_pos))

    def _sublayers(self, x: Tensor, attend_fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Both sublayers with residuals and norms around ``attend_fn`` (``(…,C) -> (…,C)``)."""
        if (not torch.is_grad_enabled() and not (self.training and self.dropout.p > 0)
                and isinstance(self.feed_forward, FeedForward)):
            # no graph and no dropout: the residual sums go into the fresh sublayer outputs
            if self.pre_norm:
                h = _residual_into(attend_fn(self.norm1(x)), x)
                return _residual_into(self.feed_forward(self.norm2(h)), h)
            h = self.norm1(_residual_into(attend_fn(x), x))
            return self.norm2(_residual_into(self.feed_forward(h), h))
        if self.pre_norm:
            h = x + self.dropout(attend_fn(self.norm1(x)))
            return h + self.dropout(self.feed_forward(self.norm2(h)))
        h = self.norm1(x + self.dropout(attend_fn(x)))
        return self.norm2(h + self.dropout(self.feed_forward(h)))


def _residual_into(out: Tensor, x: Tensor) -> Tensor:
    """``x + out`` written into ``out`` (a fresh sublayer output) when the types allow it."""
    if out.dtype == x.dtype and out.shape == x.shape:
        return out.add_(x)
    return x + out  # e.g. a bfloat16 sublayer output under autocast: promote as usual


def packed_attention(attention: nn.Module, x: Tensor, lengths: list[int],
                     qk_pos: Tensor | None = None) -> Tensor:
    """Self-attention of packed sequences with a :class:`~qkv.nn.attention.MultiHeadAttention`.

    The position-wise maps (the fused Q/K/V projection, the output map) run once over all N real
    tokens; the attention core runs per sequence on its own ``(1,H,L,D)`` block, unmasked (so on
    the sdpa path torch's fused kernel runs without a mask). No padded position is computed.

    Args:
        attention: the module whose maps, similarity and position slots are used.
        x: ``(N,C)`` packed tokens.
        lengths: sequence lengths, summing to N.
        qk_pos: ``(T,C)`` query/key positions; sequence i uses rows ``[0, lengths[i])``.

    Returns:
        ``(N,C)``.
    """
    from qkv.nn.attend import attend

    N, C = x.shape
    if sum(lengths) != N:
        raise ValueError(f"lengths sum to {sum(lengths)}, but x has {N} rows")
    pos = None
    if qk_pos is not None:
        pos = torch.cat([qk_pos[:n] for n in lengths])[None]  # (N,C) -> (1,N,C)
    q, k, v = attention._project(x[None], pos)  # 3 × (1,H,N,D)
    outs, start = [], 0
    for n in lengths:
        if n == 0:
            continue
        stop = start + n
        qs, ks, vs = q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop]  # 3 × (1,H,n,D)
        if attention.qk_transform is not None:
            qs, ks = attention.qk_transform(qs, ks)
        res = attend(qs, ks, vs, similarity=attention.similarity,
                     bias=attention.score_bias(n, n) if attention.score_bias is not None else None,
                     dropout_p=attention.dropout if attention.training else 0.0,
                     path=attention.path, chunk_size=attention.chunk_size)
        outs.append(res.output[0].transpose(0, 1).reshape(n, C))  # (H,n,D) -> (n,H,D) -> (n,C)
        start = stop
    out = torch.cat(outs) if outs else x.new_zeros(0, C)  # (N,C)
    return attention.out_proj(out) if attention.out_proj is not None else out
