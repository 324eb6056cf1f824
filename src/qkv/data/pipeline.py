"""From ``--corpus`` to masked (or causal-LM) batches in one call: the API the pretraining loop uses.

    data = prepare_pretraining_data("dataset:20newsgroups", vocab_size=8192, max_len=128,
                                    cache_dir=run_dir / "cache")           # all input errors here
    data.tokenizer.save(run_dir)                                            # tokenizer.json
    train = data.train_batches(batch_size=32, seed=0, rank=rank, world_size=world)
    for step in range(start_step, n_steps):
        batch = train.batch(step)       # MLMBatch: input_ids, attention_mask, labels  (B,T)
    for batch in data.eval_batches(64, rank=rank, world_size=world).epoch():
        ...                             # each held-out block once over all ranks, same masks each time

Everything is a function of (inputs, seed, step): resuming needs only the step number, and K ranks
with batch b see the blocks and masks one process with batch K·b sees (see :mod:`qkv.data.packing`).

Distributed use: let rank 0 call :func:`prepare_pretraining_data` and save the tokenizer, then
(after a barrier) the other ranks call it with ``tokenizer=<that folder>`` — they find the caches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from qkv.data.cache import TokenCache, build_token_cache
from qkv.data.corpus import Corpus, CorpusOptions, TrainEval, train_eval_corpora
from qkv.data.masking import IGNORE_INDEX, MaskingConfig, mask_tokens, position_generators
from qkv.data.packing import BlockSampler, PackedBlocks
from qkv.data.tokenizer import WordPieceTokenizer, load_tokenizer, train_tokenizer

__all__ = ["MLMBatch", "MLMBatches", "CLMBatches", "clm_labels", "PretrainingData", "prepare_pretraining_data"]

DEFAULT_MASKING = MaskingConfig()  # BERT's 15 % / 80-10-10, token level


@dataclass
class MLMBatch:
    """One masked batch for one rank (CPU tensors; move them with :meth:`to`).

    Attributes:
        input_ids: ``(B,T)`` int64, masked.
        attention_mask: ``(B,T)`` bool, True = real token.
        labels: ``(B,T)`` int64, original id at selected positions, -100 elsewhere.
        indices: ``(B,)`` block indices; positions: ``(B,)`` global sample positions.
    """

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    indices: Tensor
    positions: Tensor

    def to(self, device: torch.device | str) -> MLMBatch:
        return MLMBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.labels,
                                                  self.indices, self.positions)))


class MLMBatches:
    """Masked batches of a :class:`PackedBlocks`, addressed by global step, for one rank.

    Args:
        blocks: the packed blocks.
        batch_size: blocks per rank per step.
        vocab_size: vocabulary size (random replacements).
        masking: the masking rates.
        seed: seeds both the block order and the masks.
        shuffle: permute blocks each epoch (training) or read them in order (evaluation).
        rank, world_size: this process and the number of processes.
    """

    def __init__(self, blocks: PackedBlocks, batch_size: int, vocab_size: int, *,
                 masking: MaskingConfig = DEFAULT_MASKING, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1):
        self.blocks, self.vocab_size, self.masking, self.seed = blocks, vocab_size, masking, seed
        self.sampler = BlockSampler(len(blocks), batch_size, seed=seed, shuffle=shuffle, rank=rank,
                                    world_size=world_size)

    def _make(self, indices: np.ndarray, positions: np.ndarray) -> MLMBatch:
        b = self.blocks.batch(indices)
        gens = position_generators(self.seed, positions)
        ids, labels = mask_tokens(b.input_ids, self.blocks.special, self.vocab_size, self.masking,
                                  word_starts=b.word_starts, generator=gens)
        return MLMBatch(ids, b.attention_mask, labels, b.indices, torch.from_numpy(positions))

    def batch(self, step: int) -> MLMBatch:
        """The masked batch this rank trains on at global step ``step`` (micro-steps under gradient
        accumulation: number them ``step * accum + micro``)."""
        return self._make(self.sampler.indices(step), self.sampler.positions(step))

    def epoch(self) -> Iterator[MLMBatch]:
        """Every block exactly once over all ranks, in order, this rank's share (the last batch may be
        smaller; a rank may get fewer batches). Masks are the same on every call."""
        s, n = self.sampler, self.sampler.n_blocks
        for step in range(-(-n // s.global_batch_size)):
            pos = s.positions(step)
            pos = pos[pos < n]
            if len(pos):
                yield self._make(pos, pos)


def clm_labels(input_ids: Tensor, attention_mask: Tensor, sep: int) -> Tensor:
    """Next-token labels of packed ``[CLS] … [SEP]`` blocks: the ids themselves, -100 at padding and
    at each block's closing ``[SEP]`` (a block edge, not a document end; the ``[SEP]`` between two
    documents inside a block stays a target). ``[CLS]`` is never a target: it is first, and a
    causal LM scores position t against token t + 1."""
    labels = input_ids.masked_fill(~attention_mask, IGNORE_INDEX)  # (B,T)
    last = attention_mask.long().sum(1) - 1  # (B,) the last real position of each block
    rows = torch.arange(len(labels))
    closing = (last >= 0) & (input_ids[rows, last.clamp(min=0)] == sep)
    labels[rows[closing], last[closing]] = IGNORE_INDEX
    return labels


class CLMBatches(MLMBatches):
    """Causal-LM batches of a :class:`PackedBlocks`, by global step, for one rank: the blocks as they
    are (no masking), ``labels`` from :func:`clm_labels` (an :class:`MLMBatch` of the same fields;
    the model shifts them). Block order and sharding as :class:`MLMBatches`."""

    def _make(self, indices: np.ndarray, positions: np.ndarray) -> MLMBatch:
        b = self.blocks.batch(indices)
        labels = clm_labels(b.input_ids, b.attention_mask, self.blocks.special.sep)
        return MLMBatch(b.input_ids, b.attention_mask, labels, b.indices, torch.from_numpy(positions))


@dataclass
class PretrainingData:
    """What :func:`prepare_pretraining_data` returns."""

    tokenizer: WordPieceTokenizer
    corpora: TrainEval
    train_cache: TokenCache
    eval_cache: TokenCache
    train: PackedBlocks
    eval: PackedBlocks

    def train_batches(self, batch_size: int, *, masking: MaskingConfig = DEFAULT_MASKING, seed: int = 0,
                      rank: int = 0, world_size: int = 1) -> MLMBatches:
        """Shuffled, dynamically masked training batches by step."""
        return MLMBatches(self.train, batch_size, self.tokenizer.vocab_size, masking=masking, seed=seed,
                          shuffle=True, rank=rank, world_size=world_size)

    def eval_batches(self, batch_size: int, *, masking: MaskingConfig = DEFAULT_MASKING, seed: int = 1234,
                     rank: int = 0, world_size: int = 1) -> MLMBatches:
        """Held-out batches in order with fixed masks (iterate with :meth:`MLMBatches.epoch`)."""
        return MLMBatches(self.eval, batch_size, self.tokenizer.vocab_size, masking=masking, seed=seed,
                          shuffle=False, rank=rank, world_size=world_size)

    def clm_train_batches(self, batch_size: int, *, seed: int = 0, rank: int = 0,
                          world_size: int = 1) -> CLMBatches:
        """Shuffled causal-LM training batches by step."""
        return CLMBatches(self.train, batch_size, self.tokenizer.vocab_size, seed=seed, shuffle=True, rank=rank,
                          world_size=world_size)

    def clm_eval_batches(self, batch_size: int, *, rank: int = 0, world_size: int = 1) -> CLMBatches:
        """Held-out causal-LM batches in order (iterate with :meth:`CLMBatches.epoch`)."""
        return CLMBatches(self.eval, batch_size, self.tokenizer.vocab_size, shuffle=False, rank=rank,
                          world_size=world_size)

    def summary(self) -> dict:
        """Counts and provenance, for logs and the run folder."""
        return {"train_corpus": self.corpora.train.describe(), "eval_corpus": self.corpora.eval.describe(),
                "held_out": self.corpora.how, "vocab_size": self.tokenizer.vocab_size,
                "train_docs": self.train_cache.n_docs, "train_tokens": self.train_cache.n_tokens,
                "train_blocks": len(self.train), "eval_docs": self.eval_cache.n_docs,
                "eval_tokens": self.eval_cache.n_tokens, "eval_blocks": len(self.eval),
                "max_len": self.train.max_len, "packing": self.train.packing,
                "train_cache": str(self.train_cache.path), "eval_cache": str(self.eval_cache.path)}


def prepare_pretraining_data(
    corpus: str | os.PathLike | Sequence[str | os.PathLike] | Corpus, *,
    options: CorpusOptions | None = None, eval_corpus: Sequence[str | os.PathLike] | None = None,
    eval_fraction: float = 0.05, seed: int = 0,
    tokenizer: WordPieceTokenizer | str | os.PathLike | None = None, vocab_size: int = 8192,
    lowercase: bool = True, tokenizer_max_chars: int | None = None,
    max_len: int = 128, packing: str = "stream", cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> PretrainingData:
    """Resolve the corpora, get a tokenizer, tokenise (or reuse the caches) and pack.

    Every bad input — missing path, empty corpus, invalid UTF-8, an over-long document, bad JSONL,
    unknown dataset, missing data package, bad tokenizer folder — raises a
    :class:`qkv.data.errors.CorpusError` here, before any training starts.

    Args:
        corpus: training corpus spec(s) (see :mod:`qkv.data.corpus`).
        options: how files are read.
        eval_corpus: explicit held-out corpus spec(s); else the ``test`` split of named datasets,
            else a deterministic ``eval_fraction`` of the documents chosen with ``seed``.
        tokenizer: a tokenizer, or a folder/file to load one from; ``None`` trains one on the
            training corpus with ``vocab_size`` and ``lowercase`` (``tokenizer_max_chars`` caps
            the text read for that).
        max_len: block length, ``[CLS]``/``[SEP]`` included.
        packing: ``"stream"`` or ``"document"`` (see :mod:`qkv.data.packing`).
        cache_dir: where token caches live (default :func:`qkv.data.cache.default_cache_dir`).
        progress: progress bars while tokenising.
    """
    if not isinstance(max_len, int) or max_len < 3:
        raise ValueError(f"max_len must be an int ≥ 3, got {max_len!r}")
    corpora = train_eval_corpora(corpus, options, eval_fraction=eval_fraction, seed=seed,
                                 eval_specs=eval_corpus)
    if tokenizer is None:
        tok = train_tokenizer(corpora.train, vocab_size=vocab_size, lowercase=lowercase,
                              max_chars=tokenizer_max_chars, show_progress=progress)
    elif isinstance(tokenizer, WordPieceTokenizer):
        tok = tokenizer
    else:
        tok = load_tokenizer(tokenizer)
    train_cache = build_token_cache(corpora.train, tok, cache_dir, progress=progress)
    eval_cache = build_token_cache(corpora.eval, tok, cache_dir, progress=progress)
    return PretrainingData(tok, corpora, train_cache, eval_cache,
                           PackedBlocks(train_cache, max_len, tok.special, packing=packing),
                           PackedBlocks(eval_cache, max_len, tok.special, packing=packing))
