"""The one way in and out for the tokenizer of a model: load, view, check, save.

Every package that tokenizes text for a model goes through here — model folders
(:mod:`qkv.checkpoints.io`), embeddings, analysis, fine-tuning, pretraining tokenizers
(:func:`qkv.data.tokenizer.load_tokenizer`); training new WordPiece tokenizers lives in
:mod:`qkv.data.tokenizer`.

* **Load** (:func:`read_tokenizer`): a ``tokenizer.json`` file, a ``vocab.txt`` file, or a folder
  holding ``tokenizer.json`` (preferred) or a BERT WordPiece ``vocab.txt`` (lower-casing from the
  folder's ``tokenizer_config.json``); :func:`as_backend` accepts a loaded tokenizer instead.
* **View** (:class:`TokenizerView`): a copy without truncation or padding (the model's windows are
  cut by :mod:`qkv.data.windows`, not by the tokenizer) with the special-token ids — content ids,
  whole-word flags, pre-tokenized words.
* **Check** (:func:`special_ids`): the special tokens a use needs are present.
* **Save** (:func:`write_tokenizer`, :class:`TokenizerFile`): the files of a model folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from qkv.data.errors import TokenizerError

__all__ = ["SPECIAL_TOKENS", "VIEW_SPECIALS", "as_backend", "special_ids", "read_tokenizer", "no_tokenizer",
           "TokenizerView", "write_tokenizer", "TokenizerFile"]

#: The BERT special tokens, in the order qkv numbers them when it trains a tokenizer.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: What a model input needs: ``[CLS] … [SEP]`` windows padded with ``[PAD]``.
VIEW_SPECIALS = ("[CLS]", "[SEP]", "[PAD]")
# the order BertWordPieceTokenizer registers a vocab.txt's special tokens in (their JSON order)
_REGISTER_ORDER = ("[UNK]", "[SEP]", "[CLS]", "[PAD]", "[MASK]")


def as_backend(tokenizer, *, error: type[Exception] = TokenizerError) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` of ``tokenizer``: itself, or the ``.backend`` of a qkv wrapper
    (:class:`~qkv.data.tokenizer.WordPieceTokenizer`, :class:`TokenizerView`).

    Raises:
        error: anything else.
    """
    backend = getattr(tokenizer, "backend", tokenizer)
    if not isinstance(backend, Tokenizer):
        raise error(f"expected a tokenizers.Tokenizer (or a qkv WordPieceTokenizer), got {type(tokenizer).__name__}; "
                    "pass the tokenizer qkv.load returns")
    return backend


def special_ids(backend: Tokenizer, names: Sequence[str] = SPECIAL_TOKENS, *, error: type[Exception] = TokenizerError,
                where: str = "tokenizer", purpose: str | None = None) -> dict[str, int]:
    """Ids of the special tokens ``names`` in ``backend``.

    Args:
        backend: the tokenizer.
        names: the special tokens the use needs.
        error: the exception class raised (the calling package's).
        where: how the message names the tokenizer.
        purpose: why they are needed (default: ``qkv needs all of …``).

    Raises:
        error: one or more are missing (``<where> lacks the special token(s) …; <purpose>``).
    """
    ids = {t: backend.token_to_id(t) for t in names}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        why = purpose or f"qkv needs all of {', '.join(names)}"
        raise error(f"{where} lacks the special token(s) {', '.join(missing)}; {why}")
    return ids


def no_tokenizer(where: str, *, error: type[Exception] = TokenizerError, hint: str = "") -> Exception:
    """The error for a model without a tokenizer (``where``: e.g. ``"model folder runs/x"``)."""
    return error(f"{where} has no tokenizer (expected tokenizer.json or vocab.txt beside the weights); copy "
                 f"the tokenizer files of the model it was trained with into the folder{hint}")


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _wordpiece_from_vocab(vocab: Path, lowercase: bool, *, register_specials: bool) -> Tokenizer:
    """A BERT WordPiece tokenizer from ``vocab.txt`` (BertNormalizer, BertPreTokenizer, ``[CLS] $A
    [SEP]`` when both exist, ``##`` decoder); ``register_specials`` also registers the special
    tokens present as added tokens, as ``BertWordPieceTokenizer`` does."""
    tok = Tokenizer(WordPiece.from_file(str(vocab), unk_token="[UNK]"))
    if register_specials:
        for name in _REGISTER_ORDER:
            if tok.token_to_id(name) is not None:
                tok.add_special_tokens([name])
    tok.normalizer = normalizers.BertNormalizer(lowercase=bool(lowercase))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls is not None and sep is not None:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    tok.decoder = decoders.WordPiece()
    return tok


