"""Semantic search: embed a corpus once into an index folder, then rank it against queries by cosine.

Index folder (written under a temporary name and renamed into place when complete)::

    index.json     format, model folder (absolute path), the sha256 of its weights and of its
                   tokenizer files, the embedding options (pooling, layers, window, stride),
                   count N, width C, source
    vectors.npy    (N,C) float32, L2-normalised: cosine = dot product
    texts.jsonl    one {"id": …, "text": …} per document, in vector order
    offsets.npy    (N,) int64 byte offset of each line of texts.jsonl (results are read by seeking)
    ann.faiss      an approximate index of the vectors (``--index faiss-ivf`` or ``faiss-hnsw``:
                   :mod:`qkv.embeddings.ann`); none for the default ``exact`` search

Queries are embedded with the same model and options; a model whose weights or tokenizer changed
since indexing is refused (its vectors would not be comparable). The vectors are memory-mapped and
scored in blocks, so an index larger than memory can be searched exactly (:class:`SearchIndex` opens
an index once for many queries; :func:`search` is one call); an approximate index answers from its
FAISS structure instead. Files that disagree with ``index.json`` (truncated, damaged) and non-finite
vectors are refused with a message. Under ``torchrun`` the corpus is embedded in shards, one per
process, and merged into the same folder (:mod:`qkv.embeddings.shards`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qkv._fs import write_folder
from qkv.embeddings.ann import AnnOptions, build_ann, check_search_parameters, open_ann
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.options import VECTOR_FIELDS, EmbedOptions, as_options
from qkv.validation import check_range
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.streams import open_writer

__all__ = ["build_index", "search", "SearchIndex", "load_index_meta", "index_options", "Hit", "INDEX_JSON",
           "top_k", "check_index_out", "write_documents", "finish_index"]

INDEX_JSON = "index.json"
INDEX_FORMAT = "qkv-embedding-index"
_BLOCK = 1 << 16


@dataclass
class Hit:
    """One search result."""

    rank: int
    score: float
    id: Any
    text: str


def _weights_file(model_dir: Path) -> Path | None:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / name).is_file():
            return model_dir / name
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")


def _tokenizer_sha256(model_dir: Path) -> dict[str, str]:
    return {n: _sha256(model_dir / n) for n in _TOKENIZER_FILES if (model_dir / n).is_file()}


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def check_index_out(model: str | os.PathLike, out: str | os.PathLike) -> Path:
    """``out`` as a path, refused when it is not absent or an empty folder, or ``model`` is no folder.

    Raises:
        EmbeddingError: naming the problem.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EmbeddingError(f"{out} exists and is not an empty folder; choose another --out")
    if not Path(model).is_dir():
        raise EmbeddingError(f"model folder not found: {model}")
    return out


def build_index(model: str | os.PathLike, records: Iterable[tuple[Any, str]], out: str | os.PathLike, *,
                source: str = "", options: EmbedOptions | None = None, ann: AnnOptions | None = None,
                **changes) -> dict[str, Any]:
    """Embed ``(id, text)`` records into the index folder ``out``.

    Args:
        model: the model folder.
        records: ``(id, text)`` pairs.
        out: the index folder to create (absent or empty).
        source: where the records came from (recorded).
        options: the :class:`~qkv.embeddings.options.EmbedOptions` (default
            ``EmbedOptions(empty="skip")``: an empty document is not indexed); ``normalize`` is
            forced on. The resolved options that decide the vectors are recorded in ``index.json``.
        ann: the index type and its parameters (default: ``exact``, no extra structure).
        **changes: options changed on top of ``options``, by name
            (``build_index(m, records, out, max_len=64)``).

    Returns:
        The ``index.json`` content.

    Raises:
        EmbeddingError: ``out`` exists and is not empty, or the embedder's errors.
    """
    options = as_options(options, default=EmbedOptions(empty="skip"), **changes).replace(normalize=True)
    out = check_index_out(model, out)
    embedder = Embedder(model, options)
    with write_folder(out, how="new") as tmp:  # an empty folder at out (checked) is replaced
        pending: deque[tuple[int, Any, str]] = deque()

        def numbered():
            for n, (rid, text) in enumerate(records):
                pending.append((n, rid, text))
                yield n, text

        def documents():
            for seqs, vectors in embedder.embed_stream(numbered()):
                ids, texts = [], []
                for seq in seqs:
                    while pending[0][0] != seq:  # documents left out (empty) are not indexed
                        pending.popleft()
                    _, rid, text = pending.popleft()
                    ids.append(rid)
                    texts.append(text)
                yield ids, texts, vectors

        rows = write_documents(tmp, embedder.dim, documents())
        st = embedder.stats
        stats = {"empty_skipped": st.empty, "long_documents": st.long_documents, "truncated": st.truncated}
        meta = finish_index(tmp, model=model, embedding=embedder.options.to_dict(VECTOR_FIELDS), count=rows,
                            dim=embedder.dim, source=source, stats=stats, ann=ann or AnnOptions())
    return meta


