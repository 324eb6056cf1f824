"""The memory-efficient path for offset biases (relative, T5, ALiBi): same numbers as the explicit
path — outputs and the gradients of q, k, v and the bias table — with and without padding masks,
with fully-masked rows, over several tiles, and never an (H,T,S) tensor.
"""

import importlib

import pytest
import torch

import qkv.nn.backends.offset_flash as blockwise
from qkv.nn.attend import attend
from qkv.nn.offset_bias import OffsetBias, toeplitz_rows
from qkv.nn.positional import T5RelativeBias, t5_buckets
from qkv.nn.similarity import build_similarity

DT = torch.float64
attend_module = importlib.import_module("qkv.nn.backends.offset_flash")  # the backend calls offset_attention


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one intra-op thread avoids barrier waits on a busy machine (restored after)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _inputs(b, h, t, d, seed=0, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _relative(h, t, max_distance, dtype=DT, seed=1):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(h, 2 * max_distance + 1, generator=g, dtype=dtype).requires_grad_()
    index = torch.arange(-(t - 1), t).clamp(-max_distance, max_distance) + max_distance
    return table, index


def _t5(h, t, num_buckets=16, max_distance=40, dtype=DT, seed=2):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(h, num_buckets, generator=g, dtype=dtype).requires_grad_()
    return table, t5_buckets(torch.arange(-(t - 1), t), num_buckets, max_distance)


def _padding(kind, b, t):
    if kind is None:
        return None
    ok = torch.ones(b, t, dtype=torch.bool)
    if kind == "suffix":
        for i in range(b):
            ok[i, t - 7 * i :] = i == 0
    elif kind == "holes":  # several runs of valid keys, a batch row with none, a row with one key
        ok = torch.rand(b, t, generator=torch.Generator().manual_seed(3)) > 0.35
        ok[1] = False
        ok[2] = False
        ok[2, t // 2] = True
    elif kind == "shared":  # one mask for the whole batch
        ok = torch.ones(1, t, dtype=torch.bool)
        ok[0, : t // 3] = False
    return ok[:, None, None, :]


def _run(q, k, v, table, index, mask, path, similarity, go):
    t = q.shape[2]
    bias = OffsetBias(table, index, t, t)
    out = attend(q, k, v, similarity=similarity, bias=bias, mask=mask, backend=path).output
    return out, torch.autograd.grad(out, (q, k, v, table), go)


@pytest.fixture
def spy(monkeypatch):
    """Count calls of the fast path, and make sure it never builds bias rows."""
    calls = []
    real = attend_module.offset_attention

    def wrapped(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    def no_rows(self, start, stop):
        raise AssertionError("the fast path must not materialise bias rows")

    monkeypatch.setattr(attend_module, "offset_attention", wrapped)
    return calls, no_rows


CONFIGS = [  # (B, H, T, D, table) — T below, at and above the band tile, radius below and above T
    (5, 3, 7, 8, "rel3"),
    (3, 2, 150, 8, "rel20"),
    (3, 3, 130, 16, "rel200"),
    (3, 2, 200, 8, "t5"),
    (3, 2, 64, 8, "rel1"),
]


@pytest.mark.parametrize("mask_kind", [None, "suffix", "holes", "shared"])
@pytest.mark.parametrize("b,h,t,d,table_kind", CONFIGS)
def test_memory_efficient_gradients_equal_the_explicit_path(b, h, t, d, table_kind, mask_kind, spy,
                                                            monkeypatch):
    calls, no_rows = spy
    q, k, v = _inputs(b, h, t, d)
    table, index = _t5(h, t) if table_kind == "t5" else _relative(h, t, int(table_kind[3:]))
    mask = _padding(mask_kind, b, t)
    go = torch.randn(b, h, t, d, generator=torch.Generator().manual_seed(4), dtype=DT)
    sim = build_similarity("scaled_dot", n_heads=h, d_head=d)
    out_x, g_x = _run(q, k, v, table, index, mask, "explicit", sim, go)
    with monkeypatch.context() as m:
        m.setattr(OffsetBias, "__call__", no_rows)
        out_f, g_f = _run(q, k, v, table, index, mask, "sdpa", sim, go)  # "auto" prefers explicit when small
    assert calls, "the fast path did not run"
    torch.testing.assert_close(out_f, out_x, atol=1e-10, rtol=0)
    for name, a, e in zip("q k v table".split(), g_f, g_x):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=0, msg=lambda s: f"grad {name}: {s}")
    if mask_kind == "holes":  # the batch row without keys: zeros, and no gradient through it
        assert out_f[1].abs().max() == 0 and g_f[0][1].abs().max() == 0


@pytest.mark.parametrize("similarity", ["dot", "bilinear", "cosine"])
def test_float32_and_other_similarities_agree_to_1e5(similarity):
    b, h, t, d = 3, 2, 150, 8
    q, k, v = _inputs(b, h, t, d, dtype=torch.float32)
    table, index = _relative(h, t, 20, dtype=torch.float32)
    mask = _padding("suffix", b, t)
    go = torch.randn(b, h, t, d, generator=torch.Generator().manual_seed(4))
    sim = build_similarity(similarity, n_heads=h, d_head=d)
    if similarity == "dot":
        q, k = [x.detach().mul(0.3).requires_grad_() for x in (q, k)]  # unscaled scores: keep them O(1)
    out_x, g_x = _run(q, k, v, table, index, mask, "explicit", sim, go)
    out_f, g_f = _run(q, k, v, table, index, mask, "sdpa", sim, go)
    torch.testing.assert_close(out_f, out_x, atol=1e-5, rtol=0)
    for a, e in zip(g_f, g_x):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["causal", "query_mask"])
def test_causal_and_query_masks_give_the_same_numbers_as_explicit(kind, spy):
    calls, _ = spy
    b, h, t, d = 2, 3, 40, 8
    q, k, v = _inputs(b, h, t, d)
    table, index = _relative(h, t, 5)
    go = torch.randn(b, h, t, d, dtype=DT)
    sim = build_similarity("scaled_dot", n_heads=h, d_head=d)
    kw = dict(similarity=sim, bias=OffsetBias(table, index, t, t), budget=b * h * t * 8)  # chunks of 8
    if kind == "causal":
        kw["causal"] = True
    elif kind == "query_mask":
        m = torch.rand(b, 1, t, t, generator=torch.Generator().manual_seed(5)) > 0.5
        m[0, 0, 3] = False  # a fully masked query row
        kw["mask"] = m
    outs, grads = [], []
    for path in ("auto", "explicit"):
        out = attend(q, k, v, backend=path, **kw).output
        outs.append(out)
        grads.append(torch.autograd.grad(out, (q, k, v, table), go))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-10, rtol=0)
    for a, e in zip(*grads):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=0)
    # a causal mask folds into the offset bias (OffsetBias.causal) and takes the kernel; a query mask does not
    assert bool(calls) == (kind == "causal")
    calls.clear()
    # attention dropout needs the explicit weights too: no kernel, still finite
    out = attend(q, k, v, similarity=sim, bias=OffsetBias(table, index, t, t), dropout_p=0.1).output
    assert not calls and torch.isfinite(out).all()


