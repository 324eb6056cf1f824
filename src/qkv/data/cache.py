"""Tokenise a corpus once into memory-mapped arrays cached on disk.

A cache entry is a folder ``CACHE_DIR/<key>/`` where ``key`` is a sha256 of the corpus fingerprint
(content of every file + read options + held-out part, :meth:`Corpus.fingerprint`), the tokenizer
fingerprint (its serialised ``tokenizer.json``) and the cache format version. It holds

* ``tokens.bin``      — all token ids of all documents back to back, ``uint16`` (vocab ≤ 65,536)
  or ``uint32``; no special tokens (packing adds them);
* ``word_starts.bin`` — ``uint8`` 0/1 per token: 1 where the token begins a word (whole-word masking);
* ``doc_offsets.bin`` — ``int64``, ``n_docs + 1`` offsets: document d is ``tokens[off[d]:off[d+1]]``;
* ``meta.json``       — counts, dtype, fingerprints, special ids, corpus description, and the
  sha256 of each of the three arrays.

Documents that tokenise to nothing are dropped. The folder is written under a temporary name and
renamed into place only when complete (an atomic directory rename), so an interrupted tokenisation
never leaves a cache that looks good; leftovers of killed processes are removed on the next build.
Reopening (:func:`open_token_cache`) maps the files and checks them against ``meta.json``: sizes,
sha256 (one read of the arrays), document offsets that rise from 0 to the token count, and token ids
below the vocabulary size — a damaged cache is never trained on. :func:`build_token_cache` rebuilds
a damaged entry (with a warning) instead of using it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from qkv._fs import clean_stale_temps_in, pid_alive, sha256_file, write_folder
from qkv.data.corpus import Corpus
from qkv.data.errors import CacheError, EmptyCorpusError
from qkv.data.tokenizer import WordPieceTokenizer

__all__ = ["TokenCache", "cache_key", "build_token_cache", "open_token_cache", "default_cache_dir",
           "CACHE_FORMAT"]

CACHE_FORMAT = 2  # 2: meta.json holds the arrays' sha256
_FILES = ("tokens.bin", "word_starts.bin", "doc_offsets.bin", "meta.json")


def default_cache_dir() -> Path:
    """``$QKV_CACHE_DIR``, else ``~/.cache/qkv/tokens``."""
    env = os.environ.get("QKV_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qkv" / "tokens"


@dataclass
class TokenCache:
    """A tokenised corpus, memory-mapped read-only.

    Attributes:
        path: the cache folder.
        tokens: ``(N,)`` token ids (``uint16``/``uint32`` memmap).
        word_starts: ``(N,)`` bool, True where a token begins a word.
        doc_offsets: ``(D+1,)`` int64 document boundaries into ``tokens``.
        meta: the ``meta.json`` content.
        reused: True when this call found the cache on disk (no tokenisation happened).
    """

    path: Path
    tokens: np.ndarray
    word_starts: np.ndarray
    doc_offsets: np.ndarray
    meta: dict = field(repr=False)
    reused: bool = True

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_docs(self) -> int:
        return int(self.doc_offsets.shape[0]) - 1

    def document(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, word_starts)`` of document ``i``."""
        a, b = int(self.doc_offsets[i]), int(self.doc_offsets[i + 1])
        return self.tokens[a:b], self.word_starts[a:b]


