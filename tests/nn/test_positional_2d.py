"""2-D positions: the sinusoidal-2d table against its formula written out in NumPy (rows then columns,
the [CLS] row zero), axial rotary (rope-2d) against a per-vector rotation written out, its scores
depending on the row and column offsets only, the [CLS] token left unrotated; both through the
position slots, and refused for a text model."""

import math

import numpy as np
import pytest
import torch

from qkv.nn.positional import GRID_POSITIONS, build_positions
from qkv.nn.positional_2d import AxialRotary, SinCos2DPositions


def _sincos(pos, width):
    return [math.sin(pos / 10000 ** (2 * (i // 2) / width)) if i % 2 == 0 else
            math.cos(pos / 10000 ** (2 * (i // 2) / width)) for i in range(width)]


def test_sinusoidal_2d_is_row_features_then_column_features():
    grid, C = (3, 5), 16
    table = SinCos2DPositions(grid, C, prefix=1)(1 + 15).double().numpy()
    np.testing.assert_array_equal(table[0], np.zeros(C))  # the [CLS] row
    for n in range(15):
        r, c = divmod(n, 5)
        np.testing.assert_allclose(table[1 + n], _sincos(r, 8) + _sincos(c, 8), atol=1e-6)


def test_sinusoidal_2d_on_a_1d_grid_is_the_1d_table():
    table = SinCos2DPositions((7,), 12)(7).double().numpy()
    np.testing.assert_allclose(table, [_sincos(n, 12) for n in range(7)], atol=1e-6)


def _rotate_by_hand(v, r, c, base=10000.0):
    """One vector of width D: the first D/2 features turned by the row, the last D/2 by the column,
    pairs (i, i + D/4) within each half at angle pos · base^(-2i/(D/2))."""
    D = len(v)
    out = np.array(v, dtype=np.float64)
    for block, pos in ((0, r), (1, c)):
        half = D // 4
        for i in range(half):
            a, b = block * D // 2 + i, block * D // 2 + i + half
            th = pos * base ** (-2 * i / (D // 2))
            out[a] = v[a] * math.cos(th) - v[b] * math.sin(th)
            out[b] = v[b] * math.cos(th) + v[a] * math.sin(th)
    return out


def test_rope_2d_equals_the_rotation_written_out():
    grid, D = (2, 3), 8
    rot = AxialRotary(D, grid, prefix=1).double()
    x = torch.randn(2, 3, 7, D, dtype=torch.float64)
    got = rot.rotate(x).numpy()
    np.testing.assert_array_equal(got[..., 0, :], x[..., 0, :].numpy())  # [CLS]: not rotated
    for n in range(6):
        r, c = divmod(n, 3)
        np.testing.assert_allclose(got[1, 2, 1 + n], _rotate_by_hand(x[1, 2, 1 + n].numpy(), r, c), atol=1e-12)


def test_rope_2d_scores_depend_on_row_and_column_offsets_only():
    grid = (4, 4)
    rot = AxialRotary(12, grid).double()
    q, k = torch.randn(12, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
    Q, K = rot.rotate(q.expand(16, 12)), rot.rotate(k.expand(16, 12))  # the same vectors at every patch
    s = Q @ K.T  # (16,16)
    for (a, b), (c, d) in (((0, 5), (10, 15)), ((1, 4), (11, 14)), ((3, 6), (9, 12))):  # equal (Δrow, Δcol)
        assert s[a, b].item() == pytest.approx(s[c, d].item(), abs=1e-12)
    assert abs(s[0, 1].item() - s[0, 4].item()) > 1e-6  # a column step is not a row step


@pytest.mark.parametrize("name", GRID_POSITIONS)
def test_grid_schemes_through_the_slots(name):
    slots = build_positions(name, d_model=24, n_heads=3, max_len=17, grid=(4, 4), prefix=1)
    if name == "sinusoidal-2d":
        assert slots.input(17).shape == (17, 24)
    else:
        q = torch.randn(2, 3, 17, 8)
        assert slots.make_qk_transform()(q, q)[0].shape == q.shape
    with pytest.raises(ValueError, match="a text model has none"):
        build_positions(name, d_model=24, n_heads=3, max_len=17)


def test_grid_schemes_refuse_widths_they_cannot_split():
    with pytest.raises(ValueError, match="divisible by 4"):
        SinCos2DPositions((3, 3), 18)
    with pytest.raises(ValueError, match="d_head divisible by 4"):
        AxialRotary(6, (3, 3))
    with pytest.raises(ValueError, match="built for 10 tokens"):
        AxialRotary(8, (3, 3), prefix=1).rotate(torch.randn(1, 1, 9, 8))
