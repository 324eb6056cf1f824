"""Choosing the next token: greedy, or sampled after temperature, top-k and top-p.

Legend: B batch, V vocabulary.

The order is Hugging Face's: logits / temperature, then keep the k largest, then the nucleus —
the smallest set of most likely tokens whose probability mass reaches p (always at least one
token). Removed tokens get ``-inf``; the draw uses the given ``torch.Generator`` only.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_sampling", "filter_logits", "next_tokens"]


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """``ValueError`` naming the first bad sampling option."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r} (use greedy decoding for 'temperature 0')")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an int ≥ 1 or None, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def filter_logits(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None) -> Tensor:
    """``(B,V)`` logits → ``(B,V)`` scaled by 1/temperature, ``-inf`` outside top-k and top-p.

    Args:
        logits: ``(B,V)`` next-token logits.
        temperature: divides the logits (> 0).
        top_k: keep the k largest per row (ties at the k-th value kept), or ``None``.
        top_p: keep the smallest set of most likely tokens with probability mass ≥ p, or ``None``.
    """
    check_sampling(temperature, top_k, top_p)
    scores = logits.float() / temperature if temperature != 1.0 else logits.float()
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]  # (B,1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)  # (B,V)
        probs = sorted_scores.softmax(-1)
        before = probs.cumsum(-1) - probs  # (B,V) mass of the more likely tokens
        drop_sorted = before >= top_p  # the set before already reached p
        drop_sorted[..., 0] = False  # always one token
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def next_tokens(logits: Tensor, *, do_sample: bool, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """``(B,V)`` logits → ``(B,)`` next tokens: argmax, or one draw from the filtered distribution."""
    if not do_sample:
        return logits.argmax(-1)  # (B,)
    probs = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p).softmax(-1)  # (B,V)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,1) -> (B,)
