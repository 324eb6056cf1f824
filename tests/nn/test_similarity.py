"""Tests of the similarity (score) functions and their registry.

Each score is checked in float64 against an independent formula (einsum or explicit loops); the
dot-product form against the scores; and gradients with ``gradcheck`` through :func:`attend` (on
every path the similarity supports) and through :class:`MultiHeadAttention`.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck
from torch.func import functional_call

from qkv.nn.attend import attend
from qkv.nn.attention import MultiHeadAttention
from qkv.models.builders import build_attention
from qkv.nn.similarity import SIMILARITIES, build_similarity, register_similarity

BUILTIN = ("dot", "scaled_dot", "bilinear", "additive", "cosine")
B, H, T, S, D = 5, 3, 7, 6, 4  # distinct sizes
DTYPE = torch.float64



def _randomise(sim: nn.Module, seed: int = 0) -> nn.Module:
    """Move off the default initialisation (identity bilinear, equal temperatures, …)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sim.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.7)
    return sim


def _qk(seed=1, b=B, h=H, t=T, s=S, d=D):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=g, dtype=DTYPE)
    k = torch.randn(b, h, s, d, generator=g, dtype=DTYPE)
    return q, k


# ---------------------------------------------------------------------------------------------
# scores against independent formulas


def test_builtins_registered():
    for name in BUILTIN:
        assert name in SIMILARITIES
        assert build_similarity(name, n_heads=H, d_head=D).name == name


def test_dot_scores():
    q, k = _qk()
    sim = build_similarity("dot", n_heads=H, d_head=D)
    want = torch.einsum("bhtd,bhsd->bhts", q, k)
    torch.testing.assert_close(sim.scores(q, k), want, rtol=0, atol=1e-12)


def test_scaled_dot_scores():
    q, k = _qk()
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    want = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D)
    torch.testing.assert_close(sim.scores(q, k), want, rtol=0, atol=1e-12)


def test_bilinear_scores():
    q, k = _qk()
    sim = _randomise(build_similarity("bilinear", n_heads=H, d_head=D).double())
    W = sim.weight.detach()  # (H,D,D)
    want = torch.einsum("bhtd,hde,bhse->bhts", q, W, k)  # qᵀ W k per head
    torch.testing.assert_close(sim.scores(q, k), want, rtol=0, atol=1e-12)
    # default initialisation is the scaled dot product
    fresh = build_similarity("bilinear", n_heads=H, d_head=D).double()
    torch.testing.assert_close(
        fresh.scores(q, k), torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D), rtol=0, atol=1e-12
    )


def test_additive_scores_by_loops():
    b, h, t, s, d, a = 2, 3, 4, 5, 3, 6
    q, k = _qk(b=b, h=h, t=t, s=s, d=d)
    sim = _randomise(build_similarity("additive", n_heads=h, d_head=d, d_attn=a).double())
    assert sim.cost_per_score == a
    Wq, Wk, v = (p.detach() for p in (sim.w_q, sim.w_k, sim.v))  # (H,D,A), (H,D,A), (H,A)
    want = torch.empty(b, h, t, s, dtype=DTYPE)
    for bi in range(b):
        for hi in range(h):
            for ti in range(t):
                for si in range(s):
                    hidden = torch.tanh(Wq[hi].T @ q[bi, hi, ti] + Wk[hi].T @ k[bi, hi, si])  # (A,)
                    want[bi, hi, ti, si] = v[hi] @ hidden
    torch.testing.assert_close(sim.scores(q, k), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("learn", [True, False])
def test_cosine_scores(learn):
    q, k = _qk()
    sim = build_similarity("cosine", n_heads=H, d_head=D, learn_temperature=learn).double()
    with torch.no_grad():
        sim.log_tau.copy_(torch.tensor([0.1, 1.2, -0.4], dtype=DTYPE))
    assert isinstance(sim.log_tau, nn.Parameter) == learn
    tau = torch.tensor([0.1, 1.2, -0.4], dtype=DTYPE).exp()
    cos = torch.einsum("bhtd,bhsd->bhts", q, k) / (
        q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :]
    )
    want = tau[None, :, None, None] * cos
    torch.testing.assert_close(sim.scores(q, k), want, rtol=0, atol=1e-12)
    # default temperature is √D, and scores are bounded by it
    fresh = build_similarity("cosine", n_heads=H, d_head=D).double()
    assert fresh.scores(q, k).abs().max() <= math.sqrt(D) + 1e-12
    fixed = build_similarity("cosine", n_heads=H, d_head=D, temperature=2.5).double()
    # log τ is initialised in float32 before .double(), hence the looser tolerance
    torch.testing.assert_close(fixed.scores(q, k), 2.5 * cos, rtol=1e-6, atol=0)


