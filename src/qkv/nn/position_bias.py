"""The additive score biases of the offset ``d = j − i``: ``relative``, ``t5``, ``alibi``.

Legend: H heads, T query length, S key length, L = T+S-1 offsets.

Each module's ``forward(T, S)`` returns an :class:`~qkv.nn.offset_bias.OffsetBias` (a per-offset
table and which row each offset reads), which :func:`~qkv.nn.attend.attend` runs on the fused
kernel without an ``(H,T,S)`` tensor. They fill the score-bias slot of :mod:`qkv.nn.positional`
(which registers them and re-exports these names); see docs/positions.md for the formulas.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from qkv.nn.offset_bias import OffsetBias

__all__ = ["RelativePositionBias", "T5RelativeBias", "ALiBiBias", "t5_buckets", "alibi_slopes", "offsets",
           "check_sizes"]


def check_sizes(**values) -> None:
    """``ValueError`` naming the first value that is not a positive int (the position modules' sizes)."""
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")


def offsets(q_len: int, k_len: int, device=None) -> Tensor:
    """``(T+S-1,)`` every offset ``d = j - i`` of key j from query i, from ``-(T-1)`` to ``S-1``."""
    return torch.arange(-(q_len - 1), k_len, device=device)


class RelativePositionBias(nn.Module):
    """A learned scalar per head for each offset, clipped at ±``max_distance`` (Shaw et al. 2018;
    the textbook's π per offset): ``bias[h,i,j] = weight[clip(j-i, -M, M) + M, h]``.

    ``weight`` is ``(2M+1, H)``. ``forward(T, S)`` returns an :class:`OffsetBias`.

    ``init="normal"`` starts the table at N(0, 0.02²) — attention starts (and, measured, stays for
    minutes) position-blind. ``init="alibi"`` (position ``relative-alibi``) starts it at ALiBi's
    ``-slope_h · |d|``: every head local from step 0 with the prior of :class:`ALiBiBias`, yet free
    to become asymmetric (a previous-token or next-token head) or to reshape its window.
    """

    def __init__(self, n_heads: int, max_distance: int = 128, *, init: str = "normal"):
        super().__init__()
        check_sizes(n_heads=n_heads, max_distance=max_distance)
        if init not in ("normal", "alibi"):
            raise ValueError(f"unknown relative bias init {init!r}; allowed: normal, alibi")
        self.max_distance, self.init = max_distance, init
        if init == "alibi":
            d = torch.arange(-max_distance, max_distance + 1, dtype=torch.float64)  # (2M+1,)
            table = -d.abs()[:, None] * alibi_slopes(n_heads)[None, :]  # (2M+1,1)*(1,H) -> (2M+1,H)
            self.weight = nn.Parameter(table.float())
        else:
            self.weight = nn.Parameter(torch.empty(2 * max_distance + 1, n_heads).normal_(std=0.02))

    def forward(self, q_len: int, k_len: int) -> OffsetBias:
        m = self.max_distance
        index = offsets(q_len, k_len, self.weight.device).clamp(-m, m) + m  # (L,)
        return OffsetBias(self.weight.t(), index, q_len, k_len)  # table (H, 2M+1)

    def extra_repr(self) -> str:
        return f"n_heads={self.weight.shape[1]}, max_distance={self.max_distance}, init={self.init}"


def t5_buckets(offset: Tensor, num_buckets: int = 32, max_distance: int = 128, *,
               bidirectional: bool = True) -> Tensor:
    """T5's bucket of each ``offset = key - query`` (Raffel et al. 2020).

    Bidirectional (T5's encoder): half the buckets for each sign (positive offsets get
    ``+num_buckets/2``). One-directional (T5's decoder, ``bidirectional=False``): every bucket for
    the past, ``-min(offset, 0)``; keys ahead of the query share bucket 0 (a causal mask hides them).
    Within the buckets of a direction, the first half have one distance each, larger distances
    share log-spaced buckets up to ``max_distance``, and everything beyond shares the last bucket.
    """
    n = num_buckets // 2 if bidirectional else num_buckets
    exact = n // 2
    if bidirectional:
        sign, dist = (offset > 0).long() * n, offset.abs()
    else:
        sign, dist = torch.zeros_like(offset), (-offset).clamp(min=0)
    log_ratio = torch.log(dist.clamp(min=1).double() / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (n - exact)).long()).clamp(max=n - 1)
    return sign + torch.where(dist < exact, dist, large)


class T5RelativeBias(nn.Module):
    """T5's bucketed relative bias: a learned scalar per head and bucket, ``weight (buckets, H)``;
    ``bidirectional=False``: the one-directional buckets of T5's decoder (:func:`t5_buckets`).

    ``forward(T, S)`` returns an :class:`OffsetBias`.
    """

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, *, bidirectional: bool = True):
        super().__init__()
        check_sizes(n_heads=n_heads, max_distance=max_distance)
        if num_buckets < 4 or num_buckets % 2:
            raise ValueError(f"num_buckets must be an even number ≥ 4, got {num_buckets}")
        if max_distance <= num_buckets // 4:
            raise ValueError(
                f"max_distance={max_distance} must exceed the exact range num_buckets/4={num_buckets // 4}"
            )
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bool(bidirectional)
        self.weight = nn.Parameter(torch.empty(num_buckets, n_heads).normal_(std=0.02))

    def forward(self, q_len: int, k_len: int) -> OffsetBias:
        index = t5_buckets(offsets(q_len, k_len, self.weight.device), self.num_buckets, self.max_distance,
                           bidirectional=self.bidirectional)
        return OffsetBias(self.weight.t(), index, q_len, k_len)  # table (H, buckets)

    def extra_repr(self) -> str:
        heads = self.weight.shape[1]
        way = "" if self.bidirectional else ", one-directional"
        return f"n_heads={heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}{way}"


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's head slopes (Press et al. 2022), float64 ``(H,)``.

    For ``n`` a power of two: ``2^(-8/n)``, ``2^(-16/n)``, …, ``2^(-8)``. Otherwise the paper's
    rule: the slopes of the largest power of two ``m < n``, then every other slope of ``2m``.
    """
    check_sizes(n_heads=n_heads)

    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (k + 1) / n) for k in range(n)]

    m = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = powers(m) if m == n_heads else powers(m) + powers(2 * m)[0::2][: n_heads - m]
    return torch.tensor(slopes, dtype=torch.float64)


class ALiBiBias(nn.Module):
    """ALiBi, bidirectional: a fixed ``bias[h,i,j] = -slope_h · |j - i|`` (no parameters).

    ``forward(T, S)`` returns an :class:`OffsetBias`.
    """

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads).float(), persistent=False)  # (H,)

    def forward(self, q_len: int, k_len: int) -> OffsetBias:
        d = offsets(q_len, k_len, self.slopes.device)  # (L,)
        values = -self.slopes[:, None] * d.abs().to(self.slopes.dtype)  # (H,1)*(L,) -> (H,L)
        return OffsetBias(values, torch.arange(d.numel(), device=d.device), q_len, k_len)

    def extra_repr(self) -> str:
        return f"n_heads={self.slopes.numel()}"
