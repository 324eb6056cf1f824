"""Positional encodings: formulas, invariances, the three slots, and fast path = explicit path.

Distinct sizes so that transposes fail: B=5, T=7, C=24, H=3 (D=8). Every value is checked against
an independent transcription (the formulas written out in plain Python), not against the module.
"""

import math

import pytest
import torch

from qkv.nn.attention import MultiHeadAttention
from qkv.models.builders import build_attention
from qkv.nn.positional import (
    POSITIONS,
    ALiBiBias,
    LearnedPositions,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositions,
    T5RelativeBias,
    alibi_slopes,
    build_positions,
    t5_buckets,
)
from qkv.nn.similarity import SIMILARITIES

B, T, C, H = 5, 7, 24, 3
D = C // H
DT = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one intra-op thread avoids barrier waits on a busy machine (restored after)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _x(b=B, t=T, c=C, seed=0):
    return torch.randn(b, t, c, generator=torch.Generator().manual_seed(seed), dtype=DT)


# ---------------------------------------------------------------- absolute encodings


def test_sinusoidal_equals_the_formula_float64():
    pe = SinusoidalPositions(max_len=50, d_model=C).double()
    table = pe(50)
    assert table.dtype == DT and table.shape == (50, C)
    for pos in (0, 1, 7, 23, 49):
        for i in (0, 1, 5, C // 2 - 1):
            angle = pos / 10000 ** (2 * i / C)
            assert abs(table[pos, 2 * i].item() - math.sin(angle)) < 1e-12
            assert abs(table[pos, 2 * i + 1].item() - math.cos(angle)) < 1e-12
    # beyond max_len it extrapolates with the same formula; an odd width ends with a sine
    long = SinusoidalPositions(max_len=4, d_model=5).double()(9)
    assert long.shape == (9, 5)
    assert abs(long[8, 4].item() - math.sin(8 / 10000 ** (4 / 5))) < 1e-12
    assert abs(long[8, 3].item() - math.cos(8 / 10000 ** (2 / 5))) < 1e-12


def test_sinusoidal_is_a_buffer_outside_the_state_dict():
    pe = SinusoidalPositions(max_len=16, d_model=C)
    assert list(pe.parameters()) == [] and len(pe.state_dict()) == 0
    assert pe(7).dtype == torch.float32


def test_learned_table_and_its_length_error():
    pe = LearnedPositions(max_len=10, d_model=C)
    assert isinstance(pe.weight, torch.nn.Parameter) and pe.weight.shape == (10, C)
    torch.testing.assert_close(pe(7), pe.weight[:7])
    with pytest.raises(ValueError, match=r"sequence length 11 exceeds .*max_len=10"):
        pe(11)


# ---------------------------------------------------------------- rotary


def test_rope_keeps_norms_and_scores_depend_on_offset_only():
    rope = RotaryEmbedding(D)
    q = torch.randn(B, H, T, D, dtype=DT)
    k = torch.randn(B, H, T, D, dtype=DT)
    rq, rk = rope(q, k)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1), atol=1e-5, rtol=0)
    assert not torch.allclose(rq, q)
    # the same vectors placed at positions (m, n) and (m + s, n + s) give the same score
    qv, kv = q[:, :, :1], k[:, :, :1]  # (B,H,1,D)
    for m, n, s in ((0, 3, 5), (6, 2, 11), (4, 4, 100)):
        a = (rope.rotate(qv, m) * rope.rotate(kv, n)).sum(-1)
        b = (rope.rotate(qv, m + s) * rope.rotate(kv, n + s)).sum(-1)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # and it is a function of the offset: (m, n) and (m+1, n) differ
    assert not torch.allclose((rope.rotate(qv, 1) * rope.rotate(kv, 0)).sum(-1), (qv * kv).sum(-1))


def test_rope_rejects_odd_head_dims():
    with pytest.raises(ValueError, match="even head dim"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="even head dim"):
        build_positions("rope", d_model=21, n_heads=3, max_len=8)


