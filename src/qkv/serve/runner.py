"""Running a server: :func:`serve` (in the foreground, what ``qkv serve`` does) and
:class:`BackgroundServer` (in a thread of this process: tests, notebooks, benchmarks).

Both load every model first (an error is a :class:`~qkv.serve.errors.ServeError` before any port
is opened), bind the socket themselves (port 0: any free port; the real one is in the URL), then
run uvicorn on it.

SIGTERM (and Ctrl-C): uvicorn stops accepting connections, answers the requests already received
(up to ``shutdown_timeout`` seconds), then the batching queues finish and stop. uvicorn raises the
signal again once it is done; :func:`serve` holds a no-op handler for SIGTERM meanwhile, so that
the process exits 0 after a SIGTERM.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

import uvicorn

from qkv.serve.app import build_app
from qkv.serve.config import ServeConfig
from qkv.serve.errors import ServeError
from qkv.serve.metrics import Metrics
from qkv.serve.registry import Registry
from qkv.serve.state import ServerState

__all__ = ["serve", "BackgroundServer", "load_state", "bind_socket", "bound_kernel_caches", "KERNEL_CACHE_ENTRIES"]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


#: Entries of oneDNN's primitive cache and of PyTorch's ideep cache of linear-layer computations (both
#: 1024 by default). Every batch of a new total token count makes new entries; with the defaults a
#: server's memory grew by ~400 MB over 10,000 MiniLM requests before the caches filled (measured:
#: 440 → 1244 MB of RSS over 600 batches of 1–16 texts; with 64 each: 440 → 532 MB, flat after 100
#: batches, no slower). Read when the first linear map runs; a value in the environment wins.
KERNEL_CACHE_ENTRIES = 64


def bound_kernel_caches(entries: int = KERNEL_CACHE_ENTRIES) -> None:
    """Bound the CPU kernel caches of this process (see :data:`KERNEL_CACHE_ENTRIES`): call before the
    first model runs; a process that already ran one keeps the sizes it started with."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(entries))


def load_state(config: ServeConfig, *, log: Callable[[str], None] = _stderr) -> ServerState:
    """Every model loaded and warmed up, the index opened (see :class:`~qkv.serve.registry.Registry`);
    the kernel caches bounded first (:func:`bound_kernel_caches`), so memory stays flat."""
    bound_kernel_caches()
    metrics = Metrics()
    return ServerState(Registry(config, metrics, log=log), config, metrics)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one) and listening, ready for uvicorn.

    Raises:
        ServeError: the address cannot be bound (in use, not this machine's, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio switches Nagle's algorithm off (TCP_NODELAY) only on sockets that say so;
    # with proto 0 every answer written in two parts waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port (0: any free "
                         "one) or --host") from None
    sock.listen(2048)  # connections made once the address is announced wait in the backlog, not refused
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_config(app, config: ServeConfig) -> uvicorn.Config:
    return uvicorn.Config(app, lifespan="on", log_level=config.log_level, access_log=config.log_level in ("info", "debug"),
                          timeout_graceful_shutdown=math.ceil(config.shutdown_timeout), server_header=False)


def _describe(state: ServerState) -> list[str]:
    lines = []
    for m in state.registry.models.values():
        lines.append(f"qkv serve: model {m.name!r} ({m.kind}): {', '.join(m.info['endpoints'])}")
    if state.registry.search is not None:
        lines.append(f"qkv serve: index of {state.registry.search[0].count} documents: /v1/search")
    return lines


def serve(config: ServeConfig, *, log: Callable[[str], None] = _stderr,
          announce: Callable[[str], None] = lambda m: print(m, flush=True)) -> int:
    """Load the models and serve them until SIGTERM or Ctrl-C; returns 0 after a SIGTERM.

    Raises:
        ServeError: a model, the index or the address cannot be used.
        KeyboardInterrupt: after Ctrl-C, once the requests in flight are answered.
    """
    state = load_state(config, log=log)
    app = build_app(state)
    sock = bind_socket(config.host, config.port)
    url = _url(sock)
    for line in _describe(state):
        announce(line)
    announce(f"qkv serve: serving on {url} (explorer: {url}/); stop with Ctrl-C or SIGTERM")
    server = uvicorn.Server(_uvicorn_config(app, config))
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # see the module docstring
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return 0


class BackgroundServer:
    """``qkv serve`` in a thread of this process: ``with BackgroundServer(config) as server: …
    server.url …``; stopped (requests in flight answered) on leaving the block.

    Args:
        config: the :class:`~qkv.serve.config.ServeConfig` (``port=0`` for any free port).
        state: models already loaded (:func:`load_state`), to share between servers.
    """

    def __init__(self, config: ServeConfig, *, state: ServerState | None = None):
        self.config = config
        self.state = state
        self.url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        if self.state is None:
            self.state = load_state(self.config)
        sock = bind_socket(self.config.host, self.config.port)
        self.url = _url(sock)
        self._server = uvicorn.Server(_uvicorn_config(build_app(self.state), self.config))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="qkv-serve")
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ServeError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop accepting, answer the requests in flight, stop the batching threads."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
