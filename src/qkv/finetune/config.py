"""The fine-tuning configuration: one frozen, JSON-serialisable dataclass."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from qkv.training.config import RunConfig
from qkv.training.loop_fields import check_loop_values
from qkv.validation import MAX_EPOCHS, check_at_most, check_choice, check_field_types, check_int, check_positive, check_range

__all__ = ["FinetuneConfig", "TASKS", "BASELINES", "POOLINGS"]

TASKS = ("sequence-classification", "token-classification", "regression")
#: Baselines trained and scored in the same run: TF-IDF + logistic (ridge) regression, logistic
#: (ridge) regression on the starting model's frozen mean-pooled vectors, and for token tasks the
#: most frequent tag of each training word.
BASELINES = ("tfidf", "frozen", "word-tag")
POOLINGS = ("pooler", "cls", "mean")


@dataclass(frozen=True)
class FinetuneConfig(RunConfig):
    """Everything a fine-tuning run depends on.

    Attributes:
        model: the starting model folder (qkv model or run folder, Hugging Face BERT folder —
            with or without a task head).
        task: ``sequence-classification``, ``token-classification`` or ``regression``.
        train: training data specs: ``dataset:NAME[:SPLIT]``, ``.jsonl``, ``.csv``/``.tsv`` (also
            ``.gz``), CoNLL-style token files (``.conll``, ``.txt``) for token classification.
        out: the run folder.
        eval: held-out data specs; default the named dataset's test split, else a seeded
            ``eval_fraction`` of the training examples.
        eval_fraction: share of training examples held out when no eval data is given.
        text_field, label_field: columns/fields of text and label (sequence tasks).
        tokens_field, tags_field: fields of the word list and tag list (token tasks, JSONL).
        labels: the label set in id order (default: the sorted labels of the training data, or the
            starting model's head labels).
        max_len: tokens per window, ``[CLS]``/``[SEP]`` included (default 128, or less where the model's
            position table — or the block length it was pretrained with — is shorter).
        stride: content tokens between window starts of a long document (default ¾ of a window).
        truncate: keep only the first window of a long document instead of all its windows
            (counted and reported; never silent).
        pooling: how a sequence task reads the encoder: ``pooler`` (BERT's: ``[CLS]`` → dense → tanh),
            ``cls``, ``mean``; ``None`` (default): the starting model's own head, else the head of its
            family (BERT and qkv models: ``pooler``; RoBERTa: ``cls`` → dense → tanh; ELECTRA: → GELU;
            DistilBERT: → ReLU; ModernBERT: → its activation → norm), so that the fine-tuned model
            converts back to that family's Hugging Face classifier.
        classifier_dropout: dropout before the classifier.
        dropout, attention_dropout: override the model's dropout rates (``None``: keep them;
            ``attention_dropout`` defaults to 0 so attention runs on the fused kernel).
        reset_head: replace a task head the starting model already has.
        epochs: passes over the training windows (not used with ``steps`` or ``time_budget``).
        steps: optimiser steps; default from ``epochs``.
        time_budget: train for this many minutes (the learning rate reaches zero at the deadline).
        batch_size, grad_accum, lr, weight_decay, warmup_steps, schedule, clip_norm: optimisation;
            ``warmup_steps`` defaults to 10 % of the steps (of one epoch with a time budget).
        eval_every, save_every: steps between held-out evaluations / checkpoints (default: about
            4 per run, and at the end).
        eval_sample: examples of the held-out data scored at the evaluations during training (a
            fixed seeded sample; the final report scores all of them).
        eval_batch_size: windows per batch at evaluation and prediction.
        max_train, max_eval: use a seeded random subsample of at most this many examples (reported).
        baselines: what else is trained and scored on the same split (see :data:`BASELINES`);
            ``frozen`` and ``tfidf`` for sequence tasks, ``word-tag`` for token tasks.
        seed, device, precision, threads, strategy, progress, log_every: as in pretraining.
    """

    model: str
    task: str
    train: tuple[str, ...]
    out: str
    eval: tuple[str, ...] | None = None
    eval_fraction: float = 0.2
    text_field: str = "text"
    label_field: str = "label"
    tokens_field: str = "tokens"
    tags_field: str = "tags"
    encoding_errors: str = "strict"
    labels: tuple[str, ...] | None = None
    max_len: int | None = None
    stride: int | None = None
    truncate: bool = False
    pooling: str | None = None
    classifier_dropout: float = 0.1
    dropout: float | None = None
    attention_dropout: float | None = 0.0
    reset_head: bool = False
    epochs: float = 3.0
    steps: int | None = None
    time_budget: float | None = None
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_steps: int | None = None
    schedule: str = "linear"
    clip_norm: float = 1.0
    eval_every: int | None = None
    save_every: int | None = None
    eval_sample: int = 500
    eval_batch_size: int = 64
    max_train: int | None = None
    max_eval: int | None = None
    baselines: tuple[str, ...] = ("tfidf", "frozen", "word-tag")
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    threads: int | str | None = None
    strategy: str = "ddp"
    progress: bool = True
    log_every: int = 10

    def __post_init__(self) -> None:
        for name in ("train", "eval", "labels", "baselines"):
            v = getattr(self, name)
            if isinstance(v, (str, os.PathLike)):
                v = (v,)
            if isinstance(v, list):
                v = tuple(v)
            if isinstance(v, tuple):
                v = tuple(str(x) for x in v)
            object.__setattr__(self, name, v)
        for name in ("model", "out"):
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, str(getattr(self, name)))
        check_field_types(self)
        check_choice("task", self.task, TASKS)
        check_choice("encoding_errors", self.encoding_errors, ("strict", "replace"))
        if not self.model:
            raise ValueError("model is empty: give the folder of the model to fine-tune")
        if not self.train:
            raise ValueError("train is empty: give a training data spec (dataset:NAME, .jsonl, .csv, .tsv, .conll)")
        if self.eval is not None and not self.eval:
            raise ValueError("eval is empty: give a held-out data spec, or leave it out to hold out eval_fraction")
        check_loop_values(self, minutes=" of minutes")
        for name in ("eval_sample", "eval_batch_size"):
            check_int(name, getattr(self, name), low=1)
        for name in ("max_train", "max_eval", "stride"):
            check_int(name, getattr(self, name), low=1, optional=True)
        check_int("max_len", self.max_len, low=3, optional=True)
        if self.stride is not None and self.max_len is not None and self.stride > self.max_len - 2:
            raise ValueError(f"stride={self.stride} must be ≤ max_len − 2 = {self.max_len - 2} (the text tokens "
                             "of one window); a larger stride would skip tokens")
        check_positive("epochs", self.epochs)
        check_at_most("epochs", self.epochs, MAX_EPOCHS, why="passes over the training data")
        if self.steps is not None and self.time_budget is not None:
            raise ValueError("steps and time_budget are both set: give one (--steps or --time-budget)")
        if self.pooling is not None:
            check_choice("pooling", self.pooling, POOLINGS)
        check_range("eval_fraction", self.eval_fraction, 0, 1, bounds="()")
        for name in ("classifier_dropout", "dropout", "attention_dropout"):
            check_range(name, getattr(self, name), 0, 1, optional=True)
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; allowed: {', '.join(BASELINES)} (or none)")
        if self.labels is not None:
            if len(set(self.labels)) != len(self.labels) or not all(self.labels):
                raise ValueError(f"labels={list(self.labels)} must be distinct non-empty names")
            if self.task == "regression":
                raise ValueError("labels are for classification; a regression task has none")
        self.check_loop_fields()

    def tokens_per_example(self, model=None) -> int | None:
        """A window's tokens: ``max_len`` (``None``: the model's window, not known before it is read)."""
        return self.max_len

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("train", "eval", "labels", "baselines"):
            out[name] = list(out[name]) if out[name] is not None else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinetuneConfig:
        cls.check_keys(data)
        missing = [n for n in ("model", "task", "train", "out") if n not in data]
        if missing:
            raise ValueError(f"missing FinetuneConfig field(s): {', '.join(missing)}")
        return cls(**data)

