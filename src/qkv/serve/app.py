"""The ASGI application: routes, middleware, error answers, start and stop.

Middleware, outermost first: request metrics (every answer counted, 401s too) → CORS (only with
``--cors-origin``; it answers browsers' preflight requests) → the API key check (only with
``--api-key``) → the routes. Every error is a JSON body in OpenAI's shape
(:mod:`qkv.serve.errors`), unknown routes and methods included; an unexpected failure is a 500
whose message names the exception (the traceback goes to the log), and the server keeps serving.

Start: the batching threads start. Stop (after uvicorn has answered the requests in flight):
the queues finish what they accepted and their threads end.
"""

from __future__ import annotations

import contextlib
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from qkv.serve import api, pages
from qkv.serve.errors import ApiError, error_body
from qkv.serve.metrics import Metrics
from qkv.serve.security import ApiKeyMiddleware
from qkv.serve.state import ServerState, state_of

__all__ = ["build_app", "route_label"]

_ROUTE_LABELS = frozenset({"/", "/health", "/metrics", "/v1/embeddings", "/v1/classify", "/v1/fill-mask",
                           "/v1/completions", "/v1/translations", "/v1/models", "/v1/attention", "/v1/index",
                           "/v1/search"})


def route_label(path: str) -> str:
    """The metrics label of a request path: its route's template, ``"other"`` for no route."""
    if path in _ROUTE_LABELS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path.startswith("/explorer/"):
        return "/explorer/{name}"
    return "other"


class RequestMetricsMiddleware:
    """ASGI middleware counting every request, its status and duration in :class:`Metrics`."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.request_started()
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.request_finished(route_label(scope["path"]), status, time.perf_counter() - start)


async def _health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def _metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    path = request.url.path if len(request.url.path) <= 80 else request.url.path[:80] + "…"
    if exc.status_code == 404:
        message = f"no route {request.method} {path}; the routes are listed in docs/serving.md (GET /v1/models, " \
                  "POST /v1/embeddings, …)"
        code = "not_found"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{request.method} is not allowed on {path}; use {allowed or 'another method'}"
        code = "method_not_allowed"
    else:
        message, code = str(exc.detail), None
    return JSONResponse(error_body(exc.status_code, message, code=code), status_code=exc.status_code,
                        headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette raises the exception again once this answer is sent: uvicorn logs its traceback
    return JSONResponse(error_body(500, f"the server failed on this request ({type(exc).__name__}: {exc}); its log "
                                   "has the traceback", code="internal_error"), status_code=500)


def build_app(state: ServerState) -> Starlette:
    """The application serving ``state``'s models (its batching threads start with the app)."""
    config = state.config

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.registry.start()
        try:
            yield
        finally:
            await run_in_threadpool(state.registry.close)

    middleware = [Middleware(RequestMetricsMiddleware, metrics=state.metrics)]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"]))
    if config.api_key is not None:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=config.api_key))
    routes = [Route("/health", _health, methods=["GET"]), Route("/metrics", _metrics, methods=["GET"]),
              *api.ROUTES, *pages.ROUTES]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected})
    app.state.qkv = state
    return app
