"""Continued pretraining: a masked LM from any model folder ``qkv.load`` reads (``--init-from``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm

__all__ = ["load_for_pretraining"]


def load_for_pretraining(path: str, **overrides):
    """A masked LM from any folder :func:`qkv.load` reads; an encoder without a masked-LM head
    (e.g. a sentence-embedding BERT, or the encoder of a fine-tuned task model, whose task head is
    left out) gets a new head — BERT-initialised, decoder tied to the word embeddings — and
    ``new_head=True`` on the returned model's ``init_info``."""
    from qkv.models.errors import CheckpointError
    from qkv.models.io import load
    from qkv.models.mlm import MaskedLM

    try:
        loaded = load(path, **overrides).model
    except (CheckpointError, ValueError, TypeError) as e:
        raise ValueError(f"--init-from {path}: {e}") from e
    if isinstance(loaded, MaskedLM):
        return _InitModel(loaded.config, loaded, new_head=False)
    encoder = getattr(loaded, "encoder", loaded)  # a task model: its encoder (the task head is not pretrained)
    torch.manual_seed(0)
    model = build_masked_lm(loaded.config)
    model.encoder.load_state_dict(encoder.state_dict(), strict=True)
    return _InitModel(loaded.config, model, new_head=True)


@dataclass
class _InitModel:
    config: ModelConfig
    model: torch.nn.Module
    new_head: bool
