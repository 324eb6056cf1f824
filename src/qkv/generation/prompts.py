"""Prompts in, text out: left padding, tokenizer conventions, decoding.

A tokenizer from ``qkv pretrain`` is BERT-style (WordPiece, ``[CLS] … [SEP]`` added on encode);
a prompt for generation must not end in ``[SEP]``. So prompts are encoded without special
tokens, the tokenizer's beginning token (its ``bos`` role: ``[CLS]``, ``<s>``, ``<bos>``) is put in
front when it has one, and generation stops at its end token (``eos``: ``[SEP]``, ``</s>``,
``<|endoftext|>``, ``<eos>``) — the roles read from the tokenizer's own configuration
(:mod:`qkv.data.special_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from qkv.data.tokenizer_facade import as_backend, specials_of
from qkv.generation.loop import generate
from qkv.generation.streaming import continuation

__all__ = ["pad_prompts", "prompt_ids", "special_ids", "generate_texts", "decode"]


def pad_prompts(prompts: Sequence[Sequence[int]] | Sequence[Tensor] | Sequence[str], *, pad_token_id: int = 0,
                tokenizer=None) -> tuple[Tensor, Tensor]:
    """Left-pad prompts of different lengths into one batch.

    Args:
        prompts: lists of token ids (or 1-D tensors), each non-empty; or strings, with ``tokenizer``
            (encoded by :func:`prompt_ids`).
        pad_token_id: the id put in the padding slots.
        tokenizer: a ``tokenizers.Tokenizer`` for string prompts.

    Returns:
        ``(input_ids, attention_mask)``, both ``(B, T_max)`` long; 0 in the mask on the left.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    if any(isinstance(p, str) for p in prompts):
        if tokenizer is None:
            raise ValueError("string prompts need tokenizer=: pad_prompts(texts, tokenizer=tok)")
        prompts = [prompt_ids(tokenizer, p) for p in prompts]
    rows = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
    if not rows:
        raise ValueError("no prompts given: pass at least one list of token ids")
    for i, r in enumerate(rows):
        if r.numel() == 0:
            raise ValueError(f"empty prompt: prompt {i} has no tokens")
    T = max(r.numel() for r in rows)
    ids = torch.full((len(rows), T), pad_token_id, dtype=torch.long)  # (B,T)
    mask = torch.zeros(len(rows), T, dtype=torch.long)  # (B,T)
    for i, r in enumerate(rows):
        ids[i, T - r.numel():] = r
        mask[i, T - r.numel():] = 1
    return ids, mask


def special_ids(tokenizer) -> tuple[int | None, int | None, int | None]:
    """``(bos, eos, pad)`` ids of a tokenizer (``None`` where it has none)."""
    sp = specials_of(tokenizer)
    return sp.id("bos"), sp.id("eos"), sp.id("pad")


def prompt_ids(tokenizer, text: str) -> list[int]:
    """``text`` encoded without special tokens, after the tokenizer's beginning token if any."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty prompt: give some text to continue, got {text!r}")
    bos = special_ids(tokenizer)[0]
    ids = as_backend(tokenizer).encode(text, add_special_tokens=False).ids
    ids = ([bos] if bos is not None else []) + list(ids)
    if not ids:
        raise ValueError(f"empty prompt: the tokenizer gives no tokens for {text!r}")
    return ids


def decode(tokenizer, ids: Sequence[int], eos: int | None = None) -> str:
    """``ids`` up to (not including) ``eos``, decoded without special tokens."""
    ids = list(ids)
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos)]
    return tokenizer.decode(ids, skip_special_tokens=True)


def generate_texts(model, tokenizer, prompts: Sequence[str], **options) -> list[str]:
    """Continue each text prompt; return the generated continuations (prompt not included).

    Args:
        model: a :class:`~qkv.models.causal_lm.CausalLM`.
        tokenizer: a ``tokenizers.Tokenizer``.
        prompts: the texts (different lengths are left-padded).
        **options: :func:`qkv.generation.generate` options; ``eos_token_id`` and ``pad_token_id``
            default to the tokenizer's end and padding tokens.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    _, eos, pad = special_ids(tokenizer)
    options.setdefault("eos_token_id", eos)
    options.setdefault("pad_token_id", pad if pad is not None else eos)
    prefixes = [prompt_ids(tokenizer, p) for p in prompts]
    ids, mask = pad_prompts(prefixes,
                            pad_token_id=options["pad_token_id"] if options["pad_token_id"] is not None else 0)
    out = generate(model, ids, attention_mask=mask, **options)  # (B,T+n)
    stop = options["eos_token_id"]
    stop = stop if isinstance(stop, int) else None
    return [continuation(tokenizer, prefix, row[ids.shape[1]:].tolist(), stop)
            for prefix, row in zip(prefixes, out)]