# ---------------------------------------------------------------- score biases


def _t5_bucket_reference(rel: int, num_buckets: int, max_distance: int) -> int:
    """T5's _relative_position_bucket (bidirectional), transcribed with Python ints and math.log."""
    n = num_buckets // 2
    ret = n if rel > 0 else 0
    rel = abs(rel)
    max_exact = n // 2
    if rel < max_exact:
        return ret + rel
    large = max_exact + int(math.log(rel / max_exact) / math.log(max_distance / max_exact) * (n - max_exact))
    return ret + min(large, n - 1)


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 40), (8, 20)])
def test_t5_buckets_equal_the_t5_formula(num_buckets, max_distance):
    rel = torch.arange(-600, 601)
    got = t5_buckets(rel, num_buckets, max_distance).tolist()
    want = [_t5_bucket_reference(r, num_buckets, max_distance) for r in rel.tolist()]
    assert got == want


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    twelve = [2.0 ** -k for k in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(4)]  # 2^-0.5, 2^-1.5, …
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(twelve, dtype=DT), atol=1e-15, rtol=0)
    assert len(alibi_slopes(3)) == 3 and alibi_slopes(3)[2].item() == 2.0 ** -2  # 2 + every other of 4


def _bias_modules():
    return {
        "relative": RelativePositionBias(H, max_distance=3),
        "t5": T5RelativeBias(H, num_buckets=8, max_distance=6),
        "alibi": ALiBiBias(H),
    }


def _reference_bias(name, module, t, s):
    """Bias of query i, key j from the formulas, entry by entry."""
    out = torch.empty(H, t, s, dtype=DT)
    for i in range(t):
        for j in range(s):
            d = j - i
            if name == "relative":
                m = module.max_distance
                out[:, i, j] = module.weight[max(-m, min(m, d)) + m].double()
            elif name == "t5":
                bucket = _t5_bucket_reference(d, module.num_buckets, module.max_distance)
                out[:, i, j] = module.weight[bucket].double()
            else:
                out[:, i, j] = -alibi_slopes(H) * abs(d)
    return out


@pytest.mark.parametrize("name", ["relative", "t5", "alibi"])
def test_score_biases_are_functions_of_the_offset(name):
    module = _bias_modules()[name]
    t = s = 12
    dense = module(t, s).dense()[0].detach().double()  # (H,T,S)
    torch.testing.assert_close(dense, _reference_bias(name, module, t, s), atol=1e-6, rtol=0)
    # shift invariance: (i, j) and (i + 1, j + 1) get the same bias
    torch.testing.assert_close(dense[:, 1:, 1:], dense[:, :-1, :-1], atol=0, rtol=0)
    # and it is not constant (it depends on the offset)
    assert not torch.allclose(dense[:, 5, 4], dense[:, 5, 7])
    # rows of a block agree with the whole
    torch.testing.assert_close(module(t, s)(3, 8)[0].detach().double(), dense[:, 3:8])


# ---------------------------------------------------------------- the slots in attention


def _slots_layer(name, *, similarity="scaled_dot", qkv_proj=True, qk_only=False, backend="auto", max_len=64):
    torch.manual_seed(1)
    slots = build_positions(name, d_model=C, n_heads=H, max_len=max_len, qk_only=qk_only,
                            max_distance=3, num_buckets=8)
    mha = build_attention(C, H, similarity=similarity, qkv_proj=qkv_proj, backend=backend,
                             qk_transform=slots.make_qk_transform(), score_bias=slots.make_score_bias())
    modules = torch.nn.ModuleList([mha] + ([slots.input] if slots.input is not None else [])).to(DT)
    if slots.input is not None:  # move sinusoids off zero-init-like magnitudes: learned tables std 1
        for p in slots.input.parameters():
            torch.nn.init.normal_(p)
    for p in modules.parameters():
        if p.dim() == 2 and p.shape[1] == H:  # relative / T5 tables: large enough to matter
            torch.nn.init.normal_(p)
    return mha, slots, modules


