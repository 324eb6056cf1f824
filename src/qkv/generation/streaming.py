"""Printing text as it is generated: a streamer for one prompt.

Each step's token is appended and the whole continuation decoded again; the part not yet printed
is written out. Decoding the whole keeps WordPiece ``##`` joins and byte-level pieces right; text
ending in an incomplete UTF-8 sequence (``�``) waits for the next token.
"""

from __future__ import annotations

import sys
from typing import TextIO

from torch import Tensor

__all__ = ["TextStreamer"]


class TextStreamer:
    """A ``streamer`` for :func:`qkv.generation.generate` that prints row 0's new text.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        eos_token_id: stop printing at this id.
        prefix: the prompt's ids: the new text is what decoding prompt + new tokens adds to the
            prompt's own decoding (so a WordPiece ``##`` piece joins the prompt's last word, and a
            new word gets its space).
        out: where to write (default stdout).
    """

    def __init__(self, tokenizer, *, eos_token_id: int | None = None, prefix: list[int] | None = None,
                 out: TextIO | None = None):
        self.tokenizer, self.eos = tokenizer, eos_token_id
        self.out = out if out is not None else sys.stdout
        self.prefix = list(prefix or [])
        self.ids: list[int] = []
        self.printed = ""
        self.done = False

    def __call__(self, tokens: Tensor) -> None:
        """Take the ``(B,)`` tokens of one step (row 0 is printed)."""
        if self.done:
            return
        tok = int(tokens.reshape(-1)[0])
        if self.eos is not None and tok == self.eos:
            self.done = True
            return
        self.ids.append(tok)
        text = self.text()
        if text.endswith("\ufffd") or not text.startswith(self.printed):
            return  # an incomplete character, or the decoder rewrote earlier text: wait
        self.out.write(text[len(self.printed):])
        self.out.flush()
        self.printed = text

    def end(self) -> None:
        """Write what is still held back (the end of the text) and a newline."""
        text = self.text()
        self.out.write((text[len(self.printed):] if text.startswith(self.printed) else "") + "\n")
        self.out.flush()
        self.printed = text

    def text(self) -> str:
        """The whole continuation so far."""
        return continuation(self.tokenizer, self.prefix, self.ids)


def continuation(tokenizer, prefix: list[int], new: list[int], eos: int | None = None) -> str:
    """The text ``new`` adds after ``prefix`` (up to ``eos``): ``decode(prefix + new)`` less ``decode(prefix)``."""
    if eos is not None and eos in new:
        new = new[: new.index(eos)]
    if not new:
        return ""
    head = tokenizer.decode(list(prefix), skip_special_tokens=True)
    whole = tokenizer.decode(list(prefix) + list(new), skip_special_tokens=True)
    if whole.startswith(head):
        return whole[len(head):]
    return " " + tokenizer.decode(list(new), skip_special_tokens=True)
