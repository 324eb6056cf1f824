"""BERT's pooler: the first ([CLS]) token's final hidden state through a dense layer and tanh.

Legend: B batch, T length, C model width.

Pretrained BERT trains it with the next-sentence objective; Hugging Face's
``BertForSequenceClassification`` classifies its output. Kept so that a checkpoint that has one
gives the same ``pooler_output`` in qkv and exports it back.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.nn.maps import TRAINING, LinearMaps

__all__ = ["Pooler"]


class Pooler(nn.Module):
    """``tanh(dense(h[:, 0]))``.

    Args:
        d_model: C (the dense layer is C → C).
        maps: how the dense map is made (default: trainable).
    """

    def __init__(self, d_model: int, *, maps: LinearMaps = TRAINING):
        super().__init__()
        self.dense = maps.linear(d_model, d_model)

    def forward(self, h: Tensor) -> Tensor:
        """``(B,T,C)`` hidden states → ``(B,C)`` pooled vectors."""
        first = h[:, 0]  # (B,T,C) -> (B,C)
        return torch.tanh(self.dense(first))  # (B,C) -> (B,C)
