"""Tiny models and batches for the interpretability tests (distinct sizes: width 24, 3 heads, 2 layers)."""

from __future__ import annotations

import torch

from qkv.analysis.hooked import Batch
from qkv.config import ModelConfig
from qkv.models.heads import TaskConfig
from qkv.models.task_builders import build_task_model

LABELS = ("a", "b", "c", "d")


def classifier(pooling: str = "cls", dtype=torch.float32, **overrides):
    """A random tiny sequence classifier (4 classes), eval mode, no dropout."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", dropout=0.0, initializer_range=0.2, **overrides)
    task = TaskConfig("sequence-classification", labels=LABELS, pooling=pooling, classifier_dropout=0.0)
    return build_task_model(cfg, task).to(dtype).eval()


def batch(n: int = 3, t: int = 7, seed: int = 1) -> Batch:
    """``n`` texts of up to ``t`` ids, ``[CLS]``=2 first and ``[SEP]``=3 last, the second text shorter."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 97, (n, t), generator=g)
    mask = torch.ones(n, t, dtype=torch.bool)
    lengths = [t] * n
    if n > 1:
        lengths[1] = t - 2
    for i, k in enumerate(lengths):
        ids[i, 0], ids[i, k - 1] = 2, 3
        ids[i, k:], mask[i, k:] = 0, False
    return Batch(ids, mask)
