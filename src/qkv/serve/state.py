"""What every route reads: the server's models, settings and counters (``request.app.state.qkv``),
and the two steps every text endpoint shares: count the tokens against the limit, await the batch."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from qkv.errors import QkvError
from qkv.serve.bodies import too_large
from qkv.serve.config import ServeConfig
from qkv.serve.errors import ApiError
from qkv.serve.metrics import Metrics
from qkv.serve.registry import Registry

__all__ = ["ServerState", "state_of", "count_tokens", "result_of"]

#: Texts longer than this (characters, all together) are tokenized off the event loop.
_INLINE_CHARS = 16_384


@dataclass
class ServerState:
    """The server's models (:class:`~qkv.serve.registry.Registry`), settings and counters."""

    registry: Registry
    config: ServeConfig
    metrics: Metrics
    started: int = field(default_factory=lambda: int(time.time()))


def state_of(request) -> ServerState:
    return request.app.state.qkv


async def count_tokens(count, texts: list[str], state: ServerState, param: str = "input") -> list[int]:
    """Each text's tokens by ``count``; 413 when together they exceed the request limit."""
    if sum(len(t) for t in texts) > _INLINE_CHARS:
        counts = await run_in_threadpool(count, texts)
    else:
        counts = count(texts)
    total, limit = sum(counts), state.config.limits.max_tokens
    if total > limit:
        raise too_large(param, total, "tokens", limit, "--max-tokens", "send fewer or shorter texts per request",
                        param=param, code="too_many_tokens")
    return counts


async def result_of(future: asyncio.Future):
    """The batch's result for one request; a library error about the request is 400."""
    try:
        return await future
    except ApiError:
        raise
    except QkvError as e:  # the request's content (the library names it)
        raise ApiError(400, str(e), code="invalid_value") from None
