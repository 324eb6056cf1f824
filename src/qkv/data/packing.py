"""Pack a token cache into fixed-length ``[CLS] … [SEP]`` blocks, and sample them by step.

Legend: B batch (blocks), T block length = ``max_len``, L = ``max_len - 2`` content tokens.

Packing (``packing=``):

* ``"stream"`` (default; RoBERTa's FULL-SENTENCES, the BERT-like choice for MLM): the documents
  are one stream with ``[SEP]`` between neighbours, cut into consecutive windows of L tokens; block i
  is ``[CLS] window_i [SEP]``. A separator that falls on a window edge is dropped (no ``[SEP][SEP]``),
  so a block may end one token short, and the last block is short: the rest is ``[PAD]`` with
  ``attention_mask`` False. Nearly every token is real; documents cross block edges.
* ``"document"``: each document alone is cut into windows of L tokens, each ``[CLS] window [SEP]``
  padded to T. No block mixes documents; short documents waste space on padding.

Blocks are a pure function of (cache, max_len, packing): index-addressable, deterministic.

Sampling (:class:`BlockSampler`) is stateless too: global sample positions 0, 1, 2, … run through
epochs, each epoch a seeded permutation of the blocks. Global batch ``step`` covers positions
``[step·B·W, (step+1)·B·W)`` (W ranks, B per rank) and rank r takes the r-th B of them — its own
shard, disjoint from the other ranks'. One process with batch 2b therefore sees exactly the blocks
that two ranks with batch b see together, and resuming at a step needs only the step number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from qkv.data.cache import TokenCache
from qkv.data.tokenizer import SpecialTokens

__all__ = ["Blocks", "PackedBlocks", "BlockSampler", "PACKINGS"]

PACKINGS = ("stream", "document")


@dataclass
class Blocks:
    """A batch of packed blocks (torch tensors on the CPU).

    Attributes:
        input_ids: ``(B,T)`` int64 token ids, ``[CLS] … [SEP] [PAD]…``.
        attention_mask: ``(B,T)`` bool, True = real token (padding False).
        word_starts: ``(B,T)`` bool, True where a token begins a word (special tokens: True).
        indices: ``(B,)`` int64 block indices.
    """

    input_ids: Tensor
    attention_mask: Tensor
    word_starts: Tensor
    indices: Tensor


class PackedBlocks:
    """Index-addressable blocks of ``max_len`` tokens over a :class:`TokenCache`.

    Args:
        cache: the tokenised corpus.
        max_len: block length T (≥ 3), ``[CLS]`` and ``[SEP]`` included.
        special: the tokenizer's special ids.
        packing: ``"stream"`` or ``"document"`` (see module docstring).
    """

    def __init__(self, cache: TokenCache, max_len: int, special: SpecialTokens, *, packing: str = "stream"):
        if packing not in PACKINGS:
            raise ValueError(f"packing must be one of {', '.join(map(repr, PACKINGS))}, got {packing!r}")
        if max_len < 3:
            raise ValueError(f"max_len must be at least 3 ([CLS] token [SEP]), got {max_len}")
        self.cache, self.max_len, self.special, self.packing = cache, int(max_len), special, packing
        self.content = self.max_len - 2  # L
        off = np.asarray(cache.doc_offsets, dtype=np.int64)
        lengths = np.diff(off)
        if packing == "stream":
            # stream coordinates: document d starts at off[d] + d (one [SEP] before each later document)
            self._starts = off[:-1] + np.arange(len(lengths))
            total = cache.n_tokens + max(len(lengths) - 1, 0)
            self._n = -(-total // self.content)
        else:
            per_doc = -(-lengths // self.content)
            self._cum = np.cumsum(per_doc)  # blocks before document d+1
            self._n = int(self._cum[-1]) if len(per_doc) else 0

    def __len__(self) -> int:
        return self._n

    def _content(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Content tokens and word starts of block i (no [CLS]/final [SEP], not padded)."""
        c, off = self.cache, self.cache.doc_offsets
        L = self.content
        if self.packing == "document":
            d = int(np.searchsorted(self._cum, i, side="right"))
            j = i - (int(self._cum[d - 1]) if d else 0)
            a = int(off[d]) + j * L
            b = min(a + L, int(off[d + 1]))
            return np.asarray(c.tokens[a:b], np.int64), np.asarray(c.word_starts[a:b])
        lo, hi = i * L, (i + 1) * L  # window in stream coordinates
        d = int(np.searchsorted(self._starts, lo, side="right")) - 1
        ids, ws = [], []
        n_docs = len(self._starts)
        while d < n_docs and self._starts[d] < hi:
            s = int(self._starts[d])
            n = int(off[d + 1] - off[d])
            a, b = max(lo - s, 0), min(hi - s, n)  # slice of the document inside the window
            if a < b:
                ids.append(np.asarray(c.tokens[off[d] + a: off[d] + b], np.int64))
                ws.append(np.asarray(c.word_starts[off[d] + a: off[d] + b]))
            sep = s + n  # stream position of the [SEP] after document d
            if d + 1 < n_docs and lo < sep < hi - 1 and sep > lo:  # inside, not on an edge
                ids.append(np.array([self.special.sep], np.int64))
                ws.append(np.ones(1, bool))
            d += 1
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        return np.concatenate(ids), np.concatenate(ws)

    def block(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask, word_starts)`` of block i, each ``(T,)`` numpy."""
        if not 0 <= i < self._n:
            raise IndexError(f"block index {i} out of range [0, {self._n})")
        ids, ws = self._content(i)
        T, sp = self.max_len, self.special
        out = np.full(T, sp.pad, np.int64)
        wst = np.ones(T, bool)
        n = len(ids)
        out[0], out[1:n + 1], out[n + 1] = sp.cls, ids, sp.sep
        wst[1:n + 1] = ws
        att = np.zeros(T, bool)
        att[:n + 2] = True
        return out, att, wst

    def __getitem__(self, i: int) -> Blocks:
        return self.batch([i])

    def batch(self, indices) -> Blocks:
        """Blocks at ``indices`` stacked as a :class:`Blocks` of torch tensors ``(B,T)``."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        parts = [self.block(int(i)) for i in idx]
        ids, att, ws = (np.stack(p) for p in zip(*parts))  # each (B,T)
        return Blocks(torch.from_numpy(ids), torch.from_numpy(att), torch.from_numpy(ws),
                      torch.from_numpy(idx))


