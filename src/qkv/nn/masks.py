"""Attention masks. One convention everywhere: a boolean tensor where **True = may attend**.

Legend: B batch, H heads, T query length, S key length.

A mask handed to :func:`qkv.nn.attention.attend` is boolean and broadcastable to ``(B,H,T,S)``;
these helpers build such masks from the usual inputs and check them with clear errors.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["key_padding_mask", "causal_mask", "check_mask"]


def key_padding_mask(padding: Tensor, *, batch: int, length: int) -> Tensor:
    """Turn a ``(B,S)`` key padding mask (True = real token) into a ``(B,1,1,S)`` attention mask.

    Raises:
        ValueError: when the mask is not boolean or not ``(batch, length)``.
    """
    if not isinstance(padding, Tensor):
        raise ValueError(f"padding mask must be a torch.Tensor, got {type(padding).__name__}")
    if padding.dtype != torch.bool:
        raise ValueError(
            f"padding mask must have dtype torch.bool (True = real token), got {padding.dtype}; "
            "convert with mask.bool() or (attention_mask == 1)"
        )
    if tuple(padding.shape) != (batch, length):
        raise ValueError(
            f"padding mask must have shape (B, S) = ({batch}, {length}), got {tuple(padding.shape)}"
        )
    return padding[:, None, None, :]  # (B,S) -> (B,1,1,S)


def causal_mask(t: int, s: int | None = None, *, device=None) -> Tensor:
    """``(T,S)`` lower-triangular mask: query i may attend keys ``j ≤ i + (S - T)``."""
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)  # (T,S)


def check_mask(mask: Tensor, shape: tuple[int, int, int, int]) -> Tensor:
    """Check that ``mask`` is boolean and broadcastable to ``shape`` = (B,H,T,S); return it 4-D."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}")
    if mask.dim() > 4:
        raise ValueError(f"mask must have at most 4 dims (B,H,T,S), got shape {tuple(mask.shape)}")
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # left-pad to (B?,H?,T?,S?)
    for got, want, name in zip(m.shape, shape, "BHTS"):
        if got not in (1, want):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to (B,H,T,S) = {shape}: "
                f"dim {name} is {got}, allowed 1 or {want}"
            )
    return m
