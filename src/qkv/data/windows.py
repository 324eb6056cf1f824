"""Token sequences → model windows → length-grouped, padded batches: the one long-text windower of
the embedder, the analysis, fine-tuning and contrastive training.

Legend: B windows in a batch, T padded length, W window length (tokens incl. the special tokens),
S span = W − (special tokens) content tokens per window, n content tokens of a document.

A document of n content tokens (no special tokens) becomes windows ``prefix t[a:a+S] suffix`` — the
tokenizer's own template, ``[CLS] … [SEP]`` for BERT, ``<s> … </s>`` for RoBERTa, nothing for a
tokenizer without one (:mod:`qkv.data.special_tokens`) — with starts ``a = 0, stride, 2·stride, …``. Where the last window ends (:func:`window_starts`):

* ``cover_end=True`` (embeddings, fine-tuning): starts while ``a + S < n``, plus a last window
  ending exactly at the document's end (``a = n − S``), so that every token is covered and every
  window but a short document's only one holds S content tokens (windows may overlap);
* ``cover_end=False`` (analysis, with ``stride = S``): consecutive windows, the last one holding
  the rest (no token in two windows).

Nothing is dropped unless asked for: ``truncate`` keeps a document's first window only,
``max_windows`` its first windows; cut documents are counted.

Batching: windows are sorted by length (longest first, ties in input order) and cut into batches
of ``batch_size`` windows (:func:`length_batches`), so that windows of similar length share a
batch and little padding is computed; :func:`pad_batch` pads one batch. Results are scattered
back to input order by index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Windows", "window_starts", "make_windows", "length_batches", "pad_batch"]


def window_starts(n: int, span: int, stride: int, *, cover_end: bool = True) -> list[int]:
    """Start offsets of the windows over ``n`` content tokens (see the module docstring)."""
    if n <= span:
        return [0]
    if not cover_end:
        return list(range(0, n, stride))
    starts = list(range(0, n - span, stride))
    starts.append(n - span)
    return starts


@dataclass
class Windows:
    """The windows of a chunk of documents.

    Attributes:
        ids: per window, its token ids with the special tokens, ``(W_i,)`` int64.
        doc: per window, the index of its document within the chunk.
        start: per window, the offset of its first content token in its document.
        long: documents longer than one window.
        truncated: documents cut to their first window(s) (``truncate`` / ``max_windows``).
        tokens: content tokens in the chunk (before truncation).
    """

    ids: list[np.ndarray] = field(default_factory=list)
    doc: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    long: int = 0
    truncated: int = 0
    tokens: int = 0

    @property
    def lengths(self) -> np.ndarray:
        """``(windows,)`` int64: each window's length, the special tokens included."""
        return np.fromiter((len(w) for w in self.ids), dtype=np.int64, count=len(self.ids))


def make_windows(token_ids: Sequence[np.ndarray], *, window: int, stride: int | None = None, truncate: bool = False,
                 max_windows: int | None = None, cover_end: bool = True, skip_empty: bool = False,
                 prefix: Sequence[int] = (), suffix: Sequence[int] = ()) -> Windows:
    """Split each document's content ids into windows of at most ``window`` tokens.

    Args:
        token_ids: per document, its content token ids ``(n_i,)`` (no special tokens).
        window: W, the window length including the special tokens (room for at least one more).
        stride: content tokens between window starts (default S: consecutive windows).
        truncate: keep only each document's first window.
        max_windows: keep only each document's first this-many windows (``None``: all).
        cover_end: the last window ends at the document's end (see the module docstring).
        skip_empty: a document without tokens gives no window (else one of the special tokens only).
        prefix, suffix: the ids put before and after each window's text (``TokenizerView.prefix`` /
            ``.suffix``: ``[CLS]`` and ``[SEP]`` for BERT).

    Raises:
        ValueError: a window without room for text, or a stride outside ``[1, S]``.
    """
    head, tail = np.asarray(prefix, np.int64).reshape(-1), np.asarray(suffix, np.int64).reshape(-1)
    span = window - len(head) - len(tail)
    if span < 1:
        raise ValueError(f"window length {window} leaves no room for text beside the {len(head) + len(tail)} "
                         f"special tokens; use a window of at least {len(head) + len(tail) + 1} tokens")
    stride = span if stride is None else stride
    if not 1 <= stride <= span:
        raise ValueError(f"stride={stride} must be in [1, {span}] (the window holds {span} text tokens)")
    keep = 1 if truncate else max_windows
    out = Windows()
    for d, ids in enumerate(token_ids):
        n = len(ids)
        out.tokens += n
        if skip_empty and n == 0:
            continue
        starts = window_starts(n, span, stride, cover_end=cover_end)
        out.long += len(starts) > 1
        if keep is not None and len(starts) > keep:
            starts = starts[:keep]
            out.truncated += 1
        for a in starts:
            out.ids.append(np.concatenate([head, np.asarray(ids[a:a + span], dtype=np.int64), tail]))
            out.doc.append(d)
            out.start.append(a)
    return out


def length_batches(lengths: np.ndarray, batch_size: int, max_tokens: int | None = None) -> list[np.ndarray]:
    """Window indices grouped into batches of similar length (longest first, stable): ``(B,)`` each.

    A batch holds at most ``batch_size`` windows and, when ``max_tokens`` is given, at most
    ``max_tokens`` tokens in all (a window longer than that is a batch on its own): the work of a
    padding-free batch grows with its tokens, so batching by tokens keeps batches of short and of
    long windows equally large.
    """
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    if max_tokens is None:
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    batches, start, tokens = [], 0, 0
    for i, w in enumerate(order):
        n = int(lengths[w])
        if i > start and (i - start >= batch_size or tokens + n > max_tokens):
            batches.append(order[start:i])
            start, tokens = i, 0
        tokens += n
    if start < len(order):
        batches.append(order[start:])
    return batches


def pad_batch(windows: Sequence[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad windows → ``(B,T)`` int64 ids and ``(B,T)`` boolean mask (True = real token)."""
    T = max(len(w) for w in windows)
    ids = np.full((len(windows), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(windows), T), dtype=bool)
    for i, w in enumerate(windows):
        ids[i, :len(w)] = w
        mask[i, :len(w)] = True
    return ids, mask
