"""What the analysis reads: a model folder (through :func:`qkv.load`), its tokenizer, and a corpus.

Corpora are read by the data package (:mod:`qkv.data.corpus`); the analysis sees :class:`Documents`
— texts with optional labels — and nothing else.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass
from pathlib import Path

from qkv.checkpoints.bundled import model_folder
from qkv.checkpoints.io import Pretrained
from qkv.data.tokenizer_facade import TokenizerView, no_tokenizer
from qkv.errors import CheckpointError
from qkv.data.corpus import open_corpus
from qkv.data.errors import CorpusError

__all__ = [
    "AnalysisInputError",
    "Documents",
    "load_model",
    "model_and_tokenizer",
    "read_corpus",
    "tokenizer_view",
]


class AnalysisInputError(ValueError):
    """Bad input to the analysis: a model folder, corpus or text it cannot use."""


# ----------------------------------------------------------------------------------------- model


def load_model(path: str | Path):
    """Load a model folder with :func:`qkv.load` (a qkv folder, a Hugging Face folder, or a bundled
    model's short name such as ``minilm``: :mod:`qkv.checkpoints.bundled`).

    Returns:
        The :class:`~qkv.checkpoints.io.Pretrained` ``(model, tokenizer)``, the model in eval mode.

    Raises:
        AnalysisInputError: the folder is missing or ``qkv.load`` cannot load it (message names it).
    """
    try:
        path = model_folder(path)  # "minilm": the installed package's folder
    except CheckpointError as exc:
        raise AnalysisInputError(str(exc)) from None
    if not path.exists():
        raise AnalysisInputError(f"model folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise AnalysisInputError(f"model path {str(path)!r} is not a folder")
    try:
        loader = importlib.import_module("qkv").load
    except (ImportError, AttributeError) as exc:
        raise AnalysisInputError(f"qkv.load is not available in this installation: {exc}") from exc
    try:
        pretrained = loader(path)
    except Exception as exc:  # the loader's own message is the useful part
        raise AnalysisInputError(f"cannot load a model from {str(path)!r}: {exc}") from exc
    pretrained.model.eval()
    return pretrained


def model_and_tokenizer(model) -> tuple[object, TokenizerView, str]:
    """``(model, tokenizer view, name)`` of a model folder or a :class:`~qkv.checkpoints.io.Pretrained`
    (what :func:`run_analyze` and ``run_inspect`` accept); ``name``: the folder, else the model's class.

    Raises:
        AnalysisInputError: a folder :func:`load_model` cannot load, or a model without a usable tokenizer.
    """
    if isinstance(model, Pretrained):
        return model.model, tokenizer_view(model.tokenizer), type(model.model).__name__
    if not isinstance(model, (str, Path)):
        raise AnalysisInputError(f"expected a model folder or what qkv.load returns, got {type(model).__name__}; "
                                 "call analyze(model, tokenizer, documents) for another model")
    pretrained = load_model(model)
    return pretrained.model, tokenizer_view(pretrained.tokenizer, model), str(model)


# ------------------------------------------------------------------------------------- tokenizer


def tokenizer_view(tokenizer, folder: str | Path | None = None) -> TokenizerView:
    """The analysis' view of ``tokenizer`` (a ``tokenizers.Tokenizer``, what :func:`qkv.load` gives,
    a qkv :class:`~qkv.data.tokenizer.WordPieceTokenizer` or a :class:`TokenizerView`, kept as it
    is): no truncation or padding, the special tokens by role, read from the tokenizer's own
    configuration. ``folder``: the model folder it came from, for messages.

    Raises:
        AnalysisInputError: no tokenizer (``None``) or not a tokenizer.
    """
    if isinstance(tokenizer, TokenizerView):
        return tokenizer
    if tokenizer is None:
        if folder is not None:
            raise no_tokenizer(f"model folder {str(folder)!r}", error=AnalysisInputError)
        raise no_tokenizer("the model", error=AnalysisInputError,
                           hint=", or pass its tokenizer (model, tokenizer = qkv.load(folder))")
    where = f"the tokenizer of {str(folder)!r}" if folder is not None else "the tokenizer"
    return TokenizerView(tokenizer, error=AnalysisInputError, where=where)


# ---------------------------------------------------------------------------------------- corpus


@dataclass
class Documents:
    """Texts to analyse, with a label per text where the corpus has labels."""

    texts: list[str]
    labels: list[str] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.labels is not None and len(self.labels) != len(self.texts):
            raise ValueError(f"{len(self.labels)} labels for {len(self.texts)} texts")

    def __len__(self) -> int:
        return len(self.texts)


def read_corpus(specs: str | list[str], *, max_docs: int | None = None, seed: int = 0,
                label_field: str | None = None) -> Documents:
    """Read corpus specs with :mod:`qkv.data.corpus` into :class:`Documents`.

    A spec is a file or folder (plain text, ``.jsonl``, ``.gz``) or ``dataset:NAME[:SPLIT]``
    (``20newsgroups``, ``reuters8``, ``reuters52``, ``pydoc``, ``kjv``; see ``qkv.data``). With
    ``max_docs`` a seeded uniform sample of that many documents is kept while streaming (reservoir
    sampling: memory bounded by ``max_docs``; the named files are sorted by class, so the first N
    would be one class), in corpus order. ``label_field``: the JSONL field of each document's label
    (the named datasets bring their own labels).

    Raises:
        AnalysisInputError: a missing file, an unknown dataset, an unreadable file, no documents.
    """
    specs = [specs] if isinstance(specs, (str, Path)) else list(specs)
    if max_docs is not None and max_docs < 1:
        raise AnalysisInputError(f"max_docs must be ≥ 1, got {max_docs}")
    rng = random.Random(seed)
    kept: list[tuple[int, str, str | None]] = []
    try:
        for n, doc in enumerate(open_corpus([str(s) for s in specs], label_field=label_field).documents()):
            item = (n, doc.text, doc.label)
            if max_docs is None or len(kept) < max_docs:
                kept.append(item)
            else:
                j = rng.randint(0, n)  # Algorithm R: keep each document with probability max_docs/(n+1)
                if j < max_docs:
                    kept[j] = item
    except CorpusError as exc:
        raise AnalysisInputError(f"corpus {', '.join(map(str, specs))}: {exc}") from exc
    if not kept:
        raise AnalysisInputError(f"corpus {', '.join(map(str, specs))} holds no documents (empty)")
    kept.sort()
    labels = [lab for _, _, lab in kept]
    return Documents(
        [t for _, t, _ in kept],
        labels if all(lab is not None for lab in labels) else None,
        " + ".join(map(str, specs)),
    )
