"""Pooling: token vectors of one window → one vector, and the choice of layers.

Legend: B windows in a batch, T length, C model width, N packed tokens, K pooling modes.

Every mode is mask-aware: padding positions never contribute. The ``[CLS]`` and ``[SEP]`` tokens
are real tokens, as in sentence-transformers' ``Pooling`` module, whose definitions these are
(``sentence_transformers.sentence_transformer.modules.pooling``, texts without a prompt).
:func:`pool` takes a padded ``(B,T,C)`` batch (right padding) and its mask, :func:`pool_packed`
the ``(N,C)`` states of a :class:`~qkv.nn.packed.PackedBatch` (no padding; same numbers).

==============  =========================================================================
mode            vector of a window with real tokens h_1 … h_n
==============  =========================================================================
mean            Σ h_i / n
cls             h_1 (the ``[CLS]`` position)
max             element-wise max over the real tokens
mean_sqrt_len   Σ h_i / √n  (sentence-transformers' ``mean_sqrt_len_tokens``)
weightedmean    Σ i·h_i / Σ i  (position weights 1 … n; sentence-transformers' ``weightedmean``)
lasttoken       h_n (the last real token: ``[SEP]`` for a BERT window)
==============  =========================================================================

Several modes at once (``"cls+mean"``, or the tuple ``("cls", "mean")``) concatenate their vectors
in the order given: ``(B, K·C)``, as sentence-transformers does for a tuple ``pooling_mode``.
A pooling value is kept in one canonical form, the ``"+"``-joined string (:func:`check_pooling`);
:func:`pooling_modes` splits it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from qkv.embeddings.errors import EmbeddingError
from qkv.nn.packed import PackedBatch

__all__ = ["POOLINGS", "pool", "pool_packed", "select_layers", "check_pooling", "pooling_modes",
           "normalize_layers", "forward_pooled", "forward_pooled_packed"]

#: The single pooling modes; join several with ``"+"`` (see the module docstring).
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken")


def check_pooling(pooling) -> str:
    """The canonical form of a pooling value: a mode of :data:`POOLINGS`, several joined with
    ``"+"`` (``"cls+mean"``), or a tuple/list of modes (``("cls", "mean")`` → ``"cls+mean"``).

    Raises:
        EmbeddingError: not a string or a sequence of strings, empty, or an unknown mode (named,
            with the allowed ones).
    """
    if isinstance(pooling, str):
        modes = pooling.split("+")
    elif isinstance(pooling, (tuple, list)) and all(isinstance(m, str) for m in pooling):
        modes = list(pooling)
    else:
        raise EmbeddingError(f"pooling must be a mode name, several joined with '+' (e.g. 'cls+mean') or a "
                             f"tuple of mode names, got {pooling!r}; allowed modes: {', '.join(POOLINGS)}")
    modes = [m.strip() for m in modes]
    for m in modes:
        if m not in POOLINGS:
            which = f" (mode {m!r})" if len(modes) > 1 else ""
            raise EmbeddingError(f"pooling={pooling!r} is not allowed{which}; allowed: "
                                 f"{', '.join(POOLINGS)}, or several joined with '+' (e.g. 'cls+mean': their "
                                 "vectors concatenated)")
    return "+".join(modes)


def pooling_modes(pooling) -> tuple[str, ...]:
    """The modes of a pooling value, in concatenation order (``"cls+mean"`` → ``("cls", "mean")``)."""
    return tuple(check_pooling(pooling).split("+"))


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


def pool(hidden: Tensor, mask: Tensor, pooling) -> Tensor:
    """Pool token vectors into one vector per window.

    Args:
        hidden: ``(B,T,C)`` token vectors, right-padded.
        mask: ``(B,T)`` True/1 for real tokens (a prefix of each row); every row must have at least one.
        pooling: a pooling value (see :func:`check_pooling`) of K modes.

    Returns:
        ``(B,K·C)`` window vectors, in ``hidden``'s dtype.
    """
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B,T) -> (B,T,1)
    n = m.sum(dim=1).clamp_min(1.0)  # (B,1) real tokens per window
    out = []
    for mode in pooling_modes(pooling):
        if mode == "cls":
            out.append(hidden[:, 0])  # (B,T,C) -> (B,C)
        elif mode == "lasttoken":
            last = (n.squeeze(-1).long() - 1)[:, None, None].expand(-1, 1, hidden.shape[-1])  # (B,1,C)
            out.append(hidden.gather(1, last).squeeze(1))  # (B,T,C) -> (B,C)
        elif mode == "max":
            out.append(hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(dim=1))  # (B,C)
        elif mode == "weightedmean":  # in float32: Σ i reaches n(n+1)/2, beyond float16's range
            pos = torch.arange(1, hidden.shape[1] + 1, dtype=torch.float32, device=hidden.device)  # (T,)
            w = m.float() * pos[None, :, None]  # (B,T,1) weight i at position i, 0 on padding
            out.append(((hidden.float() * w).sum(dim=1) / w.sum(dim=1)).to(hidden.dtype))  # (B,T,C) -> (B,C)
        else:  # mean, mean_sqrt_len
            total = (hidden * m).sum(dim=1)  # (B,T,C) -> (B,C)
            out.append(total / (n if mode == "mean" else n.sqrt()))
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)  # (B,K·C)


def forward_pooled(encoder, input_ids: Tensor, attention_mask: Tensor, pooling,
                   layers: tuple[int, ...]) -> Tensor:
    """Run ``encoder`` on a padded batch and pool: ``(B,T)`` ids and mask → ``(B,K·C)``.

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
    return pool(hidden, attention_mask, pooling)  # (B,K·C)


