"""What the interpretability functions share: a batch of texts as model input, calling any qkv model on it,
the hook names of its layers, and a forward pass that keeps named intermediates.

Legend: B texts, T padded length, L layers, H heads, C width.

Layers and heads are numbered from 0, as the module paths are (:mod:`qkv.analysis.naming`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from qkv.analysis.inputs import AnalysisInputError, tokenizer_view
from qkv.models.kinds import encoder_of
from qkv.nn.hooks import hooks

__all__ = ["Batch", "encode_texts", "call", "layer_paths", "run_with_cache", "n_heads_of", "expand_heads"]


@dataclass(frozen=True)
class Batch:
    """Model input: ``input_ids (B,T)``, ``attention_mask (B,T)`` bool (True = real token), ``token_type_ids
    (B,T)`` or ``None``; ``tokens``: each text's token strings (``[CLS]`` … ``[SEP]``), unpadded."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor | None = None
    tokens: tuple[tuple[str, ...], ...] = ()

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def row(self, i: int) -> Batch:
        """Text i alone, without padding."""
        n = int(self.attention_mask[i].sum())
        types = None if self.token_type_ids is None else self.token_type_ids[i : i + 1, :n]
        return Batch(self.input_ids[i : i + 1, :n], self.attention_mask[i : i + 1, :n], types,
                     self.tokens[i : i + 1])


def encode_texts(tokenizer, texts: Sequence[str], *, max_len: int, truncate: bool = False) -> Batch:
    """``[CLS] text [SEP]`` for each text, right-padded with ``[PAD]``.

    Raises:
        AnalysisInputError: no texts, an empty text, or one longer than ``max_len`` tokens unless ``truncate``.
    """
    view = tokenizer_view(tokenizer)
    if not texts:
        raise AnalysisInputError("no texts given")
    rows = []
    for i, ids in enumerate(view.encode(list(texts))):
        if len(ids) == 0:
            raise AnalysisInputError(f"text {i} is empty: it gives no tokens")
        if len(ids) + 2 > max_len and not truncate:
            raise AnalysisInputError(f"text {i} has {len(ids) + 2} tokens with [CLS] and [SEP], more than "
                                     f"{max_len}; shorten it or truncate")
        rows.append([view.cls_id, *ids[: max_len - 2].tolist(), view.sep_id])
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), view.pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, True
    tokens = tuple(tuple(view.id_to_token(t) for t in r) for r in rows)
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), None, tokens)


def call(model: nn.Module, batch: Batch, **kwargs):
    """``model`` on ``batch`` (padded path; segment ids passed when the batch has them)."""
    extra = {} if batch.token_type_ids is None else {"token_type_ids": batch.token_type_ids}
    return model(batch.input_ids, attention_mask=batch.attention_mask, **extra, **kwargs)


def layer_paths(model: nn.Module) -> list[str]:
    """The module path of each layer of the model's encoder stack (``encoder.layers.0``, …): hook names are
    ``f"{path}.resid_post"``, ``f"{path}.attention.weights"``.

    Raises:
        AnalysisInputError: a model that is not qkv's (convert it with ``qkv.load``).
    """
    try:
        stack = encoder_of(model)
    except ValueError as exc:
        raise AnalysisInputError(f"{exc}; hooks need a qkv model: load the folder with qkv.load") from None
    names = {id(m): n for n, m in model.named_modules()}
    return [names[id(layer)] for layer in stack.layers]


def run_with_cache(model: nn.Module, batch: Batch, names: Sequence[str], *, detach: bool = True):
    """Run ``model`` on ``batch`` keeping the tensors at ``names`` (hook names): ``(output, {name: tensor})``.

    With ``detach=False`` the kept tensors stay in the autograd graph (for :func:`torch.autograd.grad`).
    """
    kept: dict[str, Tensor] = {}

    def keep(t: Tensor, name: str) -> None:
        kept[name] = t.detach() if detach else t

    with hooks(model, {n: keep for n in names}):
        out = call(model, batch)
    return out, kept


def n_heads_of(model: nn.Module) -> int:
    """H of the model's encoder stack."""
    return encoder_of(model).layers[0].attention.n_heads


def expand_heads(v: Tensor, n_heads: int) -> Tensor:
    """Values of G heads for H query heads: ``(B,G,S,D)`` → ``(B,H,S,D)``."""
    g = v.shape[1]
    return v if g == n_heads else v.repeat_interleave(n_heads // g, dim=1)
