"""``ServeConfig`` checks, model specs, the command line's errors and its warning for a public address,
and ``/metrics`` read back by Prometheus' own parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from qkv.cli import main
from qkv.serve.config import Limits, ModelSpec, ServeConfig, parse_model_spec
from qkv.serve.errors import ServeError
from qkv.serve.config import is_loopback
from qkv.serve.metrics import Metrics


def test_model_specs_name_folders(tmp_path):
    (tmp_path / "my-model").mkdir()
    assert parse_model_spec(str(tmp_path / "my-model")) == ModelSpec("my-model", str(tmp_path / "my-model"))
    assert parse_model_spec(f"mini={tmp_path / 'my-model'}").name == "mini"
    with pytest.raises(ServeError, match="model folder not found"):
        parse_model_spec(f"x={tmp_path / 'absent'}")
    with pytest.raises(ServeError, match="model name 'a b' is not allowed"):
        parse_model_spec(f"a b={tmp_path / 'my-model'}")


@pytest.mark.parametrize("changes, words", [
    ({"models": ()}, "no model to serve"),
    ({"port": 70000}, "port=70000"),
    ({"precision": "fp16"}, "precision='fp16' is not allowed"),
    ({"batch_tokens": 0}, "batch_tokens=0"),
    ({"max_wait_ms": -1}, "max_wait_ms=-1"),
    ({"queue_size": 0}, "queue_size=0"),
    ({"api_key": "short"}, "at least 8 characters"),
    ({"cors_origins": ("example.com/x",)}, "https://host[:port]"),
    ({"index": "/nonexistent-index"}, "index folder not found"),
])
def test_bad_settings_are_refused_by_name(tmp_path, changes, words):
    spec = ModelSpec("m", str(tmp_path))
    with pytest.raises(ServeError, match=words.replace("[", r"\[").replace("(", r"\(")):
        ServeConfig(**{"models": (spec,), **changes})
    with pytest.raises(ServeError, match="given twice"):
        ServeConfig(models=(spec, spec))
    with pytest.raises(ServeError, match="max_texts=0"):
        Limits(max_texts=0)


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.4", "example.com"))


def test_command_line_errors_name_the_problem(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "absent")]) == 2
    assert "qkv serve: error: model folder not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["serve", str(tmp_path / "empty"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv serve: error: model 'empty':") and "not a qkv or BERT checkpoint folder" in err


def test_a_public_address_is_warned_about(tiny_folders, monkeypatch, capsys):
    import qkv.serve.runner

    seen = []
    monkeypatch.setattr(qkv.serve.runner, "serve", lambda config: seen.append(config) or 0)  # never binds
    monkeypatch.setenv("QKV_API_KEY", "from-the-environment")
    assert main(["serve", f"m={tiny_folders['mlm']}", "--host", "0.0.0.0"]) == 0
    err = capsys.readouterr().err
    assert "warning: --host 0.0.0.0 makes the server reachable from other machines" in err
    assert seen[0].api_key == "from-the-environment" and seen[0].host == "0.0.0.0"
    assert main(["serve", f"m={tiny_folders['mlm']}"]) == 0
    assert "warning" not in capsys.readouterr().err and seen[1].host == "127.0.0.1"


def test_metrics_parse_as_prometheus_text():
    m = Metrics()
    for seconds in (0.003, 0.02, 0.02, 4.0):
        m.request_started()
        m.request_finished("/v1/embeddings", 200, seconds)
    m.request_started()
    m.request_finished("/v1/embeddings", 413, 0.001)
    m.request_started()  # one still in flight
    m.observe_batch("mini", "embeddings", 3, 120)
    m.observe_batch("mini", "embeddings", 17, 900)
    m.watch_queue("mini", "embeddings", lambda: 5)
    families = {f.name: f for f in text_string_to_metric_families(m.render())}
    requests = {(s.labels["route"], s.labels["status"]): s.value for s in families["qkv_requests"].samples
                if s.name == "qkv_requests_total"}
    assert requests == {("/v1/embeddings", "200"): 4, ("/v1/embeddings", "413"): 1}
    latency = {(s.name, s.labels.get("le")): s.value for s in families["qkv_request_duration_seconds"].samples}
    assert latency[("qkv_request_duration_seconds_bucket", "0.005")] == 2  # 0.001 and 0.003
    assert latency[("qkv_request_duration_seconds_bucket", "0.025")] == 4
    assert latency[("qkv_request_duration_seconds_bucket", "+Inf")] == 5
    assert latency[("qkv_request_duration_seconds_count", None)] == 5
    assert abs(latency[("qkv_request_duration_seconds_sum", None)] - 4.044) < 1e-9
    texts = {(s.name, s.labels.get("le")): s.value for s in families["qkv_batch_texts"].samples}
    assert texts[("qkv_batch_texts_bucket", "4")] == 1 and texts[("qkv_batch_texts_bucket", "32")] == 2
    assert texts[("qkv_batch_texts_sum", None)] == 20
    assert families["qkv_queue_depth"].samples[0].value == 5
    assert families["qkv_requests_in_flight"].samples[0].value == 1


def test_kernel_caches_are_bounded_unless_the_environment_says_otherwise(monkeypatch):
    from qkv.serve.runner import KERNEL_CACHE_ENTRIES, bound_kernel_caches

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "500")
    bound_kernel_caches()
    import os

    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(KERNEL_CACHE_ENTRIES)
    assert os.environ["LRU_CACHE_CAPACITY"] == "500"
