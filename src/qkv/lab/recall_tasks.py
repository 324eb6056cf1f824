"""Retrieval tasks for an encoder: ``mqar``, ``two_lookup``, ``attend_away`` (formats and worked
examples in :mod:`qkv.lab.synthetic`).

Legend: B batch, T sequence length, P pairs per row, Q queries per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.lab.streams import (FIRST_SYMBOL, IGNORE, MARK_A, MARK_B, SEP, SPECIALS, SyntheticBatch, accuracy,
                             check_vocab, distinct, names, seeded_generator, sequence_accuracy, symbol_names)
from qkv.validation import check_choice, check_int

__all__ = ["MQAR", "TwoLookup", "AttendAway", "COMBINES"]


class _KeyValueTask:
    """What the key–value tasks share: options ``n_keys``, ``n_values``, ``n_pairs``, ``n_queries``,
    the vocabulary (specials, keys ``k0 …``, values ``v0 …``), the scores and the chance level."""

    accuracy = staticmethod(accuracy)
    sequence_accuracy = staticmethod(sequence_accuracy)

    def _check_key_values(self) -> None:
        for f in ("n_keys", "n_values", "n_pairs", "n_queries"):
            check_int(f, getattr(self, f), low=2 if f == "n_values" else 1)
        if self.n_pairs > self.n_keys:
            raise ValueError(f"n_pairs={self.n_pairs} must be ≤ n_keys={self.n_keys} (keys are distinct in a "
                             "row)")
        if self.n_queries > self.n_pairs:
            raise ValueError(f"n_queries={self.n_queries} must be ≤ n_pairs={self.n_pairs} (queries are "
                             "distinct keys)")
        check_vocab(self.name, self.vocab_size, f"n_keys={self.n_keys} + n_values={self.n_values}")

    @property
    def vocab(self) -> tuple[str, ...]:
        return SPECIALS + names("k", self.n_keys) + names("v", self.n_values)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + self.n_keys + self.n_values

    @property
    def chance(self) -> float:
        return 1 / self.n_values


@dataclass(frozen=True)
class MQAR(_KeyValueTask):
    """Multi-query associative recall; see the module docstring for the layout.

    Attributes:
        n_keys: key alphabet size (≥ n_pairs: keys are distinct within a row).
        n_values: value alphabet size (values drawn independently, repeats allowed).
        n_pairs: key–value pairs per row.
        n_queries: queried keys per row, distinct, drawn from the row's pairs (≤ n_pairs).
    """

    name: ClassVar[str] = "mqar"
    n_keys: int = 32
    n_values: int = 32
    n_pairs: int = 8
    n_queries: int = 8

    def __post_init__(self):
        self._check_key_values()

    @property
    def max_len(self) -> int:
        """T of every row: pairs, ``[SEP]``, queries."""
        return 2 * self.n_pairs + 1 + self.n_queries

    def batch(self, index: int, batch_size: int, seed: int = 0) -> SyntheticBatch:
        """Batch ``index`` of stream ``seed``: ``(B, 2·n_pairs + 1 + n_queries)``, no padding."""
        check_int("batch_size", batch_size, low=1)
        g = seeded_generator(seed, index)
        B, P, Q = batch_size, self.n_pairs, self.n_queries
        k0, v0 = FIRST_SYMBOL, FIRST_SYMBOL + self.n_keys
        keys = distinct(g, B, self.n_keys, P)  # (B,P)
        values = torch.randint(0, self.n_values, (B, P), generator=g)  # (B,P)
        asked = distinct(g, B, P, Q)  # (B,Q): which pairs are queried
        ids = torch.empty(B, 2 * P + 1 + Q, dtype=torch.long)
        ids[:, 0:2 * P:2], ids[:, 1:2 * P:2], ids[:, 2 * P] = keys + k0, values + v0, SEP
        ids[:, 2 * P + 1:] = keys.gather(1, asked) + k0  # (B,P)[(B,Q)] -> (B,Q)
        labels = torch.full_like(ids, IGNORE)
        labels[:, 2 * P + 1:] = values.gather(1, asked) + v0
        return SyntheticBatch(ids, torch.ones_like(ids, dtype=torch.bool), labels)


#: How ``two_lookup`` combines the two retrieved values.
COMBINES = ("sum", "difference", "pair")


@dataclass(frozen=True)
class TwoLookup(_KeyValueTask):
    """Two tables for the same keys; a query's label combines both values (module docstring).

    Attributes:
        n_keys: key alphabet size (≥ n_pairs).
        n_values: value alphabet size, shared by both tables and the labels.
        n_pairs: keys per row; each has an ``[A]`` and a ``[B]`` entry (``6·n_pairs`` tokens).
        n_queries: queried keys per row, distinct (≤ n_pairs).
        combine: ``"sum"``: ``(A[k] + B[k]) mod n_values``; ``"difference"``: ``(A[k] − B[k]) mod n_values``;
            ``"pair"``: the ordered pair ``(A[k], B[k])`` itself, one label id per pair after the values
            (no arithmetic to learn, only the two retrievals).
    """

    name: ClassVar[str] = "two_lookup"
    n_keys: int = 16
    n_values: int = 16
    n_pairs: int = 4
    n_queries: int = 4
    combine: str = "sum"

    def __post_init__(self):
        self._check_key_values()
        check_choice("combine", self.combine, COMBINES)

    @property
    def vocab(self) -> tuple[str, ...]:
        vals = names("v", self.n_values)
        pairs = tuple(f"({a},{b})" for a in vals for b in vals) if self.combine == "pair" else ()
        return super().vocab + pairs

    @property
    def vocab_size(self) -> int:
        return super().vocab_size + (self.n_values ** 2 if self.combine == "pair" else 0)

    @property
    def chance(self) -> float:
        return 1 / self.n_values ** (2 if self.combine == "pair" else 1)

    @property
    def max_len(self) -> int:
        """T of every row: ``2·n_pairs`` triples, ``[SEP]``, queries."""
        return 6 * self.n_pairs + 1 + self.n_queries

    def batch(self, index: int, batch_size: int, seed: int = 0) -> SyntheticBatch:
        """Batch ``index`` of stream ``seed``: ``(B, 6·n_pairs + 1 + n_queries)``, no padding."""
        check_int("batch_size", batch_size, low=1)
        g = seeded_generator(seed, index)
        B, P, Q, n = batch_size, self.n_pairs, self.n_queries, self.n_values
        k0, v0 = FIRST_SYMBOL, FIRST_SYMBOL + self.n_keys
        keys = distinct(g, B, self.n_keys, P)  # (B,P)
        a = torch.randint(0, n, (B, P), generator=g)  # (B,P): table A's values
        b = torch.randint(0, n, (B, P), generator=g)  # (B,P): table B's
        marker = torch.cat([torch.full((B, P), MARK_A), torch.full((B, P), MARK_B)], dim=1)  # (B,2P)
        entry_keys, entry_values = torch.cat([keys, keys], dim=1), torch.cat([a, b], dim=1)  # (B,2P)
        order = distinct(g, B, 2 * P, 2 * P)  # (B,2P): the entries shuffled
        triples = torch.stack([marker.gather(1, order), entry_keys.gather(1, order) + k0,
                               entry_values.gather(1, order) + v0], dim=2)  # (B,2P,3)
        asked = distinct(g, B, P, Q)  # (B,Q)
        qa, qb = a.gather(1, asked), b.gather(1, asked)  # (B,Q)
        if self.combine == "pair":
            target = self.n_values + qa * n + qb  # (B,Q): the pair's id, counted from the first value id
        else:
            target = (qa + qb) % n if self.combine == "sum" else (qa - qb) % n
        ids = torch.cat([triples.reshape(B, 6 * P), torch.full((B, 1), SEP),
                         keys.gather(1, asked) + k0], dim=1)  # (B,2P,3) -> (B,6P); + (B,1) + (B,Q)
        labels = torch.cat([torch.full((B, 6 * P + 1), IGNORE), target + v0], dim=1)
        return SyntheticBatch(ids, torch.ones_like(ids, dtype=torch.bool), labels)


@dataclass(frozen=True)
class AttendAway:
    """Pairs of positions sharing a marker; each is labelled with its partner's symbol (module docstring).

    Token ids: the specials, the ``n_symbols`` plain symbols (the labels), then the
    ``n_markers · n_symbols`` input tokens ``p:s`` at ``FIRST_SYMBOL + n_symbols + p·n_symbols + s``.

    Attributes:
        n_symbols: symbol alphabet size.
        n_markers: pair-marker alphabet size (≥ n_pairs: markers are distinct within a row).
        n_pairs: pairs per row; rows are ``2 · n_pairs`` long, every position scored.
    """

    name: ClassVar[str] = "attend_away"
    n_symbols: int = 8
    n_markers: int = 8
    n_pairs: int = 8

    def __post_init__(self):
        check_int("n_symbols", self.n_symbols, low=2)
        check_int("n_markers", self.n_markers, low=1)
        check_int("n_pairs", self.n_pairs, low=1)
        if self.n_pairs > self.n_markers:
            raise ValueError(f"n_pairs={self.n_pairs} must be ≤ n_markers={self.n_markers} (markers are "
                             "distinct in a row)")
        check_vocab(self.name, self.vocab_size, f"n_symbols={self.n_symbols} labels + "
                     f"n_markers·n_symbols={self.n_markers * self.n_symbols} inputs")

    accuracy = staticmethod(accuracy)
    sequence_accuracy = staticmethod(sequence_accuracy)

    @property
    def vocab(self) -> tuple[str, ...]:
        sym = symbol_names(self.n_symbols)
        return SPECIALS + sym + tuple(f"p{p}:{s}" for p in range(self.n_markers) for s in sym)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + self.n_symbols * (1 + self.n_markers)

    @property
    def chance(self) -> float:
        return 1 / self.n_symbols

    @property
    def max_len(self) -> int:
        return 2 * self.n_pairs

    def batch(self, index: int, batch_size: int, seed: int = 0) -> SyntheticBatch:
        """Batch ``index`` of stream ``seed``: ``(B, 2·n_pairs)``, no padding."""
        check_int("batch_size", batch_size, low=1)
        g = seeded_generator(seed, index)
        B, P, S = batch_size, self.n_pairs, self.n_symbols
        markers = distinct(g, B, self.n_markers, P)  # (B,P)
        symbols = torch.randint(0, S, (B, 2 * P), generator=g)  # (B,2P): slots 2p, 2p+1 are pair p
        slot = torch.arange(2 * P)
        tokens = FIRST_SYMBOL + S + markers[:, slot // 2] * S + symbols  # (B,2P)
        partner = symbols[:, slot ^ 1] + FIRST_SYMBOL  # (B,2P): the other slot's plain symbol
        where = distinct(g, B, 2 * P, 2 * P)  # (B,2P): position t holds slot where[t]
        ids = tokens.gather(1, where)
        return SyntheticBatch(ids, torch.ones_like(ids, dtype=torch.bool), partner.gather(1, where))