def test_cosine_rejects_bad_temperature():
    with pytest.raises(ValueError, match="-1"):
        build_similarity("cosine", n_heads=H, d_head=D, temperature=-1.0)


@pytest.mark.parametrize("name", BUILTIN)
def test_as_dot_consistent_with_scores(name):
    q, k = _qk(seed=3)
    sim = _randomise(build_similarity(name, n_heads=H, d_head=D).double(), seed=4)
    form = sim.as_dot(q, k)
    assert (form is not None) == sim.has_dot_form
    if form is None:
        assert name == "additive"
        return
    qd, kd, scale = form
    assert qd.shape == q.shape and kd.shape == k.shape
    torch.testing.assert_close(scale * (qd @ kd.transpose(-2, -1)), sim.scores(q, k), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# registry


def test_unknown_similarity_lists_allowed_names():
    with pytest.raises(ValueError) as e:
        build_similarity("dott", n_heads=H, d_head=D)
    msg = str(e.value)
    assert "'dott'" in msg
    for name in BUILTIN:
        assert name in msg
    with pytest.raises(ValueError) as e:
        build_attention(24, 3, similarity="luong")
    assert "'luong'" in str(e.value) and all(n in str(e.value) for n in BUILTIN)


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="'dot'"):
        register_similarity("dot")(type("Dup", (nn.Module,), {}))


@pytest.fixture
def scratch_registry():
    """Names registered by a test are removed afterwards so the registry stays as shipped."""
    before = set(SIMILARITIES)
    yield
    for name in set(SIMILARITIES) - before:
        del SIMILARITIES[name]


