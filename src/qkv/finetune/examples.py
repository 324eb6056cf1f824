"""Labelled examples for fine-tuning, read from named datasets, JSONL, CSV/TSV and CoNLL files.

Sequence tasks (classification, regression): an example is ``(text, target)``.

* ``dataset:NAME[:SPLIT]`` — the labelled named datasets (20 Newsgroups, Reuters R8/R52, KJV);
* ``.jsonl`` — one object per line with ``text_field`` and ``label_field``;
* ``.csv`` / ``.tsv`` — a header row naming the columns ``text_field`` and ``label_field``.

Token classification: an example is ``(words, tags)``.

* CoNLL-style files (``.conll``, ``.txt``, any other name): one token per line, columns separated by
  whitespace, the word first and the tag last; a blank line ends a sentence; ``-DOCSTART-`` lines
  are skipped;
* ``.jsonl`` — objects with a list of words ``tokens_field`` and a list of tags ``tags_field``.

Everything is checked before training, with one line naming the file, line and fix: a missing
field or column, a missing or empty label, labels of mixed types (``1`` and ``"1"``; integers and
strings), a non-numeric regression target, tags that do not match the words, an empty split, and —
in :func:`label_set` — a held-out label the training data never had.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qkv.errors import QkvError
from qkv.data.errors import CorpusError
from qkv.data.readers import iter_records
from qkv.data.datasets import dataset_documents, parse_dataset_spec
from qkv.data.readers import record_format

__all__ = ["Examples", "FinetuneDataError", "read_examples", "read_conll", "label_set", "split_examples", "subsample"]


class FinetuneDataError(QkvError, ValueError):
    """Fine-tuning data the run cannot use (the message names the file, line and fix)."""


@dataclass
class Examples:
    """Examples of one split: ``inputs`` are texts (sequence tasks) or word lists (token tasks);
    ``targets`` are labels (``str``/``int``), numbers (regression) or tag lists."""

    inputs: list = field(default_factory=list)
    targets: list = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.inputs)

    def add(self, inp, target, source: str) -> None:
        self.inputs.append(inp)
        self.targets.append(target)
        self.sources.append(source)

    def extend(self, other: Examples) -> None:
        self.inputs += other.inputs
        self.targets += other.targets
        self.sources += other.sources
        self.notes += other.notes

    def take(self, idx: Sequence[int]) -> Examples:
        return Examples([self.inputs[i] for i in idx], [self.targets[i] for i in idx],
                        [self.sources[i] for i in idx], list(self.notes))


def _label_value(value, source: str, task: str, name: str):
    """A checked target: a finite number (regression) or a non-empty string / integer label."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise FinetuneDataError(f"{source}: the label {name!r} is missing or empty; every example needs one")
    if task == "regression":
        if isinstance(value, bool):
            raise FinetuneDataError(f"{source}: regression target {value!r} is not a number")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise FinetuneDataError(f"{source}: regression target {value!r} is not a number") from None
        if not math.isfinite(number):
            raise FinetuneDataError(f"{source}: regression target {value!r} is not finite")
        return number
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FinetuneDataError(f"{source}: label {value!r} ({type(value).__name__}) must be a string or an "
                                "integer")
    return value.strip() if isinstance(value, str) else value


def _record_examples(path: Path, task: str, fields: dict[str, str], encoding_errors: str) -> Examples:
    out = Examples()
    try:
        for source, rec in iter_records(path, encoding_errors=encoding_errors):
            if task == "token-classification":
                words, tags = (_require(rec, fields[k], source, _FIELD_OPTION[k]) for k in ("tokens_field", "tags_field"))
                out.add(*_check_tagged(words, tags, source), source)
                continue
            text = _require(rec, fields["text_field"], source, "--text-field")
            if not isinstance(text, str):
                raise FinetuneDataError(f"{source}: field {fields['text_field']!r} must be a string, got "
                                        f"{type(text).__name__}")
            label = _require(rec, fields["label_field"], source, "--label-field")
            label = _label_value(label, source, task, fields["label_field"])
            if text.strip():
                out.add(text.strip(), label, source)
            else:
                out.notes.append(f"{source}: empty text skipped")
    except CorpusError as e:
        raise FinetuneDataError(str(e)) from None
    return out


_FIELD_OPTION = {"text_field": "--text-field", "label_field": "--label-field", "tokens_field": "--tokens-field",
                 "tags_field": "--tags-field"}


