"""Translate texts with a trained encoder–decoder and its subword tokenizer: batched, sorted by
length (little padding), answers in the order of the texts.

Each text is encoded as subwords + ``[EOS]`` (:mod:`qkv.translation.subwords`), a batch of
similar-length sources is decoded at once (:func:`qkv.generation.seq2seq.decode`: greedy, beam
search with ``beams`` > 1, over the KV cache), and the ids up to ``[EOS]`` are decoded back to
text. Without ``max_new_tokens`` a batch may write up to twice its longest source plus 10 tokens,
within the decoder's window.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qkv.generation.seq2seq import decode
from qkv.translation.errors import TranslationError
from qkv.translation.subwords import EOS, PAD, check_subwords

__all__ = ["translate", "TOO_LONG"]

#: What :func:`translate` does with a text longer than the model's window.
TOO_LONG = ("error", "copy")


def _check(texts, beams, batch_size, max_new_tokens, too_long) -> list[str]:
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TranslationError("texts must be a list of strings (one text per item)")
    for name, value in (("beams", beams), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TranslationError(f"{name} must be an int ≥ 1, got {value!r}")
    if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                       or max_new_tokens < 1):
        raise TranslationError(f"max_new_tokens must be an int ≥ 1, got {max_new_tokens!r}")
    if too_long not in TOO_LONG:
        raise TranslationError(f"too_long={too_long!r}; allowed: {', '.join(TOO_LONG)}")
    for i, t in enumerate(texts):
        if not t.strip():
            raise TranslationError(f"text {i} is empty; give every text something to translate")
    return list(texts)


@torch.no_grad()
def translate(model, tokenizer, texts: Sequence[str], *, beams: int = 1, max_new_tokens: int | None = None,
              batch_size: int = 32, length_penalty: float = 1.0, too_long: str = "error") -> list[str]:
    """Translations of ``texts`` (see the module docstring).

    Args:
        model: a :class:`~qkv.models.seq2seq.EncoderDecoder` trained with ``tokenizer``'s ids.
        tokenizer: a ``tokenizers.Tokenizer`` with :data:`~qkv.translation.subwords.SPECIALS` as ids 0-3.
        texts: the sources.
        beams: 1 = greedy; more = beam search with that many beams.
        max_new_tokens: tokens each translation may have (default: see the module docstring; a
            given value beyond the decoder's window is refused).
        batch_size: sources decoded together.
        length_penalty: beam search's (scores divided by length ** it).
        too_long: a source longer than the window: ``"error"`` (default) or ``"copy"`` it unchanged
            (evaluation: its score counts as a copy).

    Raises:
        TranslationError: an empty text, a text longer than the window (``too_long="error"``),
            ``beams`` or ``batch_size`` < 1, a tokenizer without the special tokens.
    """
    texts = _check(texts, beams, batch_size, max_new_tokens, too_long)
    check_subwords(tokenizer)
    window, out_window = model.encoder.max_len, model.decoder.max_len
    encoded = [e.ids + [EOS] for e in tokenizer.encode_batch(texts)]
    long = [i for i, e in enumerate(encoded) if len(e) > window]
    if long and too_long == "error":
        i = long[0]
        raise TranslationError(f"text {i} has {len(encoded[i])} subword tokens, more than the model's window "
                               f"max_len={window}; shorten or split it")
    result = list(texts)  # the too-long ones stay copies
    todo = sorted(set(range(len(texts))) - set(long), key=lambda i: len(encoded[i]))
    device = model.decoder_weight.device
    for a in range(0, len(todo), batch_size):
        rows = todo[a:a + batch_size]
        S = max(len(encoded[i]) for i in rows)
        ids = torch.full((len(rows), S), PAD, dtype=torch.long)  # (B,S)
        for r, i in enumerate(rows):
            ids[r, :len(encoded[i])] = torch.tensor(encoded[i])
        n = max_new_tokens if max_new_tokens is not None else min(2 * S + 10, out_window - 1)
        out = decode(model, ids.to(device), (ids != PAD).long().to(device), max_new_tokens=n, num_beams=beams,
                     length_penalty=length_penalty, eos_token_id=EOS, pad_token_id=PAD).sequences
        for r, i in enumerate(rows):
            row = out[r, 1:].tolist()
            row = row[:row.index(EOS)] if EOS in row else row
            result[i] = tokenizer.decode([t for t in row if t != PAD])
    return result
