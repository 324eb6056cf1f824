"""WordPiece tokenizers (BERT style) trained, loaded and saved with the ``tokenizers`` library.

A trained tokenizer has the BERT special tokens first — ``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3,
[MASK]=4`` — a ``BertNormalizer`` (optional lower-casing, accents stripped when lower-casing),
``BertPreTokenizer`` (split on whitespace and punctuation), ``##`` continuation pieces, and a
``[CLS] $A [SEP]`` post-processor. Loaded tokenizers (``tokenizer.json``, or ``vocab.txt`` of a BERT
checkpoint) may number their special tokens differently: always use :attr:`WordPieceTokenizer.special`.

Saving writes the Hugging Face form: ``tokenizer.json`` (loadable by ``tokenizers.Tokenizer.from_file``
and ``transformers.PreTrainedTokenizerFast``), plus ``vocab.txt`` and ``tokenizer_config.json`` so
that ``transformers.BertTokenizerFast.from_pretrained(folder)`` works too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from qkv._fs import atomic_write_text
from qkv.data.errors import EmptyCorpusError, TokenizerError
from qkv.data.tokenizer_facade import SPECIAL_TOKENS, as_backend, read_tokenizer, specials_of

__all__ = ["SPECIAL_TOKENS", "SpecialTokens", "WordPieceTokenizer", "train_tokenizer", "load_tokenizer"]

_PIECE_CHARS = 1 << 16  # long documents are encoded in whitespace-cut pieces of at most this size


#: The roles masked-LM pretraining needs, in the order of :class:`SpecialTokens`.
PRETRAIN_ROLES = ("pad", "unk", "cls", "sep", "mask")


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens masked-LM pretraining uses, by role (``[PAD] [UNK] [CLS] [SEP]
    [MASK]`` in a BERT vocabulary, ``<pad> <unk> <s> </s> <mask>`` in a RoBERTa one)."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @property
    def ids(self) -> tuple[int, ...]:
        """All five ids (``pad, unk, cls, sep, mask``)."""
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


class WordPieceTokenizer:
    """A ``tokenizers.Tokenizer`` with the special tokens masked-LM pretraining needs (read from the
    tokenizer's own configuration, :mod:`qkv.data.special_tokens`; any model — WordPiece or
    byte-level BPE — with pad, unk, cls, sep and mask tokens), plus what the pipeline needs.

    Attributes:
        backend: the wrapped ``tokenizers.Tokenizer``.
        special: ids of the pad, unk, cls, sep and mask tokens (``[PAD] [UNK] [CLS] [SEP] [MASK]``).
        vocab_size: size of the vocabulary (including special and added tokens).
        lowercase: whether the normalizer lower-cases (``None`` if unknown).

    Raises:
        TokenizerError: the backend lacks one of the special tokens.
    """

    def __init__(self, backend: Tokenizer):
        self.specials = specials_of(backend)
        self.backend = backend = as_backend(backend)
        missing = self.specials.missing(PRETRAIN_ROLES)
        if missing:
            raise TokenizerError(f"tokenizer lacks the special token(s) {', '.join(missing)} (it has "
                                 f"{self.specials.describe()}); masked-LM pretraining needs pad, unk, cls, sep "
                                 "and mask tokens ([PAD] [UNK] [CLS] [SEP] [MASK] or <pad> <unk> <s> </s> <mask>)")
        self.special = SpecialTokens(*(self.specials.id(r) for r in PRETRAIN_ROLES))
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        norm = json.loads(backend.to_str()).get("normalizer") or {}
        self.lowercase: bool | None = norm.get("lowercase") if norm.get("type") == "BertNormalizer" else None
        # copies without padding/truncation; _plain reads "[MASK]" etc. in corpus text as plain text
        self._raw = Tokenizer.from_str(backend.to_str())
        self._raw.no_truncation()
        self._raw.no_padding()
        self._plain = Tokenizer.from_str(self._raw.to_str())
        self._plain.encode_special_tokens = True

    def __repr__(self) -> str:
        return f"WordPieceTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"

    # -- identity -----------------------------------------------------------------------------------
    def to_str(self) -> str:
        """The Hugging Face ``tokenizer.json`` text."""
        return self.backend.to_str()

    def fingerprint(self) -> str:
        """sha256 of the serialised tokenizer: equal fingerprints, equal tokenisation."""
        return hashlib.sha256(self.to_str().encode()).hexdigest()

    # -- encoding -----------------------------------------------------------------------------------
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one text (with ``[CLS] … [SEP]`` by default; never padded or truncated)."""
        return self._raw.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(int(i))

    def encode_documents(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Encode documents for pretraining: per document ``(ids, word_starts)``, both ``(L,)``.

        No special tokens are added, and special-token text inside a document (``"[MASK]"``) is
        tokenised as plain text. ``word_starts[i]`` is True where token i begins a pre-tokenizer
        word (whole-word masking keeps a word's pieces together). Documents longer than 64 Ki
        characters are encoded in pieces cut at whitespace, so memory stays bounded.
        """
        pieces: list[str] = []
        owner: list[int] = []
        for d, text in enumerate(texts):
            for piece in _pieces(text):
                pieces.append(piece)
                owner.append(d)
        encs = self._plain.encode_batch(pieces, add_special_tokens=False)
        out_ids: list[list[np.ndarray]] = [[] for _ in texts]
        out_ws: list[list[np.ndarray]] = [[] for _ in texts]
        for d, enc in zip(owner, encs):
            ids = np.asarray(enc.ids, dtype=np.int64)
            words = np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64)
            ws = np.ones(len(ids), dtype=bool)
            ws[1:] = words[1:] != words[:-1]  # a new word id, or a token outside any word
            ws[1:] |= words[1:] < 0
            out_ids[d].append(ids)
            out_ws[d].append(ws)
        return [(np.concatenate(i) if i else np.zeros(0, np.int64), np.concatenate(w) if w else
                 np.zeros(0, bool)) for i, w in zip(out_ids, out_ws)]

    # -- saving -------------------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` (+ ``vocab.txt``, ``tokenizer_config.json``) into ``folder``;
        returns the ``tokenizer.json`` path. Each file is written atomically (:mod:`qkv._fs`)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        vocab = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        config = {"tokenizer_class": "BertTokenizerFast", "do_lower_case": bool(self.lowercase),
                  **{f"{r}_token": self.specials.token(r) for r in ("unk", "sep", "pad", "cls", "mask")}}
        if json.loads(self.to_str()).get("model", {}).get("type") != "WordPiece":
            config = {"tokenizer_class": "PreTrainedTokenizerFast",
                      **{f"{r}_token": t for r, t in self.specials.tokens.items()}}
        files = {"tokenizer.json": self.to_str(),
                 "vocab.txt": "".join(tok + "\n" for tok, _ in vocab),
                 "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
        for name, text in files.items():
            atomic_write_text(folder / name, text)
        return folder / "tokenizer.json"


def _pieces(text: str) -> Iterator[str]:
    while len(text) > _PIECE_CHARS:
        cut = max(text.rfind(" ", 0, _PIECE_CHARS), text.rfind("\n", 0, _PIECE_CHARS))
        cut = cut + 1 if cut > 0 else _PIECE_CHARS
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text


def _bert_backend(lowercase: bool, vocab: dict[str, int] | None = None) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _char_counts(texts: Iterable[str], normalizer) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        counts.update(normalizer.normalize_str(text))
    for c in [c for c in counts if c.isspace()]:
        del counts[c]
    return counts


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 8192, lowercase: bool = True,
                    min_frequency: int = 2, limit_alphabet: int = 1000, max_chars: int | None = None,
                    show_progress: bool = False) -> WordPieceTokenizer:
    """Train a BERT-style WordPiece tokenizer on texts (e.g. a training :class:`Corpus`).

    Deterministic: the same texts and options give the same ``tokenizer.json`` in every process.
    (The ``tokenizers`` trainer alone is not — huggingface/tokenizers#1794: it numbers the ``##``
    pieces in hash-map order, which breaks ties between merges differently each run. So a first
    pass counts the normalised characters, fixes the alphabet — most frequent first, ties by code
    point — and gives the trainer the ``##`` pieces up front, in code-point order.)

    Args:
        texts: the training documents, read twice; a one-shot iterator is first kept in memory, so
            pass a re-iterable (a :class:`Corpus`, a list) for large corpora.
        vocab_size: target vocabulary size, special tokens included (a small corpus may give fewer;
            every alphabet character and its ``##`` piece is kept even beyond it, as in BERT).
        lowercase: lower-case (and strip accents) before splitting.
        min_frequency: minimum count of a merged piece.
        limit_alphabet: most distinct characters kept.
        max_chars: read only the first documents up to this many characters (a sample).
        show_progress: the ``tokenizers`` progress bar.

    Raises:
        ValueError: ``vocab_size`` smaller than the special tokens plus a few characters.
        EmptyCorpusError: no text seen.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 10:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 10}, got {vocab_size}")
    if iter(texts) is texts:  # a one-shot iterator: keep it for the second pass
        texts = list(texts)

    def stream() -> Iterator[str]:
        total = 0
        for text in texts:
            yield text
            total += len(text)
            if max_chars is not None and total >= max_chars:
                return

    backend = _bert_backend(lowercase)
    counts = _char_counts(stream(), backend.normalizer)
    if not counts:
        raise EmptyCorpusError("cannot train a tokenizer: the corpus holds no text")
    alphabet = sorted(sorted(counts, key=lambda c: (-counts[c], c))[:limit_alphabet])
    pieces = ["##" + c for c in alphabet]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(SPECIAL_TOKENS) + pieces,
                                        initial_alphabet=alphabet, limit_alphabet=len(alphabet),
                                        continuing_subword_prefix="##", show_progress=show_progress)
    backend.train_from_iterator(stream(), trainer)
    # rebuild without the "##c" pieces registered as special added tokens (they stay plain vocab)
    backend = _bert_backend(lowercase, backend.get_vocab(with_added_tokens=True))
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    special = SpecialTokens(*(backend.token_to_id(t) for t in SPECIAL_TOKENS))
    assert special.ids == (0, 1, 2, 3, 4), special
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", special.cls), ("[SEP]", special.sep)])
    return WordPieceTokenizer(backend)


def load_tokenizer(path: str | os.PathLike, *, lowercase: bool | None = None) -> WordPieceTokenizer:
    """Load a tokenizer from a ``tokenizer.json`` file, or a folder holding ``tokenizer.json`` or
    ``vocab.txt`` (BERT WordPiece, its special tokens registered; lower-casing: ``lowercase``, else
    ``tokenizer_config.json``'s ``do_lower_case``, else True), with
    :func:`qkv.data.tokenizer_facade.read_tokenizer`.

    Raises:
        TokenizerError: nothing loadable there, a broken file, or missing special tokens.
    """
    backend = read_tokenizer(path, lowercase=lowercase, register_specials=True)
    if backend is None:
        raise TokenizerError(f"no tokenizer in {Path(path).expanduser()}: expected tokenizer.json or vocab.txt")
    return WordPieceTokenizer(backend)