def cache_key(corpus: Corpus, tokenizer: WordPieceTokenizer) -> str:
    """The cache key: sha256 of format version, corpus fingerprint and tokenizer fingerprint."""
    text = json.dumps({"format": CACHE_FORMAT, "corpus": corpus.fingerprint(),
                       "tokenizer": tokenizer.fingerprint()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def open_token_cache(path: str | os.PathLike) -> TokenCache:
    """Map an existing cache folder (as made by :func:`build_token_cache`).

    Raises:
        CacheError: a missing file, a size that disagrees with ``meta.json``, another format version.
    """
    path = Path(path)
    missing = [f for f in _FILES if not (path / f).is_file()]
    if missing:
        raise CacheError(f"token cache {path} is incomplete (missing {', '.join(missing)}); delete it and "
                         "tokenise again")
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CacheError(f"token cache {path}: meta.json is not readable JSON ({e}); delete {path} and "
                         "tokenise again") from None
    if not isinstance(meta, dict):
        raise CacheError(f"token cache {path}: meta.json is not a JSON object; delete {path}")
    if meta.get("format") != CACHE_FORMAT:
        raise CacheError(f"token cache {path} has format {meta.get('format')}, this qkv reads "
                         f"{CACHE_FORMAT}; delete it and tokenise again")
    try:
        dtype, n, d = np.dtype(meta["dtype"]), int(meta["n_tokens"]), int(meta["n_docs"])
        sums, vocab = dict(meta["sha256"]), int(meta["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise CacheError(f"token cache {path}: meta.json lacks or garbles {e}; delete {path}") from None
    expect = {"tokens.bin": n * dtype.itemsize, "word_starts.bin": n, "doc_offsets.bin": (d + 1) * 8}
    for name, size in expect.items():
        got = (path / name).stat().st_size
        if got != size:
            raise CacheError(f"token cache {path}: {name} has {got} bytes, expected {size}; delete it")
    for name in ("tokens.bin", "word_starts.bin", "doc_offsets.bin"):
        if sha256_file(path / name) != sums.get(name):
            raise CacheError(f"token cache {path}: {name} differs from what was written (sha256 mismatch: "
                             f"damaged); delete {path} and tokenise again")
    tokens = np.memmap(path / "tokens.bin", dtype=dtype, mode="r", shape=(n,))
    word_starts = np.memmap(path / "word_starts.bin", dtype=np.uint8, mode="r", shape=(n,)).view(np.bool_)
    offsets = np.memmap(path / "doc_offsets.bin", dtype=np.int64, mode="r", shape=(d + 1,))
    if offsets[0] != 0 or offsets[-1] != n or (d and not (np.diff(offsets) > 0).all()):
        raise CacheError(f"token cache {path}: doc_offsets.bin does not rise from 0 to {n}; delete {path}")
    if n and int(tokens.max()) >= vocab:
        raise CacheError(f"token cache {path}: tokens.bin holds ids ≥ the vocabulary size {vocab}; "
                         f"delete {path}")
    return TokenCache(path, tokens, word_starts, offsets, meta, reused=True)


def _clean_stale(cache_dir: Path) -> None:
    """Remove temp folders of dead processes on this host (an interrupted tokenisation), also those
    named ``.tmp-KEY-PID-RANDOM-HOST`` by qkv versions before the :mod:`qkv._fs` temp names."""
    clean_stale_temps_in(cache_dir)
    host = socket.gethostname()
    for p in cache_dir.glob(".tmp-*"):
        parts = p.name.split("-", 4)  # .tmp, key, pid, random, host
        if len(parts) == 5 and parts[4] == host and parts[2].isdigit() and not pid_alive(int(parts[2])):
            shutil.rmtree(p, ignore_errors=True)


def build_token_cache(corpus: Corpus, tokenizer: WordPieceTokenizer,
                      cache_dir: str | os.PathLike | None = None, *, batch_docs: int = 256,
                      progress: bool = False) -> TokenCache:
    """Return the token cache of ``corpus`` under ``tokenizer``, tokenising only on a miss.

    Args:
        corpus: the documents (streamed once on a miss; the fingerprint reads the raw bytes once).
        tokenizer: the tokenizer.
        cache_dir: where cache folders live (default :func:`default_cache_dir`).
        batch_docs: documents per ``encode_batch`` call.
        progress: show a tqdm bar while tokenising.

    Raises:
        EmptyCorpusError: the corpus holds no token.
        CorpusError: any reading error of the corpus (raised before anything is kept on disk).
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cache_key(corpus, tokenizer)
    final = cache_dir / key[:32]
    if (final / "meta.json").is_file():
        try:
            return open_token_cache(final)
        except CacheError as e:  # damaged: build it again rather than train on it
            print(f"qkv: {e} — rebuilding it", file=sys.stderr)
            shutil.rmtree(final, ignore_errors=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _clean_stale(cache_dir)
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)

    def quicker(e: OSError) -> bool:  # another process was quicker: its cache is the same
        return (final / "meta.json").is_file()

    # published only when complete (an atomic rename): the cache appears complete or not at all
    with write_folder(final, how="new", on_conflict=quicker) as tmp:
        n_tokens, n_docs = _tokenise_into(tmp, corpus, tokenizer, dtype, batch_docs, progress)
        if n_tokens == 0:
            raise EmptyCorpusError(f"empty corpus: {corpus.describe()} holds no token after tokenisation")
        meta = {"format": CACHE_FORMAT, "key": key, "dtype": dtype.name, "n_tokens": n_tokens,
                "n_docs": n_docs, "corpus": corpus.describe(), "corpus_fingerprint": corpus.fingerprint(),
                "sources": corpus.sources[:100], "tokenizer_fingerprint": tokenizer.fingerprint(),
                "vocab_size": tokenizer.vocab_size, "special_ids": list(tokenizer.special.ids),
                "sha256": {f: sha256_file(tmp / f) for f in _FILES[:3]},
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with open(tmp / "meta.json", "w") as fh:
            json.dump(meta, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        if final.exists() and not (final / "meta.json").is_file():
            shutil.rmtree(final)  # not ours (we only ever rename complete folders): replace it
    cache = open_token_cache(final)
    cache.reused = False
    return cache


def _tokenise_into(folder: Path, corpus: Corpus, tokenizer: WordPieceTokenizer, dtype: np.dtype,
                   batch_docs: int, progress: bool) -> tuple[int, int]:
    n_tokens, n_docs = 0, 0
    with open(folder / "tokens.bin", "wb") as f_tok, open(folder / "word_starts.bin", "wb") as f_ws, \
            open(folder / "doc_offsets.bin", "wb") as f_off, \
            tqdm(desc="tokenising", unit="doc", disable=not progress) as bar:
        f_off.write(np.zeros(1, np.int64).tobytes())

        def flush(batch: list[str]) -> None:
            nonlocal n_tokens, n_docs
            offsets = []
            for ids, ws in tokenizer.encode_documents(batch):
                if len(ids) == 0:
                    continue
                f_tok.write(ids.astype(dtype).tobytes())
                f_ws.write(ws.astype(np.uint8).tobytes())
                n_tokens += len(ids)
                offsets.append(n_tokens)
            n_docs += len(offsets)
            f_off.write(np.asarray(offsets, np.int64).tobytes())
            bar.update(len(batch))

        batch: list[str] = []
        for text in corpus:
            batch.append(text)
            if len(batch) >= batch_docs:
                flush(batch)
                batch = []
        if batch:
            flush(batch)
        for fh in (f_tok, f_ws, f_off):
            fh.flush()
            os.fsync(fh.fileno())
    return n_tokens, n_docs
