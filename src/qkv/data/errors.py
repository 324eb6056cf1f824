"""Errors of the data pipeline.

Every problem with the user's input raises a subclass of :class:`CorpusError` (a ``ValueError``)
whose message names the file, line or byte offset, the bad value and the way out, so that a command
line can print ``str(error)`` and stop before any training starts.
"""

from __future__ import annotations

from qkv.errors import QkvError

__all__ = [
    "CorpusError",
    "CorpusNotFoundError",
    "EmptyCorpusError",
    "CorpusDecodeError",
    "DocumentTooLongError",
    "CorpusFormatError",
    "UnknownDatasetError",
    "DatasetNotInstalledError",
    "TokenizerError",
    "CacheError",
    "ImageDataError",
]


class CorpusError(QkvError):
    """Base class: a corpus (or tokenizer / cache) input the pipeline cannot use."""


class CorpusNotFoundError(CorpusError, FileNotFoundError):
    """A ``--corpus`` path that does not exist."""


class EmptyCorpusError(CorpusError):
    """A corpus (or a held-out part of it) without a single non-blank document or token."""


class CorpusDecodeError(CorpusError, UnicodeError):
    """A file that is not valid UTF-8 (message gives file, line and byte offset)."""


class DocumentTooLongError(CorpusError):
    """A document longer than ``max_doc_bytes`` while ``long_docs="error"``."""


class CorpusFormatError(CorpusError):
    """A JSONL line that is not a JSON object with the text field, or a malformed dataset file."""


class UnknownDatasetError(CorpusError):
    """``dataset:NAME[:SPLIT]`` with an unknown name or split (message lists the allowed ones)."""


class DatasetNotInstalledError(CorpusError):
    """A named dataset whose offline data package is not installed (message gives the pip command)."""


class TokenizerError(CorpusError):
    """A tokenizer folder or file that cannot be loaded or lacks the BERT special tokens."""


class CacheError(CorpusError):
    """A token cache folder that is incomplete or of another format version."""


class ImageDataError(CorpusError):
    """Images qkv cannot use: unreadable or empty files, a class folder without images, mixed sizes."""
