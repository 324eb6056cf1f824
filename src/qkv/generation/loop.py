"""The generation loop: feed the prompt once, then one token per step over the KV cache.

Legend: B batch, T prompt length (left padding included), n new tokens, V vocabulary, L the
model's window (``max_len``).

Hugging Face's ``generate`` semantics: the result is the prompt as given followed by the new
tokens; a row that has emitted ``eos_token_id`` continues with ``pad_token_id`` (``eos`` when
``None``); the loop stops once every row is done. Left-padded rows (``attention_mask`` 0 on the
left) get positions counted from their first real token. ``sliding=True`` lets a sequence
outgrow the window: the last ``L - 1`` tokens are kept as context and recomputed each step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from qkv.generation.sampling import check_sampling, next_tokens
from qkv.nn.kv_cache import KVCache
from qkv.validation import MAX_NEW_TOKENS, check_at_most

__all__ = ["generate", "check_generate"]


def _positions(mask: Tensor | None) -> Tensor | None:
    """``(B,T)`` positions counted from each row's first real token (padding at 0), or ``None``."""
    return None if mask is None else (mask.long().cumsum(-1) - 1).clamp(min=0)


def _eos_ids(eos_token_id) -> list[int]:
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"eos_token_id must be a token id ≥ 0, a list of them, or None; got {eos_token_id!r}")
    return ids


def check_generate(model, input_ids, attention_mask, max_new_tokens, temperature, top_k, top_p, sliding):
    """``ValueError`` for the first bad argument of :func:`generate`; the checked ``(ids, mask)``."""
    if not getattr(getattr(model, "decoder", None), "causal", False) or not hasattr(model, "decoder_weight"):
        # a causal stack with a tied LM head (qkv.models.causal_lm.CausalLM); checked by shape, not by
        # class, so that this module does not import the model that delegates its generate() here
        raise ValueError(f"generate needs a causal LM (qkv.models.causal_lm.CausalLM, kind causal_lm), got "
                         f"{type(model).__name__}; a masked LM or encoder does not predict the next token")
    if not isinstance(input_ids, Tensor):
        raise ValueError(f"input_ids must be a (B, T) integer tensor, got {type(input_ids).__name__}; "
                         "qkv.generation.pad_prompts turns lists of ids into one")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]  # (T,) -> (1,T)
        attention_mask = None if attention_mask is None else attention_mask.reshape(1, -1)
    if input_ids.dim() != 2 or input_ids.is_floating_point():
        raise ValueError(f"input_ids must be a (B, T) integer tensor, got {tuple(input_ids.shape)} {input_ids.dtype}")
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if input_ids.shape[1] == 0 or input_ids.shape[0] == 0 or (
            attention_mask is not None and not bool((attention_mask != 0).any(-1).all())):
        raise ValueError("empty prompt: every row needs at least one real token (start from a BOS token to "
                         "generate from nothing)")
    if attention_mask is not None and not bool((attention_mask[:, -1] != 0).all()):
        raise ValueError("attention_mask ends in padding: prompts must be left-padded (the new tokens follow the "
                         "last column); qkv.generation.pad_prompts pads on the left")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int ≥ 1, got {max_new_tokens!r}")
    check_at_most("max_new_tokens", max_new_tokens, MAX_NEW_TOKENS, why="the most tokens one call may add")
    check_sampling(temperature, top_k, top_p)
    T, limit = input_ids.shape[1], model.decoder.max_len
    if not sliding and T + max_new_tokens > limit:
        what = (f"the prompt of {T} tokens is longer than" if T > limit else
                f"the prompt of {T} tokens + max_new_tokens={max_new_tokens} exceed")
        raise ValueError(f"{what} the model's window max_len={limit}; shorten the prompt, lower max_new_tokens, "
                         f"or pass sliding=True (CLI: --sliding) to keep the last {limit - 1} tokens as context")
    if sliding and limit < 2:
        raise ValueError(f"sliding=True needs max_len ≥ 2, the model has max_len={limit}")
    return input_ids, attention_mask


