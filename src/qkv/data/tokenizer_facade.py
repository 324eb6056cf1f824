"""The one way in and out for the tokenizer of a model: load, view, check, save.

Every package that tokenizes text for a model goes through here — model folders
(:mod:`qkv.checkpoints.io`), embeddings, analysis, fine-tuning, pretraining tokenizers
(:func:`qkv.data.tokenizer.load_tokenizer`); training new WordPiece tokenizers lives in
:mod:`qkv.data.tokenizer`.

* **Load** (:func:`read_tokenizer`): a ``tokenizer.json`` file, a ``vocab.txt`` file, or a folder
  holding ``tokenizer.json`` (preferred) or a BERT WordPiece ``vocab.txt`` (lower-casing from the
  folder's ``tokenizer_config.json``); :func:`as_backend` accepts a loaded tokenizer instead.
  :func:`qkv.data.model_tokenizer.read_model_tokenizer` gives a model folder's tokenizer as a
  :class:`~qkv.data.model_tokenizer.ModelTokenizer` (what :func:`qkv.load` returns): the
  ``tokenizers.Tokenizer`` with the special tokens the folder declares, callable on texts (padded
  tensors and the mask).
* **Special tokens by role** (:mod:`qkv.data.special_tokens`): ``cls``, ``sep``, ``pad``, ``mask``,
  ``unk``, ``bos``, ``eos`` and the template put around a text, read from the tokenizer's own
  configuration — BERT's ``[CLS] … [SEP]``, RoBERTa's ``<s> … </s>``, nothing for GPT-2 — never a
  fixed list.
* **View** (:class:`TokenizerView`): a copy without truncation or padding (the model's windows are
  cut by :mod:`qkv.data.windows`, not by the tokenizer) with the special tokens — content ids,
  whole-word flags, pre-tokenized words, the template.
* **Check** (:meth:`TokenizerView.require`, :func:`special_ids`): the special tokens a use needs are present.
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
from qkv.data.special_tokens import CONVENTIONS, Specials, resolve_specials

__all__ = ["SPECIAL_TOKENS", "ROLE_OF", "as_backend", "special_ids", "read_tokenizer", "no_tokenizer", "specials_of",
           "TokenizerView", "write_tokenizer", "TokenizerFile"]

#: The BERT special tokens, in the order qkv numbers them when it trains a tokenizer.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: BERT's token names → the role each plays (``required=("[MASK]",)`` means the ``mask`` role).
ROLE_OF = {"[PAD]": "pad", "[UNK]": "unk", "[CLS]": "cls", "[SEP]": "sep", "[MASK]": "mask"}
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


def specials_of(tokenizer) -> Specials:
    """The :class:`~qkv.data.special_tokens.Specials` of ``tokenizer``: a :class:`ModelTokenizer` or
    :class:`TokenizerView` brings its own (with what its folder declared); a ``tokenizers.Tokenizer``
    or qkv wrapper is read from its own configuration."""
    own = getattr(tokenizer, "specials", None)
    if isinstance(own, Specials):
        return own
    return resolve_specials(as_backend(tokenizer))


class TokenizerView:
    """A tokenizer as a model's input needs it: a copy with truncation and padding switched off
    (the caller's tokenizer stays as it was) and its special tokens by role
    (:mod:`qkv.data.special_tokens`): the template put around a text and the ids of ``cls``,
    ``sep``, ``pad``, ``mask``, ``unk``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``, a :class:`ModelTokenizer` (``qkv.load``'s), or a qkv
            wrapper holding one as ``.backend``.
        required: roles that must be present (``"mask"``, …; BERT names such as ``"[MASK]"`` are
            read as their roles); none by default — a tokenizer without a template gives windows
            without special tokens, as it gives them to any model.
        error: the exception class raised (the calling package's).
        where: how messages name the tokenizer.
        purpose: why the special tokens are needed (for the message).

    Attributes:
        backend: the copy (``tokenizers.Tokenizer``).
        specials: the :class:`~qkv.data.special_tokens.Specials`.
        prefix, suffix: ids put before and after one text (``[CLS]`` / ``[SEP]``; ``<s>`` / ``</s>``).
        cls_id, sep_id, unk_id, mask_id: ids of those roles (``None`` when absent).
        pad_id: the padding id: the ``pad`` token's, else ``eos``'s, else 0 (padding is always
            masked out, so its id never reaches a result).

    Raises:
        error: not a tokenizer, or a required role is missing.
    """

    def __init__(self, tokenizer, *, required: Sequence[str] = (), error: type[Exception] = TokenizerError,
                 where: str = "the tokenizer", purpose: str | None = None):
        backend = as_backend(tokenizer, error=error)
        self.backend = Tokenizer.from_str(backend.to_str())
        self.backend.no_truncation()
        self.backend.no_padding()
        self.specials = specials_of(tokenizer)
        self.require(required, error=error, where=where, purpose=purpose)
        sp = self.specials
        self.prefix, self.suffix = sp.prefix, sp.suffix
        self.cls_id, self.sep_id = sp.id("cls"), sp.id("sep")
        self.unk_id, self.mask_id = sp.id("unk"), sp.id("mask")
        pad = sp.id("pad")
        self.pad_id = pad if pad is not None else sp.id("eos") if sp.id("eos") is not None else 0

    def require(self, roles: Sequence[str], *, error: type[Exception] = TokenizerError,
                where: str = "the tokenizer", purpose: str | None = None) -> None:
        """Raise ``error`` naming every role of ``roles`` the tokenizer has no token for (and the
        names looked for)."""
        missing = self.specials.missing([ROLE_OF.get(r, r) for r in roles])
        if missing:
            names = "; ".join(f"{r}: none of its settings or {'/'.join(CONVENTIONS[r])}" for r in missing)
            why = f"; {purpose}" if purpose else ""
            raise error(f"{where} has no {', '.join(missing)} token ({names}; it has "
                        f"{self.specials.describe()}){why}")

    def __repr__(self) -> str:
        return f"TokenizerView(vocab_size={self.backend.get_vocab_size()}, {self.specials.describe()})"

    @property
    def n_special(self) -> int:
        """Special tokens around one text (``len(prefix) + len(suffix)``)."""
        return len(self.prefix) + len(self.suffix)

    def frame(self, ids: Sequence[int], pair: Sequence[int] | None = None) -> list[int]:
        """``ids`` inside the tokenizer's template (``[CLS] a [SEP]``; with ``pair``:
        ``[CLS] a [SEP] b [SEP]``, RoBERTa's ``<s> a </s></s> b </s>``)."""
        out = [*self.prefix, *map(int, ids), *self.suffix]
        if pair is not None:
            sp = self.specials
            out = [*self.prefix, *map(int, ids), *sp.pair_middle, *map(int, pair), *sp.pair_suffix]
        return out

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


def _tokenizer_class(state: dict, specials: Specials) -> str:
    """The ``transformers`` tokenizer class of a tokenizer's ``tokenizer.json`` state."""
    model = (state.get("model") or {}).get("type")
    pre = (state.get("pre_tokenizer") or {}).get("type")
    if model == "WordPiece":
        return "BertTokenizer"
    if model == "BPE" and pre == "ByteLevel":
        return "RobertaTokenizer" if specials.token("cls") == "<s>" else "GPT2Tokenizer"
    return "PreTrainedTokenizerFast"


def write_tokenizer(tokenizer, folder: str | os.PathLike, *, max_len: int) -> None:
    """Write a model folder's tokenizer files into ``folder`` (nothing for ``None``):
    ``tokenizer.json``, ``vocab.txt`` for a WordPiece tokenizer, ``special_tokens_map.json`` when its
    folder declared special tokens, and a ``tokenizer_config.json`` for ``transformers`` (the
    tokenizer class — ``BertTokenizer``, ``RobertaTokenizer``, ``GPT2Tokenizer``, or
    ``PreTrainedTokenizerFast`` — lower-casing, ``max_len``, the special tokens by role,
    :mod:`qkv.data.special_tokens`): every folder qkv writes, qkv or Hugging Face, loads in
    ``AutoTokenizer`` as the tokenizer it is (a byte-level BPE vocabulary never read as WordPiece).
    The caller makes the folder appear atomically."""
    if tokenizer is None:
        return
    specials = specials_of(tokenizer)
    backend = as_backend(tokenizer)
    folder = Path(folder)
    backend.save(str(folder / "tokenizer.json"))
    state = json.loads(backend.to_str())
    if state.get("model", {}).get("type") == "WordPiece":
        vocab = sorted(backend.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
        (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    if specials.declared:  # what the source folder said, kept for the next reader
        declared = {f"{r}_token": t for r, t in specials.declared.items()}
        (folder / "special_tokens_map.json").write_text(json.dumps(declared, indent=2), encoding="utf-8")
    cls = _tokenizer_class(state, specials)
    settings = {"tokenizer_class": cls}
    if cls == "BertTokenizer":
        settings["do_lower_case"] = bool((state.get("normalizer") or {}).get("lowercase", True))
    settings["model_max_length"] = max_len
    roles = ("unk", "sep", "pad", "cls", "mask") + (() if cls == "BertTokenizer" else ("bos", "eos"))
    for role in roles:  # named, so no family's defaults are guessed
        if specials.token(role) is not None:
            settings[f"{role}_token"] = specials.token(role)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")


class TokenizerFile:
    """A tokenizer that saves itself as ``tokenizer.json`` (what a fine-tuning run folder holds
    before its model is written), with the special tokens its folder declared.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` or a qkv wrapper holding one; saved as it is (with
            any truncation or padding it carries).
    """

    def __init__(self, tokenizer):
        self.backend = as_backend(tokenizer)
        self.declared = dict(specials_of(tokenizer).declared)

    def save(self, folder: str | os.PathLike) -> None:
        """``tokenizer.json`` (and ``special_tokens_map.json`` when its folder declared special tokens)."""
        self.backend.save(str(Path(folder) / "tokenizer.json"))
        if self.declared:
            (Path(folder) / "special_tokens_map.json").write_text(
                json.dumps({f"{r}_token": t for r, t in self.declared.items()}, indent=2), encoding="utf-8")
