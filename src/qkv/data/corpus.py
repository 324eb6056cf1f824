"""Corpora: what ``--corpus`` names, streamed as documents, with a content fingerprint and a
deterministic held-out split.

A *spec* is one of

* a file — plain text (one document per line, or blank-line separated with ``doc_sep="blank"``),
  ``*.jsonl`` (one JSON object per line, text in ``text_field``), or either compressed as ``*.gz``;
* a folder — every ``*.txt``, ``*.text``, ``*.jsonl`` (and ``.gz`` of them) below it, depth first
  (a folder's files by name, then its subfolders by name), hidden files and folders skipped;
* ``dataset:NAME[:SPLIT]`` — a named offline dataset (:mod:`qkv.data.datasets`).

Paths and dataset names are checked when the :class:`Corpus` is built; file contents are checked
while streaming (every consumer — tokenizer training, the token cache — streams the whole corpus
before any training starts). A corpus that yields no document raises :class:`EmptyCorpusError` at
the end of its first pass.

Held-out split (:meth:`Corpus.split`): each document's text is hashed with the seed (blake2b);
the ``round(fraction · N)`` (at least 1) documents with the smallest hashes are held out. The split
is therefore deterministic, independent of file order, exact in size, and — since equal texts hash
equally — never puts the same text on both sides. It costs one streaming pass (8 bytes per document).
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkv.data.datasets import DATASETS, dataset_documents, dataset_fingerprint, parse_dataset_spec
from qkv.data.errors import CorpusError, CorpusNotFoundError, EmptyCorpusError
from qkv.data.readers import CorpusOptions, Document, file_format, iter_file_documents

__all__ = ["Corpus", "CorpusOptions", "Document", "TrainEval", "open_corpus", "train_eval_corpora",
           "CORPUS_SUFFIXES"]

CORPUS_SUFFIXES = (".txt", ".text", ".jsonl", ".csv", ".tsv", ".txt.gz", ".text.gz", ".jsonl.gz", ".csv.gz",
                   ".tsv.gz")


@dataclass(frozen=True)
class _Source:
    """One file, or one dataset split."""

    kind: str  # "file" | "dataset"
    path: Path | None = None
    dataset: str | None = None
    split: str | None = None

    def describe(self) -> str:
        return str(self.path) if self.kind == "file" else f"dataset:{self.dataset}:{self.split}"

    def documents(self, opts: CorpusOptions) -> Iterator[Document]:
        if self.kind == "file":
            return iter_file_documents(self.path, opts)
        return dataset_documents(DATASETS[self.dataset], self.split)

    def fingerprint(self, opts: CorpusOptions) -> str:
        if self.kind == "dataset":
            return dataset_fingerprint(DATASETS[self.dataset], self.split)
        gz = self.path.name.lower().endswith(".gz")
        h = hashlib.sha256(f"file:{file_format(self.path)}:{gz}\0".encode())
        with open(self.path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()


def _folder_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / f for f in sorted(files)
                  if not f.startswith(".") and f.lower().endswith(CORPUS_SUFFIXES)]
    return found


def _resolve(spec: str | os.PathLike) -> list[_Source]:
    if isinstance(spec, str) and spec.startswith("dataset:"):
        info, split = parse_dataset_spec(spec)
        return [_Source("dataset", dataset=info.name, split=split)]
    path = Path(spec).expanduser()
    if not path.exists():
        raise CorpusNotFoundError(
            f"corpus path not found: {path}" + (f" (from {spec!r})" if str(spec) != str(path) else "")
            + f". Give a file, a folder, or a named dataset dataset:NAME[:SPLIT] with NAME in "
            f"{', '.join(DATASETS)}."
        )
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise EmptyCorpusError(
                f"empty corpus: folder {path} holds no corpus files (looked for "
                f"{', '.join('*' + s for s in CORPUS_SUFFIXES)}; hidden files are skipped)"
            )
        return [_Source("file", path=f) for f in files]
    return [_Source("file", path=path)]


@dataclass(frozen=True)
class _Holdout:
    fraction: float
    seed: int
    part: str  # "train" | "eval"
    state: dict  # shared between the two parts: {"threshold": int}


def _doc_hash(text: str, seed: int) -> int:
    key = int(seed).to_bytes(8, "little", signed=True)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                                          key=key).digest(), "little")


class Corpus:
    """A streamed collection of documents named by one or more specs.

    Args:
        specs: a spec or a sequence of specs (their documents are concatenated in order).
        options: how files are read (:class:`CorpusOptions`).

    Raises:
        CorpusNotFoundError, EmptyCorpusError, UnknownDatasetError: bad specs, immediately.
    """

    def __init__(self, specs: str | os.PathLike | Sequence[str | os.PathLike],
                 options: CorpusOptions | None = None, *, _holdout: _Holdout | None = None):
        if isinstance(specs, (str, os.PathLike)):
            specs = [specs]
        if not specs:
            raise EmptyCorpusError("empty corpus: no corpus given (pass --corpus PATH or dataset:NAME)")
        self.specs: tuple[str, ...] = tuple(str(s) for s in specs)
        self.options = options or CorpusOptions()
        self._sources = [src for spec in specs for src in _resolve(spec)]
        self._holdout = _holdout
        self._exclude: tuple[Corpus, dict] | None = None  # (corpus, {"hashes": sorted uint64})
        self._fingerprint: str | None = None

    # -- description --------------------------------------------------------------------------------
    @property
    def sources(self) -> list[str]:
        """The files and dataset splits read, in order."""
        return [s.describe() for s in self._sources]

    @property
    def named_splits(self) -> tuple[str, ...] | None:
        """The dataset split names when the corpus is exactly dataset splits, else ``None``."""
        if all(s.kind == "dataset" for s in self._sources):
            return tuple(s.split for s in self._sources)
        return None

    def describe(self) -> str:
        what = " + ".join(self.specs)
        if self._holdout is not None:
            h = self._holdout
            what += f" [{h.part} part of a {h.fraction:g} held-out split, seed {h.seed}]"
        if self._exclude is not None:
            what += f" [minus texts in {self._exclude[0].describe()}]"
        return what

    def __repr__(self) -> str:
        return f"Corpus({self.describe()})"

    # -- streaming ----------------------------------------------------------------------------------
    def _all_documents(self) -> Iterator[Document]:
        for src in self._sources:
            yield from src.documents(self.options)

    def documents(self) -> Iterator[Document]:
        """Stream the documents (text, label, source).

        Raises:
            EmptyCorpusError: at the end of a pass that yielded nothing.
            CorpusError: the reading errors of :func:`qkv.data.readers.iter_file_documents`.
        """
        docs = self._all_documents()
        if self._holdout is not None:
            threshold = self._threshold()
            want_eval = self._holdout.part == "eval"
            seed = self._holdout.seed
            docs = (d for d in docs if (_doc_hash(d.text, seed) <= threshold) == want_eval)
        if self._exclude is not None:
            hashes = self._excluded_hashes()
            docs = (d for d in docs if not _contains(hashes, _doc_hash(d.text, 0)))
        n = 0
        for doc in docs:
            n += 1
            yield doc
        if n == 0:
            raise EmptyCorpusError(
                f"empty corpus: {self.describe()} holds no non-blank document "
                f"(read {', '.join(self.sources[:5])}{' …' if len(self.sources) > 5 else ''})"
            )

    def __iter__(self) -> Iterator[str]:
        """Stream the document texts."""
        return (d.text for d in self.documents())

    def texts(self) -> Iterator[str]:
        """Same as ``iter(corpus)``."""
        return iter(self)

    def labelled(self) -> tuple[list[str], list[str | None]]:
        """All texts and labels in memory (for small labelled datasets: evaluation, demos)."""
        texts, labels = [], []
        for d in self.documents():
            texts.append(d.text)
            labels.append(d.label)
        return texts, labels

    def count(self) -> int:
        """Number of documents (one streaming pass)."""
        return sum(1 for _ in self.documents())

    # -- identity -----------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """sha256 over the content of every source, the read options and the held-out part;
        equal fingerprints mean equal document streams. Costs one pass over the raw bytes."""
        if self._fingerprint is None:
            h = hashlib.sha256(b"qkv-corpus-v1\0" + repr(self.options).encode() + b"\0")
            for src in self._sources:
                h.update(src.fingerprint(self.options).encode() + b"\0")
            if self._holdout is not None:
                hd = self._holdout
                h.update(f"holdout:{hd.fraction!r}:{hd.seed}:{hd.part}".encode())
            if self._exclude is not None:
                h.update(b"minus:" + self._exclude[0].fingerprint().encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    # -- held-out split -----------------------------------------------------------------------------
    def split(self, eval_fraction: float = 0.05, seed: int = 0) -> tuple[Corpus, Corpus]:
        """Deterministic document-level split into ``(train, eval)`` corpora (see module docstring).

        Raises:
            ValueError: ``eval_fraction`` not in (0, 1).
            EmptyCorpusError: (on first use) fewer than two distinct documents to split.
        """
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
        if self._holdout is not None:
            raise CorpusError("a held-out part cannot be split again")
        state: dict = {}
        parts = []
        for part in ("train", "eval"):
            c = Corpus.__new__(Corpus)
            c.__dict__.update(self.__dict__)
            c._holdout, c._fingerprint = _Holdout(float(eval_fraction), int(seed), part, state), None
            parts.append(c)
        return parts[0], parts[1]

    def excluding(self, other: Corpus) -> Corpus:
        """This corpus without the documents whose exact text occurs in ``other`` (e.g. a named test
        split minus texts that also appear in the training split). Costs one pass over ``other``."""
        c = Corpus.__new__(Corpus)
        c.__dict__.update(self.__dict__)
        c._exclude, c._fingerprint = (other, {}), None
        return c

    def _excluded_hashes(self) -> np.ndarray:
        other, state = self._exclude
        if "hashes" not in state:
            arr = array("Q", (_doc_hash(d.text, 0) for d in other.documents()))
            state["hashes"] = np.sort(np.frombuffer(arr, dtype=np.uint64))
        return state["hashes"]

    def _threshold(self) -> int:
        h = self._holdout
        if "threshold" not in h.state:
            hashes = array("Q", (_doc_hash(d.text, h.seed) for d in self._all_documents()))
            n = len(hashes)
            k = max(1, round(h.fraction * n))
            if n < 2 or k >= n:
                raise EmptyCorpusError(
                    f"cannot hold out {h.fraction:g} of {' + '.join(self.specs)}: it has {n} document(s); "
                    "a held-out split needs at least one document on each side (change eval_fraction, "
                    "or give an evaluation corpus)"
                )
            arr = np.frombuffer(hashes, dtype=np.uint64)
            threshold = int(np.partition(arr, k - 1)[k - 1])
            if int((arr > threshold).sum()) == 0:
                raise EmptyCorpusError(f"{self.describe()}: all documents are identical; nothing to hold out")
            h.state["threshold"] = threshold
        return h.state["threshold"]


def _contains(sorted_hashes: np.ndarray, h: int) -> bool:
    i = int(np.searchsorted(sorted_hashes, np.uint64(h)))
    return i < len(sorted_hashes) and int(sorted_hashes[i]) == h


def open_corpus(specs: str | os.PathLike | Sequence[str | os.PathLike] | Corpus,
                options: CorpusOptions | None = None, **option_kwargs) -> Corpus:
    """Build a :class:`Corpus` from specs (a :class:`Corpus` is returned unchanged).

    ``option_kwargs`` are :class:`CorpusOptions` fields (``doc_sep="blank"``, ``text_field=...``,
    ``encoding_errors="replace"``, ``max_doc_bytes=...``, ``long_docs="split"``).
    """
    if isinstance(specs, Corpus):
        return specs
    if option_kwargs:
        base = options or CorpusOptions()
        options = CorpusOptions(**{**base.__dict__, **option_kwargs})
    return Corpus(specs, options)


@dataclass(frozen=True)
class TrainEval:
    """Training and held-out corpora, and how the held-out part was chosen."""

    train: Corpus
    eval: Corpus
    how: str


def train_eval_corpora(specs: str | os.PathLike | Sequence[str | os.PathLike] | Corpus,
                       options: CorpusOptions | None = None, *, eval_fraction: float = 0.05,
                       seed: int = 0, eval_specs: Iterable[str | os.PathLike] | None = None) -> TrainEval:
    """The corpora a pretraining run needs, never overlapping.

    * ``eval_specs`` given: that corpus is the held-out one.
    * every spec a named dataset's ``train`` split that has a ``validation`` split: that split; else,
      when each has a ``test`` split: the ``test`` split.
    * otherwise: :meth:`Corpus.split` with ``eval_fraction`` and ``seed``.

    In the first two cases the held-out corpus drops every document whose text also occurs in the
    training corpus (20 Newsgroups has 7 such test posts, R8 4, R52 6), so the two never overlap.
    """
    corpus = open_corpus(specs, options)
    if eval_specs is not None:
        if isinstance(eval_specs, (str, os.PathLike)):
            eval_specs = [eval_specs]
        held = Corpus(list(eval_specs), corpus.options).excluding(corpus)
        return TrainEval(corpus, held, "given evaluation corpus")
    named = corpus.named_splits
    for part in ("validation", "test"):
        if named and all(s == "train" for s in named) and all(
                part in DATASETS[s.dataset].splits for s in corpus._sources):
            other = Corpus([f"dataset:{s.dataset}:{part}" for s in corpus._sources], corpus.options)
            return TrainEval(corpus, other.excluding(corpus), f"named split: {part}")
    train, held = corpus.split(eval_fraction, seed)
    return TrainEval(train, held, f"held-out {eval_fraction:g} of the documents (seed {seed})")
