"""Position tasks for an encoder: ``copy``, ``reverse``, ``copy_offset``, with longer evaluation
lengths for length generalisation (formats and worked examples in :mod:`qkv.lab.synthetic`).

Legend: B batch, T sequence length, L source length.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from qkv.lab.streams import (FIRST_SYMBOL, IGNORE, MASK, MAX_TRAIN_LEN, PAD, SPECIALS, SyntheticBatch,
                             accuracy, check_length, check_vocab, draw_lengths, seeded_generator,
                             sequence_accuracy, symbol_names)
from qkv.validation import check_choice, check_int

__all__ = ["Copy", "Reverse", "CopyOffset", "Neighbours"]


def _check_options(task) -> None:
    check_int("n_symbols", task.n_symbols, low=2)
    check_int("min_len", task.min_len, low=1)
    check_int("train_len", task.train_len, low=1)
    if not task.min_len <= task.train_len <= MAX_TRAIN_LEN:
        raise ValueError(f"need min_len ≤ train_len ≤ {MAX_TRAIN_LEN}, got min_len={task.min_len}, "
                         f"train_len={task.train_len} (longer rows: batch(..., length=L) for evaluation)")
    check_vocab(task.name, task.vocab_size, f"n_symbols={task.n_symbols}")


def _source_then_blanks(g: torch.Generator, n_symbols: int, lengths: Tensor,
                        reverse: bool) -> SyntheticBatch:
    """Rows ``s_0 … s_{L-1} [MASK]×L [PAD]…``; slot ``j`` labelled ``s_j`` (or ``s_{L-1-j}``)."""
    B, width = len(lengths), int(lengths.max())
    src = torch.randint(0, n_symbols, (B, width), generator=g) + FIRST_SYMBOL  # (B,Lmax)
    pos = torch.arange(2 * width).expand(B, -1)  # (B,T), T = 2·Lmax
    L = lengths[:, None]  # (B,1)
    is_src, is_slot = pos < L, (pos >= L) & (pos < 2 * L)  # (B,T)
    ids = torch.where(is_src, src.gather(1, pos.clamp(max=width - 1)), torch.where(is_slot, MASK, PAD))
    j = pos - L  # (B,T): slot number
    read = (L - 1 - j) if reverse else j  # (B,T): source index each slot copies
    labels = torch.where(is_slot, src.gather(1, read.clamp(0, width - 1)), IGNORE)
    return SyntheticBatch(ids, pos < 2 * L, labels)


def _symbol_rows(task, index: int, batch_size: int, seed: int, length: int | None, shortest: int):
    """``(lengths (B,), symbol indices (B,T), positions (B,T), real (B,T))`` of batch ``index`` of stream
    ``seed``: rows of ``task``'s training lengths, or all ``length`` long (≥ ``shortest``)."""
    check_int("batch_size", batch_size, low=1)
    check_length(task, length, shortest)
    g = seeded_generator(seed, index)
    lengths = draw_lengths(g, batch_size, task.min_len, task.train_len, length)
    B, width = batch_size, int(lengths.max())
    sym = torch.randint(0, task.n_symbols, (B, width), generator=g)  # (B,T)
    pos = torch.arange(width).expand(B, -1)  # (B,T)
    return lengths, sym, pos, pos < lengths[:, None]


class _SymbolTask:
    """What the position tasks share: a symbol alphabet of ``n_symbols`` after the specials, the
    scores and the chance level."""

    accuracy = staticmethod(accuracy)
    sequence_accuracy = staticmethod(sequence_accuracy)

    @property
    def vocab(self) -> tuple[str, ...]:
        return SPECIALS + symbol_names(self.n_symbols)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + self.n_symbols

    @property
    def chance(self) -> float:
        return 1 / self.n_symbols


@dataclass(frozen=True)
class Copy(_SymbolTask):
    """A source then as many ``[MASK]`` slots; slot ``j`` is labelled with source symbol ``j``.

    Attributes:
        n_symbols: symbol alphabet size.
        min_len, train_len: training source lengths ``L`` are drawn from ``min_len … train_len``
            (≤ 32); rows are ``2L`` long. ``batch(…, length=L)`` draws one longer ``L`` for evaluation.
    """

    name: ClassVar[str] = "copy"
    reverse: ClassVar[bool] = False
    n_symbols: int = 16
    min_len: int = 1
    train_len: int = 16

    def __post_init__(self):
        _check_options(self)

    @property
    def max_len(self) -> int:
        """Longest training row, ``2 · train_len``."""
        return self.seq_len(self.train_len)

    def seq_len(self, length: int) -> int:
        """T of a row whose source has ``length`` symbols: ``2 · length``."""
        return 2 * length

    def batch(self, index: int, batch_size: int, seed: int = 0, *,
              length: int | None = None) -> SyntheticBatch:
        """Batch ``index`` of stream ``seed``; ``length``: every source that long (evaluation)."""
        check_int("batch_size", batch_size, low=1)
        check_length(self, length, 1)
        g = seeded_generator(seed, index)
        lengths = draw_lengths(g, batch_size, self.min_len, self.train_len, length)
        return _source_then_blanks(g, self.n_symbols, lengths, self.reverse)


@dataclass(frozen=True)
class Reverse(Copy):
    """:class:`Copy` with slot ``j`` labelled with source symbol ``L − 1 − j`` (same options)."""

    name: ClassVar[str] = "reverse"
    reverse: ClassVar[bool] = True


