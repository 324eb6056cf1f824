"""Similarity (score) functions between queries and keys, and their registry.

Legend: B batch, H heads, T query length, S key length, D head dim, A additive hidden size.

Every similarity is a small ``nn.Module`` with

* ``scores(q, k)``: ``q (B,H,T,D)``, ``k (B,H,S,D)`` → ``(B,H,T,S)`` raw scores (the explicit path);
* ``as_dot(q, k)``: ``(q', k', scale)`` such that ``scores(q, k) == scale · q' k'ᵀ`` — lets the
  fused ``scaled_dot_product_attention`` run — or ``None`` when there is no dot-product form;
* ``has_dot_form``: whether ``as_dot`` returns a form (a class attribute, read before any call);
* ``cost_per_score``: elements of work memory one score needs on the explicit path (1 for the dot
  family, A for additive), used to size query chunks.

Adding a similarity is one decorated class: ``@register_similarity("name")``; in a module outside
qkv, that module is a plugin (docs/plugins.md): :mod:`qkv.plugins` records it as the part's origin.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv import plugins

__all__ = [
    "SIMILARITIES",
    "register_similarity",
    "build_similarity",
    "DotSimilarity",
    "ScaledDotSimilarity",
    "BilinearSimilarity",
    "AdditiveSimilarity",
    "CosineSimilarity",
]

SIMILARITIES: dict[str, Callable[..., nn.Module]] = {}


def register_similarity(name: str):
    """Class decorator: make a similarity available by ``name`` to :func:`build_similarity` (the
    defining module is recorded: :func:`qkv.plugins.registered_by`)."""

    def deco(cls):
        if name in SIMILARITIES:
            raise ValueError(f"similarity {name!r} is already registered (by "
                             f"{plugins.registered_by('similarity', name)})")
        SIMILARITIES[name] = cls
        cls.name = name
        plugins.record_part("similarity", name, cls)
        return cls

    return deco


def build_similarity(name: str, *, n_heads: int, d_head: int, **kwargs) -> nn.Module:
    """Build the similarity registered as ``name`` for ``n_heads`` heads of width ``d_head``."""
    if name not in SIMILARITIES:
        plugins.load_plugins()  # a miss: the installed plugins may register it
    if name not in SIMILARITIES:
        raise ValueError(plugins.unknown_part("similarity", name, sorted(SIMILARITIES)))
    return SIMILARITIES[name](n_heads=n_heads, d_head=d_head, **kwargs)


@register_similarity("dot")
class DotSimilarity(nn.Module):
    """``s(q, k) = qᵀk`` — the textbook's unscaled dot product."""

    cost_per_score = 1
    has_dot_form = True

    def __init__(self, *, n_heads: int, d_head: int):
        super().__init__()

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        return q @ k.transpose(-2, -1)  # (B,H,T,D)(B,H,D,S) -> (B,H,T,S)

    def as_dot(self, q: Tensor, k: Tensor):
        return q, k, 1.0


@register_similarity("scaled_dot")
class ScaledDotSimilarity(nn.Module):
    """``s(q, k) = qᵀk / √D`` — scaled dot product (Vaswani et al.; the book's eq. 12.12)."""

    cost_per_score = 1
    has_dot_form = True

    def __init__(self, *, n_heads: int, d_head: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(d_head)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        return (q @ k.transpose(-2, -1)) * self.scale  # (B,H,T,S)

    def as_dot(self, q: Tensor, k: Tensor):
        return q, k, self.scale


@register_similarity("bilinear")
class BilinearSimilarity(nn.Module):
    """``s(q, k) = qᵀ W k`` per head (Luong's "general" score). W starts at ``I/√D``."""

    cost_per_score = 1
    has_dot_form = True

    def __init__(self, *, n_heads: int, d_head: int):
        super().__init__()
        eye = torch.eye(d_head) / math.sqrt(d_head)
        self.weight = nn.Parameter(eye.expand(n_heads, d_head, d_head).clone())  # (H,D,D)

    def _map_q(self, q: Tensor) -> Tensor:
        return q @ self.weight.to(q.dtype)  # (B,H,T,D)(H,D,D) -> (B,H,T,D)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        return self._map_q(q) @ k.transpose(-2, -1)  # (B,H,T,S)

    def as_dot(self, q: Tensor, k: Tensor):
        return self._map_q(q), k, 1.0


@register_similarity("additive")
class AdditiveSimilarity(nn.Module):
    """``s(q, k) = vᵀ tanh(W_q q + W_k k)`` per head (Bahdanau et al.). No dot-product form."""

    has_dot_form = False

    def __init__(self, *, n_heads: int, d_head: int, d_attn: int | None = None):
        super().__init__()
        d_attn = d_attn or d_head
        self.cost_per_score = d_attn
        bound = 1.0 / math.sqrt(d_head)
        self.w_q = nn.Parameter(torch.empty(n_heads, d_head, d_attn).uniform_(-bound, bound))
        self.w_k = nn.Parameter(torch.empty(n_heads, d_head, d_attn).uniform_(-bound, bound))
        self.v = nn.Parameter(torch.empty(n_heads, d_attn).uniform_(-bound, bound))

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        qa = q @ self.w_q.to(q.dtype)  # (B,H,T,D)(H,D,A) -> (B,H,T,A)
        ka = k @ self.w_k.to(k.dtype)  # (B,H,S,D)(H,D,A) -> (B,H,S,A)
        hidden = torch.tanh(qa.unsqueeze(-2) + ka.unsqueeze(-3))  # (B,H,T,1,A)+(B,H,1,S,A) -> (B,H,T,S,A)
        v = self.v.to(q.dtype)[:, None, :, None]  # (H,A) -> (H,1,A,1)
        return (hidden @ v).squeeze(-1)  # (B,H,T,S,A)(H,1,A,1) -> (B,H,T,S,1) -> (B,H,T,S)

    def as_dot(self, q: Tensor, k: Tensor):
        return None


@register_similarity("cosine")
class CosineSimilarity(nn.Module):
    """``s(q, k) = τ · qᵀk / (‖q‖‖k‖)`` with a per-head temperature τ.

    Args:
        temperature: initial τ (default ``√D``, the spread of a scaled dot product of unit-variance
            vectors).
        learn_temperature: learn ``log τ`` per head (default) or keep τ fixed.
    """

    cost_per_score = 1
    has_dot_form = True

    def __init__(
        self,
        *,
        n_heads: int,
        d_head: int,
        temperature: float | None = None,
        learn_temperature: bool = True,
    ):
        super().__init__()
        tau = float(temperature if temperature is not None else math.sqrt(d_head))
        if not tau > 0:
            raise ValueError(f"cosine temperature must be > 0, got {tau}")
        log_tau = torch.full((n_heads,), math.log(tau))
        if learn_temperature:
            self.log_tau = nn.Parameter(log_tau)
        else:
            self.register_buffer("log_tau", log_tau)

    def _unit(self, q: Tensor, k: Tensor):
        tau = self.log_tau.to(q.dtype).exp()[:, None, None]  # (H,) -> (H,1,1)
        return F.normalize(q, dim=-1) * tau, F.normalize(k, dim=-1)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        qn, kn = self._unit(q, k)
        return qn @ kn.transpose(-2, -1)  # (B,H,T,D)(B,H,D,S) -> (B,H,T,S)

    def as_dot(self, q: Tensor, k: Tensor):
        qn, kn = self._unit(q, k)
        return qn, kn, 1.0
