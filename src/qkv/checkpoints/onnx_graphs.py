"""What an ONNX export computes: the encoder alone, or a whole pipeline (the modules traced).

Legend: B batch, T length, C model width, K pooling modes, L labels, V vocabulary.

Each graph is a padded forward with inputs ``input_ids``, ``attention_mask`` (1 = real token, right
padding) and, when the model has segment embeddings, ``token_type_ids``; each calls the stack
directly (``Encoder._stack``), skipping the Python-level input checks of ``forward`` that read tensor
values. The pipelines (:data:`PIPELINES`):

* ``encoder``: ``last_hidden_state`` ``(B,T,C)``;
* ``embeddings``: ``sentence_embedding`` ``(B,K·C)`` — the layers chosen, pooled over the real tokens
  (:func:`qkv.embeddings.pooling.pool`), L2-normalised when the options say so: what :func:`qkv.embed`
  gives for a text within one window;
* ``classifier``: ``logits`` of a task model — ``(B,L)`` for sequence classification and regression
  (its pooling, task head and classifier), ``(B,T,L)`` for token classification;
* ``causal-lm``: ``logits`` ``(B,T,V)`` of a causal language model (next-token scores at each position).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.embeddings.pooling import pool, select_layers
from qkv.models.causal_lm import CausalLM
from qkv.models.kinds import encoder_of
from qkv.models.task_models import SequenceClassifier, TaskModel

__all__ = ["PIPELINES", "PaddedEncoder", "PaddedEmbeddings", "PaddedClassifier", "PaddedCausalLM"]

#: pipeline name → the output it gives.
PIPELINES = {"encoder": "last_hidden_state", "embeddings": "sentence_embedding", "classifier": "logits",
             "causal-lm": "logits"}


class PaddedEncoder(nn.Module):
    """``(input_ids, attention_mask[, token_type_ids]) -> last_hidden_state`` ``(B,T,C)``."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        padding_mask = attention_mask != 0  # (B,T) True = real token
        return self.encoder._stack(input_ids, token_type_ids, None, padding_mask, False, False).last_hidden_state


class PaddedEmbeddings(nn.Module):
    """``-> sentence_embedding`` ``(B,K·C)``: layers, pooling, normalisation (the embedder's options)."""

    def __init__(self, encoder: nn.Module, *, pooling: str, layers: tuple[int, ...], normalize: bool):
        super().__init__()
        self.encoder, self.pooling, self.layers, self.normalize = encoder, pooling, tuple(layers), normalize

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        padding_mask = attention_mask != 0  # (B,T)
        last = self.layers == (len(self.encoder.layers),)
        out = self.encoder._stack(input_ids, token_type_ids, None, padding_mask, not last, False)
        hidden = out.last_hidden_state if last else select_layers(out.hidden_states, self.layers)  # (B,T,C)
        v = pool(hidden, padding_mask, self.pooling)  # (B,T,C) -> (B,K·C)
        return torch.nn.functional.normalize(v, dim=-1) if self.normalize else v


class PaddedClassifier(nn.Module):
    """``-> logits``: ``(B,L)`` (sequence tasks) or ``(B,T,L)`` (token classification) of a task model."""

    def __init__(self, model: TaskModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        padding_mask = attention_mask != 0  # (B,T)
        out = self.model.encoder._stack(input_ids, token_type_ids, None, padding_mask, False, False)
        h = out.last_hidden_state  # (B,T,C)
        if isinstance(self.model, SequenceClassifier):
            h = self.model._pool(h, out.pooler_output, attention_mask)  # (B,T,C) -> (B,C)
        return self.model._classify(h)  # (B,C) -> (B,L) | (B,T,C) -> (B,T,L)


class PaddedCausalLM(nn.Module):
    """``(input_ids, attention_mask) -> logits`` ``(B,T,V)`` of a causal LM."""

    def __init__(self, model: CausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        padding_mask = attention_mask != 0  # (B,T)
        h = self.model.decoder._stack(input_ids, None, None, padding_mask, False, False).last_hidden_state
        return self.model.logits(h)  # (B,T,C) -> (B,T,V)


def graph_of(model: nn.Module, pipeline: str, **embed_options) -> nn.Module:
    """The module traced for ``pipeline`` (see the module docstring); ``embed_options``: ``pooling``,
    ``layers``, ``normalize`` for ``embeddings``.

    Raises:
        ValueError: a model of the wrong kind for the pipeline (named).
    """
    if pipeline == "causal-lm":
        if not isinstance(model, CausalLM):
            raise ValueError(f"pipeline 'causal-lm' needs a causal language model, got {type(model).__name__}")
        return PaddedCausalLM(model)
    if pipeline == "classifier":
        if not isinstance(model, TaskModel):
            raise ValueError(f"pipeline 'classifier' needs a model with a task head (qkv finetune), got "
                             f"{type(model).__name__}")
        return PaddedClassifier(model)
    encoder = encoder_of(model)
    if pipeline == "embeddings":
        return PaddedEmbeddings(encoder, **embed_options)
    return PaddedEncoder(encoder)