class BlockSampler:
    """Which blocks each rank reads at each step; stateless, so resuming needs only the step.

    Args:
        n_blocks: number of blocks (``len(PackedBlocks)``).
        batch_size: blocks per rank per step (B).
        seed: permutation seed (epoch e uses seed, e).
        shuffle: permute each epoch; False reads blocks in order (evaluation).
        rank, world_size: this process and the number of processes (W).
    """

    def __init__(self, n_blocks: int, batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1):
        if n_blocks < 1:
            raise ValueError("cannot sample from zero blocks")
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need batch_size ≥ 1 and 0 ≤ rank < world_size, got {batch_size}, {rank}, "
                             f"{world_size}")
        self.n_blocks, self.batch_size, self.seed, self.shuffle = n_blocks, batch_size, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self._perm: tuple[int, np.ndarray] | None = None

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def steps_per_epoch(self) -> float:
        """Global steps per pass over the blocks (fractional: batches run across epoch edges)."""
        return self.n_blocks / self.global_batch_size

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = (epoch, rng.permutation(self.n_blocks))
        return self._perm[1]

    def positions(self, step: int) -> np.ndarray:
        """Global sample positions ``(B,)`` this rank reads at global step ``step``. They are
        unique over the whole run: use them to seed per-sample randomness (masking)."""
        start = step * self.global_batch_size + self.rank * self.batch_size
        return np.arange(start, start + self.batch_size, dtype=np.int64)

    def indices(self, step: int) -> np.ndarray:
        """Block indices ``(B,)`` this rank reads at global step ``step``."""
        pos = self.positions(step)
        if not self.shuffle:
            return pos % self.n_blocks
        epochs, within = np.divmod(pos, self.n_blocks)
        out = np.empty_like(pos)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._permutation(int(e))[within[sel]]
        return out
