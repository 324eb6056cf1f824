"""Pooling: token vectors of one window → one vector, and the choice of layers.

Legend: B windows in a batch, T length, C model width, L selected layers.

Every mode is mask-aware: padding positions never contribute. The ``[CLS]`` and ``[SEP]`` tokens
are real tokens (as in sentence-transformers' mean pooling, whose numbers ``mean`` reproduces).

==============  =====================================================================
mode            vector of a window with real tokens h_1 … h_n (mask m)
==============  =====================================================================
mean            Σ h_i / n
cls             h_1 (the ``[CLS]`` position)
max             element-wise max over the real tokens
mean_sqrt_len   Σ h_i / √n  (sentence-transformers' ``mean_sqrt_len_tokens``)
==============  =====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from qkv.embeddings.errors import EmbeddingError
from qkv.validation import check_choice

__all__ = ["POOLINGS", "pool", "select_layers", "check_pooling", "normalize_layers"]

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")


def check_pooling(pooling: str) -> str:
    check_choice("pooling", pooling, POOLINGS, error=EmbeddingError)
    return pooling


def normalize_layers(layers: int | Sequence[int], n_layers: int) -> tuple[int, ...]:
    """Layer indices into ``hidden_states`` (0 = embedding output, ``n_layers`` = last layer;
    negative counts from the end, ``-1`` = last) → sorted non-negative, without repeats.

    Raises:
        EmbeddingError: an empty selection, a non-integer or an index out of range.
    """
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = (layers,)
    try:
        layers = tuple(layers)
    except TypeError:
        raise EmbeddingError(f"layers must be an int or a sequence of ints, got {layers!r}") from None
    if not layers:
        raise EmbeddingError("layers is empty; give at least one layer index (e.g. -1 for the last)")
    out = set()
    for i in layers:
        if not isinstance(i, int) or isinstance(i, bool) or not -(n_layers + 1) <= i <= n_layers:
            raise EmbeddingError(
                f"layer index {i!r} is out of range for a model with {n_layers} layers; allowed: "
                f"0 (embedding output) … {n_layers} (last layer), or -1 … -{n_layers + 1} from the end")
        out.add(i % (n_layers + 1))
    return tuple(sorted(out))


def select_layers(hidden_states: Sequence[Tensor], layers: tuple[int, ...]) -> Tensor:
    """Token-wise mean of the chosen ``(B,T,C)`` hidden states → ``(B,T,C)``."""
    if len(layers) == 1:
        return hidden_states[layers[0]]
    total = hidden_states[layers[0]]
    for i in layers[1:]:
        total = total + hidden_states[i]  # (B,T,C)
    return total / len(layers)


def pool(hidden: Tensor, mask: Tensor, pooling: str) -> Tensor:
    """Pool token vectors into one vector per window.

    Args:
        hidden: ``(B,T,C)`` token vectors.
        mask: ``(B,T)`` True/1 for real tokens; every row must have at least one.
        pooling: one of :data:`POOLINGS`.

    Returns:
        ``(B,C)`` window vectors, in ``hidden``'s dtype.
    """
    check_pooling(pooling)
    if pooling == "cls":
        return hidden[:, 0]  # (B,T,C) -> (B,C)
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B,T) -> (B,T,1)
    if pooling == "max":
        neg = torch.finfo(hidden.dtype).min
        return hidden.masked_fill(m == 0, neg).amax(dim=1)  # (B,T,C) -> (B,C)
    total = (hidden * m).sum(dim=1)  # (B,T,C) -> (B,C)
    n = m.sum(dim=1).clamp_min(1.0)  # (B,1)
    return total / (n if pooling == "mean" else n.sqrt())


def forward_pooled(encoder, input_ids: Tensor, attention_mask: Tensor, pooling: str,
                   layers: tuple[int, ...]) -> Tensor:
    """Run ``encoder`` on a padded batch and pool: ``(B,T)`` ids and mask → ``(B,C)``.

    ``layers`` are non-negative indices into ``hidden_states`` (see :func:`normalize_layers`); the
    last layer alone needs no hidden states and takes the cheaper path. Differentiable (used by
    contrastive training as well as by the embedder).
    """
    n_layers = len(encoder.layers)
    if layers == (n_layers,):
        hidden = encoder(input_ids, attention_mask).last_hidden_state  # (B,T,C)
    else:
        out = encoder(input_ids, attention_mask, output_hidden_states=True)
        hidden = select_layers(out.hidden_states, layers)  # (B,T,C)
    return pool(hidden, attention_mask, pooling)  # (B,C)