def pool_packed(hidden: Tensor, batch: PackedBatch, pooling) -> Tensor:
    """Pool the packed token vectors of each sequence: ``(N,C)`` → ``(B,K·C)``.

    Args:
        hidden: ``(N,C)`` token vectors of ``batch``'s sequences back to back.
        batch: the packed batch; every sequence must have at least one token.
        pooling: a pooling value (see :func:`check_pooling`) of K modes.
    """
    modes = pooling_modes(pooling)
    seq = batch.sequence_ids()  # (N,)
    B, C = len(batch.lengths), hidden.shape[1]
    lengths = torch.tensor(batch.lengths, dtype=torch.long, device=hidden.device)  # (B,)
    n = lengths.to(hidden.dtype).clamp_min(1.0)[:, None]  # (B,1)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(hidden[batch.starts])  # (N,C) -> (B,C) each sequence's first token
        elif mode == "lasttoken":
            out.append(hidden[batch.starts + lengths - 1])  # (N,C) -> (B,C) each sequence's last token
        elif mode == "max":
            top = hidden.new_full((B, C), torch.finfo(hidden.dtype).min)
            out.append(top.scatter_reduce_(0, seq[:, None].expand(-1, C), hidden, reduce="amax"))  # (B,C)
        elif mode == "weightedmean":  # in float32, as in pool()
            pos = (torch.arange(len(seq), device=hidden.device) - batch.starts[seq] + 1).float()  # (N,) 1…n
            weighted = hidden.float() * pos[:, None]  # (N,C)
            total = hidden.new_zeros(B, C, dtype=torch.float32).index_add_(0, seq, weighted)  # (N,C) -> (B,C)
            nf = lengths.float().clamp_min(1.0)[:, None]  # (B,1)
            out.append((total / (nf * (nf + 1) / 2)).to(hidden.dtype))  # (N,C) -> (B,C); Σ i for i = 1 … n
        else:  # mean, mean_sqrt_len
            total = hidden.new_zeros(B, C).index_add_(0, seq, hidden)  # (N,C) -> (B,C) per-sequence sums
            out.append(total / (n if mode == "mean" else n.sqrt()))
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)  # (B,K·C)


def forward_pooled_packed(encoder, batch: PackedBatch, pooling, layers: tuple[int, ...]) -> Tensor:
    """Run ``encoder`` on a packed batch (no padded position computed) and pool: → ``(B,K·C)``.

    Same numbers as :func:`forward_pooled` on the right-padded batch (up to float rounding).
    """
    if layers == (len(encoder.layers),):
        hidden = encoder.forward_packed(batch).last_hidden_state  # (N,C)
    else:
        hidden = select_layers(encoder.forward_packed(batch, output_hidden_states=True).hidden_states, layers)
    return pool_packed(hidden, batch, pooling)  # (B,K·C)
