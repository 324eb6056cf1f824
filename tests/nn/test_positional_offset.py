"""LearnedPositions with a row offset (RoBERTa's positions from pad id + 1), against a hand-made table."""

import pytest
import torch

from qkv.nn.positional import LearnedPositions, build_positions


def test_offset_rows_are_used():
    table = LearnedPositions(5, 3, offset=2)
    assert table.weight.shape == (7, 3)  # max_len + offset rows
    with torch.no_grad():
        table.weight.copy_(torch.arange(21.0).reshape(7, 3))
    torch.testing.assert_close(table(4), torch.arange(6.0, 18.0).reshape(4, 3))  # rows 2, 3, 4, 5
    with pytest.raises(ValueError, match="sequence length 6 exceeds the learned position table's max_len=5"):
        table(6)


def test_offset_is_only_for_the_learned_table():
    assert build_positions("learned", d_model=6, n_heads=2, max_len=4, offset=1).input.weight.shape == (5, 6)
    with pytest.raises(ValueError, match=r"a position offset \(1\) needs the learned table; position='rope'"):
        build_positions("rope", d_model=6, n_heads=2, max_len=4, offset=1)
    with pytest.raises(ValueError, match="offset must be an integer >= 0"):
        LearnedPositions(4, 6, offset=-1)
