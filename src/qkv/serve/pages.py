"""The attention explorer: its page at ``/``, its assets, and the data routes it calls
(``/v1/attention``, ``/v1/index``, ``/v1/search``; it also calls ``/v1/models``, ``/v1/fill-mask``
and ``/v1/completions``).

The page and its two assets are files of the package (``qkv/serve/static``), read once and
served by name from a fixed list — a request cannot name any other file. They load nothing from
elsewhere (no CDN): the explorer works offline, and its Content-Security-Policy
(:data:`~qkv.serve.security.PAGE_HEADERS`) forbids anything else. Texts from requests reach the
page as JSON and are put into it as text, never as HTML.
"""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from qkv.serve.bodies import Body, read_json
from qkv.serve.errors import ApiError, shown
from qkv.serve.explorer import METHODS
from qkv.serve.security import PAGE_HEADERS
from qkv.serve.state import count_tokens, result_of, state_of

__all__ = ["ROUTES", "ASSETS"]

#: name → media type of every file the explorer consists of.
ASSETS = {"index.html": "text/html; charset=utf-8", "explorer.js": "text/javascript; charset=utf-8",
          "explorer.css": "text/css; charset=utf-8"}
_FILES = {name: (files("qkv.serve") / "static" / name).read_bytes() for name in ASSETS}
_ATTENTION = ("model", "input", "text_pair", "truncate", "user")
_SEARCH = ("query", "k", "user")


async def page(request: Request) -> Response:
    return Response(_FILES["index.html"], media_type=ASSETS["index.html"], headers=PAGE_HEADERS)


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS or name == "index.html":
        raise ApiError(404, f"no explorer file {shown(name)}; the explorer is at /", code="not_found")
    return Response(_FILES[name], media_type=ASSETS[name], headers=PAGE_HEADERS)


async def attention(request: Request) -> JSONResponse:
    state = state_of(request)
    limits = state.config.limits
    body = Body(await read_json(request, limits.max_bytes), _ATTENTION, "/v1/attention")
    model, _, queue = state.registry.operation(body.string("model", required=True), "attention")
    text = body.texts("input", 1)[0]
    pair = body.string("text_pair")
    truncate = body.boolean("truncate", False)
    body.string("user")
    result = await result_of(queue.submit((text, pair, truncate), texts=1, tokens=1))
    return JSONResponse({"object": "attention", "model": model.name, "methods": list(METHODS), **result})


async def index_info(request: Request) -> JSONResponse:
    search = state_of(request).registry.search
    if search is None:
        raise ApiError(404, "this server has no index; start it with --index DIR (a folder made by qkv index)",
                       code="no_index")
    return JSONResponse({"object": "index", "documents": search[0].count, "dimensions": search[0].dim})


async def search(request: Request) -> JSONResponse:
    state = state_of(request)
    limits = state.config.limits
    if state.registry.search is None:
        await index_info(request)
    op, queue = state.registry.search
    body = Body(await read_json(request, limits.max_bytes), _SEARCH, "/v1/search")
    queries = body.texts("query", limits.max_texts)
    k = body.integer("k", 5, 1, 100)
    body.string("user")
    counts = await count_tokens(op.count_tokens, queries, state, param="query")
    hits = await result_of(queue.submit((queries, k), texts=len(queries), tokens=sum(counts)))
    data = [{"object": "search_result", "index": i, "query": q, "hits": h} for i, (q, h) in enumerate(zip(queries, hits))]
    return JSONResponse({"object": "list", "data": data})


ROUTES = [
    Route("/", page, methods=["GET"]),
    Route("/explorer/{name}", asset, methods=["GET"]),
    Route("/v1/attention", attention, methods=["POST"]),
    Route("/v1/index", index_info, methods=["GET"]),
    Route("/v1/search", search, methods=["POST"]),
]
