"""Execution paths of attention behind one interface (:class:`Backend`), and their registry.

Legend: B batch, H heads, T query length, S key length, D head dim, E value head dim, G key/value
heads (G divides H; query head h reads key/value head h // (H/G)).

A backend is one way to execute the staged core of :func:`qkv.nn.attend.attend` — the same numbers
by another route. Built in: ``sdpa`` (torch's fused kernel), ``explicit`` (materialised scores;
weights), ``chunked`` (blocks of queries; bounded memory, checkpointed under autograd),
``offset_flash`` (relative/T5/ALiBi biases on the flash kernel, learned-table gradient included)
and ``inplace`` (weights without autograd, the only score-sized tensor); each is tested against
``explicit``. A backend gets one :class:`AttendCall` (inputs already checked and normalised) and
returns an :class:`~qkv.nn.stages.AttendOutput`. :func:`qkv.nn.attend.choose_backend` picks one
from the call's :class:`Features`; a backend may also be named (``backend="explicit"``), and it
then says why it cannot run a call (:meth:`Backend.refuse`) instead of giving wrong numbers.

Adding a backend is one file (see docs/architecture.md)::

    @register_backend("mine")
    class MyBackend(Backend):
        def refuse(self, call): ...            # None, or why this call cannot run here
        def run(self, call): ...               # -> AttendOutput
        def claims(self, features): ...        # optional: take calls under backend="auto"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from qkv import plugins
from qkv.nn.stages import AttendOutput, Bias

__all__ = ["AttendCall", "Features", "Backend", "BACKENDS", "register_backend", "backend_names",
           "needs_grad"]


@dataclass(frozen=True)
class AttendCall:
    """One call of attention, as :func:`qkv.nn.attend.attend` hands it to a backend.

    Attributes:
        q: ``(B,H,T,D)``. k: ``(B,G,S,D)``. v: ``(B,G,S,E)`` (G = H, or fewer key/value heads:
            grouped-query attention; every backend runs G < H).
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

    def no_dot_form(self) -> str | None:
        """The refusal of a backend that needs a dot-product similarity, or ``None`` when it has one."""
        if self.has_dot:
            return None
        return (f"similarity {getattr(self.similarity, 'name', self.similarity)!r} has no dot-product form; "
                "use backend 'explicit' or 'chunked'")


def needs_grad(call: AttendCall) -> bool:
    """Whether autograd will run back through this call."""
    if not torch.is_grad_enabled():
        return False
    params = getattr(call.similarity, "parameters", lambda: ())()
    return (call.q.requires_grad or call.k.requires_grad or call.v.requires_grad
            or any(p.requires_grad for p in params) or bool(getattr(call.bias, "requires_grad", False)))


@dataclass(frozen=True)
class Features:
    """What :func:`qkv.nn.attend.choose_backend` decides on (all booleans, so it is a pure table).

    Attributes:
        has_dot: the similarity has a dot-product form (the fused kernel can run it).
        need_weights: the weights are wanted.
        grad: autograd will run back through the call.
        dropout: attention dropout is in effect.
        offset_bias: the bias is an :class:`~qkv.nn.offset_bias.OffsetBias`.
        learned_bias: that bias's table needs a gradient.
        offset_kernel_ok: the offset-bias flash kernel can run the call (CPU, no causal mask, keys-only mask,
            no dropout, equal q and v head sizes).
        small: the ``(B,H,T,S)`` scores fit the budget.
        bias_large: a dense ``(H,T,S)`` bias would exceed the budget.
        empty: no query (B·T = 0).
        window: a sliding window restricts the keys (the chunked backend then visits only each
            block's band, memory linear in T).
        band_narrow: that window covers under an eighth of the keys (S > 8·W): visiting only the
            band is less work than a dense band mask on the fused kernel.
    """

    has_dot: bool = True
    need_weights: bool = False
    grad: bool = False
    dropout: bool = False
    offset_bias: bool = False
    learned_bias: bool = False
    offset_kernel_ok: bool = False
    small: bool = True
    bias_large: bool = False
    empty: bool = False
    window: bool = False
    band_narrow: bool = False


class Backend(ABC):
    """One execution path of attention (see the module docstring).

    Attributes:
        window_ok: the backend reads ``call.window``; one that does not is never given a windowed
            call (``auto`` passes it over; naming it is refused with a message).
        grouped_kv_ok: the backend takes keys/values with fewer heads than the queries; one that
            does not gets them expanded to H heads (transformers' ``repeat_kv``) before ``run``.
    """

    name: str = ""
    builtin: bool = False
    window_ok: bool = False
    grouped_kv_ok: bool = False

    def refuse(self, call: AttendCall) -> str | None:
        """``None`` when this backend can run ``call``, else a one-line reason naming what to use."""
        return None

    @abstractmethod
    def run(self, call: AttendCall) -> AttendOutput:
        """Attention for ``call``: ``output (B,H,T,E)`` and, when it makes them, ``weights (B,H,T,S)``."""

    def claims(self, features: Features) -> bool:
        """Whether to take a call under ``backend="auto"`` (asked before the built-in choice)."""
        return False


#: Registered backends by name, built-in ones first.
BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, *, builtin: bool = False):
    """Class decorator: register an instance of a :class:`Backend` subclass as ``name`` (the defining
    module is recorded: :func:`qkv.plugins.registered_by`; outside qkv, a plugin: docs/plugins.md)."""

    def deco(cls):
        if name in BACKENDS or name == "auto":
            raise ValueError(f"attention backend {name!r} is already registered "
                             f"(by {plugins.registered_by('backend', name) or 'qkv'})")
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise ValueError(f"register_backend({name!r}) needs a subclass of qkv.nn.backends.Backend")
        cls.name, cls.builtin = name, builtin
        BACKENDS[name] = cls()
        plugins.record_part("backend", name, cls)
        return cls

    return deco


def backend_names() -> tuple[str, ...]:
    """``"auto"`` and every registered backend's name."""
    return ("auto", *BACKENDS)


# the built-in backends register themselves on import (after the registry above exists)
from qkv.nn.backends import chunked, explicit, inplace, offset_flash, sdpa  # noqa: E402,F401
