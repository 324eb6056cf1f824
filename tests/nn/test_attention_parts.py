"""The checks of an attention module's parts and input: each misfit is one ValueError line naming the
part and what it must be; parts that fit say whether they make a cross-attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.nn.attention_parts import check_input, check_parts

C, H, D = 24, 3, 8  # model width, heads, head dim


def _parts(**changes):
    parts = dict(qkv_proj=nn.Linear(C, 3 * C), q_proj=None, kv_proj=None, out_proj=nn.Linear(C, C),
                 shared_qk=False, qk_transform=None, score_bias=None, window=None, dropout=0.0)
    return {**parts, **changes}


def test_parts_that_fit_say_self_or_cross():
    assert check_parts(C, H, H, **_parts()) is False
    assert check_parts(C, H, H, **_parts(qkv_proj=None, out_proj=None)) is False  # the input itself, H heads
    assert check_parts(C, H, 1, **_parts(qkv_proj=nn.Linear(C, C + 2 * D))) is False  # grouped: C + 2·G·D
    assert check_parts(C, H, H, **_parts(qkv_proj=nn.Linear(C, 2 * C), shared_qk=True)) is False
    assert check_parts(C, H, H, **_parts(qkv_proj=None, q_proj=nn.Linear(C, C), kv_proj=nn.Linear(10, 2 * C))) is True


@pytest.mark.parametrize("n_kv_heads, changes, message", [
    (H, dict(shared_qk=1), "shared_qk must be a bool, got 1"),
    (H, dict(qkv_proj=None, shared_qk=True), "shared_qk=True needs a qkv_proj and n_kv_heads = n_heads"),
    (1, dict(qkv_proj=None), "n_kv_heads=1 < n_heads=3 needs a qkv_proj"),
    (H, dict(qkv_proj=nn.Linear(C, 2 * C)), r"qkv_proj must be an nn.Linear with weight \(72, 24\)"),
    (H, dict(out_proj=nn.Linear(C, 7)), r"out_proj must be an nn.Linear with weight \(24, 24\)"),
    (H, dict(q_proj=nn.Linear(C, C), kv_proj=nn.Linear(10, 2 * C)), "not a fused qkv_proj or shared_qk"),
    (H, dict(qkv_proj=None, q_proj=nn.Linear(C, C), kv_proj=nn.Linear(10, 2 * C), window=4),
     "cross-attention takes no positions"),
    (H, dict(qkv_proj=None, q_proj=nn.Linear(C, 5), kv_proj=nn.Linear(10, 2 * C)), "q_proj must be a linear map 24 → 24"),
    (H, dict(qkv_proj=None, q_proj=nn.Linear(C, C), kv_proj=nn.Linear(10, C)), "kv_proj must be a linear map E → 2·G·D = 48"),
    (H, dict(qkv_proj=None, q_proj=nn.Linear(C, C), kv_proj=nn.Linear(10, 2 * C), out_proj=nn.Linear(C, 5)),
     "out_proj must be a linear map 24 → 24"),
    (H, dict(window=0), "window must be a positive int or None"),
    (H, dict(window=True), "window must be a positive int or None"),
    (H, dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
])
def test_parts_that_do_not_fit_are_named(n_kv_heads, changes, message):
    with pytest.raises(ValueError, match=message):
        check_parts(C, H, n_kv_heads, **_parts(**changes))


def test_the_input_and_its_positions_are_checked():
    x = torch.zeros(2, 5, C)  # (B,T,C)
    check_input(x, None, C)
    check_input(x, torch.zeros(5, C), C)  # (T,C)
    check_input(x, torch.zeros(2, 5, C), C)  # (B,T,C)
    with pytest.raises(ValueError, match=r"x must be a 3-D tensor \(B, T, C=24\), got \(5, 24\)"):
        check_input(torch.zeros(5, C), None, C)
    with pytest.raises(ValueError, match="x must be a 3-D tensor .* got list"):
        check_input([1, 2], None, C)
    with pytest.raises(ValueError, match="x has width C=7, but this layer has d_model=24"):
        check_input(torch.zeros(2, 5, 7), None, C)
    with pytest.raises(ValueError, match=r"qk_pos must be \(T,C\) = \(5,24\) or \(B,T,C\), got \(4, 24\)"):
        check_input(x, torch.zeros(4, C), C)
