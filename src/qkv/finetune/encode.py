"""Examples → token windows → training and evaluation batches.

Legend: B windows in a batch, T padded length, W window length (``max_len``, the special tokens
included), S = W − (special tokens: 2 for ``[CLS]``/``[SEP]`` or ``<s>``/``</s>``) content tokens per
window.

Sequence tasks: each text becomes windows exactly as in ``qkv embed``
(:func:`qkv.data.windows.make_windows`): ``[CLS] t[a:a+S] [SEP]`` (the tokenizer's own template) at starts 0, stride, … and a
last window ending at the text's end, so every token is seen; each window carries its example's
target. At evaluation the class probabilities (or regression outputs) of an example's windows are
averaged. With ``truncate`` only the first window is kept; how many examples were cut is counted.

Token tasks: the words are tokenised as given (pre-tokenised); the label of a word sits on its
first piece, the others get -100 (ignored). A word the tokenizer turns into no piece becomes
the unknown token, so that every word has a prediction. A sentence longer than S pieces is cut at word
boundaries into consecutive windows (counted); predictions are concatenated back.

Batches: :class:`TaskBatches` orders the training windows per epoch by a permutation seeded from
``(seed, epoch)``, groups windows of similar length (sorted within chunks of 50 batches, then the
batches of a chunk shuffled) and returns micro-batch ``i`` as a pure function of ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from qkv.data.masking import IGNORE_INDEX
from qkv.data.tokenizer_facade import TokenizerView
from qkv.data.windows import make_windows, pad_batch

__all__ = ["Encoded", "TaskBatch", "TaskBatches", "encode_sequences", "encode_tagged", "eval_batches"]


@dataclass
class Encoded:
    """The windows of a split: ids ``(W_i,)``, the example of each window, and per-window targets
    (class id, float, or a ``(W_i,)`` array of tag ids with -100 off first pieces)."""

    ids: list[np.ndarray]
    example: np.ndarray
    targets: list
    n_examples: int
    long: int = 0  # examples longer than one window
    truncated: int = 0  # examples cut to their first window (truncate=True); token tasks: words cut
    word_first: list[np.ndarray] | None = None  # token tasks: per window, positions of first pieces

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(w) for w in self.ids), dtype=np.int64, count=len(self.ids))


@dataclass
class TaskBatch:
    """``input_ids``/``attention_mask`` ``(B,T)``; ``labels`` ``(B,)`` (long, or float for
    regression) or ``(B,T)`` with -100 where not scored; ``rows`` the window indices."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    rows: np.ndarray

    def to(self, device) -> TaskBatch:
        return TaskBatch(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device),
                         self.rows)


def encode_sequences(tok: TokenizerView, texts, targets, *, max_len: int, stride: int, truncate: bool) -> Encoded:
    """Windows of each text; ``targets`` already numeric (class ids or floats)."""
    wins = make_windows(tok.encode(texts), window=max_len, stride=stride, truncate=truncate,
                        prefix=tok.prefix, suffix=tok.suffix)
    doc = np.asarray(wins.doc, dtype=np.int64)
    return Encoded(wins.ids, doc, [targets[d] for d in wins.doc], len(texts), wins.long, wins.truncated)


def _word_pieces(tok: TokenizerView, sentences) -> list[list[np.ndarray]]:
    """Per sentence, per word, its piece ids (``[UNK]`` for a word with none)."""
    fill = np.asarray([next(i for i in (tok.unk_id, tok.sep_id, tok.pad_id) if i is not None)], dtype=np.int64)
    return [[p if len(p) else fill for p in words] for words in tok.encode_pretokenized(sentences)]


