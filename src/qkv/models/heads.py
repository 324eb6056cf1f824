"""What a task model is made of: its configuration (:class:`TaskConfig`: the task, its labels, the
pooling of a sequence task, the classifier's dropout, an optional head before the classifier), that
head (:class:`TaskHead`) and its output (:class:`TaskOutput`).

The task models that use them — :class:`~qkv.models.task_models.SequenceClassifier` (sequence
classification, regression) and :class:`~qkv.models.task_models.TokenClassifier` — and what the
poolings and losses compute are in :mod:`qkv.models.task_models`.

Legend: B batch, T length, C model width, L labels (1 for regression).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from qkv.nn.activations import ACTIVATIONS
from qkv.validation import check_choice, check_range

__all__ = ["TASKS", "POOLINGS", "SEQUENCE_TASKS", "HEAD_ACTIVATIONS", "TaskConfig", "TaskOutput", "TaskHead"]

#: The tasks a head is built for.
TASKS = ("sequence-classification", "token-classification", "regression")
#: How a sequence task turns ``(B,T,C)`` hidden states into ``(B,C)`` (:mod:`qkv.models.task_models`).
POOLINGS = ("pooler", "cls", "mean")
#: The tasks of one prediction per sequence (the others: one per token).
SEQUENCE_TASKS = ("sequence-classification", "regression")
#: The activations a :class:`TaskHead` may apply after its dense map.
HEAD_ACTIVATIONS = ("tanh", *ACTIVATIONS)


@dataclass(frozen=True)
class TaskConfig:
    """What a task head predicts. Frozen; every field checked on creation.

    Attributes:
        task: one of :data:`TASKS`.
        labels: class names in id order (a list is turned into a tuple); at least 2, unique,
            non-empty strings for the classification tasks, ``()`` for regression.
        pooling: one of :data:`POOLINGS`; used by the sequence tasks, ignored (but still checked)
            by token classification.
        classifier_dropout: dropout on the classifier's input, a number in [0, 1).
        head: the activation of a dense C → C map before the classifier (one of
            :data:`HEAD_ACTIVATIONS`), or ``None`` for none (see :mod:`qkv.models.task_models`).
        head_norm: the encoder's norm after that activation (ModernBERT's head); needs ``head``.
    """

    task: str
    labels: tuple[str, ...] = ()
    pooling: str = "pooler"
    classifier_dropout: float = 0.1
    head: str | None = None
    head_norm: bool = False

    def __post_init__(self) -> None:
        check_choice("task", self.task, TASKS)
        labels = self.labels
        if isinstance(labels, list):
            labels = tuple(labels)
            object.__setattr__(self, "labels", labels)
        if not isinstance(labels, tuple):
            raise ValueError(f"labels={labels!r} must be a tuple or list of class names in id order")
        bad = [x for x in labels if not isinstance(x, str) or not x]
        if bad:
            raise ValueError(f"labels={labels!r}: every label must be a non-empty string, found {bad[0]!r}")
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"labels={labels!r}: duplicate label(s) {dupes}; labels must be unique")
        if self.task == "regression" and labels:
            raise ValueError(f"labels={labels!r}: task='regression' has no class names; pass labels=()")
        if self.task != "regression" and len(labels) < 2:
            raise ValueError(f"labels={labels!r}: task={self.task!r} needs at least 2 labels "
                             "(class names in id order)")
        check_choice("pooling", self.pooling, POOLINGS)
        check_range("classifier_dropout", self.classifier_dropout, 0, 1, number=True)
        if self.head is not None:
            check_choice("head", self.head, HEAD_ACTIVATIONS)
        if not isinstance(self.head_norm, bool) or (self.head_norm and self.head is None):
            raise ValueError(f"head_norm={self.head_norm!r} must be a bool, and True only with a head "
                             "(head='gelu', …)")

    @property
    def num_labels(self) -> int:
        """L: the classifier's outputs, ``len(labels)`` (1 for regression)."""
        return 1 if self.task == "regression" else len(self.labels)

    @property
    def is_sequence(self) -> bool:
        """Whether the task predicts one output per sequence (classification or regression)."""
        return self.task in SEQUENCE_TASKS

    def describe(self) -> str:
        """One line for messages, e.g. ``sequence-classification, num_labels=3, labels ('a', …)``."""
        shown = ", ".join(repr(x) for x in self.labels[:8]) + (", …" if len(self.labels) > 8 else "")
        out = f"{self.task}, num_labels={self.num_labels}"
        if self.labels:
            out += f", labels ({shown})"
        out += f", pooling {self.pooling!r}" if self.is_sequence else ""
        return out + (f", head {self.head}{' + norm' if self.head_norm else ''}" if self.head else "")

    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of every field (JSON-serialisable; labels as a list; ``head`` and ``head_norm``
        only when a head is set, so folders without one read as before)."""
        out = {"task": self.task, "labels": list(self.labels), "pooling": self.pooling,
               "classifier_dropout": self.classifier_dropout}
        if self.head is not None:
            out.update(head=self.head, head_norm=self.head_norm)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskConfig:
        """Build from a ``dict``; unknown keys are an error naming them and the allowed ones."""
        if not isinstance(data, dict):
            raise ValueError(f"a TaskConfig needs a dict, got {type(data).__name__}")
        names = ("task", "labels", "pooling", "classifier_dropout", "head", "head_norm")
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown TaskConfig field(s) {unknown}; allowed: {', '.join(names)}")
        return cls(**data)


@dataclass
class TaskOutput:
    """Result of :class:`~qkv.models.task_models.SequenceClassifier` and
    :class:`~qkv.models.task_models.TokenClassifier`.

    Attributes:
        loss: scalar when ``labels`` are given (the losses of :mod:`qkv.models.task_models`), else ``None``.
        logits: ``(B,L)`` sequence classification; ``(B,T,L)`` token classification; ``(B,1)``
            regression (``forward_packed``: ``(N,L)`` for token classification).
        last_hidden_state: ``(B,T,C)`` encoder output (``forward_packed``: ``(N,C)``).
        hidden_states: see :class:`qkv.nn.encoder.EncoderOutput`.
        attentions: see :class:`qkv.nn.encoder.EncoderOutput`.
    """

    loss: Tensor | None
    logits: Tensor
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class TaskHead(nn.Module):
    """``norm(act(dense(x)))`` (``norm`` optional): what some families put before the classifier.

    Args:
        dense: the C → C map. activation: one of :data:`HEAD_ACTIVATIONS`. norm: a norm module or ``None``.
    """

    def __init__(self, dense: nn.Module, activation: str, norm: nn.Module | None = None):
        super().__init__()
        check_choice("activation", activation, HEAD_ACTIVATIONS)
        self.dense, self.norm = dense, norm
        self.act = torch.tanh if activation == "tanh" else ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        """``(…,C)`` → ``(…,C)``."""
        x = self.act(self.dense(x))  # (…,C) -> (…,C)
        return x if self.norm is None else self.norm(x)
