"""The one reader of input files: plain text, JSONL and CSV/TSV, optionally gzip-compressed.

Every command reads its files here, the format from the name (``.jsonl``, ``.csv``, ``.tsv``, each
optionally ``.gz``; anything else is plain text) and the text in the same field or column
(``text_field``): corpora for pretraining, analysis and contrastive training
(:func:`iter_file_documents`, through :mod:`qkv.data.corpus`), documents to embed or index
(:func:`read_records`: a file or ``-`` for standard input; id = the ``id_field`` value or the line
number), labelled records for fine-tuning and prediction (:func:`iter_records`). Delimited files are
parsed by :mod:`qkv.data.csv_records`.

Files are read as bytes, one line at a time (:mod:`qkv.data.lines`). Corpus documents are read
with a bounded read (``readline(max_doc_bytes + 1)``), so memory stays bounded by ``max_doc_bytes`` whatever the file
holds — a 50 MB line is either a clear :class:`DocumentTooLongError` (``long_docs="error"``, the
default) or streamed as consecutive documents of at most ``max_doc_bytes`` cut at whitespace
(``long_docs="split"``). Decoding happens per line so that an invalid byte is reported with its
file, line and byte offset (of the decompressed stream for ``.gz``).
"""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from qkv.data.errors import (
    CorpusError,
    CorpusFormatError,
    CorpusNotFoundError,
    DocumentTooLongError,
)
from qkv.data.csv_records import csv_rows
from qkv.data.lines import decode_line, json_lines, open_input, raw_lines
from qkv.validation import check_choice, check_int

__all__ = ["CorpusOptions", "Document", "iter_file_documents", "file_format", "DEFAULT_MAX_DOC_BYTES",
           "iter_records", "record_format", "RECORD_FORMATS", "read_records", "input_format", "INPUT_FORMATS"]

DEFAULT_MAX_DOC_BYTES = 4 << 20  # 4 MiB: far above real documents, far below a memory problem


@dataclass(frozen=True)
class CorpusOptions:
    """How corpus files are read.

    Attributes:
        doc_sep: ``"line"`` — every non-blank line is a document; ``"blank"`` — documents are runs
            of non-blank lines separated by blank lines (joined with ``"\\n"``). Plain text only.
        text_field: the JSONL field or CSV/TSV column that holds the text.
        label_field: optional JSONL field or CSV/TSV column holding a label (``None``: no labels).
        encoding_errors: ``"strict"`` raises :class:`CorpusDecodeError` on invalid UTF-8;
            ``"replace"`` substitutes U+FFFD and goes on.
        max_doc_bytes: the longest document (in UTF-8 bytes) read in one piece.
        long_docs: ``"error"`` — a longer document is a :class:`DocumentTooLongError`;
            ``"split"`` — plain-text documents are streamed as consecutive pieces of at most
            ``max_doc_bytes``, cut at whitespace. A JSONL line must always fit ``max_doc_bytes``.
    """

    doc_sep: Literal["line", "blank"] = "line"
    text_field: str = "text"
    label_field: str | None = None
    encoding_errors: Literal["strict", "replace"] = "strict"
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES
    long_docs: Literal["error", "split"] = "error"

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("doc_sep", self.doc_sep, ("line", "blank")),
            ("encoding_errors", self.encoding_errors, ("strict", "replace")),
            ("long_docs", self.long_docs, ("error", "split")),
        ):
            check_choice(name, value, allowed)
        check_int("max_doc_bytes", self.max_doc_bytes, 16)
        if not self.text_field:
            raise ValueError("text_field must be a non-empty string")


@dataclass(frozen=True)
class Document:
    """One document: its text, an optional label, and where it came from (``file:line``)."""

    text: str
    label: str | None = None
    source: str = ""


def file_format(path: Path) -> Literal["text", "jsonl", "csv", "tsv"]:
    """``"jsonl"``, ``"csv"`` or ``"tsv"`` by the name's ending (``.gz`` looked through), else ``"text"``."""
    return record_format(path) or "text"


def _text_documents(fh: BinaryIO, path: Path, opts: CorpusOptions) -> Iterator[Document]:
    split = opts.long_docs == "split"
    if opts.doc_sep == "line":
        for line_no, offset, data in raw_lines(fh, path, opts.max_doc_bytes, split):
            text = decode_line(data, path, line_no, offset, opts.encoding_errors).strip()
            if text:
                yield Document(text, None, f"{path}:{line_no}")
        return
    lines: list[str] = []
    size, first = 0, 0
    for line_no, offset, data in raw_lines(fh, path, opts.max_doc_bytes, split):
        text = decode_line(data, path, line_no, offset, opts.encoding_errors).strip()
        if not text:
            if lines:
                yield Document("\n".join(lines), None, f"{path}:{first}")
            lines, size = [], 0
            continue
        if lines and size + len(data) + 1 > opts.max_doc_bytes:
            if not split:
                raise DocumentTooLongError(
                    f"{path}, document starting at line {first}: longer than max_doc_bytes="
                    f"{opts.max_doc_bytes} bytes (blank-line separated documents). Raise the limit "
                    "(max_doc_bytes / --max-doc-bytes) or pass long_docs='split' (--long-docs split)."
                )
            yield Document("\n".join(lines), None, f"{path}:{first}")
            lines, size = [], 0
        if not lines:
            first = line_no
        lines.append(text)
        size += len(data) + 1
    if lines:
        yield Document("\n".join(lines), None, f"{path}:{first}")


