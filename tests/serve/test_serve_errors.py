"""Bad requests get the right 4xx with a JSON error naming the problem, and the server keeps serving:
malformed JSON, wrong types, empty input, limits (texts, tokens, bytes), unknown model or field,
the wrong kind of model, missing or wrong API key; a full queue is 503 with Retry-After; CORS is
off unless asked for."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import urllib.parse

import pytest
from serve_support import openai_client, running

from qkv.serve.config import Limits, ServeConfig, parse_model_spec

KEY = "s3cret-key-for-tests"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tiny_folders):
    specs = tuple(parse_model_spec(f"{n}={tiny_folders[n]}") for n in ("mlm", "lm", "clf"))
    limits = Limits(max_texts=4, max_tokens=200, max_bytes=4000, max_new_tokens=20)
    srv = running(ServeConfig(models=specs, port=0, api_key=KEY, limits=limits))
    yield srv
    srv.stop()


def call(url: str, method: str, path: str, body=None, headers=None):
    """``(status, headers, parsed JSON or text)`` of one request."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    raw = r.read()
    conn.close()
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = raw.decode(errors="replace")
    return r.status, {k.lower(): v for k, v in r.getheaders()}, payload


CASES = [  # path, body, status, code, words in the message
    ("/v1/embeddings", b'{"model": "mlm", "input": ', 400, "invalid_json", "not valid JSON"),
    ("/v1/embeddings", b"", 400, "invalid_json", "no body"),
    ("/v1/embeddings", b"[1, 2]", 400, "invalid_json", "must be a JSON object, got a JSON array"),
    ("/v1/embeddings", b'{"model": "mlm", "input": NaN}', 400, "invalid_json", "NaN"),
    ("/v1/embeddings", {"model": "mlm", "input": 5}, 400, "invalid_type", "input must be a string or a list"),
    ("/v1/embeddings", {"model": 5, "input": "x"}, 400, "invalid_type", "model must be a string"),
    ("/v1/embeddings", {"input": "x"}, 400, "missing_field", "model is missing"),
    ("/v1/embeddings", {"model": "mlm"}, 400, "missing_field", "input is missing"),
    ("/v1/embeddings", {"model": "mlm", "input": [[1, 2, 3]]}, 400, "invalid_type", "reads text only"),
    ("/v1/embeddings", {"model": "mlm", "input": ""}, 400, "empty_input", "input is empty"),
    ("/v1/embeddings", {"model": "mlm", "input": []}, 400, "empty_input", "empty list"),
    ("/v1/embeddings", {"model": "mlm", "input": ["a", " \n"]}, 400, "empty_input", "input[1] is empty"),
    ("/v1/embeddings", {"model": "mlm", "input": ["a", 3]}, 400, "invalid_type", "input[1] is a token id"),
    ("/v1/embeddings", {"model": "mlm", "input": [["a"]]}, 400, "invalid_type", "input[0] must be a string"),
    ("/v1/embeddings", {"model": "mlm", "input": ["a"] * 5}, 413, "too_many_texts",
     "5 texts, more than the limit of 4 texts per request (--max-texts)"),
    ("/v1/embeddings", {"model": "mlm", "input": ["function " * 100] * 3}, 413, "too_many_tokens",
     "more than the limit of 200 tokens per request (--max-tokens)"),
    ("/v1/embeddings", {"model": "mlm", "input": ["x" * 5000]}, 413, "request_too_large",
     "more than the limit of 4000 bytes per request (--max-bytes)"),
    ("/v1/embeddings", {"model": "nope", "input": "x"}, 404, "model_not_found", "model 'nope' is not served here"),
    ("/v1/embeddings", {"model": "mlm", "input": "x", "plugin": "os"}, 400, "unknown_field",
     "unknown field 'plugin'"),
    ("/v1/embeddings", {"model": "mlm", "input": "x", "encoding_format": "int8"}, 400, "invalid_value",
     "use 'float' or 'base64'"),
    ("/v1/embeddings", {"model": "mlm", "input": "x", "dimensions": 0}, 400, "invalid_value", "dimensions=0"),
    ("/v1/embeddings", {"model": "clf", "input": "x"}, 400, "wrong_model_kind",
     "/v1/embeddings needs a model of kind encoder or masked_lm"),
    ("/v1/fill-mask", {"model": "mlm", "input": "no mask here"}, 400, "invalid_value", "needs exactly one"),
    ("/v1/fill-mask", {"model": "mlm", "input": "[MASK] " + "function " * 60}, 400, "context_length_exceeded",
     "window of 48"),
    ("/v1/fill-mask", {"model": "mlm", "input": "a [MASK]", "top_k": 0}, 400, "invalid_value", "top_k=0"),
    ("/v1/completions", {"model": "lm", "prompt": "the", "stop": ["\n"]}, 400, "unsupported_value", "stop"),
    ("/v1/completions", {"model": "lm", "prompt": "the", "n": 2}, 400, "unsupported_value", "n=2"),
    ("/v1/completions", {"model": "lm", "prompt": "the", "max_tokens": 21}, 400, "invalid_value",
     "(the server's limit, --max-new-tokens)"),
    ("/v1/completions", {"model": "lm", "prompt": "function " * 40, "max_tokens": 20}, 400,
     "context_length_exceeded", "window of 48"),
    ("/v1/completions", {"model": "lm", "prompt": "the", "temperature": "hot"}, 400, "invalid_type",
     "temperature must be a number"),
    ("/v1/completions", {"model": "lm", "prompt": "the", "temperature": 3}, 400, "invalid_value", "[0, 2]"),
    ("/v1/translations", {"model": "lm", "input": "x"}, 404, "not_available", "translation is not available"),
    ("/v1/search", {"query": "x"}, 404, "no_index", "--index DIR"),
    ("/v1/nothing", {}, 404, "not_found", "no route POST /v1/nothing"),
]


