"""Parallel text: (source, target) pairs for translation, from a user's file or a named dataset.

A pair file goes through the one record reader (:func:`qkv.data.readers.iter_records`), so it is
read, decoded and reported like every other record file:

* ``*.jsonl`` — one object per line; the two sides in ``source_field`` / ``target_field``
  (default ``source`` and ``target``; e.g. ``source_field="en", target_field="es"``);
* ``*.tsv`` / ``*.csv`` — a header row naming the columns (the same two field names), or, with
  ``header=False``, exactly two columns, source then target, and no header;
* any of them gzip-compressed (``.gz``).

CSV/TSV quoting is ``quotes="strict"`` by default (a quote in the middle of a quoted field is an
error rather than silently dropped); raw-text TSV files whose fields may begin with a quote
character are read with ``quotes="none"``. A row with an empty side is an error naming the line,
unless the caller asks for such rows to be skipped (``empty="skip"``); blank lines are skipped.

``dataset:NAME[:SPLIT]`` names a parallel dataset (:mod:`qkv.data.datasets`: ``bible-en-es``,
``bible-es-en``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from qkv.data.errors import CorpusFormatError, CorpusNotFoundError
from qkv.data.readers import iter_records, record_format
from qkv.validation import check_choice

__all__ = ["Pair", "PairOptions", "iter_pair_file"]


@dataclass(frozen=True)
class Pair:
    """One translation pair and where it came from (``file:line``, or ``dataset:…#Gen.1.1``)."""

    source: str
    target: str
    origin: str = ""


@dataclass(frozen=True)
class PairOptions:
    """How a pair file is read.

    Attributes:
        source_field: the JSONL field / CSV-TSV column of the source side.
        target_field: the JSONL field / CSV-TSV column of the target side.
        header: CSV/TSV: the first row names the columns; ``False``: two columns, no header.
        quotes: CSV/TSV quoting: ``"strict"``, ``"csv"`` (lenient) or ``"none"`` (raw text).
        empty: a pair with an empty (blank) side: ``"error"`` or ``"skip"``.
        encoding_errors: ``"strict"`` (invalid UTF-8 is an error) or ``"replace"``.
    """

    source_field: str = "source"
    target_field: str = "target"
    header: bool = True
    quotes: Literal["strict", "csv", "none"] = "strict"
    empty: Literal["error", "skip"] = "error"
    encoding_errors: Literal["strict", "replace"] = "strict"

    def __post_init__(self) -> None:
        check_choice("quotes", self.quotes, ("strict", "csv", "none"))
        check_choice("empty", self.empty, ("error", "skip"))
        check_choice("encoding_errors", self.encoding_errors, ("strict", "replace"))
        if not self.source_field or not self.target_field or self.source_field == self.target_field:
            raise ValueError(f"source_field and target_field must be two different names, got "
                             f"{self.source_field!r} and {self.target_field!r}")


def _side(rec: dict, field: str, where: str, opts: PairOptions, fmt: str) -> str:
    if field not in rec:
        fields = ", ".join(map(repr, list(rec)[:10])) or "none"
        how = ("choose them with source_field=/target_field=" if fmt == "jsonl" else
               "name them with source_field=/target_field=, or read a file without a header row with "
               "header=False")
        raise CorpusFormatError(f"{where}: no {field!r} field (its fields: {fields}); {how}")
    value = rec[field]
    if not isinstance(value, str):
        raise CorpusFormatError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    return value.strip()


def iter_pair_file(path: str | os.PathLike, options: PairOptions | None = None) -> Iterator[Pair]:
    """Stream the pairs of one JSONL, TSV or CSV file (optionally ``.gz``), in file order.

    Raises:
        CorpusNotFoundError: no such file.
        CorpusFormatError: not a record file, a missing field, a non-string side, a row with another
            number of columns, bad quoting, or an empty side with ``empty="error"`` (each names the
            file and line and the way out).
        CorpusDecodeError, CorpusError: invalid UTF-8 (strict), an unreadable file or a broken ``.gz``.
    """
    opts = options or PairOptions()
    path = Path(path)
    fmt = record_format(path)
    if fmt is None:
        raise CorpusFormatError(f"{path}: not a pair file; expected .jsonl, .tsv or .csv (optionally .gz)")
    if not path.is_file():
        folder = " (it is a folder)" if path.is_dir() else ""
        raise CorpusNotFoundError(f"pair file not found: {path}{folder}")
    columns = None if opts.header or fmt == "jsonl" else (opts.source_field, opts.target_field)
    records = iter_records(path, encoding_errors=opts.encoding_errors, columns=columns, quotes=opts.quotes)
    for where, rec in records:
        source = _side(rec, opts.source_field, where, opts, fmt)
        target = _side(rec, opts.target_field, where, opts, fmt)
        if not source or not target:
            if opts.empty == "skip":
                continue
            side = "source" if not source else "target"
            raise CorpusFormatError(f"{where}: the {side} side is empty; fix the row, or skip such rows with "
                                    "empty='skip'")
        yield Pair(source, target, where)