def _text_of(obj: dict, path: Path, line_no: int, field: str) -> str:
    """The string in ``obj[field]``.

    Raises:
        CorpusFormatError: no such field (the message lists the object's fields), or not a string.
    """
    if field not in obj:
        keys = ", ".join(map(repr, list(obj)[:10])) or "none"
        raise CorpusFormatError(
            f"{path}, line {line_no}: expected a JSON object with a {field!r} field, found one with no {field!r} "
            f"field (its fields: {keys}); choose the field with --text-field (text_field=...)")
    text = obj[field]
    if not isinstance(text, str):
        raise CorpusFormatError(f"{path}, line {line_no}: field {field!r} must be a string, got {type(text).__name__}")
    return text


def _jsonl_documents(fh: BinaryIO, path: Path, opts: CorpusOptions) -> Iterator[Document]:
    field, label_field = opts.text_field, opts.label_field
    for line_no, obj in json_lines(fh, path, opts.max_doc_bytes, opts.encoding_errors, field):
        text = _text_of(obj, path, line_no, field)
        label = None
        if label_field is not None:
            if label_field not in obj:
                raise CorpusFormatError(f"{path}, line {line_no}: no label field {label_field!r}; choose it with "
                                        "--label-field")
            label = str(obj[label_field])
        text = text.strip()
        if text:
            yield Document(text, label, f"{path}:{line_no}")


def _csv_documents(fh: BinaryIO, path: Path, fmt: str, opts: CorpusOptions) -> Iterator[Document]:
    for line_no, row in csv_rows(fh, path, fmt, encoding_errors=opts.encoding_errors):
        text = _column(row, path, line_no, opts.text_field, "--text-field").strip()
        label = None if opts.label_field is None else _column(row, path, line_no, opts.label_field, "--label-field")
        if len(text.encode("utf-8")) > opts.max_doc_bytes:
            raise DocumentTooLongError(f"{path}, line {line_no}: a document longer than max_doc_bytes="
                                       f"{opts.max_doc_bytes}; shorten it or raise max_doc_bytes")
        if text:
            yield Document(text, label, f"{path}:{line_no}")


def _column(row: dict[str, str], path: Path, line_no: int, name: str, option: str) -> str:
    """``row[name]``, or a :class:`CorpusFormatError` naming the columns there are and ``option``."""
    if name not in row:
        raise CorpusFormatError(f"{path}, line {line_no}: no column {name!r} (columns: "
                                f"{', '.join(map(repr, row))}); choose it with {option}")
    return row[name]


def iter_file_documents(path: Path, opts: CorpusOptions) -> Iterator[Document]:
    """Stream the documents of one corpus file (format from its name, see :func:`file_format`).

    Raises:
        CorpusDecodeError, DocumentTooLongError, CorpusFormatError: see :class:`CorpusOptions`.
        CorpusError: an unreadable file or a broken ``.gz``.
    """
    fmt = file_format(path)
    try:
        with open_input(path) as fh:
            if fmt in ("csv", "tsv"):
                yield from _csv_documents(fh, path, fmt, opts)
            else:
                yield from (_jsonl_documents if fmt == "jsonl" else _text_documents)(fh, path, opts)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise CorpusError(f"{path}: not a readable gzip file ({e})") from None
    except (IsADirectoryError, PermissionError) as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror})") from None


#: Record-file formats by name ending (a ``.gz`` suffix is looked through).
RECORD_FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".tsv": "tsv"}


def record_format(path: Path) -> str | None:
    """``"jsonl"``, ``"csv"`` or ``"tsv"`` from the file name (``.gz`` looked through), else ``None``."""
    name = Path(path).name.lower().removesuffix(".gz")
    return next((fmt for ext, fmt in RECORD_FORMATS.items() if name.endswith(ext)), None)


