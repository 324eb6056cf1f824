"""Request bodies: read within the byte limit, parse as JSON, check every field.

Every problem is an :class:`~qkv.serve.errors.ApiError` naming the field (``param``) and what is
allowed: malformed JSON, a body that is not an object, an unknown field (a request can only set
what the endpoint documents, never a file, a path or a plugin), a wrong type, an empty text, or a
request over a limit (413 naming the limit and the command-line option that sets it).
"""

from __future__ import annotations

import json
from typing import Any

from qkv.serve.errors import ApiError, shown
from qkv.validation import is_int

__all__ = ["read_json", "Body", "too_large"]


def too_large(what: str, n: int, unit: str, limit: int, option: str, fix: str, *, param: str | None,
              code: str) -> ApiError:
    """The 413 answer of a request over a limit (``"input has 3000 texts, more than the limit of 2048
    texts per request (--max-texts); split …"``)."""
    return ApiError(413, f"{what} has {n} {unit}, more than the limit of {limit} {unit} per request ({option}); "
                    f"{fix}", param=param, code=code)


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


async def read_json(request, max_bytes: int) -> dict[str, Any]:
    """The request's JSON object, read without holding more than ``max_bytes`` of it.

    Raises:
        ApiError: 413 over ``max_bytes`` (by ``Content-Length`` or as read); 400 no body, not UTF-8,
            not JSON, not an object.
    """
    fix = "send fewer or shorter texts per request"
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, f"Content-Length {shown(declared)} is not a number of bytes", code="invalid_request")
        if int(declared) > max_bytes:
            raise too_large("the request body", int(declared), "bytes", max_bytes, "--max-bytes", fix, param=None,
                            code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise too_large("the request body", len(body), "bytes", max_bytes, "--max-bytes", fix, param=None,
                            code="request_too_large")
    if not body.strip():
        raise ApiError(400, 'the request has no body; send a JSON object such as {"model": "NAME", "input": "text"}',
                       code="invalid_json")
    try:
        data = json.loads(bytes(body), parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text; send JSON encoded as UTF-8",
                       code="invalid_json") from None
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                       code="invalid_json") from None
    except ValueError as e:  # NaN, Infinity
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got a JSON {_json_type(data)}",
                       code="invalid_json")
    return data


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


class Body:
    """The fields of one request body, read by type.

    Args:
        data: the JSON object.
        allowed: the field names the endpoint takes; any other is refused (400 naming it).
        endpoint: how messages name the endpoint (``"/v1/embeddings"``).
    """

    def __init__(self, data: dict[str, Any], allowed: tuple[str, ...], endpoint: str):
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise ApiError(400, f"unknown field {shown(unknown[0])} for {endpoint}; its fields are "
                           f"{', '.join(allowed)}", param=unknown[0][:80], code="unknown_field")
        self.data, self.endpoint = data, endpoint

    def _bad(self, name: str, want: str, value: Any) -> ApiError:
        return ApiError(400, f"{name} must be {want}, got a JSON {_json_type(value)}", param=name,
                        code="invalid_type")

    def string(self, name: str, *, required: bool = False, default: str | None = None) -> str | None:
        if name not in self.data or self.data[name] is None:
            if required:
                raise ApiError(400, f"{name} is missing: {self.endpoint} needs it", param=name,
                               code="missing_field")
            return default
        value = self.data[name]
        if not isinstance(value, str):
            raise self._bad(name, "a string", value)
        return value

    def integer(self, name: str, default: int | None, low: int, high: int | None = None, *,
                limit_option: str | None = None) -> int | None:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, "an integer", value)
        if value < low:
            raise ApiError(400, f"{name}={value} must be ≥ {low}", param=name, code="invalid_value")
        if high is not None and value > high:
            where = f" (the server's limit, {limit_option})" if limit_option else ""
            raise ApiError(400, f"{name}={value} must be ≤ {high}{where}", param=name, code="invalid_value")
        return value

    def number(self, name: str, default: float | None, low: float, high: float, *, low_open: bool = False
               ) -> float | None:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(name, "a number", value)
        if (value <= low if low_open else value < low) or value > high:
            bounds = f"{'(' if low_open else '['}{low}, {high}]"
            raise ApiError(400, f"{name}={value} must be in {bounds}", param=name, code="invalid_value")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(name, "true or false", value)
        return value

    def only(self, name: str, allowed: tuple, why: str) -> None:
        """Refuse any value of ``name`` but ``allowed`` (OpenAI options this server does not offer)."""
        if name in self.data and self.data[name] not in allowed:
            raise ApiError(400, f"{name}={shown(self.data[name])} is not supported by this server: {why}", param=name,
                           code="unsupported_value")

    def texts(self, name: str, max_texts: int) -> list[str]:
        """A string or a non-empty list of strings, each with words, at most ``max_texts``."""
        value = self.data.get(name)
        if value is None:
            raise ApiError(400, f"{name} is missing: give a string or a list of strings", param=name,
                           code="missing_field")
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise self._bad(name, "a string or a list of strings", value)
        if not items:
            raise ApiError(400, f"{name} is an empty list: give at least one text", param=name, code="empty_input")
        if len(items) > max_texts:
            raise too_large(name, len(items), "texts", max_texts, "--max-texts",
                            "split the texts into several requests", param=name, code="too_many_texts")
        for i, text in enumerate(items):
            where = name if isinstance(value, str) else f"{name}[{i}]"
            if is_int(text) or (isinstance(text, list) and text and all(is_int(x) for x in text)):
                raise ApiError(400, f"{where} is a token id or a list of them; this server reads text only "
                               "(it tokenizes with the model's own tokenizer): send strings", param=name,
                               code="invalid_type")
            if not isinstance(text, str):
                raise self._bad(where, "a string", text)
            if not text.strip():
                raise ApiError(400, f"{where} is empty (or only whitespace): every text needs words", param=name,
                               code="empty_input")
        return items