def test_register_new_similarity_without_dot_form(scratch_registry):
    @register_similarity("test_neg_sq_dist")
    class NegSqDist(nn.Module):
        """s(q, k) = −‖q − k‖²."""

        has_dot_form = False
        cost_per_score = 1

        def __init__(self, *, n_heads, d_head):
            super().__init__()

        def scores(self, q, k):
            return -((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1)  # (B,H,T,S)

        def as_dot(self, q, k):
            return None

    torch.manual_seed(0)
    C, nh, t = 24, 3, 7
    mha = build_attention(C, nh, similarity="test_neg_sq_dist").double()
    assert isinstance(mha.similarity, NegSqDist)
    x = torch.randn(B, t, C, dtype=DTYPE)
    res = mha(x, need_weights=True)
    q, k, v = (
        (x @ w.T + bb).view(B, t, nh, C // nh).transpose(1, 2)
        for w, bb in zip(mha.qkv_proj.weight.split(C), mha.qkv_proj.bias.split(C))
    )
    want_w = torch.softmax(-torch.cdist(q, k) ** 2, dim=-1)
    torch.testing.assert_close(res.weights, want_w, rtol=0, atol=1e-10)
    want = mha.out_proj((want_w @ v).transpose(1, 2).reshape(B, t, C))
    torch.testing.assert_close(res.output, want, rtol=0, atol=1e-10)
    # the auto path without weights must not try the fused kernel
    torch.testing.assert_close(mha(x).output, want, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="test_neg_sq_dist"):
        build_attention(C, nh, similarity="test_neg_sq_dist", backend="sdpa").double()(x)


def test_register_new_similarity_with_dot_form_runs_sdpa(scratch_registry):
    @register_similarity("test_half_dot")
    class HalfDot(nn.Module):
        has_dot_form = True
        cost_per_score = 1

        def __init__(self, *, n_heads, d_head):
            super().__init__()

        def scores(self, q, k):
            return 0.5 * (q @ k.transpose(-2, -1))

        def as_dot(self, q, k):
            return q, k, 0.5

    torch.manual_seed(1)
    x = torch.randn(B, T, 24)
    pad = torch.rand(B, T) > 0.3
    pad[:, 0] = True
    first = build_attention(24, 3, similarity="test_half_dot", backend="sdpa")
    assert isinstance(first.similarity, HalfDot)
    outs = {}
    for path in ("sdpa", "explicit", "chunked"):
        mha = build_attention(24, 3, similarity="test_half_dot", backend=path, chunk_size=3)
        mha.load_state_dict(first.state_dict())
        outs[path] = mha(x, pad).output
    torch.testing.assert_close(outs["sdpa"], outs["explicit"], rtol=0, atol=1e-5)
    torch.testing.assert_close(outs["chunked"], outs["explicit"], rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# gradcheck in float64


class _AttendFn(nn.Module):
    """Wraps :func:`attend` so that gradcheck can vary the similarity's parameters too."""

    def __init__(self, sim, **kwargs):
        super().__init__()
        self.sim = sim
        self.kwargs = kwargs

    def forward(self, q, k, v, bias):
        res = attend(q, k, v, similarity=self.sim, bias=bias, **self.kwargs)
        return (res.output,) if res.weights is None else (res.output, res.weights)


def _paths(name):
    paths = [("explicit", True, None), ("chunked", True, 2), ("chunked", False, 2)]
    if SIMILARITIES[name].has_dot_form:
        paths.append(("sdpa", False, None))
    return paths


@pytest.mark.parametrize("name", BUILTIN)
def test_gradcheck_through_attend(name):
    b, h, t, s, d, e = 2, 3, 5, 4, 3, 2
    g = torch.Generator().manual_seed(7)
    sim = _randomise(build_similarity(name, n_heads=h, d_head=d).double(), seed=8)
    q = torch.randn(b, h, t, d, generator=g, dtype=DTYPE, requires_grad=True)
    k = torch.randn(b, h, s, d, generator=g, dtype=DTYPE, requires_grad=True)
    v = torch.randn(b, h, s, e, generator=g, dtype=DTYPE, requires_grad=True)
    bias = (0.3 * torch.randn(1, h, t, s, generator=g, dtype=DTYPE)).requires_grad_()
    mask = torch.rand(b, 1, t, s, generator=g) > 0.3
    mask[0, 0, 1] = False  # a fully-masked query row
    mask[1, 0, :, 0] = True  # keep the rest alive
    names = [n for n, _ in sim.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in sim.named_parameters())
    for path, need_weights, chunk in _paths(name):
        for causal in (False, True):
            fn = _AttendFn(sim, mask=mask, causal=causal, backend=path, need_weights=need_weights,
                           chunk_size=chunk)

            def f(q, k, v, bias, *ps):
                return functional_call(fn, {f"sim.{n}": p for n, p in zip(names, ps)}, (q, k, v, bias))

            # the full Jacobian once per similarity; random projections (fast mode) elsewhere
            fast = not (path == "explicit" and not causal)
            assert gradcheck(f, (q, k, v, bias, *params), eps=1e-6, atol=1e-6, fast_mode=fast), (
                path, causal)


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("path, need_weights", [("auto", False), ("explicit", True), ("chunked", False)])
def test_gradcheck_through_multihead_attention(name, path, need_weights):
    torch.manual_seed(11)
    C, nh, b, t = 12, 3, 2, 5
    mha = build_attention(C, nh, similarity=name, backend=path, chunk_size=2).double()
    _randomise(mha.similarity, seed=12)
    x = torch.randn(b, t, C, dtype=DTYPE, requires_grad=True)
    pad = torch.tensor([[True] * t, [True, True, True, False, False]])
    names = [n for n, _ in mha.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in mha.named_parameters())

    def f(x, *ps):
        res = functional_call(mha, dict(zip(names, ps)), (x, pad), {"need_weights": need_weights,
                                                                     "causal": True})
        return (res.output,) if res.weights is None else (res.output, res.weights)

    assert gradcheck(f, (x, *params), eps=1e-6, atol=1e-6, fast_mode=True)