def _apply(mha, slots, x, padding_mask=None, need_weights=False):
    if slots.input is None:
        return mha(x, padding_mask, need_weights=need_weights).output
    pos = slots.input(x.shape[1])
    if slots.qk_only:
        return mha(x, padding_mask, need_weights=need_weights, qk_pos=pos).output
    return mha(x + pos, padding_mask, need_weights=need_weights).output


CASES = [("none", False), ("sinusoidal", False), ("learned", False), ("sinusoidal", True),
         ("learned", True), ("relative", False), ("t5", False), ("alibi", False), ("rope", False)]


@pytest.mark.parametrize("name,qk_only", CASES)
def test_permutation_equivariance_only_without_positions(name, qk_only):
    mha, slots, _ = _slots_layer(name, qk_only=qk_only)
    x = _x()
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    y, y_perm = _apply(mha, slots, x), _apply(mha, slots, x[:, perm])
    if name == "none":
        torch.testing.assert_close(y_perm, y[:, perm], atol=1e-10, rtol=0)  # Sa[XP] = Sa[X]P
    else:
        assert (y_perm - y[:, perm]).abs().max() > 1e-4


@pytest.mark.parametrize("qkv_proj", [True, False])
def test_qk_only_positions_leave_values_alone(qkv_proj):
    mha, slots, _ = _slots_layer("learned", qk_only=True, qkv_proj=qkv_proj)
    x = _x()
    pos = slots.input(T)
    q0, k0, v0 = mha.project(x, None)
    q1, k1, v1 = mha.project(x, pos)
    torch.testing.assert_close(v1, v0, atol=0, rtol=0)
    assert (k1 - k0).abs().max() > 1e-3 and (q1 - q0).abs().max() > 1e-3
    # and Q, K are those of X + Π: Ω(X + Π)
    qp, kp, _ = mha.project(x + pos, None)
    torch.testing.assert_close(q1, qp, atol=1e-12, rtol=0)
    torch.testing.assert_close(k1, kp, atol=1e-12, rtol=0)


def test_errors_name_the_allowed_values():
    with pytest.raises(ValueError, match="allowed: none, sinusoidal, learned, relative, relative-alibi, t5, alibi, rope"):
        build_positions("absolute", d_model=C, n_heads=H, max_len=8)
    for name in ("relative", "t5", "alibi", "rope", "none"):
        with pytest.raises(ValueError, match="qk_only=True .* sinusoidal, learned"):
            build_positions(name, d_model=C, n_heads=H, max_len=8, qk_only=True)
    with pytest.raises(ValueError, match="must divide"):
        build_positions("alibi", d_model=C, n_heads=5, max_len=8)
    assert POSITIONS == ("none", "sinusoidal", "learned", "relative", "relative-alibi", "t5", "alibi", "rope")


def test_slots_make_new_modules_per_layer():
    for name in ("relative", "t5", "alibi"):
        slots = build_positions(name, d_model=C, n_heads=H, max_len=8)
        a, b = slots.make_score_bias(), slots.make_score_bias()
        assert a is not b and slots.make_qk_transform() is None and slots.input is None
    slots = build_positions("rope", d_model=C, n_heads=H, max_len=8)
    assert slots.make_qk_transform() is not slots.make_qk_transform() and slots.make_score_bias() is None


@pytest.mark.parametrize("name", ["relative", "t5", "alibi", "rope", "sinusoidal"])
def test_relative_encodings_extrapolate_beyond_max_len(name):
    mha, slots, _ = _slots_layer(name, max_len=4)
    out = _apply(mha, slots, _x(t=T))
    assert out.shape == (B, T, C) and torch.isfinite(out).all()


def test_learned_positions_refuse_long_sequences():
    _, slots, _ = _slots_layer("learned", max_len=4)
    with pytest.raises(ValueError, match="sequence length 7 exceeds"):
        slots.input(T)


