"""Synthetic sequence-to-sequence tasks: seeded, endless, deterministic per ``(seed, index)``.

A :class:`Task` draws a source of ``min_len … max_len`` symbols and computes its target; token ids
are ``0 = [PAD]``, ``1 = [BOS]`` (the decoder start), ``2 = [EOS]``, then the symbols. Tasks live
in :data:`TASKS` (:func:`register_task` adds one: a name and a function from the source symbols'
indices to the target's).

* ``reverse``: the target is the source reversed;
* ``sort``: the target is the source sorted (ascending symbol order).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SPECIALS", "PAD", "BOS", "EOS", "Task", "TASKS", "register_task", "get_task", "Batch"]

#: The special tokens, ids 0, 1, 2.
SPECIALS = ("[PAD]", "[BOS]", "[EOS]")
PAD, BOS, EOS = 0, 1, 2
_ALPHABET = string.digits + string.ascii_lowercase + string.ascii_uppercase  # 62 symbols at most


#: The longest source a synthetic task draws.
MAX_TASK_LEN = 1024


@dataclass(frozen=True)
class Batch:
    """A padded batch: ``input_ids``/``attention_mask`` ``(B,S)``; ``labels`` ``(B,T)`` = target + EOS,
    -100 past the end; ``sources`` and ``targets`` the id lists (targets without EOS)."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    sources: list[list[int]]
    targets: list[list[int]]


@dataclass(frozen=True)
class Task:
    """One synthetic task.

    Attributes:
        name: registry name.
        transform: source symbol indices ``[0, n_symbols)`` → target symbol indices.
        n_symbols: alphabet size (the first ``n_symbols`` of digits, then letters; ≤ 62).
        min_len, max_len: source length range (inclusive).
    """

    name: str
    transform: Callable[[list[int]], list[int]]
    n_symbols: int = 10
    min_len: int = 4
    max_len: int = 16

    def __post_init__(self):
        if not isinstance(self.n_symbols, int) or not 2 <= self.n_symbols <= len(_ALPHABET):
            raise ValueError(f"n_symbols must be an int in [2, {len(_ALPHABET)}], got {self.n_symbols!r}")
        if not isinstance(self.min_len, int) or not isinstance(self.max_len, int) or not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 ≤ min_len ≤ max_len, got {self.min_len!r}, {self.max_len!r}")
        if self.max_len > MAX_TASK_LEN:  # every batch holds sequences this long, and attention is N²
            raise ValueError(f"max_len={self.max_len:,} is above {MAX_TASK_LEN:,}, the longest sequence a synthetic "
                             "task draws; choose a smaller --max-len")

    @property
    def specials(self) -> tuple[str, ...]:
        return SPECIALS

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(_ALPHABET[: self.n_symbols])

    @property
    def vocab(self) -> tuple[str, ...]:
        """Every token, in id order: the specials, then the symbols."""
        return SPECIALS + self.symbols

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def max_target_len(self) -> int:
        """Longest ``labels`` row (target + EOS), for a task whose target is as long as its source."""
        return self.max_len + 1

    def sample(self, generator: torch.Generator) -> tuple[list[int], list[int]]:
        """One ``(source ids, target ids)`` pair drawn with ``generator`` (no specials in either)."""
        n = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=generator))
        src = torch.randint(0, self.n_symbols, (n,), generator=generator).tolist()
        off = len(SPECIALS)
        return [s + off for s in src], [t + off for t in self.transform(src)]

    def batch(self, index: int, batch_size: int, seed: int = 0) -> Batch:
        """Batch ``index`` of the stream ``seed``: the same ``(seed, index)`` gives the same batch."""
        g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(index)) % (2**63))
        pairs = [self.sample(g) for _ in range(batch_size)]
        return collate(pairs)

    def chance(self) -> float:
        """Exact match of a uniform random guess of the target symbols (its length known), averaged over lengths."""
        lengths = range(self.min_len, self.max_len + 1)
        return sum(self.n_symbols ** -n for n in lengths) / len(lengths)

    def encode(self, text: str) -> list[int]:
        """``"3 1 4"`` → symbol ids; ``ValueError`` naming an unknown symbol."""
        index = {s: i for i, s in enumerate(self.vocab)}
        bad = [w for w in text.split() if w not in index]
        if bad:
            raise ValueError(f"unknown symbol(s) {bad[:3]} for task {self.name!r}; allowed: {' '.join(self.symbols)}")
        return [index[w] for w in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.vocab[i] for i in ids)

    @staticmethod
    def exact_match(pred: Sequence[int], target: Sequence[int]) -> bool:
        """Whether ``pred`` (ids, cut at the first EOS, specials dropped) equals ``target``."""
        pred = list(pred)
        if EOS in pred:
            pred = pred[: pred.index(EOS)]
        return [p for p in pred if p not in (PAD, BOS)] == list(target)


def collate(pairs: list[tuple[list[int], list[int]]]) -> Batch:
    """Right-pad ``(source, target)`` pairs into a :class:`Batch`."""
    S = max(len(s) for s, _ in pairs)
    T = max(len(t) for _, t in pairs) + 1
    ids = torch.full((len(pairs), S), PAD, dtype=torch.long)
    labels = torch.full((len(pairs), T), -100, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(t) + 1] = torch.tensor(t + [EOS])
    return Batch(ids, ids != PAD, labels, [s for s, _ in pairs], [t for _, t in pairs])


#: Registered tasks: name → factory ``(**options) -> Task``.
TASKS: dict[str, Callable[..., Task]] = {}


def register_task(name: str, transform: Callable[[list[int]], list[int]]) -> None:
    """Register a task computing its target with ``transform`` (source symbol indices → target's)."""
    TASKS[name] = lambda **kw: Task(name, transform, **kw)


def get_task(name: str, **options) -> Task:
    """The task ``name`` with ``options`` (``n_symbols``, ``min_len``, ``max_len``)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASKS)}")
    return TASKS[name](**options)


register_task("reverse", lambda src: src[::-1])
register_task("sort", sorted)
