"""The one long-text windower (qkv.data.windows): window starts, windows with [CLS]/[SEP], truncation
counts, length-grouped batches and padding — for the embedder, fine-tuning and the analysis."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.data.windows import length_batches, make_windows, pad_batch, window_starts


def _hand_windows(n: int, span: int, stride: int) -> list[int]:
    """Window starts as the documentation defines them, written out independently."""
    starts, a = [], 0
    while a + span < n:
        starts.append(a)
        a += stride
    starts.append(max(0, n - span))
    return sorted(set(starts))


@pytest.mark.parametrize("n,span,stride", [(1, 5, 3), (5, 5, 3), (6, 5, 3), (20, 5, 5), (23, 5, 2),
                                           (100, 30, 29)])
def test_window_starts_cover_every_token(n, span, stride):
    starts = window_starts(n, span, stride)
    assert starts == _hand_windows(n, span, stride)
    covered = set()
    for a in starts:
        assert 0 <= a and a + min(span, n) <= n
        covered.update(range(a, a + span))
    assert covered >= set(range(n))


def test_make_windows_and_truncation_count():
    docs = [np.arange(10, 10 + n) for n in (3, 12, 7)]
    w = make_windows(docs, window=7, stride=3, truncate=False, prefix=[1], suffix=[2])
    assert w.doc == [0, 1, 1, 1, 1, 2, 2] and w.long == 2 and w.truncated == 0
    assert all(x[0] == 1 and x[-1] == 2 for x in w.ids)
    t = make_windows(docs, window=7, stride=3, truncate=True, prefix=[1], suffix=[2])
    assert t.doc == [0, 1, 2] and t.truncated == 2


def test_length_batches_group_similar_lengths():
    lengths = np.array([5, 50, 6, 49, 7, 48])
    batches = length_batches(lengths, 2)
    assert [sorted(lengths[b].tolist()) for b in batches] == [[49, 50], [7, 48], [5, 6]]
    assert sorted(np.concatenate(batches).tolist()) == list(range(6))


@pytest.mark.parametrize("n,span", [(1, 5), (5, 5), (6, 5), (20, 5), (23, 5), (100, 30)])
def test_consecutive_windows_split_without_overlap(n, span):
    """``cover_end=False`` (the analysis): starts 0, S, 2S, …; the last window holds the rest."""
    assert window_starts(n, span, span, cover_end=False) == list(range(0, n, span))
    docs = [np.arange(100, 100 + n)]
    w = make_windows(docs, window=span + 2, cover_end=False, prefix=[1], suffix=[2])
    assert np.concatenate([x[1:-1] for x in w.ids]).tolist() == docs[0].tolist()  # nothing lost or repeated
    assert w.start == list(range(0, n, span)) and w.long == (n > span)


def test_skip_empty_max_windows_and_starts():
    docs = [np.arange(10, 22), np.zeros(0, np.int64), np.arange(5)]
    w = make_windows(docs, window=6, cover_end=False, skip_empty=True, max_windows=2, prefix=[1], suffix=[2])
    assert w.doc == [0, 0, 2, 2] and w.start == [0, 4, 0, 4] and w.truncated == 1 and w.tokens == 17
    assert w.ids[1].tolist() == [1, 14, 15, 16, 17, 2] and w.ids[3].tolist() == [1, 4, 2]
    kept = make_windows(docs, window=6, prefix=[1], suffix=[2])  # an empty document: one [CLS] [SEP] window
    assert kept.doc.count(1) == 1 and kept.ids[kept.doc.index(1)].tolist() == [1, 2]


def test_pad_batch_and_bad_windows():
    ids, mask = pad_batch([np.array([1, 7, 2]), np.array([1, 2])], pad_id=0)
    assert ids.tolist() == [[1, 7, 2], [1, 2, 0]] and ids.dtype == np.int64
    assert mask.tolist() == [[True, True, True], [True, True, False]]
    with pytest.raises(ValueError, match="window length 2 leaves no room for text"):
        make_windows([np.arange(3)], window=2, prefix=[1], suffix=[2])
    with pytest.raises(ValueError, match=r"stride=4 must be in \[1, 3\]"):
        make_windows([np.arange(3)], window=5, stride=4, prefix=[1], suffix=[2])


def test_windows_take_the_tokenizers_template():
    """RoBERTa's <s> … </s>, a two-token prefix, and no special tokens at all (GPT-2's tokenizer)."""
    docs = [np.arange(10, 17)]
    two = make_windows(docs, window=6, prefix=[0, 5], suffix=[2])
    assert [w.tolist() for w in two.ids] == [[0, 5, 10, 11, 12, 2], [0, 5, 13, 14, 15, 2], [0, 5, 14, 15, 16, 2]]
    bare = make_windows(docs, window=4)
    assert [w.tolist() for w in bare.ids] == [[10, 11, 12, 13], [13, 14, 15, 16]]
    with pytest.raises(ValueError, match="beside the 3 special tokens; use a window of at least 4"):
        make_windows(docs, window=3, prefix=[0, 5], suffix=[2])