@pytest.mark.parametrize("path, body, status, code, words", CASES, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in
                                                                        enumerate(CASES)])
def test_bad_requests_get_a_json_error_naming_the_problem(server, path, body, status, code, words):
    got, _, payload = call(server.url, "POST", path, body, AUTH)
    assert got == status, payload
    error = payload["error"]
    assert error["code"] == code and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_model_path_or_wrong_method_is_refused_and_the_server_keeps_serving(server, tiny_folders):
    got, _, payload = call(server.url, "POST", "/v1/embeddings", {"model": str(tiny_folders["mlm"]), "input": "x"},
                           AUTH)
    assert got == 404 and payload["error"]["code"] == "model_not_found"  # a request never names a folder
    got, _, payload = call(server.url, "DELETE", "/v1/models", None, AUTH)
    assert got == 405 and "GET" in payload["error"]["message"].partition("; use ")[2]
    got, _, payload = call(server.url, "GET", "/explorer/..%2Fqkv.json", None, AUTH)
    assert got == 404
    got, _, payload = call(server.url, "POST", "/v1/embeddings", {"model": "mlm", "input": ["still", "serving"]}, AUTH)
    assert got == 200 and len(payload["data"]) == 2


def test_the_api_key_is_needed_everywhere_but_health(server):
    assert call(server.url, "GET", "/health")[0] == 200
    for path in ("/v1/models", "/metrics", "/", "/explorer/explorer.js"):
        got, headers, payload = call(server.url, "GET", path)
        assert got == 401 and payload["error"]["code"] == "invalid_api_key", path
        assert "missing API key" in payload["error"]["message"]
        scheme = "Basic" if path in ("/", "/explorer/explorer.js") else "Bearer"  # browsers ask for Basic
        assert headers["www-authenticate"].startswith(scheme), path
    got, _, payload = call(server.url, "POST", "/v1/embeddings", {"model": "mlm", "input": "x"},
                           {"Authorization": "Bearer wrong-key-xx"})
    assert got == 401 and "wrong API key" in payload["error"]["message"]
    basic = base64.b64encode(f"anyone:{KEY}".encode()).decode()
    got, headers, page = call(server.url, "GET", "/", None, {"Authorization": f"Basic {basic}"})
    assert got == 200 and "qkv attention explorer" in page
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.AuthenticationError, match="wrong API key"):
        openai_client(server.url, "nope-nope-nope").embeddings.create(model="mlm", input="x")
    assert len(openai_client(server.url, KEY).embeddings.create(model="mlm", input="x").data) == 1