@torch.no_grad()
def generate(
    model,
    input_ids: Tensor,
    *,
    attention_mask: Tensor | None = None,
    max_new_tokens: int = 20,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    streamer: Callable[[Tensor], object] | None = None,
    sliding: bool = False,
) -> Tensor:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Args:
        model: a :class:`~qkv.models.causal_lm.CausalLM`.
        input_ids: ``(B,T)`` prompts (left-padded when of different lengths; ``(T,)`` = one).
        attention_mask: ``(B,T)``, 1 = real token, 0 = left padding; ``None`` = all real.
        max_new_tokens: tokens to add (≥ 1).
        do_sample: sample (after temperature, top-k, top-p) instead of the argmax.
        temperature: divides the logits before sampling (> 0).
        top_k: sample among the k most likely tokens only (≥ 1), or ``None``.
        top_p: sample in the nucleus, the smallest set with mass ≥ p (``(0, 1]``), or ``None``.
        eos_token_id: a row ends once it emits this id (or one of a list).
        pad_token_id: fills a row after its end (default ``eos_token_id``).
        seed: seeds the sampler's own ``torch.Generator`` (same seed, same tokens, whatever the
            global RNG); ``None`` draws from torch's global RNG.
        use_cache: decode over a KV cache (``False``: recompute the whole sequence each step).
        streamer: called with each step's ``(B,)`` new tokens.
        sliding: allow outgrowing the window ``max_len``: keep the last ``max_len - 1`` tokens
            as context, recomputed each step once the window is full.

    Returns:
        ``(B, T + k)`` long tensor, ``k ≤ max_new_tokens`` (fewer when every row ended early).

    Raises:
        ValueError: not a causal LM, an empty prompt, a prompt (plus new tokens) longer than the
            window without ``sliding``, ``max_new_tokens < 1``, ``temperature ≤ 0``,
            ``top_k < 1``, ``top_p`` outside (0, 1].
    """
    input_ids, attention_mask = check_generate(model, input_ids, attention_mask, max_new_tokens, temperature,
                                               top_k, top_p, sliding)
    eos = _eos_ids(eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    device = model.decoder_weight.device
    seqs = input_ids.to(device, torch.long)  # (B,T)
    mask = None if attention_mask is None else (attention_mask.to(device) != 0)  # (B,T) bool
    if mask is not None and bool(mask.all()):
        mask = None  # no padding: nothing to mask, positions 0 … T-1
    B, T = seqs.shape
    limit = model.decoder.max_len
    generator = None
    if do_sample and seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(int(seed))
    eos_t = torch.tensor(eos, device=device, dtype=torch.long) if eos else None
    unfinished = torch.ones(B, dtype=torch.bool, device=device)
    was_training = model.training
    model.eval()
    try:
        cache, capacity = None, min(limit, T + max_new_tokens)
        for _ in range(max_new_tokens):
            if use_cache:
                logits, cache = _logits_cached(model, seqs, mask, cache, limit, capacity)  # (B,V)
            else:
                logits = _logits_full(model, seqs, mask, limit)  # (B,V)
            tok = next_tokens(logits, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                              generator=generator)  # (B,)
            if eos_t is not None:
                tok = torch.where(unfinished, tok, torch.full_like(tok, pad))
                unfinished &= ~torch.isin(tok, eos_t)
            seqs = torch.cat([seqs, tok[:, None]], 1)  # (B,L) -> (B,L+1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(B, 1)], 1)  # (B,L+1)
            if streamer is not None:
                streamer(tok)
            if eos_t is not None and not bool(unfinished.any()):
                break
    finally:
        model.train(was_training)
    return seqs


def _window(seqs: Tensor, mask: Tensor | None, limit: int) -> tuple[Tensor, Tensor | None]:
    """The whole sequence when it fits the window, else its last ``limit - 1`` tokens."""
    if seqs.shape[1] <= limit:
        return seqs, mask
    keep = limit - 1
    return seqs[:, -keep:], None if mask is None else mask[:, -keep:]  # (B,L) -> (B,L-1)


def _logits_full(model, seqs: Tensor, mask: Tensor | None, limit: int) -> Tensor:
    """Next-token logits ``(B,V)``: the whole window recomputed."""
    ids, m = _window(seqs, mask, limit)
    h = model.decoder(ids, m, position_ids=_positions(m)).last_hidden_state[:, -1]  # (B,T,C) -> (B,C)
    return model.logits(h)  # (B,V)


def _logits_cached(model, seqs: Tensor, mask: Tensor | None, cache: KVCache | None, limit: int,
                   capacity: int) -> tuple[Tensor, KVCache]:
    """Next-token logits ``(B,V)`` and the cache: the newest token over the cache, or — first
    step, or once the window is full — the window fed into a new cache."""
    L = seqs.shape[1]
    if cache is None or L > limit or cache.seen != L - 1:
        ids, m = _window(seqs, mask, limit)
        cache = KVCache(len(model.decoder.layers), capacity=capacity)
        h = model.decoder(ids, m, cache=cache).last_hidden_state[:, -1]  # (B,T,C) -> (B,C)
    else:
        h = model.decoder(seqs[:, -1:], mask, cache=cache).last_hidden_state[:, -1]  # (B,1,C) -> (B,C)
    return model.logits(h), cache
