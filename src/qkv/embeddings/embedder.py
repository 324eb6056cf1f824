"""Document embeddings: :func:`embed` and the reusable :class:`Embedder`.

Legend: N documents, B windows in a batch, T padded length, C the vector width (the model width, or
K times it for K pooling modes concatenated).

Steps, per chunk of documents (the whole input when it fits, so a list in memory is one chunk):
tokenise (no truncation) → split long documents into overlapping windows
(:mod:`qkv.data.windows`) → sort windows by length and run them in batches → pool each
window (:mod:`qkv.embeddings.pooling`) → average the windows of a document weighted by their token
count (the tokens pooling ran over, ``[CLS]``/``[SEP]`` included) → L2-normalise (optional) →
input order.

With mean pooling the weighted average of the window means is exactly the mean over all tokens of
all windows (tokens in an overlap count once per window), so a long document is treated like one
long window whose tokens each saw at most W − 1 neighbours.

The options (pooling, layers, window, …) are one :class:`~qkv.embeddings.options.EmbedOptions`.

Empty documents (empty or whitespace only): ``empty="error"`` (default) raises
:class:`EmptyDocumentError` naming them before any work; ``"zero"`` gives an all-zero vector (left
unnormalised: its cosine with anything is 0); ``"skip"`` (streams only) leaves them out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkv.data.tokenizer_facade import TokenizerView, no_tokenizer
from qkv.data.windows import length_batches, make_windows
from qkv.embeddings.errors import EmbeddingError, EmptyDocumentError
from qkv.embeddings.options import EMBEDDING_JSON, EMPTY_MODES, EmbedOptions, as_options, folder_defaults
from qkv.embeddings.pooling import forward_pooled_packed, pooling_modes
from qkv.errors import QkvError
from qkv.inference import check_precision, for_inference_calibrated, inference_precision
from qkv.nn.packed import PackedBatch
from qkv.errors import CheckpointError
from qkv.checkpoints.bundled import model_folder
from qkv.checkpoints.io import Pretrained, load, unpack
from qkv.models.mlm import MaskedLM
from qkv.nn.encoder import Encoder
from tqdm.auto import tqdm

__all__ = ["embed", "Embedder", "EmbedOptions", "EmbedStats", "EMPTY_MODES", "EMBEDDING_JSON",
           "folder_defaults", "resolve_model"]

_CHUNK_CHARS = 8 << 20  # a chunk also ends after this many characters: memory stays bounded


@dataclass
class EmbedStats:
    """What an :class:`Embedder` has done so far (all calls together)."""

    documents: int = 0
    windows: int = 0
    tokens: int = 0
    long_documents: int = 0  # documents longer than one window (averaged over windows, or truncated)
    truncated: int = 0
    empty: int = 0
    window_tokens: int = 0  # tokens of all windows, [CLS]/[SEP] included (no padding)
    padded_tokens: int = 0  # tokens computed (the packed path computes no padding: = window_tokens)


def resolve_model(model_or_path, tokenizer=None):
    """``(encoder, tokenizer view, folder defaults, model reference)`` from a folder, a
    :class:`~qkv.checkpoints.io.Pretrained` (``qkv.load(folder)``) or a model (with ``tokenizer=``).

    Raises:
        EmbeddingError: not loadable, not an encoder, or no tokenizer.
    """
    defaults: dict[str, Any] = {}
    ref = None
    if isinstance(model_or_path, (str, os.PathLike)):
        try:
            model_or_path = model_folder(model_or_path)  # "minilm": the installed package's folder
            pretrained = load(model_or_path)
        except CheckpointError as e:
            raise EmbeddingError(f"cannot load the model: {e}") from e
        ref = str(Path(model_or_path).resolve())
        try:
            defaults = folder_defaults(model_or_path)
        except (OSError, json.JSONDecodeError) as e:
            raise EmbeddingError(f"{model_or_path}: unreadable embedding settings ({e})") from e
    else:
        pretrained = model_or_path
    model, tok = unpack(pretrained, tokenizer)
    encoder = model.encoder if isinstance(model, MaskedLM) else model
    if not isinstance(encoder, Encoder):
        where, name = f"{ref}: " if ref else "", type(model).__name__
        raise EmbeddingError(f"{where}a model of type {name} is not a text encoder; embeddings need an encoder or "
                             "masked-LM folder (BERT, RoBERTa, DistilBERT, ModernBERT, ELECTRA, a qkv masked LM)")
    if tok is None and ref is None and not isinstance(pretrained, Pretrained):
        raise EmbeddingError(f"a bare {type(model).__name__} carries no tokenizer; pass tokenizer= (model, tokenizer "
                             "= qkv.load(folder)), or the folder, or what qkv.load returns")
    if tok is None:
        where = f"model folder {model_or_path}" if ref else "the model"
        raise no_tokenizer(where, error=EmbeddingError, hint=", or pass tokenizer=")
    view = TokenizerView(tok, error=EmbeddingError)
    return encoder, view, defaults, ref


class Embedder:
    """A model with fixed embedding options; reuse it to embed many inputs.

    Args:
        model_or_path: a model folder, what :func:`qkv.load` returns, or a bare model with
            ``tokenizer=``, as for :func:`embed`.
        options: the :class:`~qkv.embeddings.options.EmbedOptions` (default ``EmbedOptions()``);
            those left unset come from the model folder (see
            :func:`~qkv.embeddings.options.folder_defaults`), else from the model.
        tokenizer: a ``tokenizers.Tokenizer`` (or qkv ``WordPieceTokenizer``) to use instead of the
            folder's or bundle's; needed with a bare model.
        **changes: options changed on top of ``options``, by name (``Embedder(m, pooling="cls")``).

    Attributes:
        options: the resolved :class:`~qkv.embeddings.options.EmbedOptions`: every field set, the
            device as a ``torch.device`` (``options.to_dict(VECTOR_FIELDS)`` is what index folders
            and evaluation results record).
        pooling, layers, normalize, window, stride, truncate, empty, batch_size, batch_tokens,
            precision, chunk_size, progress: the resolved options (``window`` is ``options.max_len``).
        device: the ``torch.device`` the encoder runs on.
        dim: the vector width: C, or K·C for K pooling modes concatenated.
        stats: an :class:`EmbedStats` over all calls.
        model_ref: the resolved model folder (``None`` for a model object).

    Raises:
        EmbeddingError: a bad or unknown option, or one that does not fit the model (see
            :meth:`~qkv.embeddings.options.EmbedOptions.resolved`); a model that cannot be loaded
            or has no tokenizer.
    """

    def __init__(self, model_or_path, options: EmbedOptions | None = None, *, tokenizer=None, **changes):
        options = as_options(options, **changes)
        self.encoder, self.tokenizer, folder, self.model_ref = resolve_model(model_or_path, tokenizer)
        limit = self.encoder.max_len
        options = options.with_folder_defaults(folder, max_positions=limit).resolved(
            n_layers=len(self.encoder.layers), max_positions=limit)
        device = options.device
        if device is None or device == "auto":
            device = next(self.encoder.parameters()).device if self.model_ref is None else (
                "cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        self.options = o = options.replace(device=self.device)
        self.pooling, self.layers, self.normalize, self.window = o.pooling, o.layers, o.normalize, o.max_len
        self.stride, self.truncate, self.empty, self.progress = o.stride, o.truncate, o.empty, o.progress
        self.batch_size, self.chunk_size = o.batch_size, o.chunk_size
        self.batch_tokens, self.precision = o.batch_tokens, o.precision
        prepared = inference_precision(self.encoder)  # a model for_inference built: it runs as it is
        if prepared is not None:
            if o.precision not in ("fp32", prepared):  # fp32 is the default: the prepared model's own is meant
                raise EmbeddingError(f"the model was prepared for {prepared} inference (for_inference); embed it "
                                     f"with precision={prepared!r}, or pass the original model for {o.precision}")
            self.precision = prepared
            self.options = o = o.replace(precision=prepared)
        self.encoder.to(self.device)
        try:
            check_precision(self.precision, self.device)
        except QkvError as e:
            raise EmbeddingError(str(e)) from None
        self._runner: torch.nn.Module | None = None  # the encoder prepared for inference (a copy)
        self._runner_version: tuple | None = None
        self.dim = int(self.encoder.config.d_model) * len(pooling_modes(self.pooling))  # K·C
        self.stats = EmbedStats()
        self.empty_ids: list = []  # the first empty documents' ids (zeroed or skipped)
        self._bar = None
        self._docs_expected: int | None = None
        self._docs_before = 0

    # -- public ---------------------------------------------------------------------------------------
    def embed(self, texts: Sequence[str] | str) -> np.ndarray:
        """``(N,C)`` float32 vectors of ``texts`` in input order (a single ``str`` is one document)."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if self.empty == "skip":
            raise EmbeddingError("empty='skip' would misalign rows and inputs; use it with embed_stream")
        for i, t in enumerate(texts):
            _check_text(t, i)
        empty = [i for i, t in enumerate(texts) if not t.strip()]
        if empty and self.empty == "error":
            raise _empty_error(empty)
        out = [v for _, v in self.embed_stream(enumerate(texts), total=len(texts))]
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

    def embed_stream(self, records: Iterable[tuple[Any, str]], *, total: int | None = None
                     ) -> Iterator[tuple[list[Any], np.ndarray]]:
        """Embed ``(id, text)`` records lazily, one chunk at a time.

        Yields:
            ``(ids, vectors)`` per chunk: the chunk's ids (empty documents left out with
            ``empty="skip"``) and their ``(n,C)`` float32 vectors, in input order.

        Raises:
            EmptyDocumentError: an empty document with ``empty="error"`` (before its chunk is run).
        """
        bar = self._open_bar(total)
        try:
            chunk: list[tuple[Any, str]] = []
            chars = 0
            for rid, text in records:
                _check_text(text, rid)
                chunk.append((rid, text))
                chars += len(text)
                if len(chunk) >= self.chunk_size or chars >= _CHUNK_CHARS:
                    yield self._chunk(chunk)
                    chunk, chars = [], 0
            if chunk:
                yield self._chunk(chunk)
        finally:
            if bar is not None:
                bar.close()
            self._bar = None

    # -- internals ------------------------------------------------------------------------------------
    def _prepared(self) -> torch.nn.Module:
        """The encoder prepared for inference in :attr:`precision` (:func:`qkv.inference.for_inference`),
        prepared again when the encoder's weights have changed since (a model trained between calls);
        an encoder built for inference already is used as it is."""
        if inference_precision(self.encoder) is not None:
            return self.encoder
        version = tuple((p.data_ptr(), p._version) for p in self.encoder.parameters())
        if self._runner is None or version != self._runner_version:
            self._runner = for_inference_calibrated(self.encoder, self.precision, self.tokenizer, self.window,
                                                    device=self.device)
            self._runner_version = version
        return self._runner

    def _open_bar(self, total):
        if not self.progress:
            return None
        self._bar = tqdm(total=0, unit="window", desc="embedding", dynamic_ncols=True)
        self._docs_expected = total
        self._docs_before = self.stats.documents + self.stats.empty  # this call's count starts here
        return self._bar

    def _chunk(self, chunk: list[tuple[Any, str]]) -> tuple[list[Any], np.ndarray]:
        is_empty = [not t.strip() for _, t in chunk]
        if any(is_empty) and self.empty == "error":
            raise _empty_error([rid for (rid, _), e in zip(chunk, is_empty) if e])
        self.stats.empty += sum(is_empty)
        if len(self.empty_ids) < 20:
            self.empty_ids += [rid for (rid, _), e in zip(chunk, is_empty) if e][:20 - len(self.empty_ids)]
        keep = [i for i, e in enumerate(is_empty) if not e]
        vectors = np.zeros((len(chunk), self.dim), np.float32)
        if keep:
            vectors[keep] = self._embed_nonempty([chunk[i][1] for i in keep])
        if self._bar is not None:
            expected = f"/{self._docs_expected}" if self._docs_expected else ""
            done = self.stats.documents + self.stats.empty - self._docs_before
            self._bar.set_postfix_str(f"{done}{expected} docs")
        if self.empty == "skip" and len(keep) < len(chunk):
            return [chunk[i][0] for i in keep], vectors[keep]
        return [rid for rid, _ in chunk], vectors

    def _embed_nonempty(self, texts: list[str]) -> np.ndarray:
        tok = self.tokenizer
        wins = make_windows(tok.encode(texts), window=self.window, stride=self.stride, truncate=self.truncate,
                            prefix=tok.prefix, suffix=tok.suffix)
        lengths = wins.lengths
        owner = torch.as_tensor(np.asarray(wins.doc, dtype=np.int64), device=self.device)  # (windows,)
        total = torch.zeros(len(texts), self.dim, dtype=torch.float32, device=self.device)  # (N,C)
        weight = torch.zeros(len(texts), dtype=torch.float32, device=self.device)  # (N,)
        if self._bar is not None:
            self._bar.total += len(lengths)
            self._bar.refresh()
        runner = self._prepared()
        with torch.inference_mode():
            for batch in length_batches(lengths, self.batch_size, self.batch_tokens):
                packed = PackedBatch.from_sequences([wins.ids[i] for i in batch], device=self.device)
                vec = forward_pooled_packed(runner, packed, self.pooling, self.layers)  # (B,C)
                idx = torch.from_numpy(batch).to(self.device)
                w = torch.from_numpy(lengths[batch].astype(np.float32)).to(self.device)  # (B,)
                docs = owner.index_select(0, idx)  # (B,)
                total.index_add_(0, docs, vec.float() * w[:, None])  # (N,C) += (B,C)
                weight.index_add_(0, docs, w)
                self.stats.padded_tokens += packed.input_ids.numel()  # packed: no padding computed
                if self._bar is not None:
                    self._bar.update(len(batch))
        vectors = total / weight[:, None]  # (N,C): token-weighted mean of the window vectors
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        self.stats.documents += len(texts)
        self.stats.windows += len(lengths)
        self.stats.window_tokens += int(lengths.sum())
        self.stats.tokens += wins.tokens
        self.stats.truncated += wins.truncated
        self.stats.long_documents += wins.long
        return vectors.cpu().numpy()


