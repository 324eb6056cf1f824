"""Count-based next-token baselines for a causal LM: unigram and bigram perplexity.

Legend: V vocabulary, N scored tokens.

A causal LM's held-out perplexity means little alone; beside the best context-free model (unigram)
and the best one-token-context count model (bigram) it says how much of the context the model uses.
Both are estimated from the training blocks only and scored on exactly the (previous, next) token
pairs the model is scored on (:func:`qkv.data.pipeline.clm_labels`):

* unigram, add-one smoothed: ``p(n) = (c(n) + 1) / (N + V)``;
* bigram, interpolated with the unigram (Jelinek–Mercer): ``p(n | m) = λ c(m, n) / c(m) +
  (1 - λ) p(n)`` (the unigram alone when m was never seen), with λ chosen on the last tenth of the
  training blocks from counts of the first nine tenths — never on held-out text — and the counts
  then taken from all training blocks.
"""

from __future__ import annotations

import math
import numpy as np

from qkv.data.masking import IGNORE_INDEX
from qkv.data.pipeline import clm_labels

__all__ = ["scored_pairs", "CountModel", "baseline_perplexities", "LAMBDAS"]

#: The interpolation weights λ tried for the bigram.
LAMBDAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def scored_pairs(blocks, indices: np.ndarray, *, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """``(previous, next)`` token ids, ``(N,)`` each, of every scored next-token target of the blocks
    ``indices`` of a :class:`~qkv.data.packing.PackedBlocks` (targets as :func:`clm_labels` makes them)."""
    prev, nxt = [], []
    for start in range(0, len(indices), chunk):
        b = blocks.batch(indices[start : start + chunk])
        labels = clm_labels(b.input_ids, b.attention_mask, blocks.special.sep)  # (B,T)
        target = labels[:, 1:]  # (B,T-1): position t predicts token t + 1
        keep = target != IGNORE_INDEX
        prev.append(b.input_ids[:, :-1][keep].numpy())
        nxt.append(target[keep].numpy())
    empty = np.zeros(0, np.int64)
    return (np.concatenate(prev) if prev else empty), (np.concatenate(nxt) if nxt else empty)


class CountModel:
    """Unigram and bigram counts of ``(previous, next)`` pairs over a vocabulary of ``V``."""

    def __init__(self, prev: np.ndarray, nxt: np.ndarray, vocab_size: int):
        self.V = int(vocab_size)
        self.unigram = np.bincount(nxt, minlength=self.V).astype(np.float64)  # (V,)
        self.n = float(len(nxt))
        codes, counts = np.unique(prev.astype(np.int64) * self.V + nxt, return_counts=True)
        self.codes, self.pair_counts = codes, counts.astype(np.float64)
        self.context = np.bincount(prev, minlength=self.V).astype(np.float64)  # (V,) c(m)

    def p_unigram(self, nxt: np.ndarray) -> np.ndarray:
        return (self.unigram[nxt] + 1.0) / (self.n + self.V)

    def p_bigram(self, prev: np.ndarray, nxt: np.ndarray, lam: float) -> np.ndarray:
        code = prev.astype(np.int64) * self.V + nxt
        pair = np.zeros(len(code))
        if len(self.codes):
            at = np.searchsorted(self.codes, code).clip(max=len(self.codes) - 1)
            pair = np.where(self.codes[at] == code, self.pair_counts[at], 0.0)  # c(m, n)
        ctx = self.context[prev]  # c(m)
        ml = np.divide(pair, ctx, out=np.zeros_like(ctx), where=ctx > 0)
        lam_eff = np.where(ctx > 0, lam, 0.0)
        return lam_eff * ml + (1.0 - lam_eff) * self.p_unigram(nxt)


def _perplexity(p: np.ndarray) -> float:
    return math.exp(-float(np.log(p).mean())) if len(p) else float("nan")


def baseline_perplexities(train_blocks, eval_blocks, eval_indices: np.ndarray, vocab_size: int) -> dict:
    """Unigram and bigram perplexity on the scored pairs of ``eval_blocks[eval_indices]``, estimated
    from ``train_blocks`` (see the module docstring).

    Returns:
        ``{"unigram_perplexity", "bigram_perplexity", "bigram_lambda", "baseline_tokens"}``.
    """
    n_train = len(train_blocks)
    all_idx = np.arange(n_train)
    cut = max(1, int(n_train * 0.9)) if n_train > 1 else n_train
    fit_p, fit_n = scored_pairs(train_blocks, all_idx[:cut])
    tune_p, tune_n = scored_pairs(train_blocks, all_idx[cut:])
    lam = 0.5
    if len(tune_n):
        partial = CountModel(fit_p, fit_n, vocab_size)
        lam = min(LAMBDAS, key=lambda x: -float(np.log(partial.p_bigram(tune_p, tune_n, x)).sum()))
    full = CountModel(np.concatenate([fit_p, tune_p]), np.concatenate([fit_n, tune_n]), vocab_size)
    ev_p, ev_n = scored_pairs(eval_blocks, eval_indices)
    return {"unigram_perplexity": _perplexity(full.p_unigram(ev_n)),
            "bigram_perplexity": _perplexity(full.p_bigram(ev_p, ev_n, lam)),
            "bigram_lambda": lam, "baseline_tokens": int(len(ev_n))}
