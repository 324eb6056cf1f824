"""Windows and batches of fine-tuning data, checked against independent computations."""

from __future__ import annotations

import random

import numpy as np
import pytest

from finetune_support import tagged_sentence
from qkv.data.masking import IGNORE_INDEX
from qkv.finetune.encode import TaskBatches, encode_sequences, encode_tagged, eval_batches


@pytest.fixture(scope="module")
def tok(tiny_bert):
    from qkv.data.tokenizer_facade import TokenizerView, read_tokenizer

    return TokenizerView(read_tokenizer(tiny_bert))


def test_long_texts_become_covering_windows_with_the_text_target(tok):
    rng = random.Random(3)
    texts = [" ".join(rng.choice(["the", "met", "in", "alice", "paris", "bank", "goal"]) for _ in range(n))
             for n in (90, 2, 30)]
    enc = encode_sequences(tok, texts, [0, 1, 2], max_len=16, stride=10, truncate=False)
    for d, text in enumerate(texts):
        content = tok.backend.encode(text, add_special_tokens=False).ids
        wins = [w for w, e in zip(enc.ids, enc.example) if e == d]
        assert all(w[0] == tok.cls_id and w[-1] == tok.sep_id and len(w) <= 16 for w in wins)
        covered = set()
        starts = list(range(0, max(1, len(content) - 14), 10)) + ([len(content) - 14] if len(content) > 14 else [])
        assert len(wins) == len(starts)
        for w, a in zip(wins, starts):  # windows at 0, stride, …, and one ending at the end
            assert list(w[1:-1]) == content[a:a + 14]
            covered |= set(range(a, min(a + 14, len(content))))
        assert covered == set(range(len(content)))
        assert all(t == d for t, e in zip(enc.targets, enc.example) if e == d)
    assert enc.long == 2 and enc.truncated == 0
    cut = encode_sequences(tok, texts, [0, 1, 2], max_len=16, stride=10, truncate=True)
    assert len(cut.ids) == 3 and cut.truncated == 2


def test_token_labels_sit_on_first_pieces_and_long_sentences_split_at_words(tok):
    rng = random.Random(5)
    sents = [tagged_sentence(rng)[0] for _ in range(20)] + [["unknownword", "alice"] * 20]
    tag_ids = [[(i % 3) for i in range(len(s))] for s in sents]
    enc = encode_tagged(tok, sents, tag_ids, max_len=12)
    for s, words in enumerate(sents):
        pieces = [tok.backend.encode(w, add_special_tokens=False).ids or [tok.backend.token_to_id("[UNK]")]
                  for w in words]
        rows = [r for r in range(len(enc.ids)) if enc.example[r] == s]
        content = [int(x) for r in rows for x in enc.ids[r][1:-1]]
        assert content == [p for ps in pieces for p in ps]  # words are never split across windows
        labels = [int(x) for r in rows for x in enc.targets[r][1:-1]]
        expected = [x for w, ps in enumerate(pieces) for x in [tag_ids[s][w]] + [IGNORE_INDEX] * (len(ps) - 1)]
        assert labels == expected
        assert sum(len(enc.word_first[r]) for r in rows) == len(words)
    assert enc.long >= 1


def test_batches_are_a_pure_function_of_the_index_and_cover_each_epoch(tok):
    texts = [" ".join(["the"] * (i % 17 + 1)) for i in range(70)]
    enc = encode_sequences(tok, texts, list(range(70)), max_len=16, stride=10, truncate=False)
    a = TaskBatches(enc, 8, seed=1, pad_id=tok.pad_id, regression=False)
    b = TaskBatches(enc, 8, seed=1, pad_id=tok.pad_id, regression=False)
    assert np.array_equal(a.batch(13).input_ids, b.batch(13).input_ids)
    seen = np.concatenate([a.batch(i).rows for i in range(a.per_epoch)])
    assert sorted(seen) == list(range(len(enc.ids)))
    second = np.concatenate([a.batch(a.per_epoch + i).rows for i in range(a.per_epoch)])
    assert sorted(second) == list(range(len(enc.ids))) and not np.array_equal(seen, second)
    ranks = [TaskBatches(enc, 4, seed=1, pad_id=tok.pad_id, regression=False, rank=r, world_size=2) for r in (0, 1)]
    both = np.concatenate([ranks[0].batch(3).rows, ranks[1].batch(3).rows])
    assert sorted(both) == sorted(a.batch(3).rows)  # two ranks of 4 = one process of 8
    batch = a.batch(0)
    assert batch.attention_mask.sum() == sum(len(enc.ids[r]) for r in batch.rows)
    assert batch.labels.tolist() == [enc.targets[r] for r in batch.rows]


def test_eval_batches_visit_every_row_once(tok):
    enc = encode_sequences(tok, ["the met"] * 5 + ["paris " * 20], [0.5] * 6, max_len=16, stride=10, truncate=False)
    rows = np.concatenate([b.rows for b in eval_batches(enc, 3, pad_id=tok.pad_id, regression=True)])
    assert sorted(rows) == list(range(len(enc.ids)))
    b = next(eval_batches(enc, 3, pad_id=tok.pad_id, regression=True))
    assert b.labels.dtype.is_floating_point
