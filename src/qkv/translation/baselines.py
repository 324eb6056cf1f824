"""What a translation model has to beat, computed in the same run on the same held-out pairs.

* ``copy`` — the source sentence as its own translation (names and numbers match; little else).
* ``dictionary`` — word for word through a dictionary learned on the *training* pairs only
  (:mod:`qkv.translation.dictionary`; IBM Model 1, 10 EM iterations, chosen on the validation books).
* ``apertium`` — Debian's rule-based Apertium (``apertium-eng-spa``), when installed; skipped with a
  line naming the install command otherwise.

:func:`score_baselines` scores all three with BLEU and chrF (:mod:`qkv.translation.metrics`) on
a split of ``dataset:bible-en-es`` / ``dataset:bible-es-en`` (the test books by default), or on
pairs given by the caller.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from qkv.data.bible import SPLIT_BOOKS, bible_pairs
from qkv.data.pairs import Pair
from qkv.translation.apertium import apertium_missing, apertium_translate
from qkv.translation.dictionary import learn_dictionary
from qkv.translation.errors import TranslationError
from qkv.translation.metrics import Scores, score

__all__ = ["BaselineScore", "BaselineReport", "score_baselines", "parse_direction"]


@dataclass(frozen=True)
class BaselineScore:
    """One baseline on one split: its scores (``None`` when skipped), how long it took, and a note."""

    name: str
    scores: Scores | None
    seconds: float
    note: str = ""


@dataclass(frozen=True)
class BaselineReport:
    """Every baseline of one direction on one set of pairs."""

    direction: str
    split: str
    pairs: int
    train_pairs: int
    books: tuple[str, ...]
    rows: tuple[BaselineScore, ...]

    def table(self) -> str:
        """A Markdown table: baseline, BLEU, chrF, seconds, note."""
        books = f"; {', '.join(self.books)}" if self.books else ""
        title = (f"{self.direction}, {self.split} ({self.pairs} pairs{books}; dictionary from "
                 f"{self.train_pairs} training pairs)")
        lines = [title, "", "| baseline | BLEU | chrF | seconds | note |", "|---|---:|---:|---:|---|"]
        for r in self.rows:
            b, c = (f"{r.scores.bleu:.2f}", f"{r.scores.chrf:.2f}") if r.scores else ("—", "—")
            lines.append(f"| {r.name} | {b} | {c} | {r.seconds:.1f} | {r.note} |")
        return "\n".join(lines)


def parse_direction(direction: str) -> tuple[str, str]:
    """``"en-es"`` → ``("en", "es")``.

    Raises:
        TranslationError: not two language codes joined by ``-``.
    """
    parts = str(direction).split("-")
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise TranslationError(f"direction {direction!r} must be SOURCE-TARGET, e.g. en-es or es-en")
    return parts[0], parts[1]


def _texts(pairs: Iterable) -> list[Pair]:
    out = [p if isinstance(p, Pair) else Pair(*p) for p in pairs]
    if not out:
        raise TranslationError("no pairs to score")
    return out


def _timed(name: str, translate, held: Sequence[Pair], note: str = "") -> BaselineScore:
    start = time.perf_counter()
    hyps = translate([p.source for p in held])
    return BaselineScore(name, score(hyps, [p.target for p in held]), time.perf_counter() - start, note)


def score_baselines(direction: str = "en-es", *, split: str = "test", train: Iterable | None = None,
                    held_out: Iterable | None = None, method: str = "ibm1", iterations: int = 10,
                    apertium: bool = True) -> BaselineReport:
    """Score the copy, dictionary and (when installed) Apertium baselines.

    Args:
        direction: ``"en-es"`` or ``"es-en"`` (also picks the Apertium mode).
        split: the split of ``dataset:bible-<direction>`` to score (``"test"`` or ``"validation"``),
            when ``held_out`` is not given.
        train: pairs to learn the dictionary from (``(source, target)`` tuples or
            :class:`~qkv.data.pairs.Pair`); default: the dataset's ``train`` split.
        held_out: pairs to score; default: the dataset's ``split``.
        method, iterations: how the dictionary is learned (:func:`learn_dictionary`).
        apertium: also run Apertium (skipped with a note when it is not installed).

    Raises:
        TranslationError: a bad direction, no pairs, a failing Apertium.
        DatasetNotInstalledError: the Bible packages are missing (when the dataset is used).
    """
    source, target = parse_direction(direction)
    if split == "train" and held_out is None:
        raise TranslationError("split='train' would score the baselines on the pairs the dictionary "
                               "learns from; use split='test' or 'validation'")
    held = _texts(held_out if held_out is not None else bible_pairs(source, target, split))
    learn = _texts(train if train is not None else bible_pairs(source, target, "train"))
    rows = [_timed("copy", list, held)]
    start = time.perf_counter()
    dictionary = learn_dictionary(learn, method=method, iterations=iterations)
    learned = time.perf_counter() - start
    row = _timed(f"dictionary ({method})", lambda xs: [dictionary.translate(x) for x in xs], held)
    rows.append(BaselineScore(row.name, row.scores, row.seconds + learned,
                              f"{len(dictionary)} entries learned in {learned:.1f} s"))
    if apertium:
        missing = apertium_missing(source, target)
        if missing:
            rows.append(BaselineScore("apertium", None, 0.0, f"skipped: {missing}"))
        else:
            rows.append(_timed("apertium", lambda xs: apertium_translate(xs, source, target), held,
                               "rule-based, offline"))
    books = tuple(SPLIT_BOOKS.get(split, ())) if held_out is None else ()
    what = split if held_out is None else "given pairs"
    return BaselineReport(direction, what, len(held), len(learn), books, tuple(rows))
