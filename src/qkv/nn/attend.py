"""The staged attention core: similarity → bias → mask → softmax → dropout → weights·V.

Legend: B batch, H heads, T query length, S key length, D head dim (q, k), E value head dim.

:func:`attend` checks its inputs, describes the call (:class:`~qkv.nn.backends.Features`), lets
:func:`choose_backend` — a pure function, tested as a table — pick an execution path, and runs it.
Every backend (:mod:`qkv.nn.backends`) computes :func:`~qkv.nn.stages.staged_attention`'s numbers:

========================  =====================================================================
``auto`` picks            when
========================  =====================================================================
a plugin backend          its ``claims(features)`` says so (asked first, in registration order)
``chunked``               a sliding window, when the scores exceed the budget or the window
                          covers under an eighth of the keys: each block of queries visits only
                          its band of keys (time and memory linear in T)
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
(:meth:`~qkv.nn.offset_bias.OffsetBias.causal`: keys after the query read an entry of −∞), so
it takes the offset-bias rows above. Below that row a window is a ``(T,S)`` band in the boolean mask. Keys and values may have fewer
heads than the queries (grouped-query attention, G dividing H; query head h reads key/value head
h // (H/G), as transformers' ``repeat_kv``); every built-in backend runs them, and a backend of
your own that does not say so (``grouped_kv_ok``) gets them expanded to H heads. A backend that
does not read ``window`` (``window_ok``) is never given a windowed call. Naming ``backend="sdpa"`` with an offset bias the kernel can run also takes ``offset_flash``
(never a dense bias). Masks: boolean, broadcastable to ``(B,H,T,S)``, True = may attend. A query
whose keys are all masked gets an output of zeros and weights of zeros on every backend — never NaN.
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from qkv.nn.backends import BACKENDS, AttendCall, Features, backend_names, needs_grad
from qkv.nn.backends.offset_flash import offset_fast_ok
from qkv.nn.masks import check_mask
from qkv.nn.offset_bias import OffsetBias
from qkv.nn.stages import AttendOutput, Bias, expand_kv, masked_softmax

__all__ = ["attend", "AttendOutput", "choose_backend", "features_of", "DEFAULT_BUDGET", "masked_softmax"]

#: Elements of score work memory one explicit block may use (2**24 floats = 64 MiB in float32).
DEFAULT_BUDGET = 2**24


def choose_backend(requested: str, f: Features, plugins=()) -> str:
    """The backend to run a call with features ``f`` (the table in the module docstring).

    Args:
        requested: ``"auto"`` or a backend name.
        f: the call's features.
        plugins: non-built-in backends, asked (``claims(f)``) first under ``"auto"``.
    """
    if requested != "auto":
        if requested == "sdpa" and f.offset_bias and f.has_dot and not f.need_weights and f.offset_kernel_ok:
            return "offset_flash"
        return requested
    for backend in plugins:
        if backend.claims(f):
            return backend.name
    if f.window and (not f.small or f.band_narrow):
        return "chunked"  # the band of each query block only: linear in T, weights or not
    blockwise = "explicit" if f.small else "chunked"
    if f.need_weights:
        return "inplace" if f.has_dot and not f.grad and not f.dropout and not f.empty else blockwise
    if f.offset_bias and f.has_dot:
        if f.offset_kernel_ok and not (f.small and f.learned_bias):
            return "offset_flash"
        if f.learned_bias or f.bias_large:
            return blockwise  # neither SDPA's math path nor a dense mask
    return "sdpa" if f.has_dot else blockwise


def features_of(call: AttendCall) -> Features:
    """The :class:`~qkv.nn.backends.Features` of ``call``."""
    B, H, T, S = call.shape
    offset = isinstance(call.bias, OffsetBias)
    return Features(
        has_dot=call.has_dot,
        need_weights=call.need_weights,
        grad=needs_grad(call),
        dropout=call.dropout_p > 0,
        offset_bias=offset,
        learned_bias=offset and call.bias.requires_grad,
        offset_kernel_ok=offset and call.window is None and offset_fast_ok(call.q, call.v, call.bias, call.mask,
                                                                           call.causal, call.dropout_p),
        small=B * H * T * S * call.cost <= call.budget,
        bias_large=H * T * S > call.budget,
        empty=B * T == 0,
        window=call.window is not None,
        band_narrow=call.window is not None and S > 8 * call.window,
    )


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
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))  # left-pad to 4-D
    if weights_out is not None and (not need_weights or tuple(weights_out.shape) != (B, H, T, S)):
        raise ValueError(f"weights_out must be a (B,H,T,S) = {(B, H, T, S)} tensor given with need_weights=True, "
                         f"got {tuple(weights_out.shape)}")
    if causal and mask is None and window is None and isinstance(bias, OffsetBias) and S >= T:
        bias, causal = bias.causal(), False  # one offset bias: the fused kernel can run it
    call = AttendCall(q, k, v, similarity, bias, mask, causal, dropout_p, need_weights, chunk_size, budget,
                      weights_out, window)
    plugins = [b for b in BACKENDS.values() if not b.builtin and (window is None or b.window_ok)]
    chosen = BACKENDS[choose_backend(backend, features_of(call), plugins)]
    if window is not None and not chosen.window_ok:
        raise ValueError(f"the {chosen.name} backend does not run a sliding window (its window_ok is False); "
                         "use backend 'auto'")
    if k.shape[1] != H and not chosen.grouped_kv_ok:  # (B,G,S,·) -> (B,H,S,·) for a backend written for H
        call = replace(call, k=expand_kv(k, H), v=expand_kv(v, H))
    reason = chosen.refuse(call)
    if reason is not None:
        raise ValueError(reason)
    res = chosen.run(call)
    return res if need_weights or res.weights is None else AttendOutput(res.output)
