"""Task models: sequence classification, regression and token classification on an encoder.

Legend: B batch, T length, C model width, L labels (1 for regression).

Sequence tasks (``sequence-classification``, ``regression``) pool each sequence into one vector
and classify it, ``logits = linear(dropout(head(pooled)))``; the pooling is one of :data:`POOLINGS`:

* ``pooler``: BERT's, the [CLS] state through the encoder's pooler (``tanh(dense(h[:, 0]))``).
  What Hugging Face's ``BertForSequenceClassification`` does, and the only pooling it expresses.
* ``cls``: the [CLS] state itself, ``h[:, 0]``.
* ``mean``: the mean of the real tokens' states (padding excluded through the attention mask).

Token classification classifies every position, ``logits = linear(dropout(head(h)))``.

``head`` is the identity unless the task names one (``TaskConfig.head``): a dense C → C map, an
activation and, with ``head_norm``, the encoder's norm — :class:`TaskHead`, the shape of the other
families' classification heads (RoBERTa's ``classifier.dense`` + tanh, ELECTRA's + GELU,
DistilBERT's ``pre_classifier`` + ReLU, ModernBERT's ``head.dense`` + activation + ``head.norm``).
transformers applies dropout before that map too (RoBERTa, ELECTRA); outputs in eval mode are the
same.

Losses: mean cross-entropy over the examples (sequence classification); mean cross-entropy over
the labelled tokens, label -100 ignored (token classification; NaN when none is labelled, as
``torch.nn.functional.cross_entropy``); mean squared error (regression).

The models take plain arguments — the :class:`~qkv.models.heads.TaskConfig`, the
:class:`~qkv.models.heads.TaskHead` — :func:`qkv.models.task_builders.build_task_model` and
:func:`qkv.models.task_builders.attach_task_head` assemble them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.models.heads import SEQUENCE_TASKS, TaskConfig, TaskHead, TaskOutput
from qkv.models.mlm import IGNORE_INDEX
from qkv.nn.encoder import Encoder
from qkv.nn.maps import linear_shape
from qkv.nn.packed import PackedBatch

__all__ = ["TaskModel", "SequenceClassifier", "TokenClassifier"]


class TaskModel(nn.Module):
    """Encoder + (task head) + dropout + linear classifier; the base of the two task models (not used
    alone).

    Args:
        encoder: a :class:`qkv.nn.encoder.Encoder`.
        task: the :class:`TaskConfig`.
        classifier: ``nn.Linear(C, L)``.
        config: the encoder's :class:`~qkv.config.ModelConfig` (kept as ``.config``; saving and
            exporting read it).
        head: the :class:`TaskHead` when ``task.head`` names one (else ``None``).
    """

    _tasks: tuple[str, ...] = ()

    def __init__(self, encoder: Encoder, task: TaskConfig, classifier: nn.Linear, *, config: ModelConfig,
                 head: TaskHead | None = None):
        super().__init__()
        name = type(self).__name__
        if not isinstance(task, TaskConfig):
            raise ValueError(f"{name}: task must be a TaskConfig, got {type(task).__name__}")
        if task.task not in self._tasks:
            other = "TokenClassifier" if task.task == "token-classification" else "SequenceClassifier"
            raise ValueError(f"{name} does not do task={task.task!r} (allowed: {', '.join(self._tasks)}); "
                             f"use {other}")
        if not isinstance(encoder, Encoder) or not isinstance(config, ModelConfig):
            raise ValueError(f"{name}: expected a qkv Encoder and a ModelConfig, got "
                             f"{type(encoder).__name__} and {type(config).__name__}")
        if (encoder.pooler is not None) != config.pooler:
            raise ValueError(f"{name}: config.pooler={config.pooler} but the encoder "
                             f"{'has' if encoder.pooler is not None else 'has no'} pooler; build the encoder "
                             "from the same config")
        want = (config.d_model, task.num_labels)
        shape = linear_shape(classifier)  # (out, in)
        if shape is None or shape[::-1] != want:
            got = shape[::-1] if shape is not None else type(classifier).__name__
            raise ValueError(f"{name}: classifier must be nn.Linear(d_model={want[0]}, num_labels={want[1]}), "
                             f"got {got}")
        if (head is not None) != (task.head is not None) or (head is not None and (head.norm is not None)
                                                              != task.head_norm):
            raise ValueError(f"{name}: task.head={task.head!r} (head_norm={task.head_norm}) but the head given is "
                             f"{type(head).__name__}; build it with build_task_model")
        self.encoder = encoder
        self.head = head
        self.dropout = nn.Dropout(task.classifier_dropout)
        self.classifier = classifier
        self.config = config
        self.task = task

    def _classify(self, x: Tensor) -> Tensor:
        """``(…,C)`` → ``(…,L)``: task head (if any), dropout, classifier."""
        if self.head is not None:
            x = self.head(x)  # (…,C) -> (…,C)
        return self.classifier(self.dropout(x))  # (…,C) -> (…,L)

    def _encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions):
        return self.encoder(input_ids, attention_mask, token_type_ids,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)


def _class_ids(labels: Tensor, shape: tuple[int, ...], num_labels: int, *, what: str, ignore: bool) -> Tensor:
    """Checked integer class ids of ``shape`` (values in [0, L), or -100 when ``ignore``) as int64."""
    if (not isinstance(labels, Tensor) or tuple(labels.shape) != shape or labels.is_floating_point()
            or labels.is_complex() or labels.dtype == torch.bool):
        got = f"{labels.dtype} {tuple(labels.shape)}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be an int64 tensor of class ids with shape {what} = {shape}, got {got}")
    labels = labels.long()
    real = labels[labels != IGNORE_INDEX] if ignore else labels
    if real.numel():
        lo, hi = int(real.min()), int(real.max())
        if lo < 0 or hi >= num_labels:
            extra = " (or -100 = ignored)" if ignore else ""
            raise ValueError(f"labels must be class ids in [0, num_labels={num_labels}){extra}; "
                             f"found values in [{lo}, {hi}]")
    return labels


class SequenceClassifier(TaskModel):
    """One prediction per sequence: pooling, dropout, ``nn.Linear(C, L)`` (also regression, L = 1).

    Pooling ``"pooler"`` needs an encoder with a pooler (``ModelConfig.from_flat(pooler=True)``).
    """

    _tasks = SEQUENCE_TASKS

    def __init__(self, encoder: Encoder, task: TaskConfig, classifier: nn.Linear, *, config: ModelConfig,
                 head: TaskHead | None = None):
        super().__init__(encoder, task, classifier, config=config, head=head)
        if task.pooling == "pooler" and encoder.pooler is None:
            raise ValueError("pooling='pooler' needs an encoder with a pooler (ModelConfig.from_flat(pooler=True)); "
                             "build the model with build_task_model or attach_task_head, or choose pooling "
                             "'cls' or 'mean'")

    def _pool(self, h: Tensor, pooled: Tensor | None, attention_mask: Tensor | None) -> Tensor:
        """``(B,T,C)`` → ``(B,C)`` by :attr:`task`'s pooling."""
        if self.task.pooling == "pooler":
            return pooled  # (B,C), the encoder's pooler output
        if self.task.pooling == "cls":
            return h[:, 0]  # (B,T,C) -> (B,C)
        if attention_mask is None:
            return h.mean(dim=1)  # (B,T,C) -> (B,C)
        real = (attention_mask != 0).to(h.dtype)[..., None]  # (B,T) -> (B,T,1)
        return (h * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)  # (B,T,C) -> (B,C), / (B,1)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        """Classify (or score) each sequence.

        Args:
            input_ids: ``(B,T)`` token ids.
            attention_mask: ``(B,T)``, 1/True = real token.
            token_type_ids: ``(B,T)`` segment ids.
            labels: ``(B,)`` int64 class ids in ``[0, L)``; regression: ``(B,)`` float targets.
            output_hidden_states: also return every hidden state.
            output_attentions: also return every layer's attention weights.

        Returns:
            :class:`TaskOutput` with ``(B,L)`` logits (``(B,1)`` for regression).

        Raises:
            ValueError: labels of the wrong shape, dtype or range (the message names the expected).
        """
        enc = self._encode(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        h = enc.last_hidden_state  # (B,T,C)
        pooled = self._pool(h, enc.pooler_output, attention_mask)  # (B,C)
        logits = self._classify(pooled)  # (B,C) -> (B,L)
        loss = None
        if labels is not None:
            B = input_ids.shape[0]
            if self.task.task == "regression":
                if not isinstance(labels, Tensor) or tuple(labels.shape) != (B,) or not labels.is_floating_point():
                    got = (f"{labels.dtype} {tuple(labels.shape)}" if isinstance(labels, Tensor)
                           else type(labels).__name__)
                    raise ValueError(f"labels must be a float tensor of targets with shape (B,) = ({B},), got {got}")
                loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))  # (B,1) -> (B,) vs (B,)
            else:
                ids = _class_ids(labels, (B,), self.task.num_labels, what="(B,)", ignore=False)
                loss = F.cross_entropy(logits, ids)  # (B,L) vs (B,)
        return TaskOutput(loss, logits, h, enc.hidden_states, enc.attentions)

    def forward_packed(self, batch: PackedBatch) -> TaskOutput:
        """Classify (or score) packed sequences, without padding (inference: no labels, no loss).

        Args:
            batch: the sequences back to back (:class:`~qkv.nn.packed.PackedBatch`), each with at
                least one token.

        Returns:
            :class:`TaskOutput` with ``(B,L)`` logits (``(B,1)`` for regression) and the ``(N,C)``
            packed encoder output: what :meth:`forward` gives on the right-padded batch with its
            padding mask (up to float rounding).
        """
        if any(n < 1 for n in batch.lengths):
            raise ValueError("forward_packed needs every sequence to have at least one token")
        enc = self.encoder.forward_packed(batch)
        h = enc.last_hidden_state  # (N,C)
        if self.task.pooling == "pooler":
            pooled = enc.pooler_output  # (B,C)
        elif self.task.pooling == "cls":
            pooled = h[batch.starts]  # (N,C) -> (B,C) each sequence's first token
        else:
            lengths = torch.tensor(batch.lengths, dtype=h.dtype, device=h.device)[:, None]  # (B,1)
            total = h.new_zeros(len(batch.lengths), h.shape[1]).index_add_(0, batch.sequence_ids(), h)  # (B,C)
            pooled = total / lengths  # (B,C)
        return TaskOutput(None, self._classify(pooled), h)  # (B,C) -> (B,L)


class TokenClassifier(TaskModel):
    """One prediction per token: (task head), dropout, ``nn.Linear(C, L)`` at every position."""

    _tasks = ("token-classification",)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        """Classify each token.

        Args:
            input_ids: ``(B,T)`` token ids.
            attention_mask: ``(B,T)``, 1/True = real token.
            token_type_ids: ``(B,T)`` segment ids.
            labels: ``(B,T)`` int64 class ids in ``[0, L)``, -100 where not scored (padding,
                sub-word continuations, special tokens).
            output_hidden_states: also return every hidden state.
            output_attentions: also return every layer's attention weights.

        Returns:
            :class:`TaskOutput` with ``(B,T,L)`` logits.

        Raises:
            ValueError: labels of the wrong shape, dtype or range (the message names the expected).
        """
        enc = self._encode(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        h = enc.last_hidden_state  # (B,T,C)
        logits = self._classify(h)  # (B,T,C) -> (B,T,L)
        loss = None
        if labels is not None:
            ids = _class_ids(labels, tuple(input_ids.shape), self.task.num_labels, what="(B, T)", ignore=True)
            L = logits.shape[-1]
            loss = F.cross_entropy(logits.reshape(-1, L), ids.reshape(-1),
                                   ignore_index=IGNORE_INDEX)  # (B·T,L) vs (B·T,)
        return TaskOutput(loss, logits, h, enc.hidden_states, enc.attentions)

    def forward_packed(self, batch: PackedBatch) -> TaskOutput:
        """Classify every token of packed sequences, without padding (inference: no labels, no loss).

        Returns:
            :class:`TaskOutput` with ``(N,L)`` logits and the ``(N,C)`` packed encoder output: at
            each real position what :meth:`forward` gives on the right-padded batch (up to float
            rounding).
        """
        h = self.encoder.forward_packed(batch).last_hidden_state  # (N,C)
        return TaskOutput(None, self._classify(h), h)  # (N,C) -> (N,L)
