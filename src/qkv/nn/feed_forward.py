"""The position-wise feed-forward network of a transformer layer, plain or gated.

Legend: C model width, F hidden width.

Forms (:data:`FEED_FORWARDS`): ``mlp`` = ``W₂ act(W₁ x)`` (:class:`FeedForward`) and ``glu`` =
``W₂ (act(W x) ⊙ V x)`` (:class:`GatedFeedForward`, Shazeer 2020: GeGLU, SwiGLU). Their linear maps
are made by a :class:`~qkv.nn.maps.LinearMaps` (trainable, or for inference in a precision: then the
first map of a plain block applies the activation itself, fused into its GEMM).
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.nn.activations import activate, get_activation
from qkv.nn.maps import TRAINING, LinearMaps

__all__ = ["FEED_FORWARDS", "FeedForward", "GatedFeedForward"]


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``linear2(act(linear1(x)))``.

    Args:
        d_model: model width C.
        d_ff: hidden width F.
        activation: a name in :data:`qkv.nn.activations.ACTIVATIONS`.
        bias: biases in both linear maps.
        maps: how the linear maps are made (default: trainable ``nn.Linear``).
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "gelu", bias: bool = True,
                 maps: LinearMaps = TRAINING):
        super().__init__()
        self.activation_name = activation
        self.activation = get_activation(activation)
        self.fused = maps.fuses(activation)  # linear1 applies the activation itself
        self.linear1 = maps.linear(d_model, d_ff, bias, kind="ffn_in", activation=activation)
        self.linear2 = maps.linear(d_ff, d_model, bias, kind="ffn_out")

    def forward(self, x: Tensor) -> Tensor:
        """``(…,C)`` → ``(…,C)``."""
        h = self.linear1(x)  # (…,C) -> (…,F)
        return self.linear2(h if self.fused else activate(self.activation_name, h))  # (…,F) -> (…,C)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}" + (" (fused)" if self.fused else "")


class GatedFeedForward(nn.Module):
    """Gated feed-forward network (Shazeer 2020, "GLU Variants Improve Transformer")::

        u, g = split(linear1(x))        # one fused C → 2F map: u = W x, g = V x
        y = linear2(act(u) ⊙ g)         # F → C

    GeGLU with ``activation="gelu"`` (ModernBERT), SwiGLU with ``"silu"`` (LLaMA, NeoBERT). The
    first half of ``linear1``'s output goes through the activation, the second half is the gate
    (ModernBERT's ``Wi`` order; LLaMA's ``gate_proj`` rows are the first half, ``up_proj`` the
    second). At equal parameter count F is usually ⅔ of the plain MLP's.

    Args:
        d_model: model width C.
        d_ff: gated hidden width F (``linear1`` is C → 2F).
        activation: a name in :data:`qkv.nn.activations.ACTIVATIONS`.
        bias: biases in both linear maps.
        maps: how the linear maps are made (default: trainable ``nn.Linear``).
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "gelu", bias: bool = True,
                 maps: LinearMaps = TRAINING):
        super().__init__()
        self.activation_name = activation
        self.activation = get_activation(activation)
        self.linear1 = maps.linear(d_model, 2 * d_ff, bias, kind="ffn_in")
        self.linear2 = maps.linear(d_ff, d_model, bias, kind="ffn_out")

    def forward(self, x: Tensor) -> Tensor:
        """``(…,C)`` → ``(…,C)``."""
        u, g = self.linear1(x).chunk(2, dim=-1)  # (…,C) -> (…,2F) -> 2 × (…,F)
        a = activate(self.activation_name, u)  # (…,F)
        h = a * g if a.requires_grad else a.mul_(g)  # (…,F) ⊙ (…,F); no graph: into u's half
        return self.linear2(h)  # (…,F) -> (…,C)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}, gated"


#: Feed-forward forms by name: ``mlp`` = ``W₂ act(W₁ x)``; ``glu`` = gated, ``W₂ (act(W x) ⊙ V x)``.
FEED_FORWARDS: dict[str, type[nn.Module]] = {"mlp": FeedForward, "glu": GatedFeedForward}