def _require(rec: dict, name: str, source: str, option: str = ""):
    if name not in rec:
        keys = ", ".join(map(repr, list(rec)[:12])) or "none"
        raise FinetuneDataError(f"{source}: no field/column {name!r} (found: {keys}); name the right one with "
                                f"{option or 'the matching --…-field option'}")
    return rec[name]


def _check_tagged(words, tags, source: str) -> tuple[list[str], list[str]]:
    if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
        raise FinetuneDataError(f"{source}: the words must be a list of non-empty strings")
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise FinetuneDataError(f"{source}: the tags must be a list of non-empty strings (missing tag?)")
    if len(words) != len(tags):
        raise FinetuneDataError(f"{source}: {len(words)} words but {len(tags)} tags; give one tag per word")
    if not words:
        raise FinetuneDataError(f"{source}: a sentence without words")
    return words, tags


def read_conll(path: Path, encoding_errors: str = "strict", *, with_tags: bool = True) -> Examples:
    """Sentences of a CoNLL-style file (see the module docstring); ``with_tags=False`` reads the
    words only (a tag column, if present, is ignored) — for prediction."""
    out = Examples()
    words: list[str] = []
    tags: list[str] = []
    start = 0
    width: tuple[int, int] | None = None  # (columns, line) of the first token line: every line has as many

    def flush() -> None:
        if words:
            out.add(list(words), list(tags), f"{path}:{start}")
            words.clear()
            tags.clear()

    try:
        fh = open(path, encoding="utf-8", errors=encoding_errors)
    except OSError as e:
        raise FinetuneDataError(f"{path}: cannot read ({e.strerror})") from None
    with fh:
        try:
            for line_no, line in enumerate(fh, 1):
                cols = line.split()
                if not cols:
                    flush()
                    continue
                if cols[0] == "-DOCSTART-":
                    flush()
                    continue
                if with_tags and len(cols) < 2:
                    raise FinetuneDataError(f"{path}, line {line_no}: expected 'word … tag' (whitespace-separated "
                                            f"columns, the tag last), got {line.strip()!r}")
                if width is None:
                    width = (len(cols), line_no)
                elif len(cols) != width[0]:
                    raise FinetuneDataError(
                        f"{path}, line {line_no}: {len(cols)} columns where line {width[1]} has {width[0]}: not a "
                        "CoNLL file (one token per line, the same columns on every line, the tag last, a blank line "
                        "between sentences); for words and tags per sentence use .jsonl with 'tokens' and 'tags'")
                if not words:
                    start = line_no
                words.append(cols[0])
                tags.append(cols[-1] if with_tags else "O")
        except UnicodeDecodeError as e:
            raise FinetuneDataError(f"{path}: not valid UTF-8 ({e.reason}); convert it, or read it with "
                                    "--encoding-errors replace (in Python: encoding_errors='replace')") from None
    flush()
    return out


def _dataset_examples(spec: str, task: str) -> Examples:
    try:
        info, split = parse_dataset_spec(spec)
        if not info.labelled:
            raise FinetuneDataError(f"{spec}: dataset {info.name!r} has no labels; labelled datasets: "
                                    "20newsgroups, reuters8, reuters52, kjv")
        if task != "sequence-classification":
            raise FinetuneDataError(f"{spec}: the named datasets are labelled by topic, for sequence-classification "
                                    f"(not {task}); give a .jsonl/.csv/.conll file")
        out = Examples()
        for doc in dataset_documents(info, split):
            out.add(doc.text, doc.label, doc.source)
    except CorpusError as e:
        raise FinetuneDataError(str(e)) from None
    return out


def read_examples(spec: str | os.PathLike, task: str, *, text_field: str = "text", label_field: str = "label",
                  tokens_field: str = "tokens", tags_field: str = "tags",
                  encoding_errors: str = "strict") -> Examples:
    """The examples of one data spec (see the module docstring).

    Raises:
        FinetuneDataError: an unreadable or malformed file, a missing field or label, a bad target.
    """
    spec = str(spec)
    if spec.startswith("dataset:"):
        ex = _dataset_examples(spec, task)
    else:
        path = Path(spec)
        if not path.is_file():
            raise FinetuneDataError(f"{spec}: no such file; give dataset:NAME[:SPLIT], a .jsonl, .csv or .tsv "
                                    "file, or a CoNLL file (token-classification)")
        fmt = record_format(path)
        if fmt is None and task != "token-classification":
            raise FinetuneDataError(f"{spec}: unknown format for {task}; expected .jsonl, .csv or .tsv "
                                    "(optionally .gz) with text and label fields")
        fields = dict(text_field=text_field, label_field=label_field, tokens_field=tokens_field,
                      tags_field=tags_field)
        ex = _record_examples(path, task, fields, encoding_errors) if fmt else read_conll(path, encoding_errors)
    if not len(ex):
        raise FinetuneDataError(f"{spec}: no examples (the split is empty)")
    if task == "sequence-classification":
        kinds = {type(t).__name__ for t in ex.targets}
        if len(kinds) > 1:
            first = {k: next(s for s, t in zip(ex.sources, ex.targets) if type(t).__name__ == k) for k in kinds}
            raise FinetuneDataError(f"{spec}: labels of mixed types ({', '.join(f'{k} at {v}' for k, v in first.items())});"
                                    " write every label the same way (all strings or all integers)")
    return ex


