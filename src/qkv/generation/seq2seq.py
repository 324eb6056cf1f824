"""Decoding for encoder–decoders: greedy, beam search and sampling over a KV cache.

Legend: B batch, K beams, S source length (right padding included), C width, V target vocabulary,
n new tokens.

The source is encoded once, and each decoder layer's cross-attention keys and values are
projected once per source (:meth:`~qkv.models.seq2seq.Decoder.project_context`); the decoder's
self-attention keys and values go into a :class:`~qkv.nn.kv_cache.KVCache`, so each step runs only
the newest token (``use_cache=False`` recomputes the whole prefix instead: the same scores, a test
checks it). Sources of different lengths go in one batch, right-padded, with an ``attention_mask``.

Hugging Face's ``generate`` semantics: the result starts with the decoder start token; a row that
has emitted ``eos`` continues with ``pad``; the loop stops when every row has ended or after
``max_new_tokens``. Beam search is :func:`qkv.generation.beam.beam_search` (length penalty, early
stopping as Hugging Face's). The model is checked by its shape (an ``encoder``, a ``decoder`` with
``project_context``, a ``logits`` head), so this module does not import the model that delegates
its ``generate`` here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkv.generation.beam import beam_search, check_beam_options
from qkv.generation.sampling import check_sampling, next_tokens
from qkv.nn.attention import ContextKV
from qkv.nn.kv_cache import KVCache

__all__ = ["Decoded", "decode", "generate_seq2seq", "check_source"]


@dataclass
class Decoded:
    """What :func:`decode` returns.

    Attributes:
        sequences: ``(B, 1 + k)`` ids, the start token first, ``pad`` after each row's end.
        scores: ``(B,)``: greedy and sampling, the summed log-probabilities of each row's tokens up
            to its end; beam search, the winning beam's score (divided by its length ** penalty).
    """

    sequences: Tensor
    scores: Tensor


def check_source(model, input_ids, attention_mask) -> tuple[Tensor, Tensor | None]:
    """The checked ``(ids (B,S), mask (B,S) bool | None)``; ``ValueError`` naming the problem."""
    if not all(hasattr(model, a) for a in ("encoder", "decoder", "logits")) or \
            not hasattr(model.decoder, "project_context"):
        raise ValueError(f"an encoder-decoder is needed (qkv.models.seq2seq.EncoderDecoder, kind encoder_decoder), "
                         f"got {type(model).__name__}")
    if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() or input_ids.dim() not in (1, 2):
        raise ValueError("input_ids must be a (B, S) integer tensor of source ids")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]  # (S,) -> (1,S)
        attention_mask = None if attention_mask is None else attention_mask.reshape(1, -1)
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    mask = None if attention_mask is None else attention_mask != 0
    if input_ids.numel() == 0 or (mask is not None and not bool(mask.any(-1).all())):
        raise ValueError("empty source: every row needs at least one token to translate")
    limit = model.encoder.max_len
    longest = int(mask.sum(-1).max()) if mask is not None else input_ids.shape[1]
    if input_ids.shape[1] > limit:
        raise ValueError(f"the source of {longest} tokens (padded to {input_ids.shape[1]}) is longer than the model's "
                         f"window max_len={limit}; shorten or split it")
    if mask is not None and bool(mask.all()):
        mask = None
    return input_ids, mask


def _check_options(model, max_new_tokens, num_beams, do_sample, temperature, top_k, top_p, length_penalty,
                   early_stopping) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int ≥ 1, got {max_new_tokens!r}")
    limit = model.decoder.max_len
    if 1 + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens + 1} target positions (the start "
                         f"token too); the decoder's window is max_len={limit}: use max_new_tokens ≤ {limit - 1}")
    check_beam_options(num_beams, length_penalty, early_stopping)
    check_sampling(temperature, top_k, top_p)
    if do_sample and num_beams > 1:
        raise ValueError("sampling is offered with num_beams=1 only; use do_sample=False for beam search")


class _Source:
    """One batch of encoded sources and the decoder's next-token logits over it (a step)."""

    def __init__(self, model, ids: Tensor, mask: Tensor | None, repeat: int, use_cache: bool, capacity: int):
        self.model = model
        enc = model.encode(ids, mask)  # (B,S,C)
        kv = model.decoder.project_context(enc)  # per layer 2 × (B,G,S,D)
        if repeat > 1:  # each source's keys and values once per beam: (B,…) -> (B·K,…)
            kv = [ContextKV(c.k.repeat_interleave(repeat, 0), c.v.repeat_interleave(repeat, 0)) for c in kv]
            mask = None if mask is None else mask.repeat_interleave(repeat, 0)
        self.kv, self.mask = kv, mask
        self.cache = KVCache(len(model.decoder.layers), capacity=capacity) if use_cache else None

    def __call__(self, seqs: Tensor, index: Tensor | None = None) -> Tensor:
        """``(N,t)`` target prefixes → ``(N,V)`` float32 logits of the next token (``index``: the
        row of the previous step each prefix continues, for the cache)."""
        if self.cache is None:
            h = self.model.decoder(seqs, self.kv, None, self.mask).last_hidden_state[:, -1]  # (N,t,C) -> (N,C)
        else:
            if index is not None:
                self.cache.reorder(index)
            new = seqs if self.cache.seen == 0 else seqs[:, self.cache.seen:]  # (N,t-P)
            h = self.model.decoder(new, self.kv, None, self.mask, cache=self.cache).last_hidden_state[:, -1]
        return self.model.logits(h).float()  # (N,V)


