"""``qkv serve MODEL [MODEL …]``: an OpenAI-compatible HTTP server with dynamic batching and the
attention explorer (see docs/serving.md).

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["add_serve_parser"]

_DEFAULTS = {"max_texts": 2048, "max_tokens": 262_144, "max_bytes": 8 << 20, "max_new_tokens": 512}


def add_serve_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve models over HTTP: OpenAI-compatible /v1/embeddings, /v1/completions, classify, fill-mask, "
        "dynamic batching, an attention explorer at /",
        description="Serve one or more model folders over HTTP until SIGTERM or Ctrl-C (requests in flight are "
        "answered first; SIGTERM exits 0). Routes: POST /v1/embeddings (OpenAI's shape: a string or a list, "
        "encoding_format float or base64, dimensions), GET /v1/models, POST /v1/classify (fine-tuned heads), POST "
        "/v1/fill-mask (masked LMs), POST /v1/completions (causal LMs; stream: server-sent events), POST "
        "/v1/attention, POST /v1/search (with --index), GET /health, GET /metrics (Prometheus), and the attention "
        "explorer at / (works offline). Concurrent requests are gathered into padding-free batches up to "
        "--batch-tokens, waiting --max-wait-ms for more. Binds 127.0.0.1 unless --host says otherwise. "
        "See docs/serving.md.",
    )
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="a model folder (qkv, Hugging Face or sentence-transformers), named after the folder, or "
                   "NAME=FOLDER; requests name models by NAME")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; another address is reachable from "
                   "other machines, and a warning says so)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port, printed)")
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="embeddings and classification run in this precision (default fp32; bf16 where the CPU has "
                   "bfloat16 instructions; see docs/inference.md); fill-mask, completions and the explorer run the "
                   "model as loaded")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="token budget of a batch: waiting requests are gathered up to it (default 4096)")
    p.add_argument("--max-wait-ms", type=float, default=2.0,
                   help="a batch waits this long after its latest request for another (at most 5× after the "
                   "first), in ms (default 2; 0: never)")
    p.add_argument("--queue-size", type=int, default=256,
                   help="requests waiting per model and operation; beyond it the answer is 503 with Retry-After "
                   "(default 256)")
    g = p.add_argument_group("per-request limits (over one: 413 naming the limit)")
    g.add_argument("--max-texts", type=int, default=_DEFAULTS["max_texts"], help="texts per request (default 2048)")
    g.add_argument("--max-tokens", type=int, default=_DEFAULTS["max_tokens"],
                   help="tokens per request, all texts together (default 262144)")
    g.add_argument("--max-bytes", type=int, default=_DEFAULTS["max_bytes"],
                   help="bytes of a request body (default 8388608, 8 MiB)")
    g.add_argument("--max-new-tokens", type=int, default=_DEFAULTS["max_new_tokens"],
                   help="the largest max_tokens a completion may ask for (default 512)")
    s = p.add_argument_group("security")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health (default: the QKV_API_KEY "
                   "environment variable, which other users of the machine cannot read from the process list)")
    s.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages of ORIGIN (https://host[:port]) call the API; repeatable (default: CORS off)")
    p.add_argument("--index", default=None, metavar="DIR",
                   help="an index folder made by qkv index: the explorer shows its nearest documents (/v1/search)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds SIGTERM waits for requests in flight (default 30)")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="warning",
                   help="server log level (default warning; info: one line per request)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from qkv.serve.config import Limits, ServeConfig, parse_model_spec
    from qkv.serve.runner import serve
    from qkv.serve.security import public_address_warning

    api_key = args.api_key if args.api_key is not None else (os.environ.get("QKV_API_KEY") or None)
    config = ServeConfig(
        models=tuple(parse_model_spec(m) for m in args.models), host=args.host, port=args.port,
        precision=args.precision, batch_tokens=args.batch_tokens, max_wait_ms=args.max_wait_ms,
        queue_size=args.queue_size, api_key=api_key, cors_origins=tuple(args.cors_origin), index=args.index,
        shutdown_timeout=args.shutdown_timeout, log_level=args.log_level,
        limits=Limits(max_texts=args.max_texts, max_tokens=args.max_tokens, max_bytes=args.max_bytes,
                      max_new_tokens=args.max_new_tokens))
    if not config.loopback:
        print(f"qkv serve: warning: {public_address_warning(config.host, api_key is not None)}", file=sys.stderr)
    return serve(config)
