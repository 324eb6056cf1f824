"""Input files as lines: the byte-level reading under every reader of :mod:`qkv.data.readers`.

:func:`open_input` opens a file (gzip-compressed when its name ends in ``.gz``) for bytes;
:func:`raw_lines` reads it one line at a time — a bounded read per line, a leading BOM dropped, a line
longer than the limit refused or streamed as pieces cut at whitespace; :func:`decode_line` decodes a
line as UTF-8 with a message naming the file, line and byte offset; :func:`json_lines` reads a
JSONL stream into objects.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from qkv.data.errors import CorpusDecodeError, CorpusFormatError, DocumentTooLongError

__all__ = ["open_input", "raw_lines", "decode_line", "json_lines"]

_WHITESPACE = (b" ", b"\t", b"\f", b"\v", b"\r")
_BOM = b"\xef\xbb\xbf"


def open_input(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _cut(buf: bytes, limit: int) -> int:
    """Where to cut ``buf`` (longer than ``limit``) so the first piece is ≤ ``limit`` bytes:
    after the last whitespace, else at a UTF-8 character boundary."""
    ws = max(buf.rfind(w, 0, limit) for w in _WHITESPACE)
    if ws > 0:
        return ws + 1
    cut = limit
    while cut > 0 and (buf[cut] & 0xC0) == 0x80:  # never split a multi-byte character
        cut -= 1
    return cut or limit


def _strip_newline(data: bytes) -> bytes:
    if data.endswith(b"\n"):
        data = data[:-1]
        if data.endswith(b"\r"):
            data = data[:-1]
    return data


def raw_lines(fh: BinaryIO, path: Path, limit: int | None,
               split: bool) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(line_no, byte_offset, bytes)`` per line (newline stripped, a leading BOM dropped);
    a line longer than ``limit`` bytes is a :class:`DocumentTooLongError`, or with ``split`` yielded
    as several pieces (same line number); ``limit=None``: lines of any length."""
    offset, line_no = 0, 0
    while True:
        start = offset
        data = fh.readline() if limit is None else fh.readline(limit + 1)
        if not data:
            return
        line_no += 1
        offset += len(data)
        if line_no == 1 and data.startswith(_BOM):
            data, start = data[len(_BOM):], start + len(_BOM)
        if limit is None or data.endswith(b"\n") or len(data) <= limit:
            yield line_no, start, _strip_newline(data)
            continue
        if not split:
            raise DocumentTooLongError(
                f"{path}, line {line_no} (byte offset {start}): a document longer than "
                f"max_doc_bytes={limit} bytes. Raise the limit (max_doc_bytes / --max-doc-bytes), or, for "
                "plain text, stream it as consecutive pieces with long_docs='split' (--long-docs split)."
            )
        buf, ended = data, False
        while True:  # stream the long line; the buffer never exceeds 2 * limit + 1 bytes
            if ended:
                buf = _strip_newline(buf)
            while len(buf) > limit:
                cut = _cut(buf, limit)
                yield line_no, start, buf[:cut]
                start, buf = start + cut, buf[cut:]
            if ended:
                if buf:
                    yield line_no, start, buf
                break
            more = fh.readline(limit + 1)
            offset += len(more)
            buf += more
            ended = not more or more.endswith(b"\n")


def decode_line(data: bytes, path: Path, line_no: int, offset: int, errors: str, *, command_input: bool = False) -> str:
    """``data`` decoded as UTF-8; ``command_input``: the message of a command's input file
    (``qkv embed`` / ``index`` / ``predict``), which names the line first and the option to use."""
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 4]
        if command_input:
            raise CorpusDecodeError(
                f"{path}: not valid UTF-8 at line {line_no}, byte offset {offset + e.start} ({e.reason}, bytes "
                f"{bad!r}). Convert the input to UTF-8 (e.g. iconv -f latin1 -t utf-8), or read it with "
                "--encoding-errors replace (U+FFFD for bad bytes).") from None
        where = "of the decompressed data " if path.name.lower().endswith(".gz") else ""
        raise CorpusDecodeError(
            f"{path}: not valid UTF-8 at byte offset {offset + e.start} {where}(line {line_no}): "
            f"{e.reason}, bytes {bad!r}. Convert the file to UTF-8 (e.g. iconv), or "
            "pass encoding_errors='replace' (on the command line: --encoding-errors replace) to "
            "read it with U+FFFD in place of the bad bytes."
        ) from None


def json_lines(fh: BinaryIO, path: Path, limit: int | None, errors: str, field: str | None = None,
                command_input: bool = False) -> Iterator[tuple[int, dict]]:
    """``(line_no, object)`` per non-blank line of a JSONL stream (``field``: the text field the
    objects must have, for the messages; ``command_input``: see :func:`decode_line`).

    Raises:
        CorpusFormatError: a line that is not valid JSON or not an object.
    """
    want = f" with a {field!r} field" if field else ""
    for line_no, offset, data in raw_lines(fh, path, limit, split=False):
        line = decode_line(data, path, line_no, offset, errors, command_input=command_input).strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusFormatError(
                f"{path}, line {line_no}: not valid JSON ({e.msg} at column {e.colno}); every non-blank line "
                f"of a .jsonl file must be one JSON object{want}") from None
        if not isinstance(obj, dict):
            raise CorpusFormatError(f"{path}, line {line_no}: expected a JSON object{want}, got {type(obj).__name__}")
        yield line_no, obj
