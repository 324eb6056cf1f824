"""Beyond raw attention: attention rollout and attention flow (Abnar & Zuidema 2020) and value-norm
weighted attention (Kobayashi et al. 2020), as plain functions over a model's attention weights.

Legend: L layers, B batch, H heads, T tokens (queries = keys), D head dim, C width, Q queried positions.

**Rollout.** Each layer's heads averaged, the residual connection added as the paper does —
``A' = 0.5·A + 0.5·I``, rows renormalised — and the layers multiplied, top down:
``R = A'_{L-1} ⋯ A'_1 A'_0``. Row i of R says how much of output position i comes from each input
token, if information mixed only through attention.

**Flow.** The layers as a graph: node (ℓ, t) for every token t after layer ℓ-1 (ℓ = 0: the input
tokens), an edge (ℓ+1, i) → (ℓ, j) of capacity ``A'_ℓ[i, j]``. The flow of output position i to input
token j is the maximum flow from (L, i) to (0, j). Computed with SciPy's integer max-flow on
capacities scaled by 2**26 (error < 1e-7 per edge; checked against ``networkx.maximum_flow_value``).
T² max-flow problems per text, each over L·T² edges: pass ``queries`` (e.g. ``[0]``, the ``[CLS]``
position) for long texts. ``normalize=True`` divides each row by its sum, as the authors' code does.

**Value norms.** Attention weight α_hij times the norm of what token j actually sends through head h,
``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h``: ``‖α_hij f_h(x_j)‖`` per head, and ``‖Σ_h α_hij f_h(x_j)‖``
for the layer (the output map's bias left out, as in the paper).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow
from torch import Tensor

from qkv.analysis.hooked import Batch, expand_heads, layer_paths, run_with_cache
from qkv.models.kinds import encoder_of

__all__ = ["attention_rollout", "attention_flow", "residual_attention", "ValueNorms", "value_norm_weights",
           "value_norms", "FLOW_SCALE"]

#: Capacities are rounded to integers after scaling by this (SciPy's max-flow is integer).
FLOW_SCALE = 2**26


def _stack(weights) -> Tensor:
    """A list of L ``(B,H,T,T)`` maps (or an ``(L,B,H,T,T)`` array) as one float64 tensor."""
    if isinstance(weights, (Tensor, np.ndarray)):
        w = torch.as_tensor(weights)
    else:
        w = torch.stack([torch.as_tensor(x) for x in weights])  # L × (B,H,T,T) -> (L,B,H,T,T)
    if w.dim() != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be L maps (B,H,T,T) of self-attention, got {tuple(w.shape)}")
    return w.detach().double()


def residual_attention(weights, residual: bool = True) -> Tensor:
    """Each layer's heads averaged, with the residual: ``(L,B,T,T)`` rows of ``0.5·A + 0.5·I`` renormalised
    (``residual=False``: the head average alone)."""
    a = _stack(weights).mean(2)  # (L,B,H,T,T) -> (L,B,T,T)
    if not residual:
        return a
    a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype)
    return a / a.sum(-1, keepdim=True).clamp_min(1e-30)


def attention_rollout(weights, residual: bool = True, *, all_layers: bool = False) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020, eq. 1).

    Args:
        weights: L attention maps ``(B,H,T,T)`` (rows: queries), e.g. ``EncoderOutput.attentions``.
        residual: add the residual connection, ``0.5·A + 0.5·I`` (the paper's choice).
        all_layers: return the rollout through layers 0 … ℓ for every ℓ.

    Returns:
        ``(B,T,T)`` float64: row i = how much output position i draws from each input token
        (``(L,B,T,T)`` with ``all_layers``).
    """
    a = residual_attention(weights, residual)
    out = [a[0]]
    for layer in range(1, a.shape[0]):
        out.append(a[layer] @ out[-1])  # (B,T,T)(B,T,T) -> (B,T,T)
    return torch.stack(out) if all_layers else out[-1]


