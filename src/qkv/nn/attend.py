"""The staged attention core: similarity → bias → mask → softmax → dropout → weights·V.

Legend: B batch, H heads, T query length, S key length, D head dim (q, k), E value head dim.

:func:`attend` checks its inputs, describes the call (:class:`~qkv.nn.backends.base.Features`), lets
:func:`choose_backend` — a pure function of those features and the backends' declarations, tested as
a table — pick an execution path, and runs it. An attention module resolves its backend once, when
it is built (:class:`BackendPlan`), and hands each call straight to the backend its plan picks.
Every backend (:mod:`qkv.nn.backends`) computes :func:`~qkv.nn.stages.staged_attention`'s numbers.

How ``auto`` picks: the backends whose declaration (:class:`~qkv.nn.backends.base.Supports`) covers
the call — weights, similarity, bias, causal mask, window, dropout, autograd, device, dtype, and,
under ``auto``, the memory budget — are the candidates; a plugin backend that ``claims`` the call
is taken first; otherwise the candidate whose :meth:`~qkv.nn.backends.base.Backend.speed` is lowest.
With the built-in declarations that gives:

========================  =====================================================================
``auto`` picks            when
========================  =====================================================================
``chunked``               a sliding window when the scores exceed the budget or the window
                          covers under an eighth of the keys (each block of queries visits only
                          its band of keys: time and memory linear in T)
``inplace``               weights wanted, a dot-product similarity, no autograd, no dropout
``explicit``/``chunked``  weights wanted otherwise (``chunked`` when the scores exceed the budget)
``offset_flash``          an offset bias (relative, T5, ALiBi) the flash kernel can run — except a
                          small learned one, which is faster on ``explicit``
``explicit``/``chunked``  an offset bias the kernel cannot run that is learned or too large to
                          make dense
``sdpa``                  a dot-product similarity
``explicit``/``chunked``  no dot-product form (additive)
========================  =====================================================================

A causal call with an offset bias and no other mask folds the causal mask into the bias
(:meth:`~qkv.nn.offset_bias.OffsetBias.causal`: keys after the query read an entry of −∞), so it
takes the offset-bias rows above. Otherwise a window is a ``(T,S)`` band in the boolean mask. Keys
and values may have fewer heads than the queries (grouped-query attention, G dividing H; query head
h reads key/value head h // (H/G), as transformers' ``repeat_kv``); every built-in backend runs
them, and a backend that does not declare ``grouped_kv`` gets them expanded to H heads. Naming a
backend runs it (``offset_flash`` stands in for ``sdpa`` when it can run the call: never a dense
bias); a named backend that cannot run a call says why in one line. Masks: boolean, broadcastable to
``(B,H,T,S)``, True = may attend. A query whose keys are all masked gets an output of zeros and
weights of zeros on every backend — never NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from torch import Tensor

from qkv import plugins
from qkv.nn.backends import BACKENDS, backend_names
from qkv.nn.backends.base import AttendCall, Backend, Features, needs_grad
from qkv.nn.masks import check_mask
from qkv.nn.offset_bias import OffsetBias
from qkv.nn.stages import AttendOutput, Bias, expand_kv

__all__ = ["attend", "attend_call", "choose_backend", "features_of", "BackendPlan", "DEFAULT_BUDGET"]

#: Elements of score work memory one explicit block may use (2**24 floats = 64 MiB in float32).
DEFAULT_BUDGET = 2**24


def choose_backend(requested: str, f: Features, backends: Mapping[str, Backend] | None = None) -> str:
    """The backend to run a call with features ``f`` (see the module docstring).

    Args:
        requested: ``"auto"`` or a backend name.
        f: the call's features.
        backends: the registered backends (default :data:`qkv.nn.backends.BACKENDS`), in order.
    """
    backends = BACKENDS if backends is None else backends
    if requested != "auto":
        named = backends.get(requested)
        standins = [b for b in backends.values() if requested in b.stands_in_for and b.supports.missing(f) is None]
        best = min(standins, key=lambda b: b.speed(f), default=None)
        if best is not None and (named is None or named.supports.missing(f) is not None
                                 or best.speed(f) < named.speed(f)):
            return best.name
        return requested
    able = [b for b in backends.values() if b.supports.missing(f) is None]
    for b in able:
        if not b.builtin and b.claims(f):
            return b.name
    if not able:
        raise ValueError(f"no attention backend can run this call ({f})")
    return min(able, key=lambda b: b.speed(f)).name


def features_of(call: AttendCall) -> Features:
    """The :class:`~qkv.nn.backends.base.Features` of ``call``."""
    B, H, T, S = call.shape
    q, bias, mask = call.q, call.bias, call.mask
    offset = isinstance(bias, OffsetBias)
    return Features(
        has_dot=call.has_dot,
        need_weights=call.need_weights,
        grad=needs_grad(call),
        dropout=call.dropout_p > 0,
        offset_bias=offset,
        learned_bias=offset and bias.requires_grad,
        dense_bias=bias is not None and not offset,
        causal=call.causal,
        key_mask_only=mask is None or (mask.shape[1] == 1 and mask.shape[2] == 1),
        device=q.device.type,
        dtype=str(q.dtype).removeprefix("torch."),
        equal_head_dims=q.shape[-1] == call.v.shape[-1],
        grouped_kv=call.k.shape[1] != H,
        small=B * H * T * S * call.cost <= call.budget,
        bias_large=H * T * S > call.budget,
        empty=B * T == 0,
        window=call.window is not None,
        band_narrow=call.window is not None and S > 8 * call.window,
    )


def attend_call(q: Tensor, k: Tensor, v: Tensor, similarity, bias: Bias | None, mask: Tensor | None, causal: bool,
                dropout_p: float, need_weights: bool, chunk_size: int | None, budget: int,
                weights_out: Tensor | None = None, window: int | None = None) -> AttendCall:
    """The :class:`AttendCall` of already checked inputs: a tensor bias left-padded to 4-D, and a causal
    mask folded into an offset bias when there is no other mask (the fused kernel can then run it)."""
    if isinstance(bias, Tensor) and bias.dim() < 4:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))  # left-pad to 4-D
    if causal and mask is None and window is None and isinstance(bias, OffsetBias) and k.shape[2] >= q.shape[2]:
        bias, causal = bias.causal(), False  # keys after the query read an entry of -inf
    return AttendCall(q, k, v, similarity, bias, mask, causal, dropout_p, need_weights, chunk_size, budget,
                      weights_out, window)


class BackendPlan:
    """An attention module's backend, resolved once when the module is built.

    ``BackendPlan("auto")`` picks, per kind of call (its :class:`Features`), the backend
    :func:`choose_backend` names — once per kind, remembered; a named plan runs its backend (or one
    that stands in for it). Unknown names load the installed plugins first, then are refused.

    Args:
        requested: ``"auto"`` or a registered backend name.
    """

    def __init__(self, requested: str = "auto"):
        if requested not in backend_names():
            plugins.load_plugins()  # a miss: the installed plugins may register it
        if requested not in backend_names():
            raise ValueError(plugins.unknown_part("attention backend", requested, backend_names()))
        self.requested = requested
        self._backends = dict(BACKENDS)  # those registered when the module was built
        self._picked: dict[Features, Backend] = {}

    def run(self, call: AttendCall) -> AttendOutput:
        """Attention for ``call`` on the backend this plan picks for it (the same kind of call: the same
        backend, chosen once). A named backend that cannot run the call says why in one line; keys and
        values are expanded to H heads for a backend that does not take grouped ones; weights not
        asked for are dropped."""
        f = features_of(call)
        backend = self._picked.get(f)
        if backend is None:
            backend = self._picked[f] = self._backends[choose_backend(self.requested, f, self._backends)]
        if self.requested != "auto":
            reason = backend.refuse(call, f)
            if reason is not None:
                able = [b.name for b in self._backends.values() if b.supports.missing(f, sized=False) is None]
                raise ValueError(f"{reason}; use backend 'auto'" + (f" (or {', '.join(able)})" if able else ""))
        if f.grouped_kv and not backend.supports.grouped_kv:  # (B,G,S,·) -> (B,H,S,·) for a backend written for H
            H = call.q.shape[1]
            call = replace(call, k=expand_kv(call.k, H), v=expand_kv(call.v, H))
        res = backend.run(call)
        return res if call.need_weights or res.weights is None else AttendOutput(res.output)

    def __repr__(self) -> str:
        return repr(self.requested)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B,H,len,dim), got {shape}")
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q, k, v must share B, and k and v share their heads G, which divide q's H (grouped-query "
            f"attention); got (B,H) {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, {tuple(v.shape[:2])}"
        )
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length S, got {k.shape[2]} and {v.shape[2]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head dim, got {q.shape[3]} and {k.shape[3]}")


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    similarity,
    bias: Bias | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: str = "auto",
    chunk_size: int | None = None,
    budget: int = DEFAULT_BUDGET,
    weights_out: Tensor | None = None,
) -> AttendOutput:
    """Attention of queries over keys/values, staged as similarity → bias → mask → softmax → mix.

    Args:
        q: ``(B,H,T,D)`` queries.
        k: ``(B,G,S,D)`` keys; G = H, or G dividing H (grouped-query attention: query head h reads
            key head h // (H/G); G = 1 is multi-query attention).
        v: ``(B,G,S,E)`` values, with k's heads.
        similarity: a similarity module (see :mod:`qkv.nn.similarity`).
        bias: additive score bias, a tensor broadcastable to ``(B,H,T,S)`` or a function
            ``(start, stop) -> (B?,H?,stop-start,S)`` giving the rows of a block of queries.
        mask: boolean, broadcastable to ``(B,H,T,S)``; True = may attend.
        causal: also forbid keys after the query (aligned at the end when S > T).
        window: sliding-window (local) attention of width W: query i sees key j iff
            ``|i - j| ≤ W // 2`` (aligned as ``causal``); combined with ``mask`` and ``causal``.
        dropout_p: dropout on the attention weights (pass 0 in eval mode).
        need_weights: also return the ``(B,H,T,S)`` weights (before dropout).
        backend: ``"auto"`` or a registered backend (:data:`qkv.nn.backends.BACKENDS`).
        chunk_size: queries per block on the chunked backend (default: sized from ``budget``).
        budget: elements of score work memory per block, used to size chunks and pick a backend.
        weights_out: with ``need_weights``, a ``(B,H,T,S)`` tensor of q's dtype to write the weights
            into (returned as ``weights``): the in-place backend then makes no score-sized tensor at all.

    Returns:
        :class:`AttendOutput` with ``output (B,H,T,E)`` and ``weights (B,H,T,S) | None``.
    """
    _check_inputs(q, k, v)
    B, H, T, _ = q.shape
    S = k.shape[2]
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; allowed: {', '.join(backend_names())}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int (keys within window // 2 either side) or None, "
                         f"got {window!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    if mask is not None:
        mask = check_mask(mask, (B, H, T, S))
    if isinstance(bias, Tensor):
        if not bias.is_floating_point():
            raise ValueError(f"bias must be a floating-point tensor, got {bias.dtype}")
    if weights_out is not None and (not need_weights or tuple(weights_out.shape) != (B, H, T, S)):
        raise ValueError(f"weights_out must be a (B,H,T,S) = {(B, H, T, S)} tensor given with need_weights=True, "
                         f"got {tuple(weights_out.shape)}")
    call = attend_call(q, k, v, similarity, bias, mask, causal, dropout_p, need_weights, chunk_size, budget,
                       weights_out, window)
    return BackendPlan(backend).run(call)  # the backends registered now, chosen for this call
