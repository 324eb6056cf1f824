"""The masked-language-model: an encoder plus a prediction head tied to the word embeddings.

Legend: B batch, T length, C model width, V vocabulary, N labelled positions in the batch.

Head (BERT's, and ModernBERT's): ``logits = Norm(act(dense(h))) · Eᵀ + b`` with E the encoder's
token embedding table (tied: one tensor, no copy) and b a per-token bias. The norm is the model's
(LayerNorm with or without β, or RMSNorm); ModernBERT's dense map has no bias.

Sparse prediction: with ``labels``, only the N labelled positions (label ≠ -100; about 15 % of
tokens in BERT pretraining) go through the head. The vocabulary projection is ``O(N·C·V)``
instead of ``O(B·T·C·V)`` — for a small model it is most of the compute — and the loss is the
same mean cross-entropy over the labelled positions.

Prepared for bf16 or int8 inference, the head multiplies by its own bfloat16 or int8 copy of E
(``head.vocab_proj``, see :meth:`qkv.nn.maps.LinearMaps.vocab_proj`) and adds b in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.nn.encoder import Encoder
from qkv.nn.activations import get_activation
from qkv.nn.maps import TRAINING, VOCAB_PROJ, LinearMaps, tie_to_table

__all__ = ["MaskedLM", "MaskedLMHead", "MaskedLMOutput", "IGNORE_INDEX"]

#: Label of a position that is not predicted.
IGNORE_INDEX = -100


@dataclass
class MaskedLMOutput:
    """Result of :class:`MaskedLM`.

    Attributes:
        loss: mean cross-entropy over the labelled positions (scalar) when ``labels`` are given;
            NaN when no position is labelled (as in ``torch.nn.functional.cross_entropy``).
        logits: without labels, ``(B,T,V)``; with labels and sparse prediction, ``(N,V)`` for
            the labelled positions in row-major (batch, then position) order; with labels and
            dense prediction, ``(B,T,V)``.
        last_hidden_state: ``(B,T,C)`` encoder output.
        hidden_states: see :class:`qkv.nn.encoder.EncoderOutput`.
        attentions: see :class:`qkv.nn.encoder.EncoderOutput`.
    """

    loss: Tensor | None
    logits: Tensor
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class MaskedLMHead(nn.Module):
    """Transform (dense, activation, norm) and a decoder whose weight is passed in (tied).

    Args:
        d_model: C.
        vocab_size: V (size of the output bias).
        norm: the transform's norm, ``(…,C) -> (…,C)`` (BERT: a LayerNorm).
        activation: a name in :data:`qkv.nn.activations.ACTIVATIONS` (BERT: ``gelu``).
        dense_bias: a bias in the dense C → C map (BERT: yes; ModernBERT: no).
        maps: how the dense map is made (default: trainable); in bf16 and int8 the head also gets its
            own output map ``vocab_proj`` (:meth:`qkv.nn.maps.LinearMaps.vocab_proj`), which the
            :class:`MaskedLM` holding the head fills from the token table.
    """

    def __init__(self, d_model: int, vocab_size: int, *, norm: nn.Module, activation: str = "gelu",
                 dense_bias: bool = True, maps: LinearMaps = TRAINING):
        super().__init__()
        self.dense = maps.linear(d_model, d_model, dense_bias)
        self.activation = get_activation(activation)
        self.norm = norm
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.vocab_proj = maps.vocab_proj(d_model, vocab_size)

    def forward(self, h: Tensor, decoder_weight: Tensor) -> Tensor:
        """``(…,C)`` hidden states and ``(V,C)`` decoder weight → ``(…,V)`` logits (float32 with
        ``vocab_proj``, which then stands for ``decoder_weight``)."""
        h = self.norm(self.activation(self.dense(h)))  # (…,C) -> (…,C)
        if self.vocab_proj is not None:
            return self.vocab_proj(h).float() + self.bias  # (…,C)(C,V) -> (…,V) in bf16 / int8, + b in float32
        # a bfloat16 inference map's output meets the float32 token table in float32
        return F.linear(h.to(decoder_weight.dtype), decoder_weight, self.bias)  # (…,C)(C,V) -> (…,V)


class MaskedLM(nn.Module):
    """Encoder + masked-LM head, the head's decoder tied to the encoder's token embeddings.

    Args:
        encoder: a :class:`qkv.nn.encoder.Encoder`.
        head: a :class:`MaskedLMHead`.
        sparse_prediction: with labels, run the head only at labelled positions (default).
            ``False`` computes ``(B,T,V)`` logits and the same loss (for comparison).
        config: the :class:`~qkv.config.ModelConfig` the model was built from (kept as
            ``.config``; saving and exporting read it), or ``None``.
    """

    def __init__(self, encoder: Encoder, head: MaskedLMHead, *, sparse_prediction: bool = True, config=None):
        super().__init__()
        self.config = config
        self.encoder = encoder
        self.head = head
        self.sparse_prediction = sparse_prediction
        if head.vocab_proj is not None:
            tie_to_table(self, "encoder.embeddings.tokens.weight", f"head.{VOCAB_PROJ}")

    @property
    def decoder_weight(self) -> Tensor:
        """``(V,C)`` — the encoder's token embedding table itself (tied)."""
        return self.encoder.embeddings.tokens.weight

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> MaskedLMOutput:
        """Predict tokens.

        Args:
            input_ids: ``(B,T)`` token ids.
            attention_mask: ``(B,T)``, 1/True = real token.
            token_type_ids: ``(B,T)`` segment ids.
            labels: ``(B,T)`` target ids, :data:`IGNORE_INDEX` (-100) where not predicted.
            output_hidden_states: also return every hidden state.
            output_attentions: also return every layer's attention weights.

        Returns:
            :class:`MaskedLMOutput`.
        """
        enc = self.encoder(input_ids, attention_mask, token_type_ids,
                           output_hidden_states=output_hidden_states,
                           output_attentions=output_attentions)
        h = enc.last_hidden_state  # (B,T,C)
        loss = None
        if labels is None:
            logits = self.head(h, self.decoder_weight)  # (B,T,V)
        else:
            if tuple(labels.shape) != tuple(input_ids.shape):
                raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, "
                                 f"got {tuple(labels.shape)}")
            flat = labels.reshape(-1)  # (B,T) -> (B·T,)
            if self.sparse_prediction:
                picked = flat != IGNORE_INDEX  # (B·T,)
                h_sel = h.reshape(-1, h.shape[-1])[picked]  # (B·T,C) -> (N,C)
                logits = self.head(h_sel, self.decoder_weight)  # (N,V)
                loss = F.cross_entropy(logits, flat[picked])
            else:
                logits = self.head(h, self.decoder_weight)  # (B,T,V)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat,
                                       ignore_index=IGNORE_INDEX)  # (B·T,V) vs (B·T,)
        return MaskedLMOutput(loss, logits, h, enc.hidden_states, enc.attentions)