def read_tokenizer(path: str | os.PathLike, *, lowercase: bool | None = None,
                   register_specials: bool = False) -> Tokenizer | None:
    """The tokenizer at ``path``, or ``None`` for a folder without one.

    Args:
        path: a ``tokenizer.json`` file, a ``vocab.txt`` file, or a folder holding ``tokenizer.json``
            (preferred) or ``vocab.txt``.
        lowercase: for ``vocab.txt``: lower-case; default: ``tokenizer_config.json``'s
            ``do_lower_case`` beside it, else True.
        register_specials: for ``vocab.txt``: register its special tokens as added tokens
            (``BertWordPieceTokenizer``'s form, what pretraining tokenizers use); model folders
            are read without (their tokenizer as :func:`qkv.load` has always given it).

    Raises:
        TokenizerError: ``path`` does not exist, or a tokenizer file there is unreadable.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise TokenizerError(f"tokenizer path not found: {path}; give a tokenizer.json file or a folder with one")
    folder = path if path.is_dir() else path.parent
    file = path if path.is_file() else folder / "tokenizer.json"
    if file.name.endswith(".json") and file.is_file():
        try:
            return Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on a damaged file
            raise TokenizerError(f"cannot load a tokenizer from {file}: {_first_line(e)}; replace it with the "
                                 "tokenizer.json the model was trained with") from None
    vocab = file if file.name == "vocab.txt" else folder / "vocab.txt"
    if not vocab.is_file():
        return None
    if lowercase is None:
        lowercase = True
        config = folder / "tokenizer_config.json"
        if config.is_file():
            try:
                lowercase = bool(json.loads(config.read_text(encoding="utf-8")).get("do_lower_case", True))
            except (OSError, ValueError, AttributeError) as e:
                raise TokenizerError(f"cannot load a tokenizer from {config}: not a readable JSON object "
                                     f"({_first_line(e)}); fix or remove the file") from None
    try:
        return _wordpiece_from_vocab(vocab, lowercase, register_specials=register_specials)
    except Exception as e:  # a vocab.txt the WordPiece model cannot read
        raise TokenizerError(f"cannot load a tokenizer from {vocab}: {_first_line(e)}") from None


class TokenizerView:
    """A tokenizer as a model's input needs it: a copy with truncation and padding switched off
    (the caller's tokenizer stays as it was) and the ids of its special tokens.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` or a qkv wrapper holding one as ``.backend``.
        required: special tokens that must be present (default ``[CLS]``, ``[SEP]``, ``[PAD]``).
        error: the exception class raised (the calling package's).
        where: how messages name the tokenizer.
        purpose: why the special tokens are needed (for the message).

    Attributes:
        backend: the copy (``tokenizers.Tokenizer``).
        cls_id, sep_id, pad_id: ids of ``[CLS]``, ``[SEP]``, ``[PAD]``.
        unk_id, mask_id: ids of ``[UNK]``, ``[MASK]`` (``None`` when absent and not required).

    Raises:
        error: not a tokenizer, or a required special token is missing.
    """

    def __init__(self, tokenizer, *, required: Sequence[str] = VIEW_SPECIALS,
                 error: type[Exception] = TokenizerError, where: str = "the tokenizer", purpose: str | None = None):
        backend = as_backend(tokenizer, error=error)
        self.backend = Tokenizer.from_str(backend.to_str())
        self.backend.no_truncation()
        self.backend.no_padding()
        special_ids(self.backend, required, error=error, where=where, purpose=purpose)
        ids = {t: self.backend.token_to_id(t) for t in SPECIAL_TOKENS}
        self.cls_id, self.sep_id, self.pad_id = ids["[CLS]"], ids["[SEP]"], ids["[PAD]"]
        self.unk_id, self.mask_id = ids["[UNK]"], ids["[MASK]"]

    def __repr__(self) -> str:
        return f"TokenizerView(vocab_size={self.backend.get_vocab_size()}, cls={self.cls_id}, sep={self.sep_id})"

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Content token ids (no special tokens) of each text: ``(n_i,)`` int64 arrays."""
        encs = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def encode_words(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text, its content ids ``(n_i,)`` int64 and whether each token is a whole word (the
        only piece of its pre-tokenizer word) ``(n_i,)`` bool."""
        out = []
        for enc in self.backend.encode_batch(list(texts), add_special_tokens=False):
            counts: dict[int, int] = {}
            for w in enc.word_ids:
                if w is not None:
                    counts[w] = counts.get(w, 0) + 1
            whole = [w is not None and counts[w] == 1 for w in enc.word_ids]
            out.append((np.asarray(enc.ids, dtype=np.int64), np.asarray(whole, dtype=bool)))
        return out

    def encode_pretokenized(self, sentences: Sequence[Sequence[str]]) -> list[list[np.ndarray]]:
        """Per sentence (a list of words, tokenised as given), per word, its piece ids ``(p,)``
        int64 — empty for a word the tokenizer turns into no piece."""
        encs = self.backend.encode_batch([list(s) for s in sentences], is_pretokenized=True,
                                         add_special_tokens=False)
        out = []
        for words, enc in zip(sentences, encs):
            pieces: list[list[int]] = [[] for _ in words]
            for piece, w in zip(enc.ids, enc.word_ids):
                if w is not None:
                    pieces[w].append(piece)
            out.append([np.asarray(p, dtype=np.int64) for p in pieces])
        return out

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, i: int) -> str:
        """The token of id ``i`` (``"<i>"`` for an id outside the vocabulary)."""
        tok = self.backend.id_to_token(int(i))
        return tok if tok is not None else f"<{i}>"


#: ``tokenizer_config.json`` special-token keys and the token texts looked for (BERT's, then RoBERTa's).
_SPECIAL_NAMES = {"unk_token": ("[UNK]", "<unk>"), "sep_token": ("[SEP]", "</s>"), "pad_token": ("[PAD]", "<pad>"),
                  "cls_token": ("[CLS]", "<s>"), "mask_token": ("[MASK]", "<mask>")}


def write_tokenizer(tokenizer, folder: str | os.PathLike, *, hf_config: bool, max_len: int) -> None:
    """Write a model folder's tokenizer files into ``folder`` (nothing for ``None``):
    ``tokenizer.json``, ``vocab.txt`` for a WordPiece tokenizer, and with ``hf_config`` a
    ``tokenizer_config.json`` for ``transformers`` (``BertTokenizer``, lower-casing, ``max_len``, the
    special tokens the vocabulary has).
    The caller makes the folder appear atomically."""
    if tokenizer is None:
        return
    tokenizer = as_backend(tokenizer)
    folder = Path(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    state = json.loads(tokenizer.to_str())
    if state.get("model", {}).get("type") == "WordPiece":
        vocab = sorted(tokenizer.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
        (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    if hf_config:
        lower = bool((state.get("normalizer") or {}).get("lowercase", True))
        settings = {"tokenizer_class": "BertTokenizer", "do_lower_case": lower, "model_max_length": max_len}
        for key, candidates in _SPECIAL_NAMES.items():  # named, so no family's defaults are guessed
            found = next((t for t in candidates if tokenizer.token_to_id(t) is not None), None)
            if found is not None:
                settings[key] = found
        (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")


class TokenizerFile:
    """A tokenizer that saves itself as ``tokenizer.json`` only (what a fine-tuning run folder holds
    before its model is written).

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` or a qkv wrapper holding one; saved as it is (with
            any truncation or padding it carries).
    """

    def __init__(self, tokenizer):
        self.backend = as_backend(tokenizer)

    def save(self, folder: str | os.PathLike) -> None:
        self.backend.save(str(Path(folder) / "tokenizer.json"))
