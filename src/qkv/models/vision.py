"""Image models on a :class:`~qkv.nn.vision_encoder.VisionEncoder`: a classifier, and a captioner
(the encoder's patches read by a text decoder through cross-attention).

Legend: B batch, K channels, T encoder tokens (P prefix + N patches), U caption length, C model
width, L labels, V caption vocabulary.

* :class:`ImageClassifier` — pool the patches (``cls``: the [CLS] state; ``mean``: the mean of the
  patch states; ``pooler``: the encoder's pooler), dropout, ``nn.Linear(C, L)``; mean cross-entropy.
  Hugging Face's ``ViTForImageClassification`` is pooling ``cls`` after the final norm.
* :class:`ImageCaptioner` — Prince §12.8 with an image as the source: the encoder reads the image
  once; a :class:`~qkv.models.seq2seq.Decoder` writes the caption, each layer attending causally to
  the words so far and, through cross-attention, to the patches. Its LM head is tied to its own token
  table. Loss and shifting as :class:`~qkv.models.seq2seq.EncoderDecoder`.

The models take plain arguments; :mod:`qkv.models.vision_builders` assembles them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.models.heads import TaskConfig, TaskOutput
from qkv.models.mlm import IGNORE_INDEX
from qkv.models.seq2seq import Decoder, Seq2SeqOutput, shift_right
from qkv.nn.maps import linear_shape
from qkv.nn.vision_encoder import VisionEncoder

__all__ = ["ImageClassifier", "ImageCaptioner"]


class ImageClassifier(nn.Module):
    """One label per image: pool, dropout, ``nn.Linear(C, L)``.

    Args:
        encoder: a :class:`~qkv.nn.vision_encoder.VisionEncoder`.
        task: a ``sequence-classification`` :class:`~qkv.models.heads.TaskConfig` (labels, pooling,
            classifier dropout).
        classifier: ``nn.Linear(C, L)``.
        config: the :class:`~qkv.config.ModelConfig` (with its ``image`` section) it was built from.
    """

    def __init__(self, encoder: VisionEncoder, task: TaskConfig, classifier: nn.Module, *, config: ModelConfig):
        super().__init__()
        if not isinstance(task, TaskConfig) or task.task != "sequence-classification":
            raise ValueError(f"ImageClassifier needs a sequence-classification TaskConfig, got {task!r}")
        if not isinstance(encoder, VisionEncoder) or not isinstance(config, ModelConfig) or config.image is None:
            raise ValueError("ImageClassifier needs a VisionEncoder and the ModelConfig (with image) it was built from")
        if task.pooling == "cls" and encoder.prefix == 0:
            raise ValueError("pooling 'cls' needs a [CLS] token (image.cls_token=True); or pool with 'mean'")
        if task.pooling == "pooler" and encoder.pooler is None:
            raise ValueError("pooling 'pooler' needs an encoder with a pooler (ModelConfig pooler=True)")
        shape = linear_shape(classifier)
        if shape is None or shape[::-1] != (config.d_model, task.num_labels):
            raise ValueError(f"classifier must be a Linear(d_model={config.d_model}, num_labels={task.num_labels})")
        self.encoder, self.task, self.classifier, self.config = encoder, task, classifier, config
        self.dropout = nn.Dropout(task.classifier_dropout)

    def pool(self, h: Tensor, pooled: Tensor | None) -> Tensor:
        """``(B,T,C)`` → ``(B,C)`` by the task's pooling."""
        if self.task.pooling == "pooler":
            return pooled
        if self.task.pooling == "cls":
            return h[:, 0]  # (B,T,C) -> (B,C)
        return h[:, self.encoder.prefix:].mean(dim=1)  # the patches' mean: (B,N,C) -> (B,C)

    def forward(self, pixel_values: Tensor, labels: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaskOutput:
        """Classify each image.

        Args:
            pixel_values: ``(B,K,…)`` images of the model's size.
            labels: ``(B,)`` int64 class ids in ``[0, L)``.
            output_hidden_states, output_attentions: also return them (see ``EncoderOutput``).

        Returns:
            :class:`~qkv.models.heads.TaskOutput` with ``(B,L)`` logits.
        """
        enc = self.encoder(pixel_values, output_hidden_states=output_hidden_states,
                           output_attentions=output_attentions)
        h = enc.last_hidden_state  # (B,T,C)
        logits = self.classifier(self.dropout(self.pool(h, enc.pooler_output)))  # (B,C) -> (B,L)
        loss = None
        if labels is not None:
            B, L = logits.shape
            if (not isinstance(labels, Tensor) or tuple(labels.shape) != (B,) or labels.is_floating_point()
                    or labels.dtype == torch.bool):
                raise ValueError(f"labels must be an int64 tensor of class ids with shape (B,) = ({B},)")
            if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= L):
                raise ValueError(f"labels must be class ids in [0, {L}); found [{int(labels.min())}, "
                                 f"{int(labels.max())}]")
            loss = F.cross_entropy(logits, labels.long())  # (B,L) vs (B,)
        return TaskOutput(loss, logits, h, enc.hidden_states, enc.attentions)