def _flow_graph(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges of the layer graph of ``a (L,T,T)``: rows, columns, integer capacities (zero ones left out)."""
    L, T, _ = a.shape
    layer, i, j = np.nonzero(np.rint(a * FLOW_SCALE))
    src = (layer + 1) * T + i  # node (ℓ+1, i)
    dst = layer * T + j  # node (ℓ, j)
    cap = np.rint(a[layer, i, j] * FLOW_SCALE).astype(np.int32)
    return src, dst, cap


def _flows_one(a: np.ndarray, queries: Sequence[int]) -> np.ndarray:
    """``(Q,T)`` max flows from the top-layer nodes ``queries`` to every input token of ``a (L,T,T)``."""
    L, T, _ = a.shape
    src, dst, cap = _flow_graph(a)
    n = (L + 1) * T
    graph = csr_matrix((cap, (src, dst)), shape=(n, n))
    out = np.zeros((len(queries), T))
    for r, q in enumerate(queries):
        for j in range(T):
            out[r, j] = maximum_flow(graph, L * T + q, j).flow_value / FLOW_SCALE
    return out


def attention_flow(weights, residual: bool = True, *, queries: Sequence[int] | None = None,
                   normalize: bool = False, all_layers: bool = False) -> Tensor:
    """Attention flow (Abnar & Zuidema 2020): max flow through the layer graph (see the module docstring).

    Args:
        weights: L attention maps ``(B,H,T,T)``.
        residual: capacities ``0.5·A + 0.5·I`` rows renormalised (the paper's), else the head average.
        queries: the output positions to compute (default all T); a text's cost grows with
            ``len(queries) · T`` max-flow problems.
        normalize: divide each row by its sum (the authors' code).
        all_layers: the flow through layers 0 … ℓ for every ℓ.

    Returns:
        ``(B,Q,T)`` float64 (``(L,B,Q,T)`` with ``all_layers``).
    """
    a = residual_attention(weights, residual).numpy()  # (L,B,T,T)
    L, B, T, _ = a.shape
    qs = list(range(T)) if queries is None else [int(q) for q in queries]
    if any(not 0 <= q < T for q in qs):
        raise ValueError(f"queries must be positions in [0, {T}), got {qs}")
    depths = range(1, L + 1) if all_layers else [L]
    out = np.zeros((len(depths), B, len(qs), T))
    for d, depth in enumerate(depths):
        for b in range(B):
            out[d, b] = _flows_one(a[:depth, b], qs)
    if normalize:
        out = out / np.clip(out.sum(-1, keepdims=True), 1e-30, None)
    result = torch.from_numpy(out)
    return result if all_layers else result[0]


@dataclass
class ValueNorms:
    """Kobayashi et al.'s norms for one layer.

    Attributes:
        per_head: ``(B,H,T,S)`` ``‖α_hij f_h(x_j)‖``.
        summed: ``(B,T,S)`` ``‖Σ_h α_hij f_h(x_j)‖`` (``None`` when not asked for).
        f_norms: ``(B,H,S)`` ``‖f_h(x_j)‖``, what each token sends through each head.
    """

    per_head: Tensor
    summed: Tensor | None
    f_norms: Tensor


@torch.no_grad()
def value_norm_weights(weights: Tensor, values: Tensor, out_weight: Tensor | None, *, summed: bool = True,
                       ) -> ValueNorms:
    """Value-norm weighted attention of one layer.

    Args:
        weights: ``(B,H,T,S)`` attention weights α.
        values: ``(B,G,S,D)`` values ``x W_V + b_V`` (the hook point ``v``; G = H or fewer heads).
        out_weight: the output map's ``(C, H·D)`` weight (``out_proj.weight``), or ``None`` for no map.
        summed: also the layer's ``‖Σ_h α_hij f_h(x_j)‖`` (T passes over ``(B,H,S,C)``; ``None`` without).

    Returns:
        :class:`ValueNorms`.
    """
    B, H, T, S = weights.shape
    v = expand_heads(values.double(), H)  # (B,H,S,D)
    D = v.shape[-1]
    if out_weight is None:
        f = v  # f_h(x) = v_h: the heads are concatenated, each into its own D columns
        f_norms = f.norm(dim=-1)  # (B,H,S)
    else:
        wo = out_weight.detach().double().view(-1, H, D)  # (C,H·D) -> (C,H,D)
        f = torch.einsum("bhsd,chd->bhsc", v, wo)  # (B,H,S,D)(C,H,D) -> (B,H,S,C)
        f_norms = f.norm(dim=-1)  # (B,H,S)
    a = weights.detach().double()
    per_head = a * f_norms[:, :, None, :]  # (B,H,T,S)
    if not summed:
        return ValueNorms(per_head, None, f_norms)
    total = torch.zeros(B, T, S, dtype=torch.float64)
    for i in range(T):  # one query row at a time: (B,H,S,·) work, never (B,H,T,S,C)
        mixed = torch.einsum("bhs,bhsc->bsc", a[:, :, i], f) if out_weight is not None else \
            (a[:, :, i, :, None] * f).transpose(1, 2).reshape(B, S, H * D)  # (B,S,C)
        total[:, i] = mixed.norm(dim=-1)
    return ValueNorms(per_head, total, f_norms)


def value_norms(model, batch: Batch) -> list[ValueNorms]:
    """:class:`ValueNorms` of every layer of a qkv model on ``batch`` (read through the hooks ``weights`` and
    ``v`` of each layer's attention)."""
    paths = layer_paths(model)
    names = [f"{p}.attention.{x}" for p in paths for x in ("weights", "v")]
    with torch.no_grad():
        _, kept = run_with_cache(model, batch, names)
    layers = encoder_of(model).layers
    out = []
    for p, layer in zip(paths, layers):
        proj = layer.attention.out_proj
        out.append(value_norm_weights(kept[f"{p}.attention.weights"], kept[f"{p}.attention.v"],
                                      None if proj is None else proj.weight))
    return out