def test_cors_is_off_unless_asked_for(server, tiny_folders):
    origin = {"Origin": "http://elsewhere.test", **AUTH}
    _, headers, _ = call(server.url, "GET", "/v1/models", None, origin)
    assert "access-control-allow-origin" not in headers
    srv = running(ServeConfig(models=(parse_model_spec(f"mlm={tiny_folders['mlm']}"),), port=0,
                              cors_origins=("http://elsewhere.test",)))
    try:
        preflight = {"Origin": "http://elsewhere.test", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization,content-type"}
        got, headers, _ = call(srv.url, "OPTIONS", "/v1/embeddings", None, preflight)
        assert got == 200 and headers["access-control-allow-origin"] == "http://elsewhere.test"
        _, headers, _ = call(srv.url, "GET", "/v1/models", None, {"Origin": "http://other.test"})
        assert "access-control-allow-origin" not in headers
    finally:
        srv.stop()


def test_a_full_queue_answers_503_with_retry_after(tiny_folders):
    srv = running(ServeConfig(models=(parse_model_spec(f"lm={tiny_folders['lm']}"),), port=0, queue_size=1))
    try:
        results, start = [], threading.Barrier(8)

        def one():
            start.wait()
            results.append(call(srv.url, "POST", "/v1/completions",
                                {"model": "lm", "prompt": "the", "max_tokens": 40, "temperature": 0}))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        statuses = sorted(r[0] for r in results)
        assert 200 in statuses and 503 in statuses and set(statuses) <= {200, 503}, statuses
        full = next(r for r in results if r[0] == 503)
        assert full[1]["retry-after"] == "1" and full[2]["error"]["code"] == "queue_full"
        assert "(--queue-size)" in full[2]["error"]["message"] and full[2]["error"]["type"] == "server_error"
        assert call(srv.url, "POST", "/v1/completions", {"model": "lm", "prompt": "the", "max_tokens": 2})[0] == 200
    finally:
        srv.stop()


def test_answers_are_not_held_back_by_delayed_acks(server):
    """An answer written in two parts (head, body) must not wait for the client's delayed ACK (~40 ms):
    the server's sockets have Nagle's algorithm off."""
    import socket
    import time

    from qkv.serve.runner import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP  # what asyncio needs to set TCP_NODELAY on accepted connections
    sock.close()
    parts = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    times = []
    for _ in range(11):
        t0 = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    assert sorted(times)[5] < 0.03, times


def test_a_failure_of_the_server_is_a_500_naming_it_and_the_next_request_is_served(server):
    queue = server.state.registry.models["mlm"].queues["embeddings"]
    run = queue.run

    def broken(payloads):
        raise RuntimeError("the disk caught fire")

    queue.run = broken
    try:
        got, _, payload = call(server.url, "POST", "/v1/embeddings", {"model": "mlm", "input": "x"}, AUTH)
    finally:
        queue.run = run
    assert got == 500 and payload["error"]["code"] == "internal_error" and payload["error"]["type"] == "server_error"
    assert "RuntimeError: the disk caught fire" in payload["error"]["message"]
    assert call(server.url, "POST", "/v1/embeddings", {"model": "mlm", "input": "x"}, AUTH)[0] == 200
