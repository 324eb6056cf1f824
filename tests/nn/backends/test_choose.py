"""``choose_backend`` as a table over the backends' declarations, the registry, plans resolved once, and
a backend added from outside (one file + a test).

Every built-in backend is tested against the explicit one elsewhere (tests/nn/test_attend.py,
tests/nn/test_attention.py, tests/nn/backends/test_inplace.py, tests/nn/backends/test_offset_flash.py);
here: which one runs, and that adding one touches no model code.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.config import ModelConfig
from qkv.models.builders import build_attention, build_encoder
from qkv.nn import backends
from qkv.nn.attend import BackendPlan, attend, choose_backend
from qkv.nn.backends import BACKENDS, register_backend
from qkv.nn.backends.base import Backend, Features, Supports
from qkv.nn.similarity import build_similarity
from qkv.nn.stages import AttendOutput

F_ = Features  # defaults: dot form, no weights, no grad, no dropout, no bias, no causal mask, CPU float32, small
#: an offset bias the flash kernel cannot run (here: a causal mask it cannot fold; a query mask, CUDA, … alike)
NO_KERNEL = dict(causal=True)

TABLE = [  # (requested, features, chosen)
    ("auto", F_(), "sdpa"),
    ("auto", F_(has_dot=False), "explicit"),
    ("auto", F_(has_dot=False, small=False), "chunked"),
    ("auto", F_(need_weights=True), "inplace"),
    ("auto", F_(need_weights=True, grad=True), "explicit"),
    ("auto", F_(need_weights=True, grad=True, small=False), "chunked"),
    ("auto", F_(need_weights=True, dropout=True), "explicit"),
    ("auto", F_(need_weights=True, has_dot=False), "explicit"),
    ("auto", F_(need_weights=True, empty=True), "explicit"),
    ("auto", F_(offset_bias=True), "offset_flash"),
    ("auto", F_(offset_bias=True, learned_bias=True), "explicit"),  # small: explicit is faster
    ("auto", F_(offset_bias=True, learned_bias=True, small=False), "offset_flash"),
    ("auto", F_(offset_bias=True, learned_bias=True, **NO_KERNEL), "explicit"),  # the kernel cannot run it
    ("auto", F_(offset_bias=True, learned_bias=True, small=False, **NO_KERNEL), "chunked"),
    ("auto", F_(offset_bias=True, bias_large=True, small=False, **NO_KERNEL), "chunked"),  # never a huge dense bias
    ("auto", F_(offset_bias=True, **NO_KERNEL), "sdpa"),  # a small fixed bias goes in dense
    ("auto", F_(offset_bias=True, has_dot=False), "explicit"),
    ("sdpa", F_(offset_bias=True), "offset_flash"),
    ("sdpa", F_(offset_bias=True, **NO_KERNEL), "sdpa"),
    ("sdpa", F_(need_weights=True), "sdpa"),  # refused by the backend with a message, not re-routed
    ("explicit", F_(), "explicit"),
    ("chunked", F_(need_weights=True), "chunked"),
    ("inplace", F_(), "inplace"),
    # a sliding window: a band in the mask while the scores fit, else the chunked band blocks
    ("auto", F_(window=True), "sdpa"),
    ("auto", F_(window=True, need_weights=True), "inplace"),
    ("auto", F_(window=True, need_weights=True, grad=True), "explicit"),
    ("auto", F_(window=True, has_dot=False), "explicit"),
    ("auto", F_(window=True, small=False), "chunked"),
    ("auto", F_(window=True, small=False, need_weights=True), "chunked"),
    ("auto", F_(window=True, small=False, offset_bias=True, bias_large=True), "chunked"),
    ("auto", F_(window=True, offset_bias=True), "sdpa"),  # the offset kernel runs no window
    ("auto", F_(window=True, band_narrow=True), "chunked"),  # S > 8·W: the band is less work
    ("auto", F_(window=True, band_narrow=True, need_weights=True), "chunked"),
    ("sdpa", F_(window=True, small=False), "sdpa"),  # a named backend runs (a dense band)
    # what the offset kernel declares it cannot run sends an offset bias elsewhere
    ("auto", F_(offset_bias=True, key_mask_only=False), "sdpa"),
    ("auto", F_(offset_bias=True, device="cuda"), "sdpa"),
    ("auto", F_(offset_bias=True, dropout=True), "sdpa"),
    ("auto", F_(offset_bias=True, equal_head_dims=False), "sdpa"),
    ("auto", F_(offset_bias=True, dtype="int8"), "sdpa"),
    ("auto", F_(offset_bias=True, learned_bias=True, small=False, dropout=True), "chunked"),
]


@pytest.mark.parametrize("requested,features,chosen", TABLE)
def test_choose_backend_table(requested, features, chosen):
    assert choose_backend(requested, features) == chosen


def test_the_choice_reads_only_declarations():
    """A backend registry of declarations alone decides: swap the speeds and the choice follows."""
    class Fast(Backend):
        supports = Supports(weights=False, any_similarity=True, window=True, grouped_kv=True, memory="linear")

        def speed(self, f):
            return -5.0

        def run(self, call):
            raise AssertionError("not run")

    table = {**BACKENDS, "fast": Fast()}
    Fast.name = "fast"
    assert choose_backend("auto", F_(), table) == "fast"
    assert choose_backend("auto", F_(need_weights=True), table) == "inplace"  # it declares no weights


def test_a_plan_is_resolved_once_and_remembers_its_choice():
    plan = BackendPlan("auto")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    sim = build_similarity("scaled_dot", n_heads=3, d_head=8)
    from qkv.nn.attend import attend_call

    call = attend_call(q, k, v, sim, None, None, False, 0.0, False, None, 2**24)
    want = attend(q, k, v, similarity=sim, backend="explicit").output
    torch.testing.assert_close(plan.run(call).output, want, atol=1e-6, rtol=0)
    assert [b.name for b in plan._picked.values()] == ["sdpa"]
    plan.run(call)
    assert len(plan._picked) == 1  # the same kind of call: no second choice
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        BackendPlan("nope")


def test_a_named_backend_refuses_what_it_does_not_declare():
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    sim = build_similarity("scaled_dot", n_heads=2, d_head=8)
    with pytest.raises(ValueError, match=r"the sdpa backend does not run weights; use backend 'auto' \(or explicit, "
                                         r"chunked, inplace\)"):
        attend(q, k, v, similarity=sim, backend="sdpa", need_weights=True)
    add = build_similarity("additive", n_heads=2, d_head=8)
    with pytest.raises(ValueError, match=r"does not run similarity 'additive', which has no dot-product form; use "
                                         r"backend 'auto' \(or explicit, chunked\)"):
        attend(q, k, v, similarity=add, backend="inplace", need_weights=True)


def test_builtin_backends_are_registered_in_one_place():
    assert {"sdpa", "explicit", "chunked", "offset_flash", "inplace"} <= set(BACKENDS)
    assert all(BACKENDS[n].builtin for n in ("sdpa", "explicit", "chunked", "offset_flash", "inplace"))
    assert backends.backend_names()[0] == "auto"


def test_registering_twice_or_a_non_backend_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_backend("explicit")(type("X", (Backend,), {"run": lambda self, call: None}))
    with pytest.raises(ValueError, match="subclass of qkv.nn.backends.base.Backend"):
        register_backend("not_a_backend")(object)


class MathSdpa(Backend):
    """torch's math kernel (no flash): the example backend of docs/architecture.md."""

    supports = Supports(weights=False, dense_bias=False, offset_bias=False)  # dot form (the default), no bias
    runs = 0

    def run(self, call):
        MathSdpa.runs += 1
        qd, kd, scale = call.similarity.as_dot(call.q, call.k)
        mask = call.mask
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return AttendOutput(F.scaled_dot_product_attention(qd, kd, call.v, attn_mask=mask, scale=scale,
                                                               is_causal=call.causal and mask is None))

    def claims(self, features):
        return features.dropout and not features.need_weights  # e.g. take dropout calls under "auto"


