"""Length-bucketed translation batches: within the token budget, every pair once per epoch, a pure
function of the index, pairs beyond the window counted; the objective's loss and units."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder_decoder
from qkv.translation.objective import TranslationBatches, TranslationObjective, make_batch


def _pairs(n=57, seed=0):
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 50, rng.integers(2, 15)) for _ in range(n)]
    tgt = [rng.integers(4, 50, rng.integers(2, 15)) for _ in range(n)]
    return src, tgt


def test_batches_stay_within_the_budget_and_cover_every_pair_once_per_epoch():
    src, tgt = _pairs()
    b = TranslationBatches(src, tgt, batch_tokens=40, max_len=14, seed=3)
    long = sum(len(s) > 14 or len(t) > 14 for s, t in zip(src, tgt))
    assert b.left_out == long and b.pairs == len(src) - long
    seen = []
    for i in range(len(b)):
        x = b.batch(i)
        assert x.input_ids.numel() <= 40 and x.labels.numel() <= 40
        assert ((x.input_ids != 0) == x.attention_mask.bool()).all()
        seen += [tuple(r[r != -100].tolist()) for r in x.labels]
    assert sorted(seen) == sorted(tuple(t.tolist()) for s, t in zip(src, tgt) if len(s) <= 14 and len(t) <= 14)


def test_a_batch_is_a_pure_function_of_its_index_and_epochs_differ():
    src, tgt = _pairs()
    a = TranslationBatches(src, tgt, batch_tokens=40, max_len=14, seed=3)
    b = TranslationBatches(src, tgt, batch_tokens=40, max_len=14, seed=3)
    n = len(a)
    for i in (0, 5, n + 2):
        assert torch.equal(a.batch(i).labels, b.batch(i).labels)
    order = lambda e: [a.batch(e * n + k).labels[0].tolist() for k in range(n)]  # noqa: E731
    assert order(0) != order(1)


def test_refusals():
    src, tgt = _pairs()
    with pytest.raises(ValueError, match="batch_tokens=8 must be at least the window"):
        TranslationBatches(src, tgt, batch_tokens=8, max_len=14, seed=0)
    with pytest.raises(ValueError, match="no pair fits the window of 1 tokens"):
        TranslationBatches(src, tgt, batch_tokens=8, max_len=1, seed=0)


def test_objective_loss_is_the_models_label_smoothed_loss_over_target_tokens():
    cfg = ModelConfig.from_flat(vocab_size=50, d_model=24, n_heads=3, d_ff=40, n_layers=1, max_len=16,
                                type_vocab_size=0, dropout=0.0, pad_token_id=0)
    torch.manual_seed(0)
    model = build_encoder_decoder(cfg)
    src, tgt = _pairs(5)
    batch = make_batch(src, tgt)
    obj = TranslationObjective(None, None, [], smoothing=0.1)
    assert int(obj.units(batch)) == sum(len(t) for t in tgt)
    full = model(batch.input_ids, batch.attention_mask, labels=batch.labels, label_smoothing=0.1).loss
    torch.testing.assert_close(obj.loss(model, batch), full)
    assert obj.evaluate(model) == {}
