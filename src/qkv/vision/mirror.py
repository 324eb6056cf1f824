"""Test-time mirroring: a picture's class probabilities averaged with those of its mirror image.

Legend: B pictures, K channels, R × W pixels (L: a signal's length), C classes.

A model trained with ``--augment flip`` has learned that a picture and its left–right mirror are the
same class; scoring both and averaging the two probability vectors (test-time augmentation) is then
a second opinion for the price of a second forward pass. ``qkv pretrain --objective image`` reports
it beside the plain accuracy for such runs (``accuracy_mirrored`` in ``report.json``), and ``qkv
predict MODEL PICTURE… --mirror`` uses it. The mirror is along the last axis (left–right for a
picture, end to start for a signal).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["class_probabilities", "view_probabilities"]


def view_probabilities(model, x: Tensor, *, mirror: bool) -> tuple[Tensor, Tensor | None]:
    """``(plain, mirrored)``: the ``(B,C)`` float32 class probabilities of ``x (B,K,R,W)`` (or
    ``(B,K,L)``), and with ``mirror`` their mean with those of ``x`` mirrored (else ``None``) — the plain
    forward pass done once for both. The caller sets eval mode and no grad."""
    plain = torch.softmax(model(x).logits.float(), dim=-1)  # (B,C)
    if not mirror:
        return plain, None
    return plain, (plain + torch.softmax(model(x.flip(-1)).logits.float(), dim=-1)) / 2  # (B,C)


def class_probabilities(model, x: Tensor, *, mirror: bool = False) -> Tensor:
    """``(B,C)`` class probabilities of ``x``; with ``mirror``, averaged with its mirror image's."""
    plain, mirrored = view_probabilities(model, x, mirror=mirror)
    return mirrored if mirror else plain
