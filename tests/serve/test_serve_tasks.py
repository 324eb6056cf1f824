"""classify, fill-mask, completions (whole and streamed), attention and search answer what the Python
API returns for the same inputs; ``/v1/models`` lists every model with its kind and endpoints."""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import pytest
from serve_support import openai_client, running

import qkv
from qkv.serve.config import ServeConfig, parse_model_spec

PROMPTS = ["the class", "a function is"]


@pytest.fixture(scope="module")
def server(tiny_folders):
    specs = tuple(parse_model_spec(f"{n}={tiny_folders[n]}") for n in ("mlm", "lm", "clf", "tagger"))
    srv = running(ServeConfig(models=specs, port=0, index=str(tiny_folders["index"])))
    yield srv
    srv.stop()


def post(server, path: str, body: dict) -> dict:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_models_lists_every_model_with_its_kind(server, tiny_folders):
    client = openai_client(server.url)
    listed = {m.id: m for m in client.models.list().data}
    assert set(listed) == {"mlm", "lm", "clf", "tagger"}
    assert listed["mlm"].kind == "masked_lm"
    assert listed["mlm"].endpoints == ["/v1/embeddings", "/v1/fill-mask", "/v1/attention"]
    assert listed["lm"].endpoints == ["/v1/completions", "/v1/attention"]
    assert listed["clf"].labels == ["neg", "pos"] and listed["clf"].task == "sequence-classification"
    assert client.models.retrieve("lm").kind == "causal_lm"
    assert str(tiny_folders["mlm"]) not in json.dumps([m.model_dump() for m in listed.values()])  # no paths


def test_classify_answers_what_the_predictor_gives(server, tiny_folders, pydoc_texts):
    from qkv.finetune.predict import Predictor

    texts = [p[:300] for p in pydoc_texts[:5]]
    got = post(server, "/v1/classify", {"model": "clf", "input": texts})
    want = Predictor(tiny_folders["clf"], device="cpu").predict(texts).records
    assert [d["index"] for d in got["data"]] == list(range(5)) and got["task"] == "sequence-classification"
    for d, w in zip(got["data"], want):
        assert d["label"] == w["label"]
        for label in ("neg", "pos"):
            assert abs(d["probabilities"][label] - w["probabilities"][label]) <= 1e-5
    assert got["usage"]["prompt_tokens"] > 5


def test_a_token_classifier_tags_each_word(server, tiny_folders):
    from qkv.finetune.predict import Predictor

    texts = ["the class  is a function", "a value"]
    got = post(server, "/v1/classify", {"model": "tagger", "input": texts})
    want = Predictor(tiny_folders["tagger"], device="cpu").predict([t.split() for t in texts]).records
    assert got["task"] == "token-classification"
    assert [{k: d[k] for k in ("tokens", "tags")} for d in got["data"]] == want
    assert got["data"][0]["tokens"] == ["the", "class", "is", "a", "function"]


def test_fill_mask_answers_what_fill_mask_gives(server, tiny_folders):
    from qkv.analysis.fill_mask import fill_mask
    from qkv.data.tokenizer import WordPieceTokenizer

    texts = ["the class [MASK] a function", "[MASK] is the value"]
    got = post(server, "/v1/fill-mask", {"model": "mlm", "input": texts, "top_k": 3})
    model, tok = qkv.load(tiny_folders["mlm"])
    want = fill_mask(model, WordPieceTokenizer(tok), texts, k=3)
    for d, w in zip(got["data"], want):
        assert [p["token"] for p in d["predictions"]] == [t for t, _ in w.top]
        np.testing.assert_allclose([p["probability"] for p in d["predictions"]], [p for _, p in w.top], rtol=1e-6)


def test_completions_answer_what_generate_texts_gives(server, tiny_folders):
    from qkv.generation.prompts import generate_texts

    model, tok = qkv.load(tiny_folders["lm"])
    client = openai_client(server.url)
    greedy = client.completions.create(model="lm", prompt=PROMPTS, max_tokens=6, temperature=0)
    assert [c.text for c in greedy.choices] == generate_texts(model, tok, PROMPTS, max_new_tokens=6)
    assert all(c.finish_reason in ("stop", "length") for c in greedy.choices)
    assert greedy.usage.prompt_tokens == sum(len(tok.encode(p, add_special_tokens=False).ids) + 1 for p in PROMPTS)
    sampled = client.completions.create(model="lm", prompt=PROMPTS[0], max_tokens=6, temperature=0.8, top_p=0.9,
                                        seed=7)
    want = generate_texts(model, tok, PROMPTS[:1], max_new_tokens=6, do_sample=True, temperature=0.8, top_p=0.9,
                          seed=7)
    assert sampled.choices[0].text == want[0]


def test_a_streamed_completion_adds_up_to_the_whole_one(server):
    client = openai_client(server.url)
    whole = client.completions.create(model="lm", prompt=PROMPTS, max_tokens=8, temperature=0)
    pieces, reasons, usage = {0: "", 1: ""}, {}, None
    for chunk in client.completions.create(model="lm", prompt=PROMPTS, max_tokens=8, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        for c in chunk.choices:
            pieces[c.index] += c.text
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert [pieces[0], pieces[1]] == [c.text for c in whole.choices]
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_attention_is_inspect_texts(server, tiny_folders):
    from qkv.analysis.viewer import inspect_text

    got = post(server, "/v1/attention", {"model": "mlm", "input": "the class is a function"})
    want = inspect_text(*qkv.load(tiny_folders["mlm"]), "the class is a function")
    assert got["tokens"] == want.tokens and got["methods"] == ["attention"]
    T = len(want.tokens)
    layers = [np.frombuffer(base64.b64decode(b), dtype="<u2").reshape(got["n_heads"], T, T) / 65535
              for b in got["attention"]]
    np.testing.assert_allclose(np.stack(layers), want.attentions, atol=1e-5)
    too_long = " ".join(["function"] * 80)
    with pytest.raises(urllib.error.HTTPError) as e:
        post(server, "/v1/attention", {"model": "mlm", "input": too_long})
    assert e.value.code == 400 and '"truncate": true' in json.loads(e.value.read())["error"]["message"]
    cut = post(server, "/v1/attention", {"model": "mlm", "input": too_long, "truncate": True})
    assert len(cut["tokens"]) == 48  # the model's window


def test_search_ranks_the_index_as_search_index_does(server, tiny_folders):
    from qkv.embeddings.search import SearchIndex

    got = post(server, "/v1/search", {"query": ["the value of a class", "a loop"], "k": 3})
    want = SearchIndex(tiny_folders["index"]).query(["the value of a class", "a loop"], k=3)
    for d, hits in zip(got["data"], want):
        assert [h["id"] for h in d["hits"]] == [h.id for h in hits]
        np.testing.assert_allclose([h["score"] for h in d["hits"]], [h.score for h in hits], atol=1e-5)
    with urllib.request.urlopen(server.url + "/v1/index", timeout=30) as r:
        assert json.loads(r.read()) == {"object": "index", "documents": 40, "dimensions": 24}
