"""The tokenizer of a model, as :func:`qkv.load` returns it: callable on texts.

:class:`ModelTokenizer` is the ``tokenizers.Tokenizer`` of a model folder (every method of it works
on the wrapper) with the special tokens the folder declares (:mod:`qkv.data.special_tokens`);
calling it gives padded tensors and the mask in the tokenizer's own template, ready for
``model(**batch)``. Reading, viewing and saving tokenizers is :mod:`qkv.data.tokenizer_facade`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from tokenizers import Tokenizer

from qkv.data.errors import TokenizerError
from qkv.data.special_tokens import read_declared, resolve_specials
from qkv.data.tokenizer_facade import TokenizerView, as_backend, read_tokenizer

__all__ = ["ModelTokenizer", "read_model_tokenizer"]


class ModelTokenizer:
    """The tokenizer of a model folder, as :func:`qkv.load` returns it: the ``tokenizers.Tokenizer``
    (every method of it works here: ``encode``, ``decode``, ``token_to_id``, …) with the special
    tokens its folder declares, callable on texts.

        model, tokenizer = qkv.load(folder)
        batch = tokenizer(["a short text", "a longer text than that"])  # padded tensors and the mask
        out = model(**batch)

    Args:
        backend: the ``tokenizers.Tokenizer``.
        declared: role → token the folder declares (:func:`qkv.data.special_tokens.read_declared`).

    Attributes:
        backend: the ``tokenizers.Tokenizer`` (its settings are left as they are).
        specials: its :class:`~qkv.data.special_tokens.Specials`.
    """

    def __init__(self, backend, declared: dict[str, str] | None = None):
        self.backend = as_backend(backend)
        self.specials = resolve_specials(self.backend, declared)
        self._view: TokenizerView | None = None

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("backend", "specials"):
            raise AttributeError(name)
        return getattr(self.backend, name)  # the tokenizers.Tokenizer API

    def __getstate__(self) -> dict:
        return {"json": self.backend.to_str(), "declared": dict(self.specials.declared)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(Tokenizer.from_str(state["json"]), state["declared"])

    def __repr__(self) -> str:
        return f"ModelTokenizer(vocab_size={self.backend.get_vocab_size()}, {self.specials.describe()})"

    @property
    def view(self) -> TokenizerView:
        """The :class:`TokenizerView` of this tokenizer (made once)."""
        if self._view is None:
            self._view = TokenizerView(self)
        return self._view

    def __call__(self, texts: str | Sequence[str], text_pairs: str | Sequence[str] | None = None, *,
                 max_len: int | None = None, truncation: bool = False, return_tensors: str = "pt") -> dict:
        """Texts (and second texts) → ``{"input_ids", "attention_mask"}`` (plus ``"token_type_ids"``
        for pairs): ``(B,T)`` int64, right-padded with the padding token, the mask 1 on real tokens;
        each text inside the tokenizer's template (``[CLS] … [SEP]``, ``<s> … </s>``).

        Args:
            texts: one text or a list.
            text_pairs: the second text of each pair (same count).
            max_len: the longest input allowed (special tokens included); ``None``: no limit.
            truncation: cut longer inputs to ``max_len`` (the longer text of a pair first);
                without it a longer input is an error naming it.
            return_tensors: ``"pt"`` (torch) or ``"np"`` (NumPy).

        Raises:
            TokenizerError: an input longer than ``max_len`` without ``truncation``; mismatched
                pairs; an unknown ``return_tensors``.
        """
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        pairs = None if text_pairs is None else ([text_pairs] if isinstance(text_pairs, str) else list(text_pairs))
        if pairs is not None and len(pairs) != len(texts):
            raise TokenizerError(f"{len(texts)} texts but {len(pairs)} text_pairs; give one second text per text")
        if return_tensors not in ("pt", "np"):
            raise TokenizerError(f"return_tensors={return_tensors!r} is not allowed; allowed: pt, np")
        view = self.view
        firsts = view.encode(texts)
        seconds = view.encode(pairs) if pairs is not None else [None] * len(texts)
        rows, types = [], []
        for i, (a, b) in enumerate(zip(firsts, seconds)):
            a, b = _fit(view, a, b, max_len, truncation, i)
            ids = view.frame(a, b)
            rows.append(np.asarray(ids, dtype=np.int64))
            n_first = len(view.prefix) + len(a) + (len(view.specials.pair_middle) if b is not None else len(view.suffix))
            types.append(np.asarray([0] * n_first + [view.specials.pair_type] * (len(ids) - n_first), np.int64))
        T = max(len(r) for r in rows)
        out = {"input_ids": np.full((len(rows), T), view.pad_id, np.int64),
               "attention_mask": np.zeros((len(rows), T), np.int64)}
        if pairs is not None:
            out["token_type_ids"] = np.zeros((len(rows), T), np.int64)
        for i, r in enumerate(rows):
            out["input_ids"][i, :len(r)] = r  # (B,T)
            out["attention_mask"][i, :len(r)] = 1
            if pairs is not None:
                out["token_type_ids"][i, :len(r)] = types[i]
        return {k: torch.from_numpy(v) for k, v in out.items()} if return_tensors == "pt" else out


def _fit(view: TokenizerView, a: np.ndarray, b: np.ndarray | None, max_len: int | None, truncation: bool,
         i: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``a`` (and ``b``) cut to fit ``max_len`` with the template, or an error naming input ``i``."""
    sp = view.specials
    extra = len(view.prefix) + (len(sp.pair_middle) + len(sp.pair_suffix) if b is not None else len(view.suffix))
    total = len(a) + (len(b) if b is not None else 0) + extra
    if max_len is None or total <= max_len:
        return a, b
    if not truncation:
        raise TokenizerError(f"text {i} has {total} tokens with its special tokens, more than max_len={max_len}; "
                             "shorten it, raise max_len, or pass truncation=True")
    room = max_len - extra
    if room < (2 if b is not None else 1):
        raise TokenizerError(f"max_len={max_len} leaves no room for text beside {extra} special tokens")
    if b is None:
        return a[:room], None
    while len(a) + len(b) > room:  # the longer text loses a token first, as transformers' longest_first
        if len(a) >= len(b):
            a = a[:-1]
        else:
            b = b[:-1]
    return a, b


def read_model_tokenizer(folder: str | os.PathLike) -> ModelTokenizer | None:
    """A model folder's tokenizer (:func:`read_tokenizer`) as a :class:`ModelTokenizer` with the
    special tokens the folder declares; ``None`` when it has none."""
    backend = read_tokenizer(folder)
    return None if backend is None else ModelTokenizer(backend, read_declared(folder))