def write_documents(folder: Path, dim: int, documents: Iterable[tuple[list, list[str], np.ndarray]]) -> int:
    """Write ``vectors.npy``, ``texts.jsonl`` and ``offsets.npy`` of an index into ``folder`` from
    ``(ids, texts, vectors)`` chunks in index order; returns the number of documents.

    Raises:
        EmbeddingError: no document at all.
    """
    offsets = array("q")
    with open_writer(folder / "vectors.npy", dim) as writer, open(folder / "texts.jsonl", "wb") as fh:
        for ids, texts, vectors in documents:
            writer.write(ids, vectors)
            for rid, text in zip(ids, texts):
                offsets.append(fh.tell())
                fh.write(json.dumps({"id": rid, "text": text}, ensure_ascii=False).encode() + b"\n")
        rows = writer.rows
    np.save(folder / "offsets.npy", np.frombuffer(offsets, dtype=np.int64) if offsets else np.zeros(0, np.int64))
    if rows == 0:
        raise EmbeddingError("nothing to index: the corpus holds no non-empty document")
    return rows


def finish_index(folder: Path, *, model: str | os.PathLike, embedding: dict, count: int, dim: int, source: str,
                 stats: dict, ann: AnnOptions) -> dict[str, Any]:
    """Build the approximate index ``ann`` names (if any) over ``folder/vectors.npy`` and write
    ``index.json``; returns its content. ``stats``: ``empty_skipped``, ``long_documents``, ``truncated``."""
    record = build_ann(np.load(folder / "vectors.npy", mmap_mode="r"), ann, folder)
    weights = _weights_file(Path(model))
    meta = {"format": INDEX_FORMAT, "version": 1, "model": str(Path(model).resolve()),
            "model_weights_sha256": _sha256(weights) if weights else None,
            "model_weights_stat": _stat(weights) if weights else None,
            "model_tokenizer_sha256": _tokenizer_sha256(Path(model)),
            "embedding": embedding, "count": count, "dim": dim, "source": source, **stats,
            "index": record, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (folder / INDEX_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def load_index_meta(index: str | os.PathLike) -> dict[str, Any]:
    """``index.json`` of an index folder (checked).

    Raises:
        EmbeddingError: not an index folder.
    """
    path = Path(index) / INDEX_JSON
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise EmbeddingError(f"{index} is not an index folder made by `qkv index` ({e})") from None
    if not isinstance(meta, dict):
        raise EmbeddingError(f"{path}: not a JSON object; the index is damaged: rebuild it with qkv index")
    if meta.get("format") != INDEX_FORMAT:
        raise EmbeddingError(f"{path}: format {meta.get('format')!r}, expected {INDEX_FORMAT!r}")
    return meta


def index_options(meta: dict[str, Any], index: str | os.PathLike = "") -> EmbedOptions:
    """The options an index was built with (``index.json``'s ``embedding`` record), for its queries.

    Args:
        meta: the ``index.json`` content (see :func:`load_index_meta`).
        index: the index folder, for messages.

    Returns:
        :class:`~qkv.embeddings.options.EmbedOptions` with the recorded fields that decide the vectors
        (:data:`~qkv.embeddings.options.VECTOR_FIELDS`), the rest at their defaults.

    Raises:
        EmbeddingError: the record is missing, incomplete or holds a bad value.
    """
    stored = meta.get("embedding")
    needed = [k for k in VECTOR_FIELDS if k != "normalize"]  # indexes always hold normalised vectors
    missing = [k for k in needed if not isinstance(stored, dict) or k not in stored]
    try:
        if missing:
            raise EmbeddingError(f"no {', '.join(missing)} in its embedding options")
        return EmbedOptions.from_dict({k: stored[k] for k in VECTOR_FIELDS if k in stored})
    except EmbeddingError as e:
        raise EmbeddingError(f"{Path(index) / INDEX_JSON}: {e}; the index is damaged: rebuild it with "
                             "qkv index") from None


def top_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(Q,k)`` best scores and row indices over a memory-mapped ``(N,C)`` matrix, scanned in blocks."""
    best_s = np.full((len(queries), 0), -np.inf, np.float32)
    best_i = np.zeros((len(queries), 0), np.int64)
    for start in range(0, len(vectors), _BLOCK):
        block = np.asarray(vectors[start:start + _BLOCK], dtype=np.float32)
        s = queries @ block.T  # (Q,C)(C,b) -> (Q,b)
        kk = min(k, s.shape[1])
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        best_s = np.concatenate([best_s, np.take_along_axis(s, part, 1)], axis=1)
        best_i = np.concatenate([best_i, part + start], axis=1)
        if best_s.shape[1] > k:
            keep = np.argpartition(-best_s, k - 1, axis=1)[:, :k]
            best_s, best_i = np.take_along_axis(best_s, keep, 1), np.take_along_axis(best_i, keep, 1)
    order = np.lexsort((best_i, -best_s), axis=1) if best_s.size else np.zeros_like(best_i)
    return np.take_along_axis(best_s, order, 1), np.take_along_axis(best_i, order, 1)


def _check_finite(vectors: np.ndarray, path: Path, block: int = 65536) -> None:
    """Refuse an index holding a non-finite vector when it is opened: ranking would pass such rows over
    silently (a NaN score is never among the best), not only when one reaches the top."""
    for start in range(0, len(vectors), block):
        rows = np.flatnonzero(~np.isfinite(vectors[start:start + block]).all(axis=1))  # block-wise: (b,C) -> (b,)
        if rows.size:
            raise EmbeddingError(f"{path} holds non-finite (NaN/inf) vectors (row {int(rows[0]) + start} first); "
                                 "the index is damaged: rebuild it with qkv index")


class SearchIndex:
    """An index folder opened once, with its query embedder loaded: rank many queries against it
    (``qkv serve --index`` keeps one; :func:`search` opens one per call).

    Args:
        index: the folder made by ``qkv index`` (:func:`build_index`).
        device, precision: how queries are embedded (see
            :class:`~qkv.embeddings.options.EmbedOptions`).

    Attributes:
        meta: the ``index.json`` content.
        embedder: the :class:`~qkv.embeddings.embedder.Embedder` of queries (the index's model and
            options).

    Raises:
        EmbeddingError: not an index, its model folder missing or changed since indexing, damaged
            arrays.
    """

    def __init__(self, index: str | os.PathLike, *, device=None, precision: str = "fp32"):
        self.index = Path(index)
        self.meta = meta = load_index_meta(index)
        model = Path(meta["model"])
        if not model.is_dir():
            raise EmbeddingError(f"the index's model folder {model} no longer exists")
        weights = _weights_file(model)
        expected = meta.get("model_weights_sha256")
        if expected and (weights is None or (_stat(weights) != meta.get("model_weights_stat")
                                             and _sha256(weights) != expected)):
            raise EmbeddingError(f"the model in {model} changed since the index was built; rebuild it with "
                                 "qkv index")
        tok = meta.get("model_tokenizer_sha256")
        if tok is not None and _tokenizer_sha256(model) != tok:
            raise EmbeddingError(f"the tokenizer in {model} changed since the index {index} was built; its "
                                 "vectors no longer match queries: rebuild it with qkv index")
        self._model = model
        self._vectors, self._offsets = _open_arrays(self.index, meta)
        _check_finite(self._vectors, self.index / "vectors.npy")
        self.ann = open_ann(self.index, meta)  # None: exact search
        self.embedder = Embedder(str(model), index_options(meta, index).replace(normalize=True, device=device,
                                                                                precision=precision))

    def __len__(self) -> int:
        return int(self.meta["count"])

    def query(self, queries: str | list[str], *, k: int = 10, nprobe: int | None = None,
              ef_search: int | None = None) -> list[list[Hit]]:
        """The ``k`` documents most cosine-similar to each query (best first): exactly, or as the
        index's approximate structure finds them (``nprobe`` / ``ef_search``: the search breadth of an
        IVF / HNSW index; default: what the index was built with).

        Raises:
            EmbeddingError: ``k < 1``, an empty query, non-finite vectors, a damaged texts file.
        """
        if isinstance(queries, str):
            queries = [queries]
        check_range("k", k, 1, error=EmbeddingError)
        check_search_parameters("exact" if self.ann is None else self.ann.type, nprobe=nprobe, ef_search=ef_search)
        empty = [i for i, q in enumerate(queries) if not str(q).strip()]
        if empty:
            raise EmbeddingError(f"query {empty[0] + 1} is empty; give a query with words")
        q = self.embedder.embed(queries).astype(np.float32)  # (Q,C)
        if not np.isfinite(q).all():
            raise EmbeddingError(f"the model in {self._model} gives non-finite (NaN/inf) query vectors; its "
                                 "weights are damaged")
        if self.ann is None:
            scores, rows = top_k(self._vectors, q, k)
        else:
            scores, rows = self.ann.search(q, min(k, len(self)), nprobe=nprobe, ef_search=ef_search)
        if not np.isfinite(scores[rows >= 0]).all():
            raise EmbeddingError(f"{self.index / 'vectors.npy'} holds non-finite (NaN/inf) vectors; the index is "
                                 "damaged: rebuild it with qkv index")
        out = []
        with open(self.index / "texts.jsonl", "rb") as fh:
            for qs, qr in zip(scores, rows):
                hits = []
                for rank, (s, r) in enumerate(((s, r) for s, r in zip(qs.tolist(), qr.tolist()) if r >= 0), 1):
                    fh.seek(int(self._offsets[r]))
                    try:
                        doc = json.loads(fh.readline())
                        hits.append(Hit(rank, float(s), doc["id"], doc["text"]))
                    except (ValueError, KeyError, TypeError):
                        raise EmbeddingError(f"{self.index / 'texts.jsonl'}: damaged at document {r}; rebuild "
                                             "the index with qkv index") from None
                out.append(hits)
        return out


def search(index: str | os.PathLike, queries: str | list[str], *, k: int = 10, device=None,
           precision: str = "fp32", nprobe: int | None = None, ef_search: int | None = None) -> list[list[Hit]]:
    """The ``k`` documents of ``index`` most cosine-similar to each query (best first; ``nprobe``,
    ``ef_search``: see :meth:`SearchIndex.query`).

    Raises:
        EmbeddingError: not an index, its model folder missing or changed since indexing.
    """
    if isinstance(queries, str):
        queries = [queries]
    check_range("k", k, 1, error=EmbeddingError)
    empty = [i for i, q in enumerate(queries) if not str(q).strip()]
    if empty:  # before the model is loaded
        raise EmbeddingError(f"query {empty[0] + 1} is empty; give a query with words")
    return SearchIndex(index, device=device, precision=precision).query(queries, k=k, nprobe=nprobe,
                                                                        ef_search=ef_search)


def _open_arrays(index: Path, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    """``vectors.npy`` (memory-mapped) and ``offsets.npy`` of an index, checked against ``index.json``."""
    try:
        vectors = np.load(index / "vectors.npy", mmap_mode="r")
        offsets = np.load(index / "offsets.npy")
    except (OSError, ValueError, EOFError) as e:
        raise EmbeddingError(f"index {index}: cannot read its arrays ({e}); rebuild it with qkv index") from None
    n, dim = meta.get("count"), meta.get("dim")
    if vectors.shape != (n, dim) or offsets.shape != (n,):
        raise EmbeddingError(f"index {index}: vectors {vectors.shape} / offsets {offsets.shape} disagree with "
                             f"index.json ({n} × {dim}): truncated or damaged; rebuild it with qkv index")
    size = (index / "texts.jsonl").stat().st_size if (index / "texts.jsonl").is_file() else -1
    if n and (size < 0 or offsets.min() < 0 or offsets.max() >= size):
        raise EmbeddingError(f"index {index}: texts.jsonl is missing or shorter than its offsets say; "
                             "rebuild it with qkv index")
    return vectors, offsets