@pytest.fixture
def math_backend():
    register_backend("math_sdpa")(MathSdpa)
    MathSdpa.runs = 0
    yield BACKENDS["math_sdpa"]
    del BACKENDS["math_sdpa"]  # unregistered again for the other tests


def test_a_new_backend_is_used_by_name_by_auto_and_from_a_config(math_backend):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 3, 7, 8, generator=g) for _ in range(3))
    sim = build_similarity("scaled_dot", n_heads=3, d_head=8)
    mask = torch.rand(5, 1, 1, 7, generator=g) > 0.3
    mask[..., 0] = True
    want = attend(q, k, v, similarity=sim, mask=mask, backend="explicit").output
    got = attend(q, k, v, similarity=sim, mask=mask, backend="math_sdpa").output
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert MathSdpa.runs == 1
    attend(q, k, v, similarity=sim, dropout_p=0.1)  # claimed under "auto"
    assert MathSdpa.runs == 2
    with pytest.raises(ValueError, match="the math_sdpa backend does not run weights"):
        attend(q, k, v, similarity=sim, backend="math_sdpa", need_weights=True)
    mha = build_attention(24, 3, backend="math_sdpa")
    mha(torch.randn(2, 5, 24))
    assert MathSdpa.runs == 3
    cfg = ModelConfig.preset("tiny", attention_path="math_sdpa")
    build_encoder(cfg).eval()(torch.randint(1, 97, (2, 6)))
    assert MathSdpa.runs == 3 + cfg.n_layers


def test_a_backend_of_your_own_gets_expanded_kv_and_no_window(math_backend):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 7, 8, generator=g)
    k, v = (torch.randn(2, 2, 7, 8, generator=g) for _ in range(2))  # 2 key/value heads for 6 query heads
    sim = build_similarity("scaled_dot", n_heads=6, d_head=8)
    want = attend(q, k, v, similarity=sim, backend="explicit").output
    got = attend(q, k, v, similarity=sim, backend="math_sdpa").output  # written for H heads: gets k, v expanded
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="does not run a sliding window"):
        attend(q, k, v, similarity=sim, backend="math_sdpa", window=3)
    runs = MathSdpa.runs
    attend(q, k, v, similarity=sim, dropout_p=0.1, window=3)  # it would claim this call; a window passes it over
    assert MathSdpa.runs == runs
