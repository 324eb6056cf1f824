"""Subword vocabularies for translation: byte-pair encoding that keeps case and accents and
decodes back to the exact text.

A translation model must write ``¿Quién es éste?`` — with its capitals, accents and the spacing of
its punctuation — so the BERT WordPiece tokenizer of :mod:`qkv.data.tokenizer` (lower-casing,
accent stripping, a space around every punctuation mark) does not fit. :func:`train_subwords`
trains a ``tokenizers`` BPE model with SentencePiece's conventions instead: Unicode NFC, words
marked by a leading ``▁`` (the Metaspace pre-tokenizer), and a decoder that turns ``▁`` back into
spaces, so ``decode(encode(text)) == text`` for any text of single-spaced words made of characters
seen in training. A character never seen becomes ``[UNK]`` (a special token: decoding leaves it
out); the Bible pairs' test books hold none that the training books lack.

Special tokens come first, in the ids an :class:`~qkv.models.seq2seq.EncoderDecoder` uses:
``[PAD]=0`` (padding), ``[BOS]=1`` (the decoder's start token), ``[EOS]=2`` (ends a source and a
target), ``[UNK]=3`` (a character never seen in training). One vocabulary serves both languages
when trained on both sides of the pairs (shared vocabulary, one tied table), or one per side.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from qkv.translation.errors import TranslationError

__all__ = ["SPECIALS", "PAD", "BOS", "EOS", "UNK", "train_subwords", "check_subwords"]

#: The special tokens, in id order.
SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]")
PAD, BOS, EOS, UNK = range(4)


def train_subwords(texts: Iterable[str], *, vocab_size: int = 8000, min_frequency: int = 2) -> Tokenizer:
    """A BPE ``tokenizers.Tokenizer`` learned from ``texts`` (see the module docstring).

    Args:
        texts: the training text (for a shared vocabulary: both sides of the training pairs).
        vocab_size: the vocabulary's size, special tokens included (at least 64).
        min_frequency: a merge is learned only from pairs seen this often.

    Raises:
        TranslationError: ``vocab_size`` below 64, or no text.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 64:
        raise TranslationError(f"vocab_size must be an int ≥ 64, got {vocab_size!r}")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise TranslationError("no text to learn a subword vocabulary from; give the training pairs")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    check_subwords(tok)
    return tok


def check_subwords(tok: Tokenizer) -> None:
    """``TranslationError`` unless ``tok`` numbers :data:`SPECIALS` 0…3 (what the models expect)."""
    found = [tok.token_to_id(s) for s in SPECIALS]
    if found != list(range(len(SPECIALS))):
        pairs = ", ".join(f"{s}={i}" for s, i in zip(SPECIALS, found))
        raise TranslationError(f"a translation tokenizer needs {', '.join(SPECIALS)} as ids 0-3, this one has "
                               f"{pairs}; give a model trained by qkv pretrain --objective translation, which writes it (in Python: "
                               "qkv.translation.subwords.train_subwords)")
