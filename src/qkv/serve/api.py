"""The OpenAI-shaped routes: ``/v1/embeddings``, ``/v1/models``, ``/v1/completions`` (whole or as
server-sent events), and qkv's own ``/v1/classify`` and ``/v1/fill-mask`` in the same style
(``{"object": "list", "data": [...], "model": ..., "usage": ...}``).

Each handler reads and checks its body (:mod:`qkv.serve.bodies`), counts tokens against the
limits, queues the request for its model's batch (:mod:`qkv.serve.batching`) and shapes the
answer. Translation has no model kind yet: ``/v1/translations`` answers 404 saying so.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from qkv.serve.bodies import Body, read_json
from qkv.serve.completions import CompletionRequest
from qkv.serve.errors import ApiError, error_body, shown
from qkv.serve.state import count_tokens, result_of, state_of

__all__ = ["ROUTES"]

_EMBED = ("model", "input", "encoding_format", "dimensions", "user")
_CLASSIFY = ("model", "input", "user")
_FILL = ("model", "input", "top_k", "user")
_COMPLETE = ("model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options",
             "n", "stop", "echo", "logprobs", "best_of", "presence_penalty", "frequency_penalty", "logit_bias",
             "suffix", "user")


def _usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


async def embeddings(request: Request) -> JSONResponse:
    state = state_of(request)
    limits = state.config.limits
    body = Body(await read_json(request, limits.max_bytes), _EMBED, "/v1/embeddings")
    model, op, queue = state.registry.operation(body.string("model", required=True), "embeddings")
    texts = body.texts("input", limits.max_texts)
    fmt = body.string("encoding_format", default="float")
    if fmt not in ("float", "base64"):
        raise ApiError(400, f"encoding_format={shown(fmt)} is not offered; use 'float' or 'base64'",
                       param="encoding_format", code="invalid_value")
    dims = body.integer("dimensions", None, 1)
    if dims is not None and dims > op.dim:
        raise ApiError(400, f"dimensions={dims}: model {model.name!r} gives {op.dim}-dimensional vectors; ask for "
                       f"{op.dim} or fewer", param="dimensions", code="invalid_value")
    body.string("user")
    counts = await count_tokens(op.count, texts, state)
    vectors = await result_of(queue.submit(texts, texts=len(texts), tokens=sum(counts)))  # (n,C)
    if dims is not None and dims < op.dim:  # the first dims components, unit length again if normalised
        vectors = vectors[:, :dims]
        if op.normalized:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.tobytes()).decode("ascii") if fmt == "base64" else v.tolist()}
            for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model.name, "usage": _usage(sum(counts))})


async def classify(request: Request) -> JSONResponse:
    state = state_of(request)
    limits = state.config.limits
    body = Body(await read_json(request, limits.max_bytes), _CLASSIFY, "/v1/classify")
    model, op, queue = state.registry.operation(body.string("model", required=True), "classify")
    texts = body.texts("input", limits.max_texts)
    body.string("user")
    counts = await count_tokens(op.count, texts, state)
    records = await result_of(queue.submit(texts, texts=len(texts), tokens=sum(counts)))
    data = [{"object": "classification", "index": i, **rec} for i, rec in enumerate(records)]
    return JSONResponse({"object": "list", "data": data, "model": model.name, "task": op.task,
                         "usage": _usage(sum(counts))})


async def fill_mask(request: Request) -> JSONResponse:
    state = state_of(request)
    limits = state.config.limits
    body = Body(await read_json(request, limits.max_bytes), _FILL, "/v1/fill-mask")
    model, op, queue = state.registry.operation(body.string("model", required=True), "fill-mask")
    texts = body.texts("input", limits.max_texts)
    k = body.integer("top_k", 5, 1, 100)
    body.string("user")
    counts = await count_tokens(op.count, texts, state)
    results = await result_of(queue.submit((texts, k), texts=len(texts), tokens=sum(counts)))
    data = [{"object": "fill_mask", "index": i, "text": r.text,
             "predictions": [{"token": t, "probability": p} for t, p in r.top]} for i, r in enumerate(results)]
    return JSONResponse({"object": "list", "data": data, "model": model.name, "usage": _usage(sum(counts))})


def _completion_request(body: Body, limits) -> tuple[CompletionRequest, list[str], bool, bool]:
    prompts = body.texts("prompt", limits.max_texts)
    max_tokens = body.integer("max_tokens", 16, 1, limits.max_new_tokens, limit_option="--max-new-tokens")
    temperature = body.number("temperature", 1.0, 0, 2)
    top_p = body.number("top_p", None, 0, 1, low_open=True)
    top_k = body.integer("top_k", None, 1)
    seed = body.integer("seed", None, 0)
    stream = body.boolean("stream", False)
    options = body.data.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError(400, 'stream_options must be {"include_usage": true|false}', param="stream_options",
                       code="invalid_value")
    include_usage = bool((options or {}).get("include_usage", False))
    for name, allowed, why in (("n", (1, None), "one completion per prompt"), ("best_of", (1, None), "no reranking"),
                               ("echo", (False, None), "the prompt is not repeated"),
                               ("logprobs", (None,), "no log-probabilities"),
                               ("stop", (None, []), "no stop strings (generation stops at the model's end token)"),
                               ("suffix", (None,), "no insertion"),
                               ("presence_penalty", (0, None), "no penalties"),
                               ("frequency_penalty", (0, None), "no penalties"),
                               ("logit_bias", (None, {}), "no logit bias")):
        body.only(name, allowed, why)
    body.string("user")
    req = CompletionRequest([], max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    return req, prompts, stream, include_usage


async def completions(request: Request):
    state = state_of(request)
    limits = state.config.limits
    body = Body(await read_json(request, limits.max_bytes), _COMPLETE, "/v1/completions")
    model, op, queue = state.registry.operation(body.string("model", required=True), "completions")
    req, prompts, stream, include_usage = _completion_request(body, limits)
    if sum(len(p) for p in prompts) > 16_384:  # long prompts are tokenized off the event loop
        req.prompts = await run_in_threadpool(op.encode, prompts, req.max_tokens)
    else:
        req.prompts = op.encode(prompts, req.max_tokens)
    tokens = sum(len(p) for p in req.prompts)
    if tokens > limits.max_tokens:
        raise ApiError(413, f"prompt has {tokens} tokens, more than the limit of {limits.max_tokens} tokens per request "
                       "(--max-tokens); send fewer or shorter prompts", param="prompt", code="too_many_tokens")
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": model.name}
    if not stream:
        done = await result_of(queue.submit(req, texts=len(prompts), tokens=tokens))
        return JSONResponse({**head, "choices": [
            {"text": t, "index": i, "logprobs": None, "finish_reason": r}
            for i, (t, r) in enumerate(zip(done.texts, done.finish_reasons))], "usage": _completion_usage(done)})
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    req.emit = lambda row, text: loop.call_soon_threadsafe(events.put_nowait, (row, text))
    future = queue.submit(req, texts=len(prompts), tokens=tokens)  # a full queue is 503 before the stream starts
    return StreamingResponse(_sse(head, events, future, req, include_usage), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _completion_usage(done) -> dict:
    prompt, completion = sum(done.prompt_tokens), sum(done.completion_tokens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _sse(head: dict, events: asyncio.Queue, future: asyncio.Future, req: CompletionRequest,
               include_usage: bool):
    """The stream's events: text pieces as they come, each row's finish reason, usage, ``[DONE]``."""
    def chunk(row: int, text: str, reason=None) -> str:
        return _event({**head, "choices": [{"text": text, "index": row, "logprobs": None, "finish_reason": reason}]})

    try:
        while not (future.done() and events.empty()):
            getter = asyncio.ensure_future(events.get())
            done, _ = await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield chunk(*getter.result())
            else:
                getter.cancel()
        try:
            result = await result_of(future)
        except ApiError as e:
            yield _event(e.body())
            return
        except Exception as e:  # noqa: BLE001 - the stream has started: the error goes into it
            yield _event(error_body(500, f"generation failed ({type(e).__name__}: {e})", code="internal_error"))
            return
        for row, reason in enumerate(result.finish_reasons):
            yield chunk(row, "", reason)
        if include_usage:
            yield _event({**head, "choices": [], "usage": _completion_usage(result)})
        yield "data: [DONE]\n\n"
    except asyncio.CancelledError:  # the client left: stop generating at the next token
        req.cancelled.set()
        future.cancel()
        raise


async def models(request: Request) -> JSONResponse:
    state = state_of(request)
    return JSONResponse({"object": "list", "data": [_model_entry(state, m) for m in state.registry.models.values()]})


async def model(request: Request) -> JSONResponse:
    state = state_of(request)
    return JSONResponse(_model_entry(state, state.registry.get(request.path_params["model"])))


def _model_entry(state, served) -> dict:
    return {"id": served.name, "object": "model", "created": state.started, "owned_by": "qkv", **served.info}


async def translations(request: Request) -> JSONResponse:
    raise ApiError(404, "translation is not available in this version of qkv serve: no served model kind translates "
                   "yet (an encoder_decoder model answers /v1/attention only)", code="not_available")


ROUTES = [
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/classify", classify, methods=["POST"]),
    Route("/v1/fill-mask", fill_mask, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/translations", translations, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model}", model, methods=["GET"]),
]
