"""Feed-forward non-linearities by name, and applying one in place when no graph needs its input.

Legend: F a feed-forward block's hidden width.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ACTIVATIONS", "get_activation", "activate"]

#: Feed-forward non-linearities by name (``gelu`` is the exact erf form used by BERT).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}

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


def activate(name: str, h: Tensor) -> Tensor:
    """The activation ``name`` of ``h`` ``(…,F)``, written into ``h`` when no graph keeps it (saves a
    copy; ``h`` must be a fresh tensor, or a part of one, that nothing else reads)."""
    inplace = _INPLACE_ACTIVATIONS.get(name)
    if inplace is not None and not h.requires_grad:
        return inplace(h)
    return ACTIVATIONS[name](h)
