"""Captions of pictures, and where each written word looked: greedy decoding of an
:class:`~qkv.models.vision.ImageCaptioner` over a KV cache, with the cross-attention weights of
every written token.

Legend: B pictures, K channels, R × W pixels, n written tokens, L decoder layers, H heads, T image
tokens (the [CLS] vector, when the model has one, then the patches in reading order).

:func:`caption_with_attention` encodes the pictures once, projects each decoder layer's keys and
values of the patches once, and decodes greedily over a :class:`~qkv.nn.kv_cache.KVCache` until
every row has written ``[EOS]``. The weights come from one teacher-forced pass over the written
tokens afterwards (the decoder is causal, so the query that wrote token ``j`` sees the same prefix
it saw while decoding): ``cross_attentions[b, l, h, j]`` is how the query that wrote token ``j``
spread its attention over the T image tokens in layer ``l``, head ``h``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.data.caption_grammar import EOS
from qkv.models.vision import ImageCaptioner
from qkv.nn.kv_cache import KVCache
from qkv.vision.pictures import read_pictures as read_image_files

__all__ = ["Captions", "caption_pictures", "caption_with_attention", "check_captioner", "read_pictures"]


@dataclass
class Captions:
    """What :func:`caption_with_attention` returns.

    Attributes:
        captions: one caption per picture (the words before ``[EOS]``, joined by spaces).
        words: the written tokens of each picture before ``[EOS]`` (word-level: one word each).
        ids: ``(B, 1 + n)`` the start token, the written ids, ``[PAD]`` after a row's ``[EOS]``.
        cross_attentions: ``(B,L,H,n,T)`` float32 — the weights of the query that wrote token ``j`` over
            the image's tokens (``None`` when not asked for). Row ``b``'s words are its first
            ``len(words[b])`` positions; the next is its ``[EOS]``, the rest padding.
        prefix: image tokens before the patches (1 with a [CLS] vector). grid: the patches'
            ``(rows, cols)``: ``cross_attentions[..., prefix:].reshape(..., *grid)`` is the map
            over the picture.
    """

    captions: list[str]
    words: list[list[str]]
    ids: Tensor
    cross_attentions: Tensor | None
    prefix: int
    grid: tuple[int, ...]


def check_captioner(model) -> ImageCaptioner:
    """``model`` when it is an image captioner; ``ValueError`` naming what it is otherwise."""
    if not isinstance(model, ImageCaptioner):
        raise ValueError(f"not a caption model: this is a model of type {type(model).__name__}; give a model trained with "
                         "qkv pretrain --objective caption (kind image_captioning)")
    return model


@torch.no_grad()
def _greedy(model: ImageCaptioner, x: Tensor, max_new_tokens: int, eos: int | None) -> Tensor:
    """``(B,K,R,W)`` → ``(B, 1 + n)`` greedy ids over a KV cache."""
    kv = model.decoder.project_context(model.encoder(x).last_hidden_state)  # per layer: the patches' keys, values
    cache = KVCache(len(model.decoder.layers), capacity=1 + max_new_tokens)
    seqs = torch.full((x.shape[0], 1), model.decoder_start_token_id, dtype=torch.long, device=x.device)  # (B,1)
    live = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    for _ in range(max_new_tokens):
        h = model.decoder(seqs[:, cache.seen:], kv, cache=cache).last_hidden_state[:, -1]  # (B,C)
        tok = F.linear(h, model.decoder_weight).argmax(-1)  # (B,C)(C,V) -> (B,)
        tok = torch.where(live, tok, torch.full_like(tok, model.pad_token_id))
        seqs = torch.cat([seqs, tok[:, None]], 1)  # (B,t) -> (B,t+1)
        if eos is not None:
            live &= tok != eos
        if not bool(live.any()):
            break
    return seqs


@torch.no_grad()
def caption_with_attention(model, tokenizer, pixels: Tensor, *, max_new_tokens: int | None = None,
                           attention: bool = True, batch_size: int = 256, eos_token_id: int | None = EOS) -> Captions:
    """Caption pictures greedily; with ``attention``, each written token's cross-attention weights.

    Args:
        model: an :class:`~qkv.models.vision.ImageCaptioner` (eval mode is set for the call).
        tokenizer: its tokenizer (``qkv.load(run).tokenizer``; ``id_to_token``); ``None``: words are the ids
            written as numbers.
        pixels: ``(B,K,R,W)`` pixel values of the model's size (:func:`qkv.data.images.pixel_values`).
        max_new_tokens: the most tokens written per caption; default the decoder's window less one.
        attention: also return ``cross_attentions``. batch_size: pictures decoded at once.
        eos_token_id: the token that ends a caption (default the caption grammar's ``[EOS]``); ``None``:
            every caption runs to ``max_new_tokens``.

    Returns:
        :class:`Captions`.

    Raises:
        ValueError: not a captioner; pictures of another size or channel count.
    """
    model = check_captioner(model)
    image = model.config.image
    want = (image.channels, *image.size)
    if not isinstance(pixels, Tensor) or tuple(pixels.shape[1:]) != want:
        got = tuple(pixels.shape[1:]) if isinstance(pixels, Tensor) else type(pixels).__name__
        raise ValueError(f"the model reads pictures of {'×'.join(map(str, want))} (channels×height×width), got {got}")
    limit = model.decoder.max_len - 1
    n = limit if max_new_tokens is None else max_new_tokens
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limit:
        raise ValueError(f"max_new_tokens must be an int in [1, {limit}] (the decoder's window), got {max_new_tokens!r}")
    was = model.training
    model.eval()
    try:
        ids_parts, att_parts = [], []
        for i in range(0, len(pixels), batch_size):
            x = pixels[i:i + batch_size].to(model.decoder_weight.device)
            ids = _greedy(model, x, n, eos_token_id)
            ids_parts.append(ids)
            if attention:
                out = model(x, decoder_input_ids=ids[:, :-1], output_attentions=True)  # queries that wrote ids[:, 1:]
                att_parts.append(torch.stack(out.cross_attentions, 1).float().cpu())  # L × (B,H,n,T) -> (B,L,H,n,T)
    finally:
        model.train(was)
    width = max(p.shape[1] for p in ids_parts)
    ids = torch.cat([F.pad(p, (0, width - p.shape[1]), value=model.pad_token_id) for p in ids_parts]).cpu()
    att = None
    if attention:
        att = torch.cat([F.pad(a, (0, 0, 0, width - 1 - a.shape[3])) for a in att_parts])  # (B,L,H,n,T)
    name = (lambda t: tokenizer.id_to_token(t) or "[UNK]") if tokenizer is not None else str
    words = []
    for row in ids[:, 1:].tolist():
        end = row.index(eos_token_id) if eos_token_id in row else len(row)
        words.append([name(t) for t in row[:end]])
    return Captions([" ".join(w) for w in words], words, ids, att, image.prefix, tuple(image.grid))


def read_pictures(paths: Sequence[str | os.PathLike], model) -> Tensor:
    """Picture files → ``(B,K,R,W)`` pixel values for the captioner ``model``, read as every image command
    reads them (:func:`qkv.vision.pictures.read_pictures`: one line naming the file when one is
    unreadable, empty, or not of the model's size; nothing is resized behind your back)."""
    image = check_captioner(model).config.image
    return read_image_files([Path(p) for p in paths], image)[0]


def caption_pictures(model, tokenizer, paths: Sequence[str | os.PathLike], *,
                     max_new_tokens: int | None = None) -> list[str]:
    """One caption per picture file (see :func:`read_pictures` and :func:`caption_with_attention`)."""
    return caption_with_attention(model, tokenizer, read_pictures(paths, model), max_new_tokens=max_new_tokens,
                                  attention=False).captions