def label_set(train: Examples, held_out: Examples, task: str, *, given: Sequence[str] | None = None,
              head: Sequence[str] | None = None) -> tuple[tuple[str, ...], str]:
    """The labels in id order and their kind (``"str"``/``"int"``), checked against the data.

    The order is ``given`` (``--labels``), else the starting model's head labels, else the sorted
    training labels (integers numerically). Classification only; token tasks label tags.

    Raises:
        FinetuneDataError: fewer than 2 labels, a held-out (or training) label outside the set.
    """
    if task == "token-classification":
        seen_train = sorted({t for tags in train.targets for t in tags})
        seen_eval = {t for tags in held_out.targets for t in tags}
        kind = "str"
    else:
        kind = "int" if all(isinstance(t, int) for t in train.targets) else "str"
        if kind == "int" and held_out.targets and not all(isinstance(t, int) for t in held_out.targets):
            raise FinetuneDataError("the held-out labels are strings but the training labels integers; write them "
                                    "the same way")
        seen_train = sorted({t for t in train.targets})
        seen_eval = {t for t in held_out.targets}
        seen_train = [str(t) for t in seen_train]
        seen_eval = {str(t) for t in seen_eval}
    labels = tuple(given) if given else (tuple(head) if head else tuple(seen_train))
    if len(labels) < 2:
        source = "--labels gives" if given else "the model's head has" if head else "the training data has"
        raise FinetuneDataError(f"{source} {len(labels)} label{'' if len(labels) == 1 else 's'} "
                                f"({', '.join(labels) or 'none'}); classification needs at least 2")
    known = set(labels)
    for what, seen, ex in (("training", set(seen_train), train), ("held-out", seen_eval, held_out)):
        extra = sorted(seen - known)
        if extra:
            where = _first_source(ex, extra[0], task)
            fix = ("add it to --labels" if given else
                   "fine-tune with --reset-head to replace the model's head" if head else
                   "every held-out label must occur in the training data")
            raise FinetuneDataError(f"{what} label {extra[0]!r} (at {where}) is not among the {len(labels)} labels "
                                    f"{', '.join(labels[:10])}{' …' if len(labels) > 10 else ''}; {fix}")
    return labels, kind


def _first_source(ex: Examples, label: str, task: str) -> str:
    for src, t in zip(ex.sources, ex.targets):
        if (label in t) if task == "token-classification" else (str(t) == label):
            return src
    return "?"


def split_examples(ex: Examples, fraction: float, seed: int) -> tuple[Examples, Examples]:
    """A seeded (train, held-out) split holding out ``fraction`` of the examples."""
    order = np.random.default_rng(seed).permutation(len(ex))
    n_eval = max(1, round(fraction * len(ex)))
    if len(ex) - n_eval < 1:
        raise FinetuneDataError(f"only {len(ex)} example(s): too few to hold out {fraction:.0%}; give --eval data")
    held, train = ex.take(sorted(order[:n_eval])), ex.take(sorted(order[n_eval:]))
    train.notes.append(f"held out a seeded {fraction:.0%} of the training examples ({n_eval}) for evaluation "
                       f"(seed {seed})")
    return train, held


def subsample(ex: Examples, n: int | None, seed: int, what: str) -> Examples:
    """A seeded random subsample of at most ``n`` examples (noted), or ``ex`` itself."""
    if n is None or n >= len(ex):
        return ex
    keep = np.sort(np.random.default_rng(seed).choice(len(ex), size=n, replace=False))
    out = ex.take(keep)
    out.notes.append(f"{what}: seeded random subsample of {n} of {len(ex)} examples (seed {seed})")
    return out
