"""The one-call pipeline the training loop uses (qkv.data.pipeline)."""

from __future__ import annotations

import pytest
import torch

from qkv.data.errors import CorpusDecodeError, CorpusFormatError, CorpusNotFoundError, UnknownDatasetError
from qkv.data.masking import IGNORE_INDEX, MaskingConfig
from qkv.data.pipeline import prepare_pretraining_data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_pretraining_data("dataset:pydoc", vocab_size=613, max_len=48, eval_fraction=0.1, seed=2,
                                    cache_dir=tmp_path_factory.mktemp("cache"))


def test_prepare_on_real_text(data):
    s = data.summary()
    assert s["vocab_size"] == 613 and s["max_len"] == 48 and s["packing"] == "stream"
    assert s["eval_docs"] == round(0.1 * (s["train_docs"] + s["eval_docs"]))
    assert s["train_blocks"] > 2000 and s["eval_blocks"] > 50
    assert not set(data.corpora.train) & set(data.corpora.eval)


def test_second_prepare_reuses_caches_and_a_saved_tokenizer(data, tmp_path):
    data.tokenizer.save(tmp_path / "run")
    again = prepare_pretraining_data("dataset:pydoc", tokenizer=tmp_path / "run", max_len=48,
                                     eval_fraction=0.1, seed=2, cache_dir=data.train_cache.path.parent)
    assert again.train_cache.reused and again.eval_cache.reused
    assert again.train_cache.path == data.train_cache.path


def test_train_batches(data):
    batches = data.train_batches(6, seed=0)
    b = batches.batch(0)
    assert b.input_ids.shape == b.labels.shape == b.attention_mask.shape == (6, 48)
    assert (b.labels[~b.attention_mask] == IGNORE_INDEX).all()
    assert (b.labels != IGNORE_INDEX).any()
    b2 = data.train_batches(6, seed=0).batch(0)
    assert torch.equal(b.input_ids, b2.input_ids) and torch.equal(b.labels, b2.labels)
    assert not torch.equal(batches.batch(1).indices, b.indices)
    ww = data.train_batches(6, seed=0, masking=MaskingConfig(whole_word=True)).batch(0)
    assert torch.equal(ww.indices, b.indices)


def test_two_ranks_see_what_one_process_sees(data):
    one = data.train_batches(8, seed=4)
    ranks = [data.train_batches(4, seed=4, rank=r, world_size=2) for r in range(2)]
    for step in (0, 3, 250):
        whole = one.batch(step)
        parts = [r.batch(step) for r in ranks]
        for field in ("input_ids", "labels", "attention_mask", "indices"):
            assert torch.equal(getattr(whole, field), torch.cat([getattr(p, field) for p in parts]))


def test_eval_epoch_covers_each_block_once_with_fixed_masks(data):
    n = len(data.eval)
    shards = [list(data.eval_batches(16, rank=r, world_size=2).epoch()) for r in range(2)]
    seen = torch.cat([b.indices for shard in shards for b in shard])
    assert sorted(seen.tolist()) == list(range(n))
    again = list(data.eval_batches(16, rank=0, world_size=2).epoch())
    assert all(torch.equal(a.labels, b.labels) for a, b in zip(shards[0], again))


@pytest.mark.parametrize("make,error", [
    (lambda p: p / "missing.txt", CorpusNotFoundError),
    (lambda p: (p / "x.jsonl").write_text('{"text": "a b"}\n{oops\n') and p / "x.jsonl", CorpusFormatError),
    (lambda p: (p / "x.txt").write_bytes(b"ok ok\n\x80\n") and p / "x.txt", CorpusDecodeError),
    (lambda p: "dataset:nope", UnknownDatasetError),
])
def test_bad_input_stops_before_training_and_leaves_no_cache(tmp_path, make, error):
    spec = make(tmp_path)
    with pytest.raises(error):
        prepare_pretraining_data(spec, vocab_size=100, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
