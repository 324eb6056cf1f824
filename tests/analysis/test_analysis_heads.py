"""Head statistics against hand-computed attention patterns (Clark et al. 2019 definitions)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qkv.analysis.heads import HEAD_METRICS, HeadAccumulator, head_statistics

CLS, SEP, PAD = 101, 102, 0


def _batch(rows_per_head: list[np.ndarray]) -> np.ndarray:
    """(L=1, B=1, H, T, T) from per-head (T,T) matrices."""
    return np.stack(rows_per_head)[None, None]


def test_entropy_zero_for_one_hot_and_log_s_for_uniform():
    t = 6
    ids = np.array([[CLS, 5, 6, 7, 8, SEP]])
    mask = np.ones((1, t), dtype=bool)
    one_hot = np.eye(t)[np.array([3, 0, 5, 1, 1, 2])]  # each row attends to one token
    uniform = np.full((t, t), 1.0 / t)
    st = head_statistics(_batch([one_hot, uniform]), mask, ids, cls_id=CLS, sep_id=SEP)
    assert st.entropy.shape == (1, 2)
    assert st.entropy[0, 0] == pytest.approx(0.0, abs=1e-9)
    assert st.entropy[0, 1] == pytest.approx(math.log(t), rel=1e-6)
    assert st.uniform_entropy == pytest.approx(math.log(t), rel=1e-9)


def test_uniform_over_real_keys_with_padding_is_log_of_real_count():
    """Mask-aware: padded queries do not count, padded keys have weight 0, S = number of real keys."""
    t, real = 7, 4
    ids = np.array([[CLS, 5, 6, SEP, PAD, PAD, PAD]])
    mask = np.arange(t)[None] < real
    a = np.zeros((t, t))
    a[:, :real] = 1.0 / real
    a[real:] = 1.0 / t  # padded query rows: anything; must be ignored
    st = head_statistics(a[None, None, None], mask, ids, cls_id=CLS, sep_id=SEP)
    assert st.n_queries == real
    assert st.entropy[0, 0] == pytest.approx(math.log(real), rel=1e-6)
    assert st.cls_share[0, 0] == pytest.approx(1 / real)
    assert st.sep_share[0, 0] == pytest.approx(1 / real)
    # mean |i-j| over the 4x4 real block, uniform weights: (0+1+2+3 + 1+0+1+2 + 2+1+0+1 + 3+2+1+0)/16
    assert st.distance[0, 0] == pytest.approx(20 / 16)
    assert st.uniform_distance == pytest.approx(20 / 16)


def test_special_token_and_neighbour_shares_of_a_constructed_pattern():
    # tokens: [CLS] a b [SEP] c d [SEP]   (a pair: two [SEP]s)
    ids = np.array([[CLS, 10, 11, SEP, 12, 13, SEP]])
    t = ids.shape[1]
    mask = np.ones((1, t), dtype=bool)
    cls_head = np.zeros((t, t))
    cls_head[:, 0] = 1.0  # everything on [CLS]
    sep_head = np.zeros((t, t))
    sep_head[:, 3] = 0.5
    sep_head[:, 6] = 0.5  # everything on the two [SEP]s
    prev_head = np.zeros((t, t))
    prev_head[0, 0] = 1.0  # the first token has no previous: attends to itself
    for i in range(1, t):
        prev_head[i, i - 1] = 1.0
    next_head = np.zeros((t, t))
    for i in range(t - 1):
        next_head[i, i + 1] = 1.0
    next_head[t - 1, t - 1] = 1.0
    mixed = 0.25 * np.eye(t) + 0.75 * cls_head  # a quarter on itself, the rest on [CLS]
    attn = np.stack([cls_head, sep_head, prev_head, next_head, mixed])[None, None]  # (1,1,5,T,T)
    st = head_statistics(attn, mask, ids, cls_id=CLS, sep_id=SEP)
    # Worked by hand, head by head (T = 7 queries; 6 have a previous and 6 a next token):
    np.testing.assert_allclose(st.cls_share[0], [1, 0, 2 / t, 0, (1 + 6 * 0.75) / t], atol=1e-9)
    np.testing.assert_allclose(st.sep_share[0], [0, 1, 1 / t, 3 / t, 2 * 0.25 / t], atol=1e-9)
    # prev share: mean over queries 1..T-1 of a[i, i-1]; next: over queries 0..T-2 of a[i, i+1]
    np.testing.assert_allclose(st.prev_share[0], [1 / (t - 1), 0.5 / (t - 1), 1, 0, 0.75 / (t - 1)], atol=1e-9)
    np.testing.assert_allclose(st.next_share[0], [0, 1 / (t - 1), 0, 1, 0], atol=1e-9)
    np.testing.assert_allclose(st.self_share[0], [1 / t, 1 / t, 1 / t, 1 / t, (1 + 6 * 0.25) / t], atol=1e-9)
    # attended distance of the prev/next heads: 1 for every query but the one attending to itself
    np.testing.assert_allclose(st.distance[0, 2:4], [(t - 1) / t, (t - 1) / t], atol=1e-9)
    np.testing.assert_allclose(st.entropy[0, :4], [0, math.log(2), 0, 0], atol=1e-9)


def test_accumulating_batches_equals_one_big_batch():
    rng = np.random.default_rng(0)
    n_l, b, h, t = 2, 5, 3, 9
    logits = rng.normal(size=(n_l, b, h, t, t))
    lengths = np.array([9, 4, 7, 2, 9])
    mask = np.arange(t)[None] < lengths[:, None]
    logits = np.where(mask[None, :, None, None, :], logits, -np.inf)
    attn = np.exp(logits - logits.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    ids = rng.integers(3, 50, size=(b, t))
    ids[:, 0] = CLS
    ids[np.arange(b), lengths - 1] = SEP
    whole = head_statistics(attn, mask, ids, cls_id=CLS, sep_id=SEP)
    acc = HeadAccumulator(CLS, SEP)
    for part in (slice(0, 2), slice(2, 5)):
        acc.update(attn[:, part], mask[part], ids[part])
    split = acc.result()
    for name in HEAD_METRICS:
        np.testing.assert_allclose(split.metric(name), whole.metric(name), rtol=1e-6, atol=1e-9)
    assert split.n_queries == whole.n_queries == lengths.sum()
    # every real row sums to one, so shares are in [0, 1]
    for name in HEAD_METRICS[2:]:
        assert (whole.metric(name) >= 0).all() and (whole.metric(name) <= 1 + 1e-6).all()


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="disagree"):
        head_statistics(np.zeros((1, 2, 3, 4, 4)), np.ones((2, 5), bool), np.ones((2, 5), int), cls_id=1, sep_id=2)
