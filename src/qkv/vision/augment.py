"""Training-time augmentation of a batch of images, drawn from a seeded generator (so a batch stays a
pure function of its index and ``--resume`` repeats the run bit for bit).

Legend: B batch, K channels, R × W pixels (L: a signal's length).

* ``flip`` — mirror half the images left to right (a shirt is a shirt either way round; not for
  digits or signals whose direction matters);
* ``shift`` — move each image by up to ``max_shift`` pixels on every axis, filling with the
  background (the minimum pixel value of the batch: black for Fashion-MNIST);
* ``erase`` — blank one random rectangle (up to a quarter of each side) in half the images (random
  erasing, Zhong et al. 2020).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["augment_batch"]


def _shift(x: Tensor, g: torch.Generator, max_shift: int) -> Tensor:
    """Each image moved by its own offset in ``[-max_shift, max_shift]`` per axis, background filled."""
    B, dims = x.shape[0], x.shape[2:]
    s = max_shift
    fill = float(x.min())
    pad = [s] * (2 * len(dims))
    padded = torch.nn.functional.pad(x, pad, value=fill)  # (B,K,R+2s,W+2s)
    offsets = torch.randint(0, 2 * s + 1, (B, len(dims)), generator=g)  # (B,A)
    b = torch.arange(B)
    if len(dims) == 1:
        idx = offsets[:, 0, None] + torch.arange(dims[0])  # (B,L)
        return padded[b[:, None], :, idx].permute(0, 2, 1)  # (B,L,K) -> (B,K,L)
    rows = offsets[:, 0, None] + torch.arange(dims[0])  # (B,R)
    cols = offsets[:, 1, None] + torch.arange(dims[1])  # (B,W)
    out = padded[b[:, None, None], :, rows[:, :, None], cols[:, None, :]]  # (B,R,W,K)
    return out.permute(0, 3, 1, 2)  # (B,K,R,W)


def _erase(x: Tensor, g: torch.Generator) -> Tensor:
    B, dims = x.shape[0], x.shape[2:]
    keep = torch.ones_like(x[:, :1])  # (B,1,…)
    fill = float(x.min())
    for i in range(B):
        if torch.rand((), generator=g) < 0.5:
            continue
        box = []
        for n in dims:
            size = int(torch.randint(1, max(2, n // 4 + 1), (), generator=g))
            start = int(torch.randint(0, n - size + 1, (), generator=g))
            box.append(slice(start, start + size))
        keep[(i, 0, *box)] = 0
    return x * keep + fill * (1 - keep)


def augment_batch(x: Tensor, ops: tuple[str, ...], g: torch.Generator, *, max_shift: int = 2) -> Tensor:
    """``x (B,K,…)`` pixel values with ``ops`` applied in the order flip, shift, erase."""
    if not ops:
        return x
    if "flip" in ops:
        mirror = torch.rand(x.shape[0], generator=g) < 0.5  # (B,)
        x = torch.where(mirror.view(-1, *([1] * (x.dim() - 1))), x.flip(-1), x)
    if "shift" in ops:
        x = _shift(x, g, max_shift)
    if "erase" in ops:
        x = _erase(x, g)
    return x