def encode_tagged(tok: TokenizerView, sentences, tag_ids, *, max_len: int) -> Encoded:
    """Windows of word-aligned pieces; ``tag_ids`` per sentence, per word (ints)."""
    span = max_len - tok.n_special
    ids, example, targets, firsts, long, cut = [], [], [], [], 0, 0
    for s, words in enumerate(_word_pieces(tok, sentences)):
        chunks, cur, n = [], [], 0
        for w, pieces in enumerate(words):
            cut += len(pieces) > span  # a single word longer than a window keeps its first pieces (counted)
            pieces = pieces[:span]
            if n + len(pieces) > span and cur:
                chunks.append(cur)
                cur, n = [], 0
            cur.append(w)
            n += len(pieces)
        chunks.append(cur)
        long += len(chunks) > 1
        for chunk in chunks:
            seq = list(tok.prefix)
            lab = [IGNORE_INDEX] * len(seq)
            first = []
            for w in chunk:
                pieces = words[w][:span]
                first.append(len(seq))
                seq.extend(int(p) for p in pieces)
                lab.extend([int(tag_ids[s][w])] + [IGNORE_INDEX] * (len(pieces) - 1))
            seq.extend(tok.suffix)
            lab.extend([IGNORE_INDEX] * len(tok.suffix))
            ids.append(np.asarray(seq, dtype=np.int64))
            targets.append(np.asarray(lab, dtype=np.int64))
            firsts.append(np.asarray(first, dtype=np.int64))
            example.append(s)
    return Encoded(ids, np.asarray(example, dtype=np.int64), targets, len(sentences), long, cut, firsts)


def _collate(enc: Encoded, rows: np.ndarray, pad_id: int, regression: bool) -> TaskBatch:
    ids, mask = pad_batch([enc.ids[r] for r in rows], pad_id)  # (B,T), (B,T)
    if enc.word_first is not None:  # token labels, padded with -100 like the ids
        labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
        for i, r in enumerate(rows):
            labels[i, :len(enc.targets[r])] = enc.targets[r]
        lab = torch.from_numpy(labels)
    else:
        lab = torch.tensor([enc.targets[r] for r in rows], dtype=torch.float32 if regression else torch.long)
    return TaskBatch(torch.from_numpy(ids), torch.from_numpy(mask), lab, np.asarray(rows))


class TaskBatches:
    """Training micro-batches over the windows of ``enc``, a pure function of their index.

    Each epoch is a permutation seeded from ``(seed, epoch)``; the windows of a chunk of 50 batches
    are sorted by length, cut into batches, and the chunk's batches shuffled. With ``world_size``
    K, global batch ``i`` holds ``K · batch_size`` windows and rank r takes every K-th.
    """

    def __init__(self, enc: Encoded, batch_size: int, *, seed: int, pad_id: int, regression: bool,
                 rank: int = 0, world_size: int = 1):
        self.enc, self.batch_size, self.seed, self.pad_id = enc, batch_size, seed, pad_id
        self.regression, self.rank, self.world_size = regression, rank, world_size
        self.global_size = batch_size * world_size
        self.per_epoch = max(1, -(-len(enc.ids) // self.global_size))
        self._epoch, self._batches = -1, []

    def _plan(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch, 0x51F7])
        order = rng.permutation(len(self.enc.ids))
        lengths = self.enc.lengths
        chunk = self.global_size * 50
        batches = []
        for a in range(0, len(order), chunk):
            part = order[a:a + chunk]
            part = part[np.argsort(-lengths[part], kind="stable")]
            group = [part[i:i + self.global_size] for i in range(0, len(part), self.global_size)]
            batches += [group[j] for j in rng.permutation(len(group))]
        return batches

    def batch(self, index: int) -> TaskBatch:
        epoch, pos = divmod(index, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self._plan(epoch)
        rows = self._batches[pos][self.rank::self.world_size]
        if not len(rows):  # a last global batch smaller than the world: this rank repeats its first window
            rows = self._batches[pos][:1]
        return _collate(self.enc, rows, self.pad_id, self.regression)


def eval_batches(enc: Encoded, batch_size: int, *, pad_id: int, regression: bool, rows: np.ndarray | None = None):
    """Batches over ``rows`` (default all windows), longest first, for scoring."""
    rows = np.arange(len(enc.ids)) if rows is None else np.asarray(rows)
    order = rows[np.argsort(-enc.lengths[rows], kind="stable")]
    for i in range(0, len(order), batch_size):
        yield _collate(enc, order[i:i + batch_size], pad_id, regression)
