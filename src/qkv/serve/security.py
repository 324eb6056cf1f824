"""Safe by default: the API key check, the explorer page's headers, the warning for a public address.

* :class:`ApiKeyMiddleware`: with ``--api-key``, every route but ``/health`` needs
  ``Authorization: Bearer KEY`` (what OpenAI's clients send) or HTTP Basic auth with KEY as the
  password (any user name): a browser asks for it when the explorer page answers 401 with a Basic
  challenge, then sends it with the page's own requests. Keys are compared in constant time.
* :data:`PAGE_HEADERS`: the explorer's pages load scripts, styles and data from this server only
  (a Content-Security-Policy without inline scripts), cannot be framed, are not sniffed.
* :func:`public_address_warning`: what ``qkv serve`` prints when ``--host`` is not a loopback
  address.

CORS is added only for the origins ``--cors-origin`` names (Starlette's ``CORSMiddleware``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json

from qkv.serve.errors import error_body

__all__ = ["ApiKeyMiddleware", "PAGE_HEADERS", "public_address_warning", "OPEN_PATHS"]

#: Routes that need no key.
OPEN_PATHS = frozenset({"/health"})
#: Headers of the explorer's page and assets.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def public_address_warning(host: str, has_key: bool) -> str:
    """The warning for serving on ``host``, not a loopback address."""
    risk = (f"--host {host} makes the server reachable from other machines: anyone who can reach this port can "
            "send texts to the models, read /metrics and load this CPU")
    if has_key:
        return risk + "; requests need the API key, which travels in clear text without TLS (put a TLS proxy in front)"
    return risk + "; give --api-key (or QKV_API_KEY) and put a TLS proxy in front, or bind 127.0.0.1"


def _presented_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() != b"authorization":
            continue
        scheme, _, token = value.strip().partition(b" ")
        if scheme.lower() == b"bearer":
            return token.strip()
        if scheme.lower() == b"basic":
            try:
                return base64.b64decode(token.strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return b""
        return b""
    return None


class ApiKeyMiddleware:
    """ASGI middleware: 401 for a request without the key (or with a wrong one), except on
    :data:`OPEN_PATHS`.

    Args:
        app: the application behind it.
        api_key: the key.
    """

    def __init__(self, app, api_key: str):
        self.app = app
        self._key = api_key.encode("utf-8")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = _presented_key(scope.get("headers", []))
        if presented is not None and hmac.compare_digest(presented, self._key):
            await self.app(scope, receive, send)
            return
        if presented is None:
            message = ("missing API key: this server needs the header 'Authorization: Bearer KEY' (the key it was "
                       "started with, --api-key or QKV_API_KEY)")
        else:
            message = "wrong API key: send the key this server was started with, as 'Authorization: Bearer KEY'"
        page = not scope["path"].startswith("/v1/") and scope["path"] != "/metrics"
        challenge = b'Basic realm="qkv serve", charset="UTF-8"' if page else b'Bearer realm="qkv serve"'
        body = json.dumps(error_body(401, message, code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", challenge)]})
        await send({"type": "http.response.body", "body": body})
