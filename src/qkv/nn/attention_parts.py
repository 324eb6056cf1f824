"""The checks of what :class:`~qkv.nn.attention.MultiHeadAttention` is built from and called with: each
refusal is one ``ValueError`` line naming the part, what it is and what it must be.

Legend: T query length, H heads, G key/value heads, D head dim, C model width (= H·D), E context width.

* self-attention: a fused ``qkv_proj`` C → C + 2·G·D (C → 2·C with ``shared_qk``) or none (queries,
  keys and values are the input itself, H heads each), an ``out_proj`` C → C or none;
* cross-attention: a ``q_proj`` C → C and a ``kv_proj`` E → 2·G·D, no fused map, no positions.
"""

from __future__ import annotations

from torch import Tensor

from qkv.nn.maps import linear_shape
from qkv.validation import check_heads

__all__ = ["check_parts", "check_input"]


def check_parts(d_model: int, n_heads: int, n_kv_heads: int, *, qkv_proj, q_proj, kv_proj, out_proj,
                shared_qk: bool, qk_transform, score_bias, window: int | None, dropout: float) -> bool:
    """Refuse parts that do not make one attention module; return whether they make a cross-attention
    (``q_proj`` or ``kv_proj`` given).

    Raises:
        ValueError: naming the first part that does not fit.
    """
    if not isinstance(shared_qk, bool):
        raise ValueError(f"shared_qk must be a bool, got {shared_qk!r}")
    cross = kv_proj is not None or q_proj is not None
    if cross:
        _check_cross(d_model, n_heads, n_kv_heads, q_proj, kv_proj, out_proj, qkv_proj=qkv_proj,
                     shared_qk=shared_qk, positions=(qk_transform, score_bias, window))
    else:
        if shared_qk and (qkv_proj is None or n_kv_heads != n_heads):
            raise ValueError(f"shared_qk=True needs a qkv_proj and n_kv_heads = n_heads (got qkv_proj="
                             f"{'None' if qkv_proj is None else 'a map'}, n_kv_heads={n_kv_heads})")
        _check_self(d_model, n_heads, n_kv_heads, qkv_proj, out_proj, shared_qk)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None (global attention), got {window!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    return cross


def check_input(x: Tensor, qk_pos: Tensor | None, d_model: int) -> None:
    """Refuse an input ``x`` that is not ``(B,T,C)`` with C = ``d_model``, or a ``qk_pos`` that is
    neither ``(T,C)`` nor ``(B,T,C)``."""
    if not isinstance(x, Tensor) or x.dim() != 3:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a 3-D tensor (B, T, C={d_model}), got {shape}")
    if x.shape[-1] != d_model:
        raise ValueError(f"x has width C={x.shape[-1]}, but this layer has d_model={d_model}")
    T, C = x.shape[1:]
    if qk_pos is not None and (qk_pos.shape[-2:] != (T, C) or qk_pos.dim() not in (2, 3)):
        raise ValueError(f"qk_pos must be (T,C) = ({T},{C}) or (B,T,C), got {tuple(qk_pos.shape)}")


def _check_self(d_model: int, n_heads: int, n_kv_heads: int, qkv_proj, out_proj, shared_qk: bool = False) -> None:
    check_heads(d_model, n_heads, n_kv_heads)
    if qkv_proj is None and n_kv_heads != n_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} < n_heads={n_heads} needs a qkv_proj (without one queries, "
                         "keys and values are the embeddings themselves, H heads each)")
    qkv_rows = 2 * d_model if shared_qk else d_model + 2 * n_kv_heads * (d_model // n_heads)  # C + 2·G·D
    for name, lin, shape in (("qkv_proj", qkv_proj, (qkv_rows, d_model)),
                             ("out_proj", out_proj, (d_model, d_model))):
        if lin is not None and linear_shape(lin) != shape:
            raise ValueError(f"{name} must be an nn.Linear with weight {shape} (or an inference map of that shape) "
                             f"or None, got {linear_shape(lin) or type(lin).__name__}")


def _check_cross(d_model: int, n_heads: int, n_kv_heads: int, q_proj, kv_proj, out_proj, *, qkv_proj,
                 shared_qk: bool, positions) -> None:
    """The parts of a cross-attention module (``q_proj`` and ``kv_proj``, no fused map, no positions)."""
    check_heads(d_model, n_heads, n_kv_heads)
    if qkv_proj is not None or shared_qk:
        raise ValueError("cross-attention takes q_proj and kv_proj, not a fused qkv_proj or shared_qk")
    if any(p is not None for p in positions):
        raise ValueError("cross-attention takes no positions (qk_transform, score_bias, window): queries and keys "
                         "live in different sequences")
    D = d_model // n_heads
    if linear_shape(q_proj) != (d_model, d_model):
        raise ValueError(f"q_proj must be a linear map {d_model} → {d_model} (e.g. nn.Linear({d_model}, {d_model}))")
    if linear_shape(kv_proj) is None or linear_shape(kv_proj)[0] != 2 * n_kv_heads * D:
        raise ValueError(f"kv_proj must be a linear map E → 2·G·D = {2 * n_kv_heads * D} (e.g. nn.Linear)")
    if out_proj is not None and linear_shape(out_proj) != (d_model, d_model):
        raise ValueError(f"out_proj must be a linear map {d_model} → {d_model} (e.g. nn.Linear) or None")
