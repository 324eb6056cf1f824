"""Tokens → windows → length-grouped batches.

Legend: B windows in a batch, T padded length, W window length (tokens incl. ``[CLS]``/``[SEP]``),
S span = W − 2 content tokens per window.

A document of n content tokens (no special tokens) becomes windows ``[CLS] t[a:a+S] [SEP]`` with
starts ``a = 0, stride, 2·stride, …`` while ``a + S < n``, plus a last window ending exactly at
the document's end (``a = n − S``), so that every token is covered and every window but a short
document's only one holds S content tokens. Nothing is dropped unless truncation is asked for,
which keeps the first window only and is counted.

Batching: the windows of a chunk of documents are sorted by length (longest first, ties in input
order) and cut into batches of ``batch_size`` windows, so that windows of similar length share a
batch and little padding is computed. Results are scattered back to input order by index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qkv.embeddings.errors import EmbeddingError

__all__ = ["Windows", "window_starts", "make_windows", "length_batches", "pad_batch"]


def window_starts(n: int, span: int, stride: int) -> list[int]:
    """Start offsets of the windows over ``n`` content tokens (see the module docstring)."""
    if n <= span:
        return [0]
    starts = list(range(0, n - span, stride))
    starts.append(n - span)
    return starts


@dataclass
class Windows:
    """The windows of a chunk of documents.

    Attributes:
        ids: per window, its token ids with ``[CLS]``/``[SEP]``, ``(W_i,)`` int64.
        doc: per window, the index of its document within the chunk.
        long: documents longer than one window.
        truncated: documents cut to their first window (only with truncation).
        tokens: content tokens in the chunk (before truncation).
    """

    ids: list[np.ndarray] = field(default_factory=list)
    doc: list[int] = field(default_factory=list)
    long: int = 0
    truncated: int = 0
    tokens: int = 0

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(w) for w in self.ids), dtype=np.int64, count=len(self.ids))


def make_windows(token_ids: Sequence[np.ndarray], *, window: int, stride: int, truncate: bool,
                 cls_id: int, sep_id: int) -> Windows:
    """Split each document's content ids into windows of at most ``window`` tokens."""
    span = window - 2
    if span < 1:
        raise EmbeddingError(f"window length {window} leaves no room for text between [CLS] and [SEP]")
    out = Windows()
    head, tail = np.array([cls_id], np.int64), np.array([sep_id], np.int64)
    for d, ids in enumerate(token_ids):
        n = len(ids)
        out.tokens += n
        starts = window_starts(n, span, stride)
        out.long += len(starts) > 1
        if truncate and len(starts) > 1:
            starts = starts[:1]
            out.truncated += 1
        for a in starts:
            out.ids.append(np.concatenate([head, ids[a:a + span], tail]))
            out.doc.append(d)
    return out


def length_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Window indices grouped into batches of similar length (longest first, stable)."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def pad_batch(windows: Sequence[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad windows → ``(B,T)`` ids and ``(B,T)`` boolean mask (True = real token)."""
    T = max(len(w) for w in windows)
    ids = np.full((len(windows), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(windows), T), dtype=bool)
    for i, w in enumerate(windows):
        ids[i, :len(w)] = w
        mask[i, :len(w)] = True
    return ids, mask
