"""What a server is started with: :class:`ServeConfig` (models, address, batching, limits, security),
frozen and checked on construction.

A model is given as ``FOLDER`` (named after the folder) or ``NAME=FOLDER``
(:func:`parse_model_spec`); requests name models by that name only, never by a path.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from qkv.nn.maps import PRECISIONS
from qkv.serve.errors import ServeError
from qkv.validation import MAX_BATCH_TOKENS, MAX_NEW_TOKENS, check_at_most, check_choice, check_int, check_range

__all__ = ["ModelSpec", "Limits", "ServeConfig", "parse_model_spec", "is_loopback", "NAME_PATTERN"]

#: What a model name may hold: letters, digits, ``.``, ``_``, ``-`` (1–64 characters).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class ModelSpec:
    """One model to serve: the name requests use and the folder it is loaded from."""

    name: str
    folder: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ServeError(f"model name {self.name!r} is not allowed: use 1–64 letters, digits, '.', '_' or "
                             "'-', starting with a letter or digit (NAME=FOLDER)")
        if not Path(self.folder).is_dir():
            raise ServeError(f"model folder not found: {self.folder}; give a qkv, Hugging Face or "
                             "sentence-transformers model folder")


def parse_model_spec(spec: str) -> ModelSpec:
    """``"NAME=FOLDER"`` or ``"FOLDER"`` (named after the folder's last part) → :class:`ModelSpec`.

    Raises:
        ServeError: an empty spec, a bad name, or a folder that does not exist.
    """
    name, sep, folder = spec.partition("=")
    if not sep or Path(spec).is_dir():  # a folder whose path holds "=" is a folder
        name, folder = Path(spec).resolve().name, spec
    if not folder:
        raise ServeError(f"model {spec!r}: give FOLDER or NAME=FOLDER")
    return ModelSpec(name, folder)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Per-request limits; a request over one is answered 413 naming the limit.

    Attributes:
        max_texts: texts in one request.
        max_tokens: tokens of one request, all its texts together ([CLS]/[SEP] counted; a long text
            counts all its tokens, though it is embedded in windows).
        max_bytes: bytes of a request body.
        max_new_tokens: ``max_tokens`` a completion may ask for.
    """

    max_texts: int = 2048
    max_tokens: int = 262_144
    max_bytes: int = 8 << 20
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        for name in ("max_texts", "max_tokens", "max_bytes", "max_new_tokens"):
            check_int(name, getattr(self, name), 1, error=ServeError)
        check_at_most("max_new_tokens", self.max_new_tokens, MAX_NEW_TOKENS, why="the most one completion may add",
                      error=ServeError)


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """How ``qkv serve`` runs.

    Attributes:
        models: the models, by name (at least one; names unique).
        host: the address to bind; loopback by default (anything else is reachable from other
            machines: the command line warns).
        port: the TCP port (0: any free one, printed when serving).
        precision: ``"fp32"``, ``"bf16"`` or ``"int8"`` for embeddings and classification (see
            :func:`qkv.inference.for_inference`); fill-mask, completions and the explorer run the model as
            loaded (float32).
        batch_tokens: the token budget of a batch: requests waiting are gathered up to it (a larger
            request runs alone, in batches of this many tokens).
        max_wait_ms: how long a batch waits after its latest request for another (at most five times
            that after its first; 0: never).
        queue_size: requests waiting per model and operation; beyond it, 503 with ``Retry-After``.
        limits: the per-request :class:`Limits`.
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer KEY`` (or HTTP
            Basic auth with KEY as the password, which browsers ask for).
        cors_origins: origins allowed to call from a browser page of another site (none: CORS off).
        index: an index folder made by ``qkv index``: the explorer's nearest documents, ``/v1/search``.
        shutdown_timeout: seconds SIGTERM waits for requests in flight before cancelling them.
        log_level: uvicorn's log level (``"warning"`` by default: no line per request).
    """

    models: tuple[ModelSpec, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    precision: str = "fp32"
    batch_tokens: int = 4096
    max_wait_ms: float = 2.0
    queue_size: int = 256
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    index: str | None = None
    shutdown_timeout: float = 30.0
    log_level: str = "warning"

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        if not self.models:
            raise ServeError("no model to serve: give at least one model folder (NAME=FOLDER)")
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ServeError(f"model name {dupes[0]!r} given twice; name each model: NAME=FOLDER")
        check_int("port", self.port, 0, error=ServeError)
        if self.port > 65535:
            raise ServeError(f"port={self.port} must be in [0, 65535]")
        check_choice("precision", self.precision, PRECISIONS, error=ServeError)
        check_int("batch_tokens", self.batch_tokens, 1, error=ServeError)
        check_at_most("batch_tokens", self.batch_tokens, MAX_BATCH_TOKENS, why="tokens of one batch", error=ServeError)
        check_range("max_wait_ms", self.max_wait_ms, 0, 10_000, bounds="[]", number=True, error=ServeError)
        check_int("queue_size", self.queue_size, 1, error=ServeError)
        check_range("shutdown_timeout", self.shutdown_timeout, 0, bounds="(", number=True, error=ServeError)
        check_choice("log_level", self.log_level, ("critical", "error", "warning", "info", "debug"), error=ServeError)
        if self.api_key is not None and (not isinstance(self.api_key, str) or len(self.api_key) < 8
                                         or any(c.isspace() for c in self.api_key)):
            raise ServeError("the API key must be at least 8 characters without spaces")
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        for origin in self.cors_origins:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ServeError(f"CORS origin {origin!r} must look like https://host[:port] (no path), or *")
        if self.index is not None and not Path(self.index).is_dir():
            raise ServeError(f"index folder not found: {self.index}; make one with qkv index MODEL CORPUS --out DIR")

    @property
    def loopback(self) -> bool:
        """Whether the server is reachable from this machine only."""
        return is_loopback(self.host)
