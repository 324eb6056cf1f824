"""The server's counters for ``GET /metrics``, in Prometheus' text format (version 0.0.4).

* ``qkv_requests_total{route, status}``: answered requests (counter);
* ``qkv_request_duration_seconds{route}``: time from request to the end of the answer (histogram);
* ``qkv_requests_in_flight``: requests being answered now (gauge);
* ``qkv_batch_texts{model, op}`` and ``qkv_batch_tokens{model, op}``: texts and tokens of each
  batch the model ran (histograms);
* ``qkv_queue_depth{model, op}``: requests waiting for a batch now (gauge);
* ``qkv_rejected_total{model, op, reason}``: requests turned away by a full queue (counter).

Updated from the event loop and the batching threads, so every change holds a lock. Routes are
labelled by their template (``/v1/models/{id}``), never by a raw path, so the series stay few.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence

__all__ = ["Metrics", "Histogram", "LATENCY_BUCKETS", "SIZE_BUCKETS", "TOKEN_BUCKETS"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)

Labels = tuple[tuple[str, str], ...]


def _labels(pairs: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in pairs] + ([extra] if extra else [])
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(x: float) -> str:
    return repr(float(x)) if x != int(x) or abs(x) >= 1e15 else str(int(x))


class Histogram:
    """Cumulative-bucket histogram per label set (``le`` upper bounds, ``+Inf`` implied)."""

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]):
        self.name, self.help, self.buckets = name, help_text, tuple(sorted(buckets))
        self._series: dict[Labels, list] = {}  # labels -> [counts per bucket + inf, sum, count]

    def observe(self, labels: Labels, value: float) -> None:
        series = self._series.setdefault(labels, [[0] * (len(self.buckets) + 1), 0.0, 0])
        series[0][bisect_left(self.buckets, value)] += 1  # the first bucket whose bound ≥ value
        series[1] += value
        series[2] += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, (counts, total, n) in sorted(self._series.items()):
            running = 0
            for bound, c in zip((*self.buckets, float("inf")), counts):
                running += c
                le = 'le="' + ("+Inf" if bound == float("inf") else _number(bound)) + '"'
                lines.append(f"{self.name}_bucket{_labels(labels, le)} {running}")
            lines.append(f"{self.name}_sum{_labels(labels)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(labels)} {n}")
        return lines


class Metrics:
    """Everything ``/metrics`` shows (see the module docstring); safe to update from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._requests: dict[Labels, int] = {}
        self._rejected: dict[Labels, int] = {}
        self._in_flight = 0
        self._latency = Histogram("qkv_request_duration_seconds", "Time from request to the end of its answer.",
                                  LATENCY_BUCKETS)
        self._texts = Histogram("qkv_batch_texts", "Texts in each batch a model ran.", SIZE_BUCKETS)
        self._tokens = Histogram("qkv_batch_tokens", "Tokens in each batch a model ran.", TOKEN_BUCKETS)
        self._depths: dict[Labels, Callable[[], int]] = {}

    # -- updates ------------------------------------------------------------------------------------
    def request_started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def request_finished(self, route: str, status: int, seconds: float) -> None:
        key = (("route", route), ("status", str(status)))
        with self._lock:
            self._in_flight -= 1
            self._requests[key] = self._requests.get(key, 0) + 1
            self._latency.observe((("route", route),), seconds)

    def observe_batch(self, model: str, op: str, texts: int, tokens: int) -> None:
        key = (("model", model), ("op", op))
        with self._lock:
            self._texts.observe(key, texts)
            self._tokens.observe(key, tokens)

    def rejected(self, model: str, op: str, reason: str) -> None:
        key = (("model", model), ("op", op), ("reason", reason))
        with self._lock:
            self._rejected[key] = self._rejected.get(key, 0) + 1

    def watch_queue(self, model: str, op: str, depth: Callable[[], int]) -> None:
        """Report ``depth()`` as ``qkv_queue_depth{model, op}`` at each scrape."""
        with self._lock:
            self._depths[(("model", model), ("op", op))] = depth

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    # -- exposition ---------------------------------------------------------------------------------
    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        with self._lock:
            lines = ["# HELP qkv_requests_total Requests answered, by route and HTTP status.",
                     "# TYPE qkv_requests_total counter"]
            lines += [f"qkv_requests_total{_labels(k)} {v}" for k, v in sorted(self._requests.items())]
            lines += self._latency.render()
            lines += ["# HELP qkv_requests_in_flight Requests being answered now.",
                      "# TYPE qkv_requests_in_flight gauge", f"qkv_requests_in_flight {self._in_flight}"]
            lines += self._texts.render() + self._tokens.render()
            lines += ["# HELP qkv_queue_depth Requests waiting for a batch, by model and operation.",
                      "# TYPE qkv_queue_depth gauge"]
            lines += [f"qkv_queue_depth{_labels(k)} {int(f())}" for k, f in sorted(self._depths.items())]
            lines += ["# HELP qkv_rejected_total Requests turned away (a full queue), by model and operation.",
                      "# TYPE qkv_rejected_total counter"]
            lines += [f"qkv_rejected_total{_labels(k)} {v}" for k, v in sorted(self._rejected.items())]
        return "\n".join(lines) + "\n"
