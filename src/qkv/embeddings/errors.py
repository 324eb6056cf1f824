"""Errors of the embeddings package."""

from __future__ import annotations

from qkv.errors import QkvError

__all__ = ["EmbeddingError", "EmptyDocumentError", "OutputFormatError"]


class EmbeddingError(QkvError):
    """Input the embedder cannot use: a model folder, an option, a document or a file. The message
    names the bad value and the way out, so that a command line can print it and stop."""


class EmptyDocumentError(EmbeddingError):
    """A document that is empty or only whitespace while ``empty="error"``."""


class OutputFormatError(EmbeddingError):
    """An output path whose format is unknown or whose writer is not installed."""
