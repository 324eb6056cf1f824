"""Tests of the mask helpers (one convention: boolean, True = may attend)."""

from __future__ import annotations

import pytest
import torch

from qkv.nn.masks import causal_mask, check_mask, key_padding_mask

B, H, T, S = 5, 3, 7, 4


def test_key_padding_mask_shape_and_values():
    pad = torch.rand(B, S) > 0.4
    m = key_padding_mask(pad, batch=B, length=S)
    assert m.dtype == torch.bool and m.shape == (B, 1, 1, S)
    assert torch.equal(m[:, 0, 0], pad)
    # broadcasts over heads and queries
    assert torch.equal(m.expand(B, H, T, S)[2, 1, 5], pad[2])


@pytest.mark.parametrize(
    "bad, needle",
    [
        (torch.ones(B, S), "torch.float32"),
        (torch.ones(B, S, dtype=torch.long), "torch.int64"),
        (torch.ones(B, S + 1, dtype=torch.bool), f"({B}, {S + 1})"),
        (torch.ones(S, B, dtype=torch.bool), f"({S}, {B})"),
        (torch.ones(S, dtype=torch.bool), f"({S},)"),
        ([[True] * S] * B, "list"),
    ],
)
def test_key_padding_mask_rejects_bad_masks(bad, needle):
    with pytest.raises(ValueError) as e:
        key_padding_mask(bad, batch=B, length=S)
    msg = str(e.value)
    assert needle in msg
    assert "bool" in msg or f"({B}, {S})" in msg or "Tensor" in msg  # says what is allowed


@pytest.mark.parametrize("t, s", [(7, 7), (4, 7), (7, 4), (1, 5), (5, 1)])
def test_causal_mask_aligned_at_the_end(t, s):
    m = causal_mask(t, s)
    assert m.dtype == torch.bool and m.shape == (t, s)
    for i in range(t):
        for j in range(s):
            assert bool(m[i, j]) == (j <= i + s - t)


def test_causal_mask_square_default():
    assert torch.equal(causal_mask(T), torch.ones(T, T, dtype=torch.bool).tril())


@pytest.mark.parametrize(
    "shape", [(T, S), (S,), (1, S), (B, 1, 1, S), (1, H, T, 1), (B, H, T, S), (H, T, S), ()]
)
def test_check_mask_accepts_broadcastable(shape):
    mask = torch.rand(shape) > 0.5
    out = check_mask(mask, (B, H, T, S))
    assert out.dim() == 4 and out.dtype == torch.bool
    assert torch.equal(out.expand(B, H, T, S), mask.expand(B, H, T, S))


@pytest.mark.parametrize(
    "mask, needles",
    [
        (torch.ones(T, S), ["torch.float32", "bool"]),
        (torch.ones(T, S, dtype=torch.uint8), ["torch.uint8", "bool"]),
        (torch.ones(T, S + 1, dtype=torch.bool), [f"({T}, {S + 1})", f"{S}"]),
        (torch.ones(S, T, dtype=torch.bool), [f"({S}, {T})"]),
        (torch.ones(2, 1, 1, S, dtype=torch.bool), ["(2, 1, 1, 4)", "dim B", f"{B}"]),
        (torch.ones(1, B, H, T, S, dtype=torch.bool), ["(1, 5, 3, 7, 4)", "at most 4"]),
        ("mask", ["str"]),
    ],
)
def test_check_mask_rejects_bad(mask, needles):
    with pytest.raises(ValueError) as e:
        check_mask(mask, (B, H, T, S))
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))
