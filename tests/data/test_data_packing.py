"""Packing into [CLS] … [SEP] blocks and the step-addressed, rank-sharded sampler (qkv.data.packing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.data.cache import TokenCache
from qkv.data.packing import BlockSampler, PackedBlocks
from qkv.data.tokenizer import SpecialTokens

SP = SpecialTokens(pad=0, unk=1, cls=2, sep=3, mask=4)


def _cache(lengths, seed=0) -> TokenCache:
    rng = np.random.default_rng(seed)
    n = int(sum(lengths))
    tokens = rng.integers(5, 97, size=n).astype(np.uint16)
    starts = rng.random(n) < 0.7
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    starts[off[:-1]] = True
    return TokenCache(Path("."), tokens, starts, off, {}, reused=False)


def _reference_stream_blocks(cache, max_len):
    """Independent reference: the documents joined by [SEP], cut every L, edge [SEP]s dropped."""
    stream = []
    for d in range(cache.n_docs):
        if d:
            stream.append(SP.sep)
        stream += cache.document(d)[0].tolist()
    L = max_len - 2
    out = []
    for i in range(0, len(stream), L):
        w = stream[i:i + L]
        if w and w[0] == SP.sep:
            w = w[1:]
        if w and w[-1] == SP.sep:
            w = w[:-1]
        out.append([SP.cls] + w + [SP.sep] + [SP.pad] * (max_len - len(w) - 2))
    return out


@pytest.mark.parametrize("lengths,max_len", [
    ([1, 5, 5, 12, 3, 30, 1, 1, 7], 7),  # documents shorter and longer than L = 5
    ([4, 4, 4, 4], 7),  # separators fall exactly on window edges
    ([50], 9), ([3], 11),
])
def test_stream_packing_matches_reference(lengths, max_len):
    cache = _cache(lengths)
    blocks = PackedBlocks(cache, max_len, SP)
    ref = _reference_stream_blocks(cache, max_len)
    assert len(blocks) == len(ref)
    b = blocks.batch(range(len(blocks)))
    assert b.input_ids.shape == (len(ref), max_len)
    assert b.input_ids.tolist() == ref
    assert (b.attention_mask == (b.input_ids != SP.pad)).all()
    content = b.input_ids[(b.input_ids > 4)]
    assert content.tolist() == cache.tokens.tolist()  # every token exactly once, in order


def test_stream_blocks_are_full_and_bert_shaped(pydoc_cache, pydoc_tokenizer):
    blocks = PackedBlocks(pydoc_cache, 64, pydoc_tokenizer.special)
    b = blocks.batch(range(len(blocks)))
    sp = pydoc_tokenizer.special
    assert (b.input_ids[:, 0] == sp.cls).all()
    last = b.attention_mask.sum(1) - 1
    assert (b.input_ids[range(len(blocks)), last] == sp.sep).all()
    assert (b.attention_mask[:-1].sum(1) >= 63).all()  # all but the last block (nearly) full
    assert b.word_starts.dtype == b.attention_mask.dtype == torch.bool and b.input_ids.dtype == torch.int64
    assert not ((b.input_ids[:, 1:] == sp.sep) & (b.input_ids[:, :-1] == sp.sep)).any()  # no [SEP][SEP]


def test_document_packing():
    cache = _cache([1, 5, 6, 12])
    blocks = PackedBlocks(cache, 7, SP, packing="document")
    assert len(blocks) == 1 + 1 + 2 + 3
    b = blocks.batch(range(len(blocks)))
    docs = [cache.document(d)[0].tolist() for d in range(4)]
    want = [docs[0], docs[1], docs[2][:5], docs[2][5:], docs[3][:5], docs[3][5:10], docs[3][10:]]
    for row, w in zip(b.input_ids.tolist(), want):
        assert row == [SP.cls] + w + [SP.sep] + [SP.pad] * (5 - len(w))
    assert b.word_starts[1, 1]  # a document's first token starts a word


def test_word_starts_follow_tokens():
    cache = _cache([9, 9])
    blocks = PackedBlocks(cache, 6, SP)
    b = blocks.batch(range(len(blocks)))
    real = b.input_ids > 4
    assert b.word_starts[real].tolist() == cache.word_starts.tolist()
    assert b.word_starts[~real].all()  # special tokens count as word starts


def test_bad_arguments():
    cache = _cache([5])
    with pytest.raises(ValueError, match="max_len"):
        PackedBlocks(cache, 2, SP)
    with pytest.raises(ValueError, match="packing"):
        PackedBlocks(cache, 8, SP, packing="greedy")
    with pytest.raises(IndexError):
        PackedBlocks(cache, 8, SP).block(1)


def test_sampler_epochs_cover_every_block_once_and_reshuffle():
    s = BlockSampler(23, 5, seed=1)
    seen = np.concatenate([s.indices(step) for step in range(46)])  # 10 epochs of 23 positions
    for e in range(10):
        assert sorted(seen[23 * e: 23 * (e + 1)]) == list(range(23))
    assert not np.array_equal(seen[:23], seen[23:46])
    assert np.array_equal(BlockSampler(23, 5, seed=1).indices(7), s.indices(7))  # stateless
    assert not np.array_equal(BlockSampler(23, 5, seed=2).indices(0), s.indices(0))


def test_sampler_ranks_shard_the_global_batch():
    one = BlockSampler(101, 8, seed=3)
    ranks = [BlockSampler(101, 4, seed=3, rank=r, world_size=2) for r in range(2)]
    for step in (0, 1, 12, 13, 40):
        parts = [r.indices(step) for r in ranks]
        assert not set(parts[0]) & set(parts[1])  # each rank its own shard
        assert np.array_equal(np.concatenate(parts), one.indices(step))
        assert np.array_equal(np.concatenate([r.positions(step) for r in ranks]), one.positions(step))
    assert BlockSampler(10, 2, shuffle=False).indices(6).tolist() == [2, 3]
    with pytest.raises(ValueError):
        BlockSampler(10, 2, rank=2, world_size=2)
