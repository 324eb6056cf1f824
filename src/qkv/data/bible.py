"""English–Spanish verse pairs from two public-domain Bibles, split by whole books.

The English side is the King James Version (1769 text, SWORD module ``engKJV2006eb``, Debian
``sword-text-kjv``), the Spanish side the Reina-Valera 1909 (``spaRV1909eb``, ``sword-text-sparv``).
Both configurations say ``Versification=KJV``, so a verse key names the same slot in both. A pair is
one verse whose slot holds text in both modules *and* says the same thing in both: the Spanish
module fills the KJV slots with its own verse numbers, so where its chapters or verses are divided
otherwise, a slot holds a neighbouring verse (all of Numbers 13, 1 Samuel 24, Jonah 2, Job 39–40 …)
or is empty (18 slots, their text joined to a neighbour). A length-based alignment of each book
(:mod:`qkv.data.verse_align`) finds those verses, and they are left out: of the 31,102 verses,
30,894 make pairs (18 empty, 190 shifted; :func:`bible_alignment` lists them).

Split by whole books, so that no verse of a held-out book is seen in training and no book is cut:

=============  =====================================================  ======
split          books                                                  pairs
=============  =====================================================  ======
validation     Ruth, Esther, Jonah, Lamentations, Galatians,           909
               Philippians, James, 1 Peter
test           Joshua, Daniel, Romans, Hebrews                         1,751
train          the other 54 books                                     28,234
=============  =====================================================  ======

The held-out books were chosen to be mid-sized, from both testaments and of several kinds
(narrative, prophecy and vision, letters, poetry), and to have no close parallel elsewhere — the
synoptic gospels, Samuel–Kings against Chronicles, Ephesians against Colossians and Jude against
2 Peter stay together in training, so that the test does not reward recalling a parallel passage.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from qkv.data.errors import CorpusNotFoundError, DatasetNotInstalledError
from qkv.data.pairs import Pair
from qkv.data.sword import SwordModule, find_module
from qkv.data.verse_align import LengthModel, same_key_mask
from qkv.data.versification import VerseKey, book

__all__ = ["LANGUAGES", "SPLIT_BOOKS", "SPLITS", "INSTALL_HINT", "Alignment", "book_split", "bible_pairs",
           "bible_alignment", "bible_fingerprint"]


@dataclass(frozen=True)
class _Side:
    module: str
    package: str
    title: str


LANGUAGES = {
    "en": _Side("engKJV2006eb", "sword-text-kjv", "King James Version (1769)"),
    "es": _Side("spaRV1909eb", "sword-text-sparv", "Reina-Valera 1909"),
}
SPLIT_BOOKS = {
    "validation": ("Ruth", "Esth", "Jonah", "Lam", "Gal", "Phil", "Jas", "1Pet"),
    "test": ("Josh", "Dan", "Rom", "Heb"),
}
SPLITS = ("train", "validation", "test")
INSTALL_HINT = ("make data (as root), or: sudo apt-get install "
                + " ".join(side.package for side in LANGUAGES.values()))
_SPLIT_OF = {book(osis).number: split for split, books in SPLIT_BOOKS.items() for osis in books}


def book_split(book_number: int) -> str:
    """``"train"``, ``"validation"`` or ``"test"``: the split a whole book belongs to."""
    return _SPLIT_OF.get(book_number, "train")


def _modules(dataset: str, roots: Sequence[str | os.PathLike] | None) -> dict[str, SwordModule]:
    found = {}
    for lang, side in LANGUAGES.items():
        try:
            found[lang] = SwordModule(find_module(side.module, roots))
        except CorpusNotFoundError as e:  # no such module in any library, or a data file missing
            raise DatasetNotInstalledError(
                f"dataset {dataset!r} needs the SWORD module {side.module} of the Debian package "
                f"{side.package}: "
                f"{e}. Install it: {INSTALL_HINT}") from None
    return found


def _stamp(modules: dict[str, SwordModule]) -> tuple:
    """What identifies the modules' content cheaply: every file's path, size and modification time."""
    out = []
    for lang, m in sorted(modules.items()):
        for path in [m.conf.conf_path] + m.data_files():
            st = path.stat()
            out.append((lang, str(path), st.st_size, st.st_mtime_ns))
    return tuple(out)


@dataclass(frozen=True)
class Alignment:
    """The verse pairs of both modules and what was left out.

    Attributes:
        pairs: ``(key, {"en": …, "es": …})`` for every verse kept, in canonical order.
        empty: keys whose verse is empty in one module (its text is joined to a neighbour there).
        shifted: keys the length check (:mod:`qkv.data.verse_align`) found paired with another
            verse's translation (a chapter numbered otherwise, verses merged or split).
        model: the length model fitted on all verses.
    """

    pairs: tuple[tuple[VerseKey, dict[str, str]], ...]
    empty: tuple[VerseKey, ...]
    shifted: tuple[VerseKey, ...]
    model: LengthModel


_ALIGNED: dict[tuple, Alignment] = {}  # by _stamp; at most 2 kept


def _align(modules: dict[str, SwordModule]) -> Alignment:
    texts = {lang: {v.key: v.text for v in m.verses()} for lang, m in modules.items()}
    first, second = (texts[lang] for lang in LANGUAGES)
    keys = list(first)
    model = LengthModel.fit([len(first[k]) for k in keys], [len(second[k]) for k in keys])
    kept: set[VerseKey] = set()
    for number in sorted({k.book for k in keys}):
        book_keys = [k for k in keys if k.book == number]
        mask = same_key_mask([len(first[k]) for k in book_keys], [len(second[k]) for k in book_keys], model)
        kept.update(k for k, ok in zip(book_keys, mask) if ok)
    empty = tuple(k for k in keys if not first[k] or not second[k])
    return Alignment(tuple((k, {lang: t[k] for lang, t in texts.items()}) for k in keys if k in kept), empty,
                     tuple(k for k in keys if k not in kept and first[k] and second[k]), model)


def bible_alignment(*, dataset: str = "bible", roots: Sequence[str | os.PathLike] | None = None) -> Alignment:
    """Both modules read and their verses checked (:class:`Alignment`). Read once per process (about
    three seconds) and kept while the module files are unchanged.

    Raises:
        DatasetNotInstalledError: a module is missing (the message names the install command).
    """
    modules = _modules(dataset, roots)
    stamp = _stamp(modules)
    if stamp not in _ALIGNED:
        while len(_ALIGNED) >= 2:
            _ALIGNED.pop(next(iter(_ALIGNED)))
        _ALIGNED[stamp] = _align(modules)
    return _ALIGNED[stamp]


def bible_pairs(source: str = "en", target: str = "es", split: str = "train", *, dataset: str | None = None,
                roots: Sequence[str | os.PathLike] | None = None) -> list[Pair]:
    """The verse pairs of one split, ``source`` → ``target`` (``"en"``, ``"es"``), in canonical order;
    ``Pair.origin`` is ``dataset:NAME:SPLIT#Gen.1.1``.

    Raises:
        ValueError: an unknown language or split.
        DatasetNotInstalledError: a module is missing.
    """
    for name, value in (("source", source), ("target", target)):
        if value not in LANGUAGES:
            raise ValueError(f"{name}={value!r} is not a language of the Bible pairs; "
                             f"known: {', '.join(LANGUAGES)}")
    if source == target:
        raise ValueError(f"source and target are both {source!r}; give two languages")
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not allowed; allowed: {', '.join(SPLITS)}")
    name = dataset or f"bible-{source}-{target}"
    pairs = bible_alignment(dataset=name, roots=roots).pairs
    return [Pair(texts[source], texts[target], f"dataset:{name}:{split}#{key}")
            for key, texts in pairs if book_split(key.book) == split]


def bible_fingerprint(split: str, *, dataset: str = "bible",
                      roots: Sequence[str | os.PathLike] | None = None) -> str:
    """sha256 over both modules' files and the book split."""
    modules = _modules(dataset, roots)
    h = hashlib.sha256(f"bible-pairs:v1:{split}:{sorted(SPLIT_BOOKS.items())}\0".encode())
    for lang, m in sorted(modules.items()):
        for path in [m.conf.conf_path] + m.data_files():
            h.update(f"{lang}:{path.name}\0".encode())
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
    return h.hexdigest()

