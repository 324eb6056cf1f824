"""Positions of image patches on their grid: 2-D sinusoidal encodings (added to the input) and 2-D
(axial) rotary embeddings (a transform of q and k).

Legend: B batch, H heads, T tokens (prefix + patches), D head dim, C model width, A axes of the
grid (2 for images, 1 for signals), P prefix tokens ([CLS]).

A patch sequence is a grid read row by row: patch ``n`` sits at row ``n // columns``, column
``n % columns``. Tokens before the patches (the [CLS] token, ``prefix`` of them) have no place on
the grid: they get a zero encoding and are not rotated.

* ``sinusoidal-2d`` (MAE, He et al. 2022): the first C/2 features encode the row with the 1-D
  sinusoids of :func:`~qkv.nn.positional.sinusoid_table` (width C/2), the last C/2 the column;
  needs C divisible by 4. On a 1-D grid it is the 1-D table over the patch index.
* ``rope-2d`` (axial rotary, as in RoPE-Mixed's axial variant and EVA-02): each head's D
  features split into A blocks; block a is rotated (rotate-half pairing within the block) by
  ``pos_a · base^(-2i/(D/A))``, so ``rot(q, m)ᵀ rot(k, n)`` depends on the row and column offsets
  only. Needs D divisible by 2A.

Both are registered in :mod:`qkv.nn.positional` (this module registers nothing, so that it can sit
below it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.nn.position_bias import check_sizes

__all__ = ["grid_coordinates", "sincos_2d_table", "SinCos2DPositions", "AxialRotary"]


def grid_coordinates(grid: tuple[int, ...]) -> Tensor:
    """``(N, A)`` int64: each patch's coordinate per axis, in reading order."""
    axes = [torch.arange(n) for n in grid]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(grid))  # (N,A)


def _sinusoid(pos: Tensor, width: int, base: float) -> Tensor:
    """``(N, width)`` float64 sinusoids of positions ``pos (N,)``, interleaved sin/cos (the 1-D table's)."""
    two_i = (torch.arange(width) // 2 * 2).to(torch.float64)  # (W,) 0,0,2,2,…
    angle = pos.to(torch.float64)[:, None] / base ** (two_i / width)  # (N,1)/(W,) -> (N,W)
    return torch.where(torch.arange(width) % 2 == 0, angle.sin(), angle.cos())


def sincos_2d_table(grid: tuple[int, ...], d_model: int, *, prefix: int = 0, base: float = 10000.0) -> Tensor:
    """``(P + N, C)`` float64: zero rows for the prefix, then each patch's encoding (module docstring)."""
    axes = len(grid)
    if d_model % (2 * axes):
        raise ValueError(f"sinusoidal-2d on a {axes}-D grid needs d_model divisible by {2 * axes}, got {d_model}")
    coords = grid_coordinates(grid)  # (N,A)
    width = d_model // axes
    table = torch.cat([_sinusoid(coords[:, a], width, base) for a in range(axes)], dim=-1)  # (N,C)
    return torch.cat([torch.zeros(prefix, d_model, dtype=torch.float64), table])  # (P+N,C)


class SinCos2DPositions(nn.Module):
    """Fixed 2-D sinusoidal encodings of a patch grid, ``forward(T) -> (T, C)`` (the input slot).

    Args:
        grid: patches per axis. d_model: C. prefix: tokens before the patches (zero rows).
        base: the wavelength base.

    Raises ``ValueError`` for a length other than ``prefix + patches``.
    """

    def __init__(self, grid: tuple[int, ...], d_model: int, *, prefix: int = 0, base: float = 10000.0):
        super().__init__()
        check_sizes(d_model=d_model)
        self.grid, self.prefix, self.d_model = tuple(grid), prefix, d_model
        self.register_buffer("table", sincos_2d_table(self.grid, d_model, prefix=prefix, base=base).float(),
                             persistent=False)

    def forward(self, length: int) -> Tensor:
        if length != self.table.shape[0]:
            raise ValueError(f"sinusoidal-2d was built for {self.table.shape[0]} tokens ({self.prefix} + a "
                             f"{'×'.join(map(str, self.grid))} grid of patches), got {length}")
        return self.table

    def extra_repr(self) -> str:
        return f"grid={self.grid}, d_model={self.d_model}, prefix={self.prefix}"


class AxialRotary(nn.Module):
    """Axial rotary embedding of each head's q and k over a patch grid (the q/k-transform slot).

    Args:
        d_head: D (divisible by 2A). grid: patches per axis. prefix: tokens before the patches (not
        rotated). base: the angle base.
    """

    def __init__(self, d_head: int, grid: tuple[int, ...], *, prefix: int = 0, base: float = 10000.0):
        super().__init__()
        check_sizes(d_head=d_head)
        axes = len(grid)
        if d_head % (2 * axes):
            raise ValueError(f"rope-2d on a {axes}-D grid needs d_head divisible by {2 * axes}, got d_head={d_head}")
        if not base > 0:
            raise ValueError(f"rope-2d base must be > 0, got {base}")
        self.d_head, self.grid, self.prefix, self.base = d_head, tuple(grid), prefix, base
        block = d_head // axes  # features per axis
        inv_freq = base ** (-torch.arange(block // 2, dtype=torch.float64) * 2 / block)  # (D/2A,)
        angle = grid_coordinates(self.grid).to(torch.float64)[:, :, None] * inv_freq  # (N,A,1)*(D/2A,) -> (N,A,D/2A)
        angle = torch.cat([torch.zeros(prefix, axes, block // 2, dtype=torch.float64), angle])  # (T,A,D/2A)
        self._angle = torch.stack([angle, angle], dim=2)  # (T,A,2,D/2A) float64: both halves of a block alike
        self._cache: tuple | None = None

    @property
    def length(self) -> int:
        return self._angle.shape[0]

    def _cos_sin(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """Cosines and sines of the angles, computed in float64 and cast once per dtype and device."""
        key = (like.dtype, like.device)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._angle.cos().to(like), self._angle.sin().to(like))
        return self._cache[1], self._cache[2]

    def rotate(self, x: Tensor) -> Tensor:
        """``x (…,T,D)`` rotated: block a of each vector by its token's coordinate on axis a."""
        if x.shape[-2] != self.length:
            raise ValueError(f"rope-2d was built for {self.length} tokens ({self.prefix} + a "
                             f"{'×'.join(map(str, self.grid))} grid of patches), got {x.shape[-2]}")
        axes = len(self.grid)
        blocks = x.unflatten(-1, (axes, 2, self.d_head // axes // 2))  # (…,T,D) -> (…,T,A,2,D/2A)
        x1, x2 = blocks.unbind(-2)  # (…,T,A,D/2A) each
        half_turn = torch.stack([-x2, x1], dim=-2)  # rotate-half within each block
        cos, sin = self._cos_sin(x)  # (T,A,2,D/2A)
        return (blocks * cos + half_turn * sin).flatten(-3)  # (…,T,A,2,D/2A) -> (…,T,D)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``q (B,H,T,D)``, ``k (B,H,T,D)`` → rotated ``(q, k)`` (self-attention over the same tokens)."""
        return self.rotate(q), self.rotate(k)

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, grid={self.grid}, prefix={self.prefix}, base={self.base}"