def test_toeplitz_rows_and_radius():
    t, s, h = 5, 8, 2
    values = torch.arange(h * (t + s - 1), dtype=DT).view(h, -1)
    rows = toeplitz_rows(values, t, s, 1, 4)  # (H,3,S)
    for r, i in enumerate(range(1, 4)):
        for j in range(s):
            assert rows[:, r, j].tolist() == values[:, j - i + t - 1].tolist()
    table, index = _relative(h, 30, 4)
    assert OffsetBias(table, index, 30, 30).radius() == 4
    assert OffsetBias(table, torch.arange(59), 30, 30).radius() == 29  # tails: the single corners ±29
    t5 = T5RelativeBias(h, num_buckets=32, max_distance=128)(300, 300)
    assert t5.radius() <= 128 and (t5.index[: 300 - t5.radius()] == t5.index[0]).all()
    with pytest.raises(ValueError, match="T\\+S-1"):
        OffsetBias(table, index[:-1], 30, 30)


def test_no_table_gradient_needed_for_alibi_like_fixed_biases(spy):
    calls, _ = spy
    b, h, t, d = 3, 3, 100, 8
    q, k, v = _inputs(b, h, t, d)
    values = -torch.tensor([0.5, 0.25, 0.125], dtype=DT)[:, None] * torch.arange(-(t - 1), t).abs()
    bias = OffsetBias(values, torch.arange(2 * t - 1), t, t)
    sim = build_similarity("scaled_dot", n_heads=h, d_head=d)
    go = torch.randn(b, h, t, d, dtype=DT)
    mask = _padding("holes", b, t)
    g_f = torch.autograd.grad(attend(q, k, v, similarity=sim, bias=bias, mask=mask).output, (q, k, v), go)
    assert calls  # a fixed bias takes the kernel even when small
    g_x = torch.autograd.grad(attend(q, k, v, similarity=sim, bias=bias, mask=mask, backend="explicit").output,
                              (q, k, v), go)
    for a, e in zip(g_f, g_x):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=0)
    from qkv.nn.attend import attend_call, features_of

    f = features_of(attend_call(q, k, v, sim, bias, None, False, 0.0, False, None, 2**24))
    assert blockwise.OffsetFlashBackend.supports.missing(f) is None  # the declaration admits it


