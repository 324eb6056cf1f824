"""Beam search with Hugging Face's semantics (``generate(num_beams=K)``), over any next-token scorer.

Legend: B batch (sources), K beams, V vocabulary, L the longest output (start token + new tokens),
2K the candidates kept per step.

Each step every running beam proposes its V continuations, scored by the running sum of
log-probabilities; the 2K best of each source's K·V survive the step. A candidate that ends in
``eos`` (or reaches length L) is *finished*: among the first K candidates it competes for the K
finished slots with its score divided by ``(generated tokens) ** length_penalty``; the K best
unfinished candidates run on. A source stops when no running beam can beat its worst finished one
(``early_stopping=False``: judged at the present length; ``"never"``: at the longest length when
``length_penalty > 0``) or, with ``early_stopping=True``, as soon as K beams have finished. The
answer is the best finished beam.

The scorer is a callable ``step(seqs, index) -> logits``: ``seqs (B·K, t)`` the running beams,
``index (B·K,)`` which previous row each beam continues (``None`` at the first step) — a cached
decoder reorders its cache with it (:meth:`qkv.nn.kv_cache.KVCache.reorder`) — and ``logits
(B·K, V)`` for the next token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from qkv.validation import MAX_BEAMS, check_at_most

__all__ = ["BeamResult", "beam_search", "check_beam_options", "EARLY_STOPPING"]

#: The values of ``early_stopping`` (Hugging Face's).
EARLY_STOPPING = (True, False, "never")
_NEG = -1.0e9  # Hugging Face's "impossible" score


@dataclass
class BeamResult:
    """The best finished beam of each source.

    Attributes:
        sequences: ``(B, L')`` ids, the start token first, ``pad`` after a beam's end; ``L'`` the
            longest chosen beam.
        scores: ``(B,)`` their scores: summed log-probabilities / generated tokens ** length_penalty.
        lengths: ``(B,)`` tokens of each chosen beam, the start token included.
    """

    sequences: Tensor
    scores: Tensor
    lengths: Tensor


def check_beam_options(num_beams, length_penalty, early_stopping) -> None:
    """``ValueError`` naming the first bad beam-search option."""
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an int ≥ 1 (1 = greedy), got {num_beams!r}")
    check_at_most("num_beams", num_beams, MAX_BEAMS, why="beams of one search")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise ValueError(f"length_penalty must be a number (1.0: scores divided by the length), got {length_penalty!r}")
    if not any(early_stopping is v for v in EARLY_STOPPING[:2]) and early_stopping != "never":
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")


def _gather(t: Tensor, index: Tensor) -> Tensor:
    """``t (B,N,…)`` rows ``index (B,M)`` along dim 1 → ``(B,M,…)``."""
    while index.dim() < t.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(t, index, dim=1)


@torch.no_grad()
def beam_search(step: Callable[[Tensor, Tensor | None], Tensor], *, batch: int, start: int | Tensor,
                num_beams: int, max_length: int, eos: int | None, pad: int, length_penalty: float = 1.0,
                early_stopping: bool | str = False, device=None) -> BeamResult:
    """Beam search (see the module docstring).

    Args:
        step: the scorer ``step(seqs (B·K,t), index (B·K,) | None) -> (B·K,V)`` logits.
        batch: B. start: the first token (an int, or ``(B,)`` one per source). num_beams: K.
        max_length: L, the start token included. eos: the end token, or ``None``. pad: fills
            positions after a beam's end. length_penalty, early_stopping: Hugging Face's.
    """
    check_beam_options(num_beams, length_penalty, early_stopping)
    B, K, L = batch, num_beams, max_length
    running = torch.full((B, K, L), pad, dtype=torch.long, device=device)  # (B,K,L)
    running[:, :, 0] = torch.as_tensor(start, device=device).reshape(-1, 1) if torch.is_tensor(start) else start
    run_scores = torch.zeros(B, K, device=device)
    run_scores[:, 1:] = _NEG  # only the first beam's continuations at the first step
    done_seqs, done_scores = running.clone(), torch.full((B, K), _NEG, device=device)
    done_len = torch.ones(B, K, dtype=torch.long, device=device)
    finished = torch.zeros(B, K, dtype=torch.bool, device=device)
    improvable = torch.ones(B, 1, dtype=torch.bool, device=device)  # a running beam may still win
    top_k_mask = torch.arange(2 * K, device=device) < K  # (2K,) the candidates that may finish
    offset = torch.arange(B, device=device)[:, None] * K  # (B,1) row of each source's first beam
    index, t = None, 1
    while True:
        logits = step(running[:, :, :t].reshape(B * K, t), index).float()  # (B·K,V)
        V = logits.shape[-1]
        logp = torch.log_softmax(logits, -1).view(B, K, V) + run_scores[:, :, None]  # (B,K,V)
        top_lp, top_i = logp.view(B, K * V).topk(2 * K)  # (B,2K) best of the K·V continuations
        beam, tok = top_i // V, top_i % V  # (B,2K): the beam continued, the token added
        cand = _gather(running, beam)  # (B,2K,L)
        cand[:, :, t] = tok
        hits = torch.full_like(tok, t + 1 >= L, dtype=torch.bool)  # (B,2K) reached the longest output
        if eos is not None:
            hits |= tok == eos
        # the K best unfinished candidates run on
        live = top_lp + hits.float() * _NEG
        keep = live.topk(K).indices  # (B,K)
        running, run_scores, origin = _gather(cand, keep), _gather(live, keep), _gather(beam, keep)
        # finished candidates (among the first K) compete for the K finished slots
        just = hits & top_k_mask[None, :]
        fin = top_lp / (t ** length_penalty)  # t generated tokens (the start token not counted)
        full = finished.all(-1, keepdim=True) & (early_stopping is True)
        fin = fin + (full | ~improvable).float() * _NEG + (~just).float() * _NEG
        merged = torch.cat([done_scores, fin], 1)  # (B,3K)
        best = merged.topk(K).indices  # (B,K)
        done_seqs = _gather(torch.cat([done_seqs, cand], 1), best)
        done_len = _gather(torch.cat([done_len, torch.full_like(tok, t + 1)], 1), best)
        finished = _gather(torch.cat([finished, just], 1), best)
        done_scores = _gather(merged, best)
        index = (origin + offset).reshape(-1)  # (B·K,) the previous row of each running beam
        t += 1
        at = (L - 1) if (early_stopping == "never" and length_penalty > 0) else (t - 1)
        best_running = run_scores[:, :1] / (at ** length_penalty)  # (B,1)
        worst_done = torch.where(finished, done_scores.min(-1, keepdim=True).values, torch.full_like(done_scores, _NEG))
        improvable = improvable & (best_running > worst_done).any(-1, keepdim=True)
        open_beams = not (bool(finished.all()) and early_stopping is True)
        if not (bool(improvable.any()) and open_beams and not bool(hits.all())):
            break
    lengths = done_len[:, 0]  # (B,)
    out = done_seqs[:, 0, : int(lengths.max())]  # (B,L')
    past_end = torch.arange(out.shape[1], device=device)[None, :] >= lengths[:, None]
    return BeamResult(out.masked_fill(past_end, pad), done_scores[:, 0], lengths)
