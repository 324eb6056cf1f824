"""The error type of translation scoring and baselines."""

from __future__ import annotations

from qkv.errors import QkvError

__all__ = ["TranslationError"]


class TranslationError(QkvError):
    """A translation input or tool qkv cannot use (the message names it and the fix)."""