def test_auto_routes_small_learned_biases_to_the_explicit_path_and_large_ones_to_the_kernel(spy):
    calls, _ = spy
    b, h, t, d = 2, 2, 40, 8
    q, k, v = _inputs(b, h, t, d)
    table, index = _relative(h, t, 5)
    sim = build_similarity("scaled_dot", n_heads=h, d_head=d)
    attend(q, k, v, similarity=sim, bias=OffsetBias(table, index, t, t)).output.sum().backward()
    assert not calls
    small_budget = b * h * t  # the scores no longer fit: the kernel path
    out = attend(q, k, v, similarity=sim, bias=OffsetBias(table, index, t, t), budget=small_budget).output
    out.sum().backward()
    assert calls


@pytest.mark.parametrize("t,s", [(150, 90), (60, 150)])
@pytest.mark.parametrize("mask_kind", [None, "holes"])
def test_queries_and_keys_of_different_lengths(t, s, mask_kind, spy):
    calls, _ = spy
    b, h, d, m = 3, 2, 8, 12
    g = torch.Generator().manual_seed(7)
    q = torch.randn(b, h, t, d, generator=g, dtype=DT).requires_grad_()
    k, v = [torch.randn(b, h, s, d, generator=g, dtype=DT).requires_grad_() for _ in range(2)]
    table = torch.randn(h, 2 * m + 1, generator=g, dtype=DT).requires_grad_()
    index = torch.arange(-(t - 1), s).clamp(-m, m) + m
    mask = _padding(mask_kind, b, s)
    go = torch.randn(b, h, t, d, generator=g, dtype=DT)
    sim = build_similarity("scaled_dot", n_heads=h, d_head=d)
    res = []
    for path in ("sdpa", "explicit"):
        bias = OffsetBias(table, index, t, s)
        out = attend(q, k, v, similarity=sim, bias=bias, mask=mask, backend=path).output
        res.append((out, torch.autograd.grad(out, (q, k, v, table), go)))
    assert calls
    torch.testing.assert_close(res[0][0], res[1][0], atol=1e-10, rtol=0)
    for a, e in zip(res[0][1], res[1][1]):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=0)
