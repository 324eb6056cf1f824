"""The replaced-token discriminator (ELECTRA's pretraining head): one logit per token.

Legend: B batch, T length, C model width.

Head (ELECTRA's ``discriminator_predictions``): ``logit = w · act(dense(h)) + b`` at every
position, ``dense: C → C``, ``w: C → 1``. A positive logit says "this token was replaced".
Loss with ``labels`` (1 = replaced, 0 = original): binary cross-entropy with logits, averaged over
the real tokens (``attention_mask``), as Hugging Face's ``ElectraForPreTraining`` computes it.

Built by :func:`qkv.models.builders.build_discriminator`; saved, loaded and exported by
:mod:`qkv.checkpoints.io` (kind ``"discriminator"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.nn.encoder import Encoder
from qkv.nn.activations import get_activation
from qkv.nn.maps import TRAINING, LinearMaps

__all__ = ["Discriminator", "DiscriminatorHead", "DiscriminatorOutput"]


@dataclass
class DiscriminatorOutput:
    """Result of :class:`Discriminator`.

    Attributes:
        loss: mean binary cross-entropy over the real tokens (scalar) when ``labels`` are given.
        logits: ``(B,T)`` one "replaced" logit per position (meaningless at padding).
        last_hidden_state: ``(B,T,C)`` encoder output.
        hidden_states: see :class:`qkv.nn.encoder.EncoderOutput`.
        attentions: see :class:`qkv.nn.encoder.EncoderOutput`.
    """

    loss: Tensor | None
    logits: Tensor
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class DiscriminatorHead(nn.Module):
    """``dense (C → C)``, activation, ``prediction (C → 1)``.

    Args:
        d_model: C.
        activation: a name in :data:`qkv.nn.activations.ACTIVATIONS` (ELECTRA: the encoder's).
        maps: how the two maps are made (default: trainable).
    """

    def __init__(self, d_model: int, *, activation: str = "gelu", maps: LinearMaps = TRAINING):
        super().__init__()
        self.dense = maps.linear(d_model, d_model)
        self.activation = get_activation(activation)
        self.prediction = maps.linear(d_model, 1)

    def forward(self, h: Tensor) -> Tensor:
        """``(…,C)`` hidden states → ``(…)`` logits."""
        return self.prediction(self.activation(self.dense(h))).squeeze(-1)  # (…,C) -> (…,1) -> (…)


class Discriminator(nn.Module):
    """Encoder + :class:`DiscriminatorHead`.

    Args:
        encoder: a :class:`qkv.nn.encoder.Encoder`.
        head: a :class:`DiscriminatorHead`.
        config: the :class:`~qkv.config.ModelConfig` the model was built from (kept as
            ``.config``; saving and exporting read it), or ``None``.
    """

    def __init__(self, encoder: Encoder, head: DiscriminatorHead, *, config=None):
        super().__init__()
        self.config = config
        self.encoder = encoder
        self.head = head

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> DiscriminatorOutput:
        """Score every token.

        Args:
            input_ids: ``(B,T)`` token ids.
            attention_mask: ``(B,T)``, 1/True = real token.
            token_type_ids: ``(B,T)`` segment ids.
            labels: ``(B,T)`` 1 where the token was replaced, 0 where it is the original.
            output_hidden_states: also return every hidden state.
            output_attentions: also return every layer's attention weights.

        Returns:
            :class:`DiscriminatorOutput`.
        """
        enc = self.encoder(input_ids, attention_mask, token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.head(enc.last_hidden_state)  # (B,T,C) -> (B,T)
        loss = None
        if labels is not None:
            if tuple(labels.shape) != tuple(input_ids.shape):
                raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, "
                                 f"got {tuple(labels.shape)}")
            target = labels.to(logits.dtype)
            if attention_mask is None:
                loss = F.binary_cross_entropy_with_logits(logits, target)
            else:
                real = attention_mask.bool()  # (B,T)
                loss = F.binary_cross_entropy_with_logits(logits[real], target[real])  # (N,) vs (N,)
        return DiscriminatorOutput(loss, logits, enc.last_hidden_state, enc.hidden_states, enc.attentions)
