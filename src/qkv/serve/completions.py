"""``/v1/completions``: a causal LM continues text prompts, whole or streamed as it generates.

The prompts of one request are one left-padded batch through :func:`qkv.generation.generate`,
encoded and decoded as :func:`qkv.generation.generate_texts` does (the tokenizer's beginning
token in front, generation stopped at its end token), so a request answers what
``generate_texts`` gives for the same options and seed. ``temperature`` 0 is greedy decoding.

Streaming: each row has a :class:`~qkv.generation.streaming.TextStreamer` whose output is sent
to the request as server-sent events while the batch runs; what it holds back (a word piece that
may still join the next one) follows at the end, so the streamed pieces add up to the text a
whole answer gives. A client that leaves stops its generation at the next token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from qkv.generation.loop import generate
from qkv.generation.prompts import pad_prompts, prompt_ids, special_ids
from qkv.generation.streaming import TextStreamer, continuation
from qkv.serve.errors import ApiError

__all__ = ["CompletionRequest", "Completion", "CompletionsOperation", "Cancelled"]


class Cancelled(Exception):
    """The client of a streamed completion left; its generation stops."""


@dataclass
class CompletionRequest:
    """One request's prompts (already encoded) and decoding options."""

    prompts: list[list[int]]
    max_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    emit: Callable[[int, str], None] | None = None  # streaming: emit(row, new text), thread-safe
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class Completion:
    """What a request gets: per prompt its text, why it ended (``"stop"``: the end token,
    ``"length"``: ``max_tokens``) and its new tokens (the end token included)."""

    texts: list[str]
    finish_reasons: list[str]
    completion_tokens: list[int]
    prompt_tokens: list[int]


class _RowWriter:
    """The ``out`` of one row's :class:`TextStreamer`: what it writes goes to the request."""

    def __init__(self, row: int, emit: Callable[[int, str], None]):
        self.row, self.emit = row, emit

    def write(self, text: str) -> None:
        if text:
            self.emit(self.row, text)

    def flush(self) -> None:
        pass


class CompletionsOperation:
    """Generation for a :class:`~qkv.models.causal_lm.CausalLM` and its tokenizer (run as loaded)."""

    name = "completions"

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        _, self.eos, pad = special_ids(tokenizer)
        self.pad = pad if pad is not None else self.eos  # generate_texts' defaults
        self.window = int(model.decoder.max_len)

    def encode(self, prompts: list[str], max_tokens: int) -> list[list[int]]:
        """Each prompt's ids; 400 when one gives no tokens or does not leave room for ``max_tokens``."""
        encoded = []
        for i, text in enumerate(prompts):
            where = f"prompt[{i}]" if len(prompts) > 1 else "prompt"
            try:
                ids = prompt_ids(self.tokenizer, text)
            except ValueError as e:
                raise ApiError(400, f"{where}: {e}", param="prompt", code="empty_input") from None
            if len(ids) + max_tokens > self.window:
                raise ApiError(400, f"{where} has {len(ids)} tokens; with max_tokens={max_tokens} that exceeds the "
                               f"model's window of {self.window}; shorten the prompt or lower max_tokens",
                               param="prompt", code="context_length_exceeded")
            encoded.append(ids)
        return encoded

    def run(self, payloads: list[CompletionRequest]) -> list[Completion]:
        """One request at a time (its prompts are one batch)."""
        return [self._complete(request) for request in payloads]

    def _complete(self, req: CompletionRequest) -> Completion:
        ids, mask = pad_prompts(req.prompts, pad_token_id=self.pad if self.pad is not None else 0)  # (B,T) each
        streamers = [] if req.emit is None else [
            TextStreamer(self.tokenizer, eos_token_id=self.eos, prefix=p, out=_RowWriter(i, req.emit))
            for i, p in enumerate(req.prompts)]

        def on_step(tokens) -> None:  # (B,) new tokens
            if req.cancelled.is_set():
                raise Cancelled()
            for i, streamer in enumerate(streamers):
                streamer(tokens[i:i + 1])

        greedy = req.temperature == 0
        out = generate(self.model, ids, attention_mask=mask, max_new_tokens=req.max_tokens, do_sample=not greedy,
                       temperature=1.0 if greedy else req.temperature, top_k=req.top_k, top_p=req.top_p,
                       eos_token_id=self.eos, pad_token_id=self.pad, seed=req.seed,
                       streamer=on_step if (streamers or req.emit is not None) else None)  # (B,T+n)
        texts, reasons, counts = [], [], []
        for i, prefix in enumerate(req.prompts):
            new = out[i, ids.shape[1]:].tolist()
            text = continuation(self.tokenizer, prefix, new, self.eos)
            ended = self.eos is not None and self.eos in new
            texts.append(text)
            reasons.append("stop" if ended else "length")
            counts.append(new.index(self.eos) + 1 if ended else len(new))
            if streamers and text.startswith(streamers[i].printed):
                _RowWriter(i, req.emit).write(text[len(streamers[i].printed):])  # what the streamer held back
        return Completion(texts, reasons, counts, [len(p) for p in req.prompts])