class ImageCaptioner(nn.Module):
    """Vision encoder + text decoder with cross-attention + the LM head tied to the decoder's tokens.

    Args:
        encoder: a :class:`~qkv.nn.vision_encoder.VisionEncoder`.
        decoder: a :class:`~qkv.models.seq2seq.Decoder` (its layers' cross-attention reads C-wide states).
        decoder_start_token_id: the first decoder input. pad_token_id: fills shifted -100 labels.
        config: the :class:`~qkv.config.ModelConfig` it was built from.
    """

    def __init__(self, encoder: VisionEncoder, decoder: Decoder, *, decoder_start_token_id: int = 1,
                 pad_token_id: int = 0, config: ModelConfig):
        super().__init__()
        if not isinstance(encoder, VisionEncoder) or not isinstance(decoder, Decoder):
            raise ValueError("ImageCaptioner needs a VisionEncoder and a Decoder")
        self.encoder, self.decoder, self.config = encoder, decoder, config
        self.decoder_start_token_id, self.pad_token_id = decoder_start_token_id, pad_token_id

    @property
    def decoder_weight(self) -> Tensor:
        """``(V,C)`` — the decoder's token table (tied head)."""
        return self.decoder.embeddings.tokens.weight

    def forward(self, pixel_values: Tensor, decoder_input_ids: Tensor | None = None,
                decoder_attention_mask: Tensor | None = None, labels: Tensor | None = None,
                output_attentions: bool = False) -> Seq2SeqOutput:
        """Encode the images, decode the captions (teacher forcing).

        Args:
            pixel_values: ``(B,K,…)`` images. decoder_input_ids: ``(B,U)``; default ``shift_right(labels)``.
            decoder_attention_mask: ``(B,U)``, 1 = real token. labels: ``(B,U)``, -100 where not scored.
            output_attentions: also return the encoder's, the decoder's and the cross-attention weights
                (``cross_attentions``: per layer ``(B,H,U,T)`` over the image's tokens).

        Returns:
            :class:`~qkv.models.seq2seq.Seq2SeqOutput`.
        """
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids or labels (decoder inputs are the labels shifted right)")
            decoder_input_ids = shift_right(labels, self.decoder_start_token_id, self.pad_token_id)
        enc = self.encoder(pixel_values, output_attentions=output_attentions)
        dec = self.decoder(decoder_input_ids, enc.last_hidden_state, decoder_attention_mask, None,
                           output_attentions=output_attentions)
        logits = F.linear(dec.last_hidden_state, self.decoder_weight)  # (B,U,C)(C,V) -> (B,U,V)
        loss = None
        if labels is not None:
            if tuple(labels.shape) != tuple(decoder_input_ids.shape):
                raise ValueError(f"labels must have the shape of decoder_input_ids {tuple(decoder_input_ids.shape)}, "
                                 f"got {tuple(labels.shape)}")
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),  # (B·U,V), (B·U,)
                                   ignore_index=IGNORE_INDEX)
        return Seq2SeqOutput(loss, logits, enc.last_hidden_state, enc.attentions, dec.attentions, dec.cross_attentions)

    @torch.no_grad()
    def generate(self, pixel_values: Tensor, *, max_new_tokens: int = 24, eos_token_id: int | None = None) -> Tensor:
        """Greedy decoding: ``(B,K,…)`` images → ``(B, 1 + n)`` ids beginning with the start token.

        The encoder runs once and each layer's keys and values of the patches are projected once; the
        decoder runs on the growing prefix (short captions). A row that has written ``eos_token_id``
        is padded after it; decoding stops when every row has.
        """
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int ≥ 0, got {max_new_tokens!r}")
        max_new_tokens = min(max_new_tokens, self.decoder.max_len - 1)
        kv = self.decoder.project_context(self.encoder(pixel_values).last_hidden_state)  # per layer
        out = torch.full((pixel_values.shape[0], 1), self.decoder_start_token_id, dtype=torch.long,
                         device=pixel_values.device)
        done = torch.zeros(out.shape[0], dtype=torch.bool, device=out.device)
        for _ in range(max_new_tokens):
            h = self.decoder(out, kv).last_hidden_state[:, -1]  # (B,C)
            nxt = F.linear(h, self.decoder_weight).argmax(-1).masked_fill(done, self.pad_token_id)  # (B,)
            out = torch.cat([out, nxt[:, None]], dim=1)  # (B,u) -> (B,u+1)
            if eos_token_id is not None:
                done |= nxt == eos_token_id
                if bool(done.all()):
                    break
        return out