# ---------------------------------------------------------------- fast path = explicit path


def _grads(modules, out, x):
    params = [p for p in modules.parameters() if p.requires_grad]
    return torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=DT).view_as(out)).sum(),
                               params + [x])


@pytest.mark.parametrize("qkv_proj", [True, False])
@pytest.mark.parametrize("similarity", sorted(SIMILARITIES))
@pytest.mark.parametrize("name,qk_only", CASES)
def test_fast_and_explicit_paths_agree(name, qk_only, similarity, qkv_proj):
    mha, slots, modules = _slots_layer(name, qk_only=qk_only, similarity=similarity, qkv_proj=qkv_proj)
    x = _x().requires_grad_()
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, 4:] = False
    padding[3, :] = False  # a fully masked row: zeros, never NaN
    outs, grads = [], []
    paths = ("auto", "chunked") + (("sdpa",) if mha.similarity.has_dot_form else ()) + ("explicit",)
    for path in paths:
        mha.path, mha.chunk_size = path, 3
        out = _apply(mha, slots, x, padding)
        outs.append(out)
        grads.append(_grads(modules, out, x))
    for out, g in zip(outs[:-1], grads[:-1]):
        torch.testing.assert_close(out, outs[2], atol=1e-5, rtol=0)
        for a, b in zip(g, grads[2]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert torch.isfinite(outs[0]).all()
    # the weights the explicit path returns come with the same output
    mha.path = "auto"
    with_weights = _apply(mha, slots, x, padding, need_weights=True)
    torch.testing.assert_close(with_weights, outs[-1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name,qk_only", [("learned", False), ("learned", True), ("relative", False),
                                          ("t5", False)])
def test_gradients_reach_every_learned_position_parameter(name, qk_only):
    mha, slots, modules = _slots_layer(name, qk_only=qk_only, backend="sdpa")
    out = _apply(mha, slots, _x(t=6))  # the fused kernel path
    out.pow(2).sum().backward()
    owner = slots.input if slots.input is not None else mha.score_bias
    pos_params = list(owner.parameters())
    assert pos_params
    for p in pos_params:
        assert p.grad is not None and p.grad.abs().sum() > 0
    if name == "relative":  # every offset that occurs reaches its own entry (|d| ≤ 5 > max_distance 3)
        assert (mha.score_bias.weight.grad.abs().sum(1) > 0).all()


def test_relative_alibi_starts_as_alibi_and_is_learned():
    from qkv.nn.positional import ALiBiBias, RelativePositionBias

    heads, t, m = 4, 9, 5
    module = RelativePositionBias(heads, m, init="alibi")
    assert isinstance(module.weight, torch.nn.Parameter) and module.weight.requires_grad
    # by hand: w[d + M, h] = -slope_h |d| with the paper's slopes 2^-2, 2^-4, 2^-6, 2^-8 for 4 heads
    slopes = [0.25, 0.0625, 0.015625, 0.00390625]
    for d in range(-m, m + 1):
        for h in range(heads):
            assert module.weight[d + m, h].item() == pytest.approx(-slopes[h] * abs(d), abs=1e-7)
    # within ±M the dense bias is ALiBi's; beyond it, clipped at M
    dense = module(t, t).dense()[0].detach()
    alibi = ALiBiBias(heads)(t, t).dense()[0]
    near = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs() <= m  # (T,S)
    torch.testing.assert_close(dense[:, near], alibi[:, near], atol=1e-6, rtol=0)
    assert torch.allclose(dense[:, 0, 8], torch.tensor(slopes) * -m)
    slots = build_positions("relative-alibi", d_model=24, n_heads=3, max_len=16, max_distance=4)
    a, b = slots.make_score_bias(), slots.make_score_bias()
    assert a is not b and a.init == "alibi" and torch.equal(a.weight, b.weight)
    with pytest.raises(ValueError, match="allowed: normal, alibi"):
        RelativePositionBias(2, 3, init="zeros")