@dataclass(frozen=True)
class CopyOffset(_SymbolTask):
    """A row of symbols; position ``i`` is labelled with the symbol at ``i − shift``.

    Attributes:
        n_symbols: symbol alphabet size.
        shift: how far back the label is read (≥ 1); the first ``shift`` positions are unscored.
        min_len, train_len: training row lengths (``shift < min_len ≤ train_len ≤ 32``);
            ``batch(…, length=L)`` draws one longer ``L`` for evaluation.
    """

    name: ClassVar[str] = "copy_offset"
    n_symbols: int = 16
    shift: int = 1
    min_len: int = 4
    train_len: int = 16

    def __post_init__(self):
        check_int("shift", self.shift, low=1)
        _check_options(self)
        if self.min_len <= self.shift:
            raise ValueError(f"min_len={self.min_len} must be > shift={self.shift} (a row needs a scored "
                             "position)")

    @property
    def max_len(self) -> int:
        """Longest training row, ``train_len``."""
        return self.train_len

    def seq_len(self, length: int) -> int:
        """T of a row of ``length`` symbols: ``length``."""
        return length

    def batch(self, index: int, batch_size: int, seed: int = 0, *,
              length: int | None = None) -> SyntheticBatch:
        """Batch ``index`` of stream ``seed``; ``length``: every row that long (evaluation)."""
        lengths, sym, pos, real = _symbol_rows(self, index, batch_size, seed, length, self.shift + 1)
        src = sym + FIRST_SYMBOL  # (B,T)
        back = src.gather(1, (pos - self.shift).clamp(min=0))  # (B,T): the symbol shift places back
        labels = torch.where(real & (pos >= self.shift), back, IGNORE)
        return SyntheticBatch(torch.where(real, src, PAD), real, labels)


@dataclass(frozen=True)
class Neighbours(_SymbolTask):
    """A row of symbols; position ``i`` is labelled with a function of the symbols at ``i + o`` for each
    offset ``o`` of ``offsets``: the ordered tuple itself (``combine="tuple"``: one label id per tuple,
    after the symbols), their sum mod ``n_symbols`` (``"sum"``) or, for two offsets ``(o1, o2)``,
    ``(s[i+o1] − s[i+o2]) mod n_symbols`` (``"difference"``); positions missing a neighbour are unscored.

    Several reads at fixed offsets per position, which one head must mix into one weighted average
    of value vectors (the heads question); ``"tuple"`` and ``"difference"`` also need to know which
    value came from which offset.

    Attributes:
        n_symbols: symbol alphabet size.
        offsets: distinct non-zero offsets, e.g. ``(-1, 1)`` (the left and right neighbours).
        combine: ``"tuple"``, ``"sum"`` or ``"difference"``.
        min_len, train_len: training row lengths (``min_len > max(offsets) − min(offsets)``, ≤ 32).
    """

    name: ClassVar[str] = "neighbours"
    n_symbols: int = 8
    offsets: tuple[int, ...] = (-1, 1)
    combine: str = "tuple"
    min_len: int = 4
    train_len: int = 16

    def __post_init__(self):
        offsets = self.offsets
        if isinstance(offsets, list):
            offsets = tuple(offsets)
            object.__setattr__(self, "offsets", offsets)  # a JSON list, frozen as a tuple
        if (not isinstance(offsets, tuple) or not offsets or len(set(offsets)) != len(offsets)
                or any(isinstance(o, bool) or not isinstance(o, int) or o == 0 for o in offsets)):
            raise ValueError(f"offsets={self.offsets!r} must be distinct non-zero ints, e.g. (-1, 1)")
        check_choice("combine", self.combine, ("tuple", "sum", "difference"))
        if self.combine == "difference" and len(offsets) != 2:
            raise ValueError(f"combine='difference' needs exactly two offsets, got {offsets}")
        _check_options(self)
        if self.min_len <= self._span:
            raise ValueError(f"min_len={self.min_len} must be > {self._span}, the span of offsets {offsets} "
                             "(a row needs a scored position)")

    @property
    def _span(self) -> int:
        return max(max(self.offsets), 0) - min(min(self.offsets), 0)

    @property
    def _tuples(self) -> int:
        return self.n_symbols ** len(self.offsets) if self.combine == "tuple" else 0

    @property
    def vocab(self) -> tuple[str, ...]:
        sym = symbol_names(self.n_symbols)
        combos = tuple(itertools.product(sym, repeat=len(self.offsets))) if self.combine == "tuple" else ()
        return SPECIALS + sym + tuple("(" + ",".join(c) + ")" for c in combos)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + self.n_symbols + self._tuples

    @property
    def chance(self) -> float:
        return 1 / (self._tuples or self.n_symbols)

    @property
    def max_len(self) -> int:
        return self.train_len

    def seq_len(self, length: int) -> int:
        return length

    def batch(self, index: int, batch_size: int, seed: int = 0, *,
              length: int | None = None) -> SyntheticBatch:
        """Batch ``index`` of stream ``seed``; ``length``: every row that long (evaluation)."""
        lengths, sym, pos, real = _symbol_rows(self, index, batch_size, seed, length, self._span + 1)
        width, n = sym.shape[1], self.n_symbols
        reads = [sym.gather(1, (pos + o).clamp(0, width - 1)) for o in self.offsets]  # each (B,T)
        if self.combine == "tuple":
            label = torch.zeros_like(sym)
            for r in reads:  # base-n digits, the first offset most significant
                label = label * n + r
            label = label + FIRST_SYMBOL + n  # (B,T): the tuple's id
        elif self.combine == "sum":
            label = torch.stack(reads).sum(0).remainder(n) + FIRST_SYMBOL
        else:
            label = (reads[0] - reads[1]).remainder(n) + FIRST_SYMBOL
        scored = (pos + min(min(self.offsets), 0) >= 0) & (pos + max(max(self.offsets), 0) < lengths[:, None])
        labels = torch.where(scored, label, IGNORE)
        return SyntheticBatch(torch.where(real, sym + FIRST_SYMBOL, PAD), real, labels)
