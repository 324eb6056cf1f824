"""Continued pretraining (``--init-from``): a masked LM from any encoder folder ``qkv.load`` reads, or
a causal LM from a causal-LM folder."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm
from qkv.models.causal_lm import CausalLM
from qkv.errors import CheckpointError
from qkv.checkpoints.io import declared_kind, load
from qkv.models.kinds import IMAGE_KINDS
from qkv.models.mlm import MaskedLM

__all__ = ["load_for_pretraining", "check_init_kind"]

#: what a folder holds, from its config file alone: qkv.json's kind, or config.json's model_type
_CAUSAL, _SEQ2SEQ, _IMAGE = ("causal_lm", "gpt2"), ("encoder_decoder", "marian", "bart", "t5"), (*IMAGE_KINDS, "vit")


def check_init_kind(path: str, objective: str = "mlm") -> None:
    """Refuse, before the tokenizer or the data are read, a folder whose kind ``objective`` cannot continue
    (read from ``qkv.json`` / ``config.json`` only; :func:`load_for_pretraining` checks the loaded model)."""
    kind = declared_kind(path)
    if kind in _IMAGE or kind in _SEQ2SEQ:
        what = "an image model" if kind in _IMAGE else "an encoder-decoder"
        raise ValueError(f"--init-from {path}: holds {what}; --objective {objective} continues "
                         f"{'a causal LM (e.g. GPT-2)' if objective == 'clm' else 'a text encoder or masked LM'}")
    if objective == "mlm" and kind in _CAUSAL:
        raise ValueError(f"--init-from {path}: holds a causal LM; masked-LM pretraining needs an encoder "
                         "(use --objective clm to continue it as a causal LM)")


def load_for_pretraining(path: str, *, objective: str = "mlm", **overrides):
    """The model to continue pretraining from a folder :func:`qkv.load` reads.

    ``objective="mlm"``: a masked LM; an encoder without a masked-LM head (e.g. a sentence-embedding
    BERT, or the encoder of a fine-tuned task model, whose task head is left out) gets a new head —
    BERT-initialised, decoder tied to the word embeddings — and ``new_head=True``. A causal LM is
    refused (its stack never saw the right-hand context). ``objective="clm"``: the folder must hold
    a causal LM (its head is tied: nothing new); an encoder is refused."""
    try:
        loaded = load(path, **overrides).model
    except (CheckpointError, ValueError, TypeError) as e:
        raise ValueError(f"--init-from {path}: {e}") from e
    if objective == "clm":
        if not isinstance(loaded, CausalLM):
            raise ValueError(f"--init-from {path}: holds a model of type {type(loaded).__name__}, not a causal LM; "
                             "--objective clm continues a causal LM (kind causal_lm, e.g. GPT-2)")
        return _InitModel(loaded.config, loaded, new_head=False)
    if isinstance(loaded, CausalLM):
        raise ValueError(f"--init-from {path}: holds a causal LM; masked-LM pretraining needs an encoder "
                         "(use --objective clm to continue it as a causal LM)")
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
