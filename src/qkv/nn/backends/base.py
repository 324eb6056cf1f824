"""What every attention backend is: one call (:class:`AttendCall`), its features (:class:`Features`),
what a backend declares it supports (:class:`Supports`), and the interface (:class:`Backend`).

Legend: B batch, H heads, T query length, S key length, D head dim, E value head dim, G key/value
heads (G divides H; query head h reads key/value head h // (H/G)).

A backend is one way to execute the staged core of :func:`qkv.nn.attend.attend` — the same numbers
by another route. It declares what it can run in :attr:`Backend.supports` (weights, similarities,
score biases, causal masks, windows, dropout, autograd, grouped keys, devices, dtypes, memory) and
how fast it is for a call (:meth:`Backend.speed`); :func:`qkv.nn.attend.choose_backend` reads only
those declarations. A backend named outright refuses a call it cannot run with one line built from
the same declarations (:meth:`Backend.refuse`), never with wrong numbers.

This module imports no backend: the built-in ones (``sdpa``, ``explicit``, ``chunked``,
``offset_flash``, ``inplace``) import it, and :mod:`qkv.nn.backends` registers them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from qkv.nn.stages import AttendOutput, Bias

__all__ = ["AttendCall", "Features", "Supports", "Backend", "needs_grad"]


@dataclass(frozen=True)
class AttendCall:
    """One call of attention, as a backend receives it (inputs already checked and normalised).

    Attributes:
        q: ``(B,H,T,D)``. k: ``(B,G,S,D)``. v: ``(B,G,S,E)`` (G = H, or fewer key/value heads:
            grouped-query attention; a backend that does not declare ``grouped_kv`` gets them
            expanded to H heads).
        similarity: the similarity module.
        bias: ``None``, a float tensor of 4 dims broadcastable to ``(B,H,T,S)``, or a row-block
            function ``(start, stop) -> (B?,H?,stop-start,S)`` (e.g. an
            :class:`~qkv.nn.offset_bias.OffsetBias`).
        mask: ``None`` or a boolean 4-D mask broadcastable to ``(B,H,T,S)``; True = may attend.
        causal: also forbid keys after the query (aligned at the end when S > T).
        dropout_p: dropout on the weights (0 in eval mode).
        need_weights: the ``(B,H,T,S)`` weights are wanted.
        chunk_size: queries per block for blockwise backends, or ``None`` (sized from ``budget``).
        budget: elements of score work memory one block may use.
        weights_out: a ``(B,H,T,S)`` tensor to write the weights into (and return), or ``None``.
        window: ``None``, or a sliding window W: query i sees key j iff ``|i + (S-T) - j| ≤ W // 2``.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    similarity: object
    bias: Bias | None
    mask: Tensor | None
    causal: bool
    dropout_p: float
    need_weights: bool
    chunk_size: int | None
    budget: int
    weights_out: Tensor | None = None
    window: int | None = None

    def put_weights(self, weights: Tensor | None) -> Tensor | None:
        """``weights`` written into :attr:`weights_out` when one was given (autograd follows the copy)."""
        if self.weights_out is None or weights is None or weights is self.weights_out:
            return weights
        return self.weights_out.copy_(weights)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, T, S)``."""
        B, H, T, _ = self.q.shape
        return B, H, T, self.k.shape[2]

    @property
    def cost(self) -> int:
        """Elements of work memory one score needs on the explicit path."""
        return int(getattr(self.similarity, "cost_per_score", 1))

    @property
    def has_dot(self) -> bool:
        return bool(getattr(self.similarity, "has_dot_form", False))


def needs_grad(call: AttendCall) -> bool:
    """Whether autograd will run back through this call."""
    if not torch.is_grad_enabled():
        return False
    params = getattr(call.similarity, "parameters", lambda: ())()
    return (call.q.requires_grad or call.k.requires_grad or call.v.requires_grad
            or any(p.requires_grad for p in params) or bool(getattr(call.bias, "requires_grad", False)))


@dataclass(frozen=True)
class Features:
    """What a call asks of a backend (:func:`qkv.nn.attend.features_of`); hashable, so a choice is
    made once per kind of call and :func:`~qkv.nn.attend.choose_backend` is a pure table.

    Attributes:
        has_dot: the similarity has a dot-product form.
        need_weights: the weights are wanted.
        grad: autograd will run back through the call.
        dropout: attention dropout is in effect.
        offset_bias: the bias is an :class:`~qkv.nn.offset_bias.OffsetBias` (relative, T5, ALiBi).
        learned_bias: that bias's table needs a gradient.
        dense_bias: the bias is a dense tensor.
        causal: a causal mask (keys after the query are hidden).
        key_mask_only: the mask, if any, is over keys only (``(B,1,1,S)``).
        device: ``"cpu"``, ``"cuda"``, … of q.
        dtype: q's dtype, as a string (``"float32"``).
        equal_head_dims: q's and v's head widths are equal (D = E).
        grouped_kv: fewer key/value heads than query heads.
        small: the ``(B,H,T,S)`` scores fit the budget.
        bias_large: a dense ``(H,T,S)`` bias would exceed the budget.
        empty: no query (B·T = 0).
        window: a sliding window restricts the keys.
        band_narrow: that window covers under an eighth of the keys (S > 8·W).
    """

    has_dot: bool = True
    need_weights: bool = False
    grad: bool = False
    dropout: bool = False
    offset_bias: bool = False
    learned_bias: bool = False
    dense_bias: bool = False
    causal: bool = False
    key_mask_only: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    equal_head_dims: bool = True
    grouped_kv: bool = False
    small: bool = True
    bias_large: bool = False
    empty: bool = False
    window: bool = False
    band_narrow: bool = False


@dataclass(frozen=True)
class Supports:
    """What a backend declares it can run. :meth:`missing` reads a call's :class:`Features` against it.

    Attributes:
        weights: it returns the ``(B,H,T,S)`` weights (a backend that cannot is never given a call
            that wants them).
        any_similarity: it runs any similarity (``False``: only those with a dot-product form).
        offset_bias: it runs an offset bias (relative, T5, ALiBi) — learned tables included unless
            ``learned_bias`` is False.
        learned_bias: it runs offset biases whose table needs a gradient.
        offset_bias_only: it runs nothing but offset biases (a bias-specific kernel).
        dense_bias: it runs dense bias tensors.
        offset_as_dense: it runs an offset bias by making it dense (then the ``(H,T,S)`` bias must
            fit the budget, and its table must need no gradient).
        causal: it runs causal masks.
        masks: ``"any"`` or ``"keys"`` (masks over keys only).
        window: it runs sliding windows (a backend that does not is never given one).
        window_as_mask: it runs a window as a dense ``(T,S)`` band (then the scores must fit).
        dropout: it runs attention dropout.
        autograd: it runs under autograd.
        grouped_kv: it takes keys/values with fewer heads than the queries (else they are expanded).
        empty: it runs calls with no query.
        devices: the devices it runs on (``None``: any).
        dtypes: the dtypes it runs (``None``: any), as strings.
        equal_head_dims: it needs q's and v's head widths equal.
        memory: ``"scores"`` (it makes the ``(B,H,T,S)`` scores: the call must fit the budget
            under ``auto``), ``"blocks"`` (bounded) or ``"linear"`` (linear in T).
    """

    weights: bool = False
    any_similarity: bool = False
    offset_bias: bool = True
    learned_bias: bool = True
    offset_bias_only: bool = False
    dense_bias: bool = True
    offset_as_dense: bool = False
    causal: bool = True
    masks: str = "any"
    window: bool = False
    window_as_mask: bool = False
    dropout: bool = True
    autograd: bool = True
    grouped_kv: bool = False
    empty: bool = True
    devices: tuple[str, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    equal_head_dims: bool = False
    memory: str = "scores"

    def missing(self, f: Features, *, sized: bool = True) -> str | None:
        """What of ``f`` this declaration does not cover (a few words), or ``None``.

        ``sized``: also apply the memory limits (``auto``); a backend named outright runs a call
        that is only too large.
        """
        checks = (
            (f.need_weights and not self.weights, "weights"),
            (not f.has_dot and not self.any_similarity, "a similarity without a dot-product form"),
            (self.offset_bias_only and not f.offset_bias, "a call without an offset bias"),
            (f.offset_bias and not self.offset_bias, "an offset bias (relative, t5, alibi)"),
            (f.offset_bias and f.learned_bias and not self.learned_bias, "a learned offset bias"),
            (f.dense_bias and not self.dense_bias, "a dense bias"),
            (f.causal and not self.causal, "a causal mask"),
            (not f.key_mask_only and self.masks == "keys", "a mask over queries as well as keys"),
            (f.window and not self.window, "a sliding window"),
            (f.dropout and not self.dropout, "dropout"),
            (f.grad and not self.autograd, "autograd"),
            (f.empty and not self.empty, "an empty call"),
            (self.devices is not None and f.device not in self.devices, f"device {f.device}"),
            (self.dtypes is not None and f.dtype not in self.dtypes, f"dtype {f.dtype}"),
            (self.equal_head_dims and not f.equal_head_dims, "value heads of another width than the keys'"),
        )
        for failed, what in checks:
            if failed:
                return what
        if sized:
            dense_offset = f.offset_bias and self.offset_as_dense
            if dense_offset and (f.learned_bias or f.bias_large):
                return "a learned or large offset bias made dense"
            if self.memory == "scores" and not f.small:
                return "scores larger than the budget"
            if f.window and self.window_as_mask and not f.small:
                return "a window band larger than the budget"
        return None


class Backend(ABC):
    """One execution path of attention (see the module docstring).

    Subclasses set :attr:`supports`, implement :meth:`run`, and may refine :meth:`speed` (lower is
    preferred among the backends that can run a call), :meth:`claims` (a backend that is not
    built in takes the calls it claims under ``auto``) and :meth:`refuse` (conditions the
    declaration cannot express).
    """

    name: str = ""
    builtin: bool = False
    supports: Supports = Supports(weights=True, any_similarity=True)
    #: backend names a request for which this one may take, when it can run the call (and is faster)
    stands_in_for: tuple[str, ...] = ()

    def speed(self, f: Features) -> float:
        """Lower is faster for a call with features ``f`` (compared across the backends able to run it)."""
        return 10.0

    def refuse(self, call: AttendCall, f: Features) -> str | None:
        """``None`` when this backend can run ``call``, else what it does not run (a few words;
        :meth:`~qkv.nn.attend.BackendPlan.run` adds which backends would)."""
        what = self.supports.missing(f, sized=False)
        if what is None:
            return None
        if not f.has_dot and what.startswith("a similarity"):
            name = getattr(call.similarity, "name", type(call.similarity).__name__)
            what = f"similarity {name!r}, which has no dot-product form"
        return f"the {self.name} backend does not run {what}"

    @abstractmethod
    def run(self, call: AttendCall) -> AttendOutput:
        """Attention for ``call``: ``output (B,H,T,E)`` and, when it makes them, ``weights (B,H,T,S)``."""

    def claims(self, features: Features) -> bool:
        """Whether to take a call under ``backend="auto"`` before the declared choice."""
        return False
