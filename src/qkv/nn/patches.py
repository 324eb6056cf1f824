"""Images in: patches cut from an image (or a 1-D signal), each mapped to a vector, a [CLS] token in
front, positions added — the input of a Vision Transformer (Dosovitskiy et al. 2021).

Legend: B batch, K channels, (R, W) image height and width (L: a signal's length), (p, q) patch
size, (s, t) stride, N patches, F = K·p·q values per patch, C model width, T = P + N tokens (P: 1
with a [CLS] token, else 0).

A patch embedding is a convolution whose kernel is the patch and whose step is the stride; it is
computed here as what it is — patches cut out and flattened (channel, then row, then column, the
layout of a convolution kernel's weight ``(C, K, p, q)``), then one linear map ``F → C`` made
through the model's :class:`~qkv.nn.maps.LinearMaps` like every other map (so inference precision
reaches it too). Patches side by side (stride = patch) are a reshape; overlapping ones go through
``unfold``. With a convolutional stem (:class:`~qkv.nn.conv_stem.ConvStem`) the patches are cut
from its feature maps (K' channels, the image's size) instead of the pixels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.nn.conv_stem import ConvStem
from qkv.nn.maps import TRAINING, LinearMaps

__all__ = ["PatchEmbedding", "ImageEmbeddings", "cut_patches"]


def cut_patches(x: Tensor, patch: tuple[int, ...], stride: tuple[int, ...]) -> Tensor:
    """``(B,K,R,W)`` images (or ``(B,K,L)`` signals) → ``(B,N,F)`` flattened patches in reading order."""
    B, K = x.shape[:2]
    if len(patch) == 1:
        (p,), (s,) = patch, stride
        cut = x.unfold(2, p, s)  # (B,K,L) -> (B,K,N,p)
        return cut.permute(0, 2, 1, 3).reshape(B, cut.shape[2], K * p)  # (B,N,K,p) -> (B,N,F)
    (p, q), (s, t) = patch, stride
    R, W = x.shape[2:]
    if (p, q) == (s, t) and R % p == 0 and W % q == 0:  # side by side: a reshape
        grid = x.reshape(B, K, R // p, p, W // q, q)  # (B,K,R/p,p,W/q,q)
        return grid.permute(0, 2, 4, 1, 3, 5).reshape(B, (R // p) * (W // q), K * p * q)  # (B,N,F)
    return F.unfold(x, (p, q), stride=(s, t)).transpose(1, 2)  # (B,F,N) -> (B,N,F)


class PatchEmbedding(nn.Module):
    """Patches of ``size`` images mapped to C: ``proj(cut_patches(stem(x)))`` (no stem: ``stem(x) = x``).

    Args:
        size: ``(R, W)`` or ``(L,)``. channels: K. patch, stride: per axis (tiling checked by
        :class:`~qkv.config_image.ImageConfig`). d_model: C. stem: output channels of a
        :class:`~qkv.nn.conv_stem.ConvStem`'s convolutions (``()``: none; K' = ``stem[-1]``).
        maps: how the map ``F → C`` is made.
    """

    def __init__(self, size: tuple[int, ...], channels: int, patch: tuple[int, ...], stride: tuple[int, ...],
                 d_model: int, *, stem: tuple[int, ...] = (), maps: LinearMaps = TRAINING):
        super().__init__()
        self.size, self.channels, self.patch, self.stride = tuple(size), channels, tuple(patch), tuple(stride)
        self.stem = ConvStem(channels, tuple(stem), dims=len(self.size)) if stem else None
        features = stem[-1] if stem else channels
        self.proj = maps.linear(features * math.prod(patch), d_model)  # weight (C,F): a conv kernel flattened

    def check(self, x: Tensor) -> None:
        """``ValueError`` in one line unless ``x`` is a float ``(B, K, *size)`` tensor."""
        want = (self.channels, *self.size)
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 2 + len(self.size) \
                or tuple(x.shape[1:]) != want:
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            shown = "×".join(map(str, self.size))
            raise ValueError(f"pixel_values must be a float tensor (B, {', '.join(map(str, want))}) — batches of "
                             f"{self.channels}-channel {shown} images — got {got}; resize the images or build a "
                             "model for this size (ModelConfig.image)")

    def forward(self, x: Tensor) -> Tensor:
        """``(B,K,*size)`` → ``(B,N,C)``."""
        self.check(x)
        if self.stem is not None:
            x = self.stem(x)  # (B,K,*size) -> (B,K',*size)
        return self.proj(cut_patches(x, self.patch, self.stride))  # (B,N,F) -> (B,N,C)

    def extra_repr(self) -> str:
        return f"size={self.size}, channels={self.channels}, patch={self.patch}, stride={self.stride}"


class ImageEmbeddings(nn.Module):
    """``x = Dropout([cls; patches(image)] + P)``: the patch embeddings, a learned [CLS] vector in
    front (ViT's), input positions added (``P``, the input slot of :mod:`qkv.nn.positional`).

    Args:
        patches: a :class:`PatchEmbedding`. d_model: C.
        cls_token: put the learned [CLS] vector first.
        positions: module ``length -> (T,C)`` added to the sequence, or ``None``.
        dropout: dropout on the sum.
    """

    def __init__(self, patches: PatchEmbedding, d_model: int, *, cls_token: bool = True,
                 positions: nn.Module | None = None, dropout: float = 0.0):
        super().__init__()
        self.patches = patches
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model)) if cls_token else None
        self.positions = positions
        self.dropout = nn.Dropout(dropout)

    @property
    def prefix(self) -> int:
        return 0 if self.cls is None else 1

    def forward(self, pixel_values: Tensor) -> Tensor:
        """``(B,K,*size)`` → ``(B,T,C)``."""
        x = self.patches(pixel_values)  # (B,N,C)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)  # (B,1,C)+(B,N,C) -> (B,T,C)
        if self.positions is not None:
            x = x + self.positions(x.shape[1])  # (B,T,C) + (T,C)
        return self.dropout(x)
