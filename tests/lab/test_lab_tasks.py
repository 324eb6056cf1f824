"""The synthetic tasks: deterministic streams, the targets, exact match, chance."""

from __future__ import annotations

import pytest
import torch

from qkv.lab.tasks import BOS, EOS, PAD, TASKS, get_task, register_task


def test_reverse_and_sort_targets():
    for name, fn in (("reverse", lambda s: s[::-1]), ("sort", sorted)):
        task = get_task(name, min_len=4, max_len=16)
        b = task.batch(3, 64, seed=5)
        for src, tgt in zip(b.sources, b.targets):
            assert 4 <= len(src) <= 16 and tgt == fn(src)
            assert all(3 <= t < task.vocab_size for t in src)


def test_a_batch_is_the_same_for_the_same_seed_and_index():
    task = get_task("reverse")
    a, b, c = task.batch(7, 8, seed=1), task.batch(7, 8, seed=1), task.batch(8, 8, seed=1)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)
    assert not torch.equal(a.input_ids, task.batch(7, 8, seed=2).input_ids)


def test_batch_layout_pads_and_ends_with_eos():
    task = get_task("reverse", min_len=2, max_len=5)
    b = task.batch(0, 16)
    for i, (src, tgt) in enumerate(zip(b.sources, b.targets)):
        n = len(src)
        assert b.input_ids[i, :n].tolist() == src and torch.all(b.input_ids[i, n:] == PAD)
        assert b.attention_mask[i].sum() == n
        assert b.labels[i, : n + 1].tolist() == tgt + [EOS] and torch.all(b.labels[i, n + 1:] == -100)


def test_exact_match_cuts_at_eos_and_chance_is_the_uniform_guess():
    task = get_task("sort", n_symbols=10, min_len=1, max_len=2)
    assert task.exact_match([BOS, 4, 5, EOS, 7], [4, 5]) and not task.exact_match([4, EOS], [4, 5])
    assert task.chance() == pytest.approx((0.1 + 0.01) / 2)
    assert task.vocab[:3] == ("[PAD]", "[BOS]", "[EOS]") and task.encode("3 1") == [6, 4]
    assert task.decode([6, 4]) == "3 1"


def test_bad_options_and_names_are_one_clear_error():
    with pytest.raises(ValueError, match="n_symbols"):
        get_task("sort", n_symbols=99)
    with pytest.raises(ValueError, match="min_len"):
        get_task("reverse", min_len=5, max_len=4)
    with pytest.raises(ValueError, match="unknown task"):
        get_task("copy-twice")
    with pytest.raises(ValueError, match="unknown symbol"):
        get_task("reverse").encode("3 z")


def test_a_registered_task_joins_the_registry():
    register_task("copy", lambda s: list(s))
    try:
        b = get_task("copy").batch(0, 4)
        assert b.targets == b.sources
    finally:
        del TASKS["copy"]