def iter_records(path: Path, *, encoding_errors: str = "strict", columns: tuple[str, ...] | None = None,
                 quotes: Literal["csv", "strict", "none"] = "csv") -> Iterator[tuple[str, dict]]:
    """Stream ``(source, record)`` from a JSONL file (one object per non-blank line) or a CSV/TSV
    file whose first row names the columns (values stay strings); ``source`` is ``file:line``.

    ``columns`` names the columns of a CSV/TSV file that has no header row (its first row is data).
    ``quotes`` is how CSV/TSV fields are quoted: ``"csv"`` (the csv module's lenient reading),
    ``"strict"`` (a stray quote inside a field is an error, not silently dropped), ``"none"`` (no
    quoting: every character is data — TSV files that hold raw text).

    Raises:
        CorpusFormatError: invalid JSON, a line that is not an object, a CSV row with another number
            of fields than the header, an empty header or an unknown format (each names file and line).
        CorpusDecodeError, CorpusError: invalid UTF-8 (strict), an unreadable file or a broken ``.gz``.
    """
    path = Path(path)
    fmt = record_format(path)
    if fmt is None:
        raise CorpusFormatError(f"{path}: not a record file; expected .jsonl, .csv or .tsv (optionally .gz)")
    try:
        with open_input(path) as fh:
            if fmt == "jsonl":
                for line_no, obj in json_lines(fh, path, DEFAULT_MAX_DOC_BYTES, encoding_errors):
                    yield f"{path}:{line_no}", obj
                return
            for line_no, row in csv_rows(fh, path, fmt, encoding_errors=encoding_errors, columns=columns,
                                         quotes=quotes):
                yield f"{path}:{line_no}", row
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise CorpusError(f"{path}: not a readable gzip file ({e})") from None
    except (IsADirectoryError, PermissionError) as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror})") from None
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file") from None


#: The formats :func:`read_records` reads.
INPUT_FORMATS = ("text", "jsonl", "csv", "tsv")


def input_format(path: str | Path, fmt: str | None = None) -> str:
    """The format of a :func:`read_records` input: ``fmt`` (one of :data:`INPUT_FORMATS`, else a
    :class:`CorpusFormatError`) when given, else from the name (:func:`file_format`)."""
    if fmt is not None:
        if fmt not in INPUT_FORMATS:
            raise CorpusFormatError(f"input format {fmt!r} is not allowed; allowed: {', '.join(INPUT_FORMATS)}")
        return fmt
    return file_format(Path(str(path)))


def read_records(path: str | Path, *, fmt: str | None = None, text_field: str = "text", id_field: str = "id",
                 encoding_errors: str = "strict") -> Iterator[tuple[Any, str]]:
    """Stream ``(id, text)`` records of a file, or of standard input for ``"-"`` (what ``qkv embed``
    and ``qkv index`` read).

    A text file (``fmt="text"``): one document per line, the newline removed (a blank line is an
    empty document), id = line number (from 1). A JSONL file: one object per non-blank line, the
    text in ``text_field``, id = its ``id_field`` value when present, else the line number. A CSV or
    TSV file (first row: the column names): one document per row, the text in column ``text_field``
    (an empty cell is an empty document), id = column ``id_field`` when the file has it, else the
    row's line number. Any may be gzip-compressed (``.gz``); ``fmt`` defaults to the name (:func:`input_format`; ``"-"`` is
    text). Lines of any length are read one at a time; invalid UTF-8 is an error naming the line
    and byte offset unless ``encoding_errors="replace"``.

    Raises:
        CorpusNotFoundError, CorpusDecodeError, CorpusFormatError, CorpusError: a missing file,
            invalid UTF-8, invalid JSON, a missing or non-string text field, a broken ``.gz``.
    """
    if encoding_errors not in ("strict", "replace"):
        raise CorpusError(f"encoding_errors={encoding_errors!r}; allowed: strict, replace")
    fmt, owned, name = input_format(path, fmt), str(path) != "-", Path("<stdin>" if str(path) == "-" else path)
    if owned and not name.is_file():
        raise CorpusNotFoundError(f"input file not found: {name}" + (" (it is a folder)" if name.is_dir() else ""))
    fh = open_input(name) if owned else sys.stdin.buffer
    try:
        if fmt == "jsonl":
            for line_no, obj in json_lines(fh, name, None, encoding_errors, text_field, command_input=True):
                yield obj.get(id_field, line_no), _text_of(obj, name, line_no, text_field)
            return
        if fmt in ("csv", "tsv"):
            for line_no, row in csv_rows(fh, name, fmt, encoding_errors=encoding_errors):
                yield row.get(id_field, line_no), _column(row, name, line_no, text_field, "--text-field")
            return
        for line_no, offset, data in raw_lines(fh, name, None, split=False):
            yield line_no, decode_line(data, name, line_no, offset, encoding_errors, command_input=True).rstrip("\r\n")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise CorpusError(f"{name}: not a readable gzip file ({e})") from None
    finally:
        if owned:
            fh.close()