def _check_text(text, rid) -> None:
    if not isinstance(text, str):
        hint = " (decode bytes first, e.g. b.decode('utf-8'))" if isinstance(text, (bytes, bytearray)) else ""
        raise EmbeddingError(f"document {rid!r} is a {type(text).__name__}, expected str{hint}")


def _empty_error(ids: list) -> EmptyDocumentError:
    shown = ", ".join(map(repr, ids[:10])) + (" …" if len(ids) > 10 else "")
    return EmptyDocumentError(
        f"{len(ids)} empty document(s) (empty or whitespace only): {shown}. An empty text has no tokens "
        "to pool; remove them, or choose empty='zero' (an all-zero vector) or, for streams and for "
        "qkv embed and qkv index, empty='skip' (--empty skip)")


def embed(model_or_path, texts: Sequence[str] | str, options: EmbedOptions | None = None, *,
          tokenizer=None, **changes) -> np.ndarray:
    """Embed documents with a qkv or Hugging Face BERT encoder.

    ``qkv.embed(m, texts, pooling="cls", max_len=128)`` is
    ``qkv.embed(m, texts, options=EmbedOptions().replace(pooling="cls", max_len=128))``.

    Args:
        model_or_path: a model folder (qkv, qkv run, or Hugging Face BERT; see :func:`qkv.load`), what
            :func:`qkv.load` returns (a :class:`~qkv.checkpoints.io.Pretrained`), or an
            :class:`~qkv.nn.encoder.Encoder` / :class:`~qkv.models.mlm.MaskedLM` (with ``tokenizer=``).
        texts: the documents (a single ``str`` is one document).
        options: the :class:`~qkv.embeddings.options.EmbedOptions` (default ``EmbedOptions()``:
            pooling, layers and window from the model folder, else mean, the last layer and the
            model's limit; normalised vectors; ``empty="error"``).
        tokenizer: a ``tokenizers.Tokenizer`` (or qkv ``WordPieceTokenizer``) to use instead of the
            folder's or bundle's; needed with a bare model.
        **changes: options changed on top of ``options``, by name: ``pooling``, ``layers``,
            ``normalize``, ``max_len``, ``stride``, ``truncate``, ``empty`` (``"error"`` or
            ``"zero"``; see the module docstring), ``batch_size``, ``chunk_size``, ``device``,
            ``progress`` (see :class:`~qkv.embeddings.options.EmbedOptions`).

    Returns:
        ``(N,C)`` float32 array, row i for ``texts[i]``.

    Raises:
        EmbeddingError: a bad or unknown option, a model without tokenizer, a non-``str`` document.
        EmptyDocumentError: an empty document with ``empty="error"``.
    """
    return Embedder(model_or_path, options, tokenizer=tokenizer, **changes).embed(texts)
