"""The shared parts of the synthetic tasks: the seeded generator, distinct draws, the two scores."""

from __future__ import annotations

import pytest
import torch

from qkv.lab.streams import IGNORE, accuracy, distinct, seeded_generator, sequence_accuracy

LABELS = torch.tensor([[IGNORE, 7, 8, IGNORE],
                       [5, IGNORE, IGNORE, 6],
                       [IGNORE, IGNORE, IGNORE, IGNORE]])  # row 2 has nothing scored
PRED = torch.tensor([[0, 7, 9, 0],  # 1 of 2 right
                     [5, 1, 1, 6],  # 2 of 2 right
                     [3, 3, 3, 3]])


def test_the_generator_depends_on_seed_and_index_only():
    draw = lambda s, i: torch.rand(4, generator=seeded_generator(s, i)).tolist()  # noqa: E731
    assert draw(3, 5) == draw(3, 5)
    assert len({tuple(draw(s, i)) for s in range(3) for i in range(3)}) == 9
    assert draw(0, 1_000_003) != draw(1, 0)  # no arithmetic collision of (seed, index)


def test_distinct_draws_k_different_values_per_row():
    rows = distinct(seeded_generator(0, 0), 50, 9, 4)
    assert rows.shape == (50, 4) and rows.min() >= 0 and rows.max() < 9
    assert all(len(set(r)) == 4 for r in rows.tolist())
    assert len({tuple(r) for r in rows.tolist()}) > 40  # not the same subset every row


def test_accuracy_counts_scored_positions_only():
    assert accuracy(PRED, LABELS) == pytest.approx(3 / 4)
    assert sequence_accuracy(PRED, LABELS) == pytest.approx(1 / 2)  # row 2 (no scored position) left out
    logits = torch.nn.functional.one_hot(PRED, 10).float()  # (B,T,V) whose argmax is PRED
    assert accuracy(logits, LABELS) == pytest.approx(3 / 4)
    sparse = PRED[LABELS != IGNORE]  # (N,) row-major, a masked LM's sparse output
    assert sparse.tolist() == [7, 9, 5, 6]
    assert accuracy(sparse, LABELS) == pytest.approx(3 / 4)
    assert sequence_accuracy(torch.nn.functional.one_hot(sparse, 10).float(), LABELS) == pytest.approx(1 / 2)


def test_scores_refuse_shapes_that_do_not_fit_and_empty_labels():
    with pytest.raises(ValueError, match=r"do not fit labels of shape \(3, 4\) with 4 scored positions"):
        accuracy(torch.zeros(3, dtype=torch.long), LABELS)
    with pytest.raises(ValueError, match="no scored position"):
        sequence_accuracy(PRED, torch.full_like(LABELS, IGNORE))
    with pytest.raises(ValueError, match="index=-1 must be an int ≥ 0"):
        seeded_generator(0, -1)
