"""Errors raised while reading or writing checkpoints."""

from __future__ import annotations

from qkv.errors import QkvError

__all__ = ["CheckpointError"]


class CheckpointError(QkvError):
    """A checkpoint folder or file that cannot be loaded as asked; the message names the file,
    the tensor or field, and the expected versus found value."""
