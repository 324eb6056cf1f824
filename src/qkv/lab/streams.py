"""The parts every synthetic task of :mod:`qkv.lab.synthetic` shares: the token layout, the batch,
the seeded generator, and the scores (token and sequence exact match over the scored positions).

Legend: B batch, T sequence length, N scored positions, V vocabulary.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor

from qkv.validation import check_int, is_int

__all__ = ["SyntheticBatch", "accuracy", "sequence_accuracy", "SPECIALS", "PAD", "MASK", "SEP", "MARK_A",
           "MARK_B", "FIRST_SYMBOL", "IGNORE", "MAX_VOCAB", "MAX_TRAIN_LEN", "MAX_EVAL_LEN",
           "seeded_generator", "distinct", "draw_lengths", "check_vocab", "check_length", "names",
           "symbol_names"]

#: The special tokens, ids 0 … 4; a task's symbols follow from :data:`FIRST_SYMBOL`.
SPECIALS = ("[PAD]", "[MASK]", "[SEP]", "[A]", "[B]")
PAD, MASK, SEP, MARK_A, MARK_B = range(5)
FIRST_SYMBOL = len(SPECIALS)
#: Label of an unscored position (the masked-LM loss ignores it).
IGNORE = -100
MAX_VOCAB = 256
#: Longest training source of the length tasks; longest ``length=`` drawn for evaluation.
MAX_TRAIN_LEN, MAX_EVAL_LEN = 32, 256


@dataclass(frozen=True)
class SyntheticBatch:
    """``input_ids`` ``(B,T)`` long, ``attention_mask`` ``(B,T)`` bool (False on padding),
    ``labels`` ``(B,T)`` long: the target id where scored, :data:`IGNORE` elsewhere."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor


def seeded_generator(seed: int, index: int) -> torch.Generator:
    """A generator seeded from ``(seed, index)`` by a hash (no two pairs share a stream by arithmetic)."""
    check_int("index", index, low=0)
    check_int("seed", seed, low=0)
    digest = hashlib.blake2b(f"qkv.lab.synthetic:{seed}:{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def distinct(g: torch.Generator, batch: int, n: int, k: int) -> Tensor:
    """``k`` distinct draws from ``range(n)`` per row, in random order: ``(batch,k)``."""
    return torch.rand(batch, n, generator=g).argsort(dim=1)[:, :k]  # (B,n) -> (B,k)


def check_vocab(name: str, size: int, parts: str) -> None:
    """A task's vocabulary (``parts`` says what it counts) fits in :data:`MAX_VOCAB` ids."""
    if size > MAX_VOCAB:
        raise ValueError(f"{name}: vocab_size={size} ({len(SPECIALS)} specials + {parts}) exceeds "
                         f"{MAX_VOCAB}; use smaller alphabets")


def check_length(task, length: int | None, low: int) -> None:
    """``length`` (an evaluation length) is ``None`` or an int in ``[low, MAX_EVAL_LEN]``."""
    if length is not None and not (is_int(length) and low <= length <= MAX_EVAL_LEN):
        raise ValueError(f"length={length!r} must be an int in [{low}, {MAX_EVAL_LEN}] ({task.name})")


def draw_lengths(g: torch.Generator, batch: int, low: int, high: int, length: int | None) -> Tensor:
    """Each row's length: ``length`` for all, or drawn uniformly from ``low … high``: ``(batch,)``."""
    if length is not None:
        return torch.full((batch,), length, dtype=torch.long)
    return torch.randint(low, high + 1, (batch,), generator=g)


def predictions(logits_or_pred: Tensor, labels: Tensor) -> Tensor:
    """Predicted ids shaped like ``labels`` ``(B,T)``: from ``(B,T,V)`` logits, ``(B,T)`` ids, or the
    scored positions only — ``(N,V)`` logits or ``(N,)`` ids in row-major order (a masked LM's
    sparse output)."""
    pred = logits_or_pred.argmax(-1) if logits_or_pred.is_floating_point() else logits_or_pred
    scored = labels != IGNORE
    if tuple(pred.shape) == tuple(labels.shape):
        return pred
    if pred.dim() == 1 and len(pred) == int(scored.sum()):
        dense = torch.full_like(labels, IGNORE)
        dense[scored] = pred.to(labels.dtype)  # (N,) into the scored places of (B,T)
        return dense
    raise ValueError(f"predictions of shape {tuple(logits_or_pred.shape)} do not fit labels of shape "
                     f"{tuple(labels.shape)} with {int(scored.sum())} scored positions; give (B,T,V) or "
                     "(N,V) logits, or (B,T) or (N,) ids")


def accuracy(logits_or_pred: Tensor, labels: Tensor) -> float:
    """Token-level exact match: the fraction of scored positions (label ≠ -100) predicted right.

    Args:
        logits_or_pred: ``(B,T,V)`` logits or ``(B,T)`` ids, or the scored positions only (``(N,V)``
            logits / ``(N,)`` ids, row-major: what a masked LM returns with ``labels``).
        labels: ``(B,T)``.
    """
    scored = labels != IGNORE
    if not bool(scored.any()):
        raise ValueError("labels have no scored position (every label is -100)")
    pred = predictions(logits_or_pred, labels)
    return float((pred[scored] == labels[scored]).float().mean())


def sequence_accuracy(logits_or_pred: Tensor, labels: Tensor) -> float:
    """The fraction of rows (with a scored position) whose every scored position is right."""
    scored = labels != IGNORE
    rows = scored.any(dim=1)  # (B,)
    if not bool(rows.any()):
        raise ValueError("labels have no scored position (every label is -100)")
    pred = predictions(logits_or_pred, labels)
    right = ((pred == labels) | ~scored).all(dim=1)  # (B,T) -> (B,)
    return float(right[rows].float().mean())


def names(prefix: str, n: int) -> tuple[str, ...]:
    """``prefix0 … prefix{n-1}``."""
    return tuple(f"{prefix}{i}" for i in range(n))


def symbol_names(n: int) -> tuple[str, ...]:
    """Symbol names: ``a … z``, then ``s26``, ``s27``, …"""
    return tuple(chr(ord("a") + i) if i < 26 else f"s{i}" for i in range(n))