@torch.no_grad()
def decode(model, input_ids: Tensor, attention_mask: Tensor | None = None, *, max_new_tokens: int | None = None,
           num_beams: int = 1, length_penalty: float = 1.0, early_stopping: bool | str = False,
           do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           seed: int | None = None, decoder_start_token_id: int | None = None, eos_token_id: int | None = None,
           pad_token_id: int | None = None, use_cache: bool = True) -> Decoded:
    """Translate a batch of sources (see the module docstring).

    Args:
        model: a :class:`~qkv.models.seq2seq.EncoderDecoder`.
        input_ids: ``(B,S)`` source ids (right-padded; ``(S,)`` = one). attention_mask: ``(B,S)``, 1 = real.
        max_new_tokens: tokens to add at most (≥ 1; the start token + these fit the decoder's window);
            default 32, or fewer where the window is shorter.
        num_beams: beams (1: greedy or sampling). length_penalty, early_stopping: beam search's
            (:mod:`qkv.generation.beam`).
        do_sample, temperature, top_k, top_p, seed: sampling (:mod:`qkv.generation.sampling`); ``seed``
            seeds a generator of its own.
        decoder_start_token_id, eos_token_id, pad_token_id: default the model's.
        use_cache: decode over the KV cache (``False``: recompute the prefix every step).

    Returns:
        :class:`Decoded`.

    Raises:
        ValueError: not an encoder-decoder, an empty source, a source longer than the window,
            ``max_new_tokens`` < 1 or beyond the window, ``num_beams`` < 1, a bad sampling option.
    """
    ids, mask = check_source(model, input_ids, attention_mask)
    if max_new_tokens is None:
        max_new_tokens = min(32, model.decoder.max_len - 1)
    _check_options(model, max_new_tokens, num_beams, do_sample, temperature, top_k, top_p, length_penalty,
                   early_stopping)
    start = model.decoder_start_token_id if decoder_start_token_id is None else decoder_start_token_id
    pad = model.pad_token_id if pad_token_id is None else pad_token_id
    device = model.decoder_weight.device
    ids, mask = ids.to(device), None if mask is None else mask.to(device)
    was = model.training
    model.eval()
    try:
        source = _Source(model, ids, mask, num_beams, use_cache, 1 + max_new_tokens)
        B = ids.shape[0]
        if num_beams > 1:
            r = beam_search(source, batch=B, start=start, num_beams=num_beams, max_length=1 + max_new_tokens,
                            eos=eos_token_id, pad=pad, length_penalty=length_penalty, early_stopping=early_stopping,
                            device=device)
            return Decoded(r.sequences, r.scores)
        generator = None
        if do_sample and seed is not None:
            generator = torch.Generator(device=device).manual_seed(int(seed))
        return _one_beam(source, B, start, pad, eos_token_id, max_new_tokens, device,
                         dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                              generator=generator))
    finally:
        model.train(was)


def _one_beam(step: _Source, B: int, start: int, pad: int, eos: int | None, max_new_tokens: int, device,
              sampling: dict) -> Decoded:
    """Greedy decoding or sampling: one token per row per step."""
    seqs = torch.full((B, 1), start, dtype=torch.long, device=device)  # (B,1)
    live = torch.ones(B, dtype=torch.bool, device=device)
    scores = torch.zeros(B, device=device)
    for _ in range(max_new_tokens):
        logits = step(seqs)  # (B,V)
        tok = next_tokens(logits, **sampling)  # (B,)
        logp = torch.log_softmax(logits, -1).gather(1, tok[:, None])[:, 0]  # (B,)
        scores += torch.where(live, logp, torch.zeros_like(logp))
        tok = torch.where(live, tok, torch.full_like(tok, pad))
        seqs = torch.cat([seqs, tok[:, None]], 1)  # (B,t) -> (B,t+1)
        if eos is not None:
            live &= tok != eos
            if not bool(live.any()):
                break
    return Decoded(seqs, scores)


def generate_seq2seq(model, input_ids: Tensor, attention_mask: Tensor | None = None, **options) -> Tensor:
    """:func:`decode`'s sequences: ``(B, 1 + k)`` ids beginning with the start token."""
    return decode(model, input_ids, attention_mask, **options).sequences
