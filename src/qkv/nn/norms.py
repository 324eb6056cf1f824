"""Normalisation layers, selected by name: ``layernorm`` and ``rmsnorm``.

Legend: C the normalised width (the last dimension).

* ``layernorm`` (Ba et al. 2016; BERT, the textbook): ``y = (x − mean(x)) / √(var(x) + ε) · γ + β``;
* ``rmsnorm`` (Zhang & Sennrich 2019; LLaMA, NeoBERT): ``y = x / √(mean(x²) + ε) · γ`` — no centring,
  no bias.

``bias=False`` gives a LayerNorm without β (ModernBERT's ``norm_bias=False``). Adding a norm is one
decorated factory: ``@register_norm("name")`` taking ``(width, *, eps, bias)``; in a module outside
qkv, that module is a plugin (docs/plugins.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from qkv import plugins

__all__ = ["NORM_TYPES", "RMSNorm", "build_norm", "register_norm"]

#: Norm factories by name: ``factory(width, *, eps, bias) -> nn.Module``.
NORM_TYPES: dict[str, Callable[..., nn.Module]] = {}


def register_norm(name: str):
    """Register a norm factory ``(width, *, eps, bias) -> nn.Module`` under ``name`` (the defining
    module is recorded: :func:`qkv.plugins.registered_by`)."""

    def deco(factory):
        if name in NORM_TYPES:
            raise ValueError(f"norm {name!r} is already registered "
                             f"(by {plugins.registered_by('norm', name)})")
        NORM_TYPES[name] = factory
        plugins.record_part("norm", name, factory)
        return factory

    return deco


def build_norm(name: str, width: int, *, eps: float, bias: bool = True) -> nn.Module:
    """The norm registered as ``name`` over the last dimension of width ``width``."""
    if name not in NORM_TYPES:
        plugins.load_plugins()  # a miss: the installed plugins may register it
    if name not in NORM_TYPES:
        raise ValueError(plugins.unknown_part("norm", name, sorted(NORM_TYPES)))
    return NORM_TYPES[name](width, eps=eps, bias=bias)


class RMSNorm(nn.Module):
    """``y = x / √(mean(x²) + ε) · γ`` over the last dimension (computed in float32 for low-precision
    inputs, as LLaMA does), γ starting at 1.

    Args:
        width: C. eps: ε. scale: learn γ (``False``: γ = 1, no parameter).
    """

    def __init__(self, width: int, *, eps: float = 1e-6, scale: bool = True):
        super().__init__()
        self.width, self.eps = width, eps
        self.weight = nn.Parameter(torch.ones(width)) if scale else None

    def forward(self, x: Tensor) -> Tensor:
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # (…,C) / (…,1)
        h = h.to(x.dtype)
        return h * self.weight if self.weight is not None else h

    def extra_repr(self) -> str:
        return f"{self.width}, eps={self.eps}, scale={self.weight is not None}"


@register_norm("layernorm")
def _layer_norm(width: int, *, eps: float, bias: bool = True) -> nn.Module:
    return nn.LayerNorm(width, eps=eps, bias=bias)


@register_norm("rmsnorm")
def _rms_norm(width: int, *, eps: float, bias: bool = True) -> nn.Module:
    del bias  # RMSNorm has no bias term: the option is for norms that have one
    return RMSNorm(width, eps=eps)
