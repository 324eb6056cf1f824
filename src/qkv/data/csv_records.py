"""CSV and TSV records: the rows of a delimited file whose first row names the columns, streamed.

The one home of delimited-file parsing; :mod:`qkv.data.readers` opens the file (plain or ``.gz``, or
standard input) and hands the byte stream here. Rows come out as ``dict`` column → string, with the
line number of the row's first line; a byte-order mark is looked through.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal

from qkv.data.errors import CorpusDecodeError, CorpusFormatError
from qkv.validation import check_choice

__all__ = ["csv_rows", "DELIMITERS"]

_BOM = b"\xef\xbb\xbf"

#: Delimiter of each delimited format.
DELIMITERS = {"csv": ",", "tsv": "\t"}


def csv_rows(fh: BinaryIO, path: Path, fmt: str, *, encoding_errors: str = "strict",
             columns: tuple[str, ...] | None = None,
             quotes: Literal["csv", "strict", "none"] = "csv") -> Iterator[tuple[int, dict[str, str]]]:
    """Stream ``(line_no, row)`` of the CSV (``fmt="csv"``) or TSV (``"tsv"``) bytes in ``fh``.

    ``columns`` names the columns of a file without a header row (its first row is data). ``quotes``:
    ``"csv"`` (the csv module's lenient reading), ``"strict"`` (a stray quote inside a field is an
    error), ``"none"`` (every character is data: TSV files of raw text). Blank rows are skipped.

    Raises:
        CorpusFormatError: an empty header, a column named twice, a row with another number of fields
            than the header, or text the csv module cannot parse (each names the file and line).
        CorpusDecodeError: invalid UTF-8 with ``encoding_errors="strict"``.
    """
    check_choice("quotes", quotes, ("csv", "strict", "none"))
    check_choice("format", fmt, tuple(DELIMITERS))
    quoting = {"quoting": csv.QUOTE_NONE} if quotes == "none" else {"strict": quotes == "strict"}
    reader = csv.reader(_decoded_lines(fh, path, encoding_errors), delimiter=DELIMITERS[fmt], **quoting)
    try:
        header = list(columns) if columns is not None else next(reader, None)
        header = _check_header(header, path)
        start = reader.line_num + 1
        for row in reader:
            if row and any(c.strip() for c in row):
                if len(row) != len(header):
                    raise CorpusFormatError(_width_message(path, start, row, header, columns, quotes))
                yield start, dict(zip(header, row))
            start = reader.line_num + 1
    except csv.Error as e:
        raise CorpusFormatError(f"{path}, line {reader.line_num}: not valid {fmt.upper()} ({e})") from None


def _decoded_lines(fh: BinaryIO, path: Path, errors: str) -> Iterator[str]:
    """The lines of ``fh`` decoded one at a time (line ending kept), so that invalid UTF-8 is reported with
    its line; a byte-order mark at the start is dropped."""
    for line_no, data in enumerate(fh, 1):
        if line_no == 1 and data.startswith(_BOM):
            data = data[len(_BOM):]
        try:
            yield data.decode("utf-8", errors)
        except UnicodeDecodeError as e:
            raise CorpusDecodeError(
                f"{path}, line {line_no}: invalid UTF-8 at byte offset {e.start} of the line ({e.reason}, bytes "
                f"{data[e.start:e.start + 4]!r}); convert the file to UTF-8 (e.g. iconv), or read it with "
                "--encoding-errors replace (encoding_errors='replace')") from None


def _check_header(header: list[str] | None, path: Path) -> list[str]:
    if not header or not any(h.strip() for h in header):
        raise CorpusFormatError(f"{path}: the first row must name the columns (e.g. text,label)")
    header = [h.strip() for h in header]
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:  # a dict of the row would keep the last column of each name, silently
        raise CorpusFormatError(f"{path}: column(s) {', '.join(map(repr, twice))} appear more than once in the "
                                "header; give every column its own name")
    return header


def _width_message(path: Path, line: int, row: list[str], header: list[str], columns, quotes: str) -> str:
    has = "the header has" if columns is None else "the file has"
    fix = ("quote fields that contain the delimiter" if quotes != "none"
           else "with quotes='none' a field cannot hold the delimiter")
    return f"{path}, line {line}: {len(row)} fields, but {has} {len(header)} ({', '.join(header)}); {fix}"
