"""Errors of the server: :class:`ServeError` (a setting the user can fix, before the server starts)
and :class:`ApiError` (an HTTP error answer to one request, in OpenAI's JSON shape).

Every error answer has the body OpenAI's API gives, so that its clients raise their usual
exceptions (``openai.BadRequestError``, ``openai.NotFoundError`` …) with the message::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input", "code": "..."}}

The message names the problem and the fix in one line; ``param`` the request field at fault.
"""

from __future__ import annotations

from qkv.errors import QkvError

__all__ = ["ServeError", "ApiError", "error_body", "shown"]

#: OpenAI's error ``type`` by HTTP status (any other 4xx: ``invalid_request_error``; 5xx: ``server_error``).
_TYPES = {401: "authentication_error", 403: "permission_error", 503: "server_error"}


class ServeError(QkvError):
    """A server setting that cannot work (a model folder, a name, a limit, a port): reported by
    ``qkv serve`` as ``qkv serve: error: …`` before anything is served."""


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: what a message quotes of a request's own content."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    """The JSON body of an error answer (see the module docstring)."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ApiError(Exception):
    """One request's error answer.

    Args:
        status: the HTTP status (400 bad request, 401 no or wrong key, 404 unknown model or route,
            413 over a limit, 503 queue full or shutting down, 500 a failure of the server).
        message: one line naming the problem and the fix.
        param: the request field at fault, if any.
        code: a short machine-readable reason (``"model_not_found"``, ``"too_many_tokens"`` …).
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param, code=self.code)
