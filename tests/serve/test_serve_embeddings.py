"""``/v1/embeddings`` on the real MiniLM, through OpenAI's own client: the vectors ``qkv.embed`` gives
(float and base64), long texts in windows, ``dimensions``, usage, and 32 concurrent clients each
getting its own vectors from shared batches."""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_support import openai_client, running

import qkv
from qkv.serve.config import ServeConfig, parse_model_spec

TEXTS = ["the cat sat on the mat", "Attention is all you need.",
         "Transformers read whole sentences at once; every token attends to every other token in the layer before.",
         "ünïcödé and émojis 🙂 too"]


@pytest.fixture(scope="module")
def server(minilm):
    # a long wait gathers the concurrent clients' requests into shared batches
    srv = running(ServeConfig(models=(parse_model_spec(f"minilm={minilm}"),), port=0, max_wait_ms=25))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.url)


def test_openai_client_gets_the_vectors_of_qkv_embed(client, minilm):
    expected = qkv.embed(minilm, TEXTS)
    for fmt in ("float", "base64", None):  # None: the client's default, base64 decoded by the client itself
        kwargs = {} if fmt is None else {"encoding_format": fmt}
        res = client.embeddings.create(model="minilm", input=TEXTS, **kwargs)
        rows = [d.embedding for d in sorted(res.data, key=lambda d: d.index)]
        if fmt == "base64":  # asked for explicitly, the client hands over the strings: little-endian float32
            rows = [np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows]
        got = np.array(rows, dtype=np.float32)
        assert got.shape == expected.shape == (4, 384)
        assert np.abs(got - expected).max() <= 1e-5, fmt
        assert res.model == "minilm" and res.object == "list"
    one = client.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1 and np.abs(np.array(one.data[0].embedding) - expected[0]).max() <= 1e-5


def test_usage_counts_the_tokens_read(client, minilm):
    tok = qkv.load(minilm).tokenizer
    tok.no_padding()  # the folder's tokenizer.json pads to 128
    tok.no_truncation()
    res = client.embeddings.create(model="minilm", input=TEXTS)
    n = sum(len(tok.encode(t).ids) for t in TEXTS)  # [CLS] … [SEP] each
    assert res.usage.prompt_tokens == res.usage.total_tokens == n


def test_a_long_text_is_embedded_in_windows_as_qkv_embed_does(client, minilm, pydoc_texts):
    long = max(pydoc_texts, key=len)[:6000]  # well over the 256-token window
    got = client.embeddings.create(model="minilm", input=[long, "short"], encoding_format="float")
    expected = qkv.embed(minilm, [long, "short"])
    vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
    assert got.usage.prompt_tokens > 600
    assert np.abs(vectors - expected).max() <= 1e-5


def test_dimensions_cut_the_vector_and_keep_it_unit_length(client, minilm):
    res = client.embeddings.create(model="minilm", input=TEXTS[:2], dimensions=64, encoding_format="float")
    full = qkv.embed(minilm, TEXTS[:2])[:, :64]
    want = full / np.linalg.norm(full, axis=1, keepdims=True)
    got = np.array([d.embedding for d in res.data], dtype=np.float32)
    assert got.shape == (2, 64) and np.abs(got - want).max() <= 1e-5
    same = client.embeddings.create(model="minilm", input=TEXTS[:1], dimensions=384)
    assert len(same.data[0].embedding) == 384
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError, match="384-dimensional vectors; ask for 384 or fewer"):
        client.embeddings.create(model="minilm", input="x", dimensions=385)


def test_32_concurrent_clients_each_get_their_own_vectors(server, minilm, pydoc_texts):
    words = " ".join(pydoc_texts[10:14]).split()
    texts = [" ".join(words[i * 7:i * 7 + 3 + (i * 5) % 40]) for i in range(32)]  # 32 texts of varied length
    expected = qkv.embed(minilm, texts)
    before = _batches(server)
    start, results, errors = threading.Barrier(32), [None] * 32, []

    def one(i):
        try:
            client = openai_client(server.url)
            start.wait()
            res = client.embeddings.create(model="minilm", input=texts[i])
            results[i] = np.array(res.data[0].embedding, dtype=np.float32)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    for i in range(32):
        assert np.abs(results[i] - expected[i]).max() <= 1e-5, i
    count, texts_run = (a - b for a, b in zip(_batches(server), before))
    assert texts_run == 32 and count < 32  # dynamic batching: fewer batches than requests


def _batches(server) -> tuple[float, float]:
    """(batches run, texts in them) of the embeddings queue, from /metrics."""
    import urllib.request

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "qkv_batch_texts":
            got = {s.name: s.value for s in family.samples if s.labels.get("op") == "embeddings"}
            return got.get("qkv_batch_texts_count", 0), got.get("qkv_batch_texts_sum", 0)
    return 0, 0
