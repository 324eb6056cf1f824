"""What every synthetic encoder task shares: the registry, determinism per ``(seed, index)``, the
token layout (ids inside the vocabulary, specials first), unpadded or padded shapes with a mask that
is False exactly on ``[PAD]``, and labels uniform over the answer alphabet (so an input-blind
constant guess scores the stated chance level)."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from qkv.lab.synthetic import (IGNORE, PAD, SPECIALS, SYNTHETIC_TASKS, accuracy, get_synthetic_task,
                               sequence_accuracy)

NAMES = sorted(SYNTHETIC_TASKS)
#: Small options for each task (distinct sizes, so that an index mix-up shows).
SMALL = {"mqar": dict(n_keys=11, n_values=7, n_pairs=5, n_queries=3),
         "two_lookup": dict(n_keys=9, n_values=6, n_pairs=4, n_queries=3, combine="difference"),
         "copy": dict(n_symbols=7, min_len=2, train_len=9),
         "reverse": dict(n_symbols=7, min_len=2, train_len=9),
         "copy_offset": dict(n_symbols=7, shift=2, min_len=4, train_len=11),
         "attend_away": dict(n_symbols=5, n_markers=7, n_pairs=4),
          "neighbours": dict(n_symbols=5, offsets=(-1, 2), combine="tuple", min_len=5, train_len=12)}


def test_the_registry_holds_the_seven_tasks_and_refuses_unknown_names_and_options():
    assert NAMES == sorted(["mqar", "two_lookup", "copy", "reverse", "copy_offset", "attend_away", "neighbours"])
    with pytest.raises(ValueError, match=r"unknown synthetic task 'mqr'; allowed: mqar, two_lookup"):
        get_synthetic_task("mqr")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['n_symbol'\] for synthetic task 'copy'; "
                                         r"allowed: n_symbols, min_len, train_len"):
        get_synthetic_task("copy", n_symbol=4)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_and_index_give_the_same_batch_other_seeds_and_indices_others(name):
    task = get_synthetic_task(name, **SMALL[name])
    a, again = task.batch(3, 16, seed=5), task.batch(3, 16, seed=5)
    for field in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(getattr(a, field), getattr(again, field))
    for other in (task.batch(3, 16, seed=6), task.batch(4, 16, seed=5)):
        assert a.input_ids.shape != other.input_ids.shape or not torch.equal(a.input_ids, other.input_ids)
    assert task.batch(3, 16) is not None and task == get_synthetic_task(name, **SMALL[name])


@pytest.mark.parametrize("name", NAMES)
def test_layout_ids_vocab_mask_and_padding(name):
    task = get_synthetic_task(name, **SMALL[name])
    assert len(task.vocab) == task.vocab_size == len(set(task.vocab)) and task.vocab[:5] == SPECIALS
    b = task.batch(0, 200, seed=1)
    ids, mask, labels = b.input_ids, b.attention_mask, b.labels
    assert ids.dtype == labels.dtype == torch.long and mask.dtype == torch.bool
    assert ids.shape == mask.shape == labels.shape and ids.shape[0] == 200
    assert ids.shape[1] <= task.max_len
    assert int(ids.min()) >= 0 and int(ids.max()) < task.vocab_size
    assert torch.equal(mask, ids != PAD)  # the mask is False exactly on padding
    scored = labels != IGNORE
    assert not (scored & ~mask).any()  # no label on padding
    assert int(labels[scored].min()) >= len(SPECIALS) and int(labels[scored].max()) < task.vocab_size
    assert scored.any(dim=1).all()  # every row has something to answer


@pytest.mark.parametrize("name", NAMES)
def test_labels_are_uniform_so_a_constant_guess_scores_chance(name):
    """Over many rows every answer symbol is about equally frequent; hence the best input-blind
    constant (and every other constant) scores ≈ ``task.chance``."""
    task = get_synthetic_task(name, **SMALL[name])
    labels = torch.cat([task.batch(i, 256, seed=2).labels.flatten() for i in range(8)])
    labels = labels[labels != IGNORE]
    n = len(labels)
    counts = collections.Counter(labels.tolist())
    assert len(counts) == round(1 / task.chance)  # the answer alphabet, every symbol seen
    tol = 4.5 * math.sqrt(task.chance * (1 - task.chance) / n)
    for symbol in counts:
        guess = torch.full_like(labels, symbol)  # (N,) the constant guess, scored like a masked LM's output
        assert accuracy(guess, labels[None]) == pytest.approx(task.chance, abs=tol), (task.vocab[symbol], n)
    wrong = torch.full_like(labels, PAD)  # [PAD] is never an answer
    assert accuracy(wrong, labels[None]) == 0.0 and sequence_accuracy(wrong, labels[None]) == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_bad_batch_arguments_are_refused(name):
    task = get_synthetic_task(name, **SMALL[name])
    with pytest.raises(ValueError, match="batch_size=0 must be an int ≥ 1"):
        task.batch(0, 0)
    with pytest.raises(ValueError, match="seed=-1 must be an int ≥ 0"):
        task.batch(0, 4, seed=-1)
    with pytest.raises(ValueError, match="index=1.5 must be an int ≥ 0"):
        task.batch(1.5, 4)
