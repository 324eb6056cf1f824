"""Dynamic batching: requests that arrive together run as one batch, on one thread per model and
operation.

A request handler (on the event loop) calls :meth:`BatchQueue.submit` and awaits the future it
gets. The queue's worker thread takes the oldest waiting request, then keeps taking more until
their tokens reach the budget or no request has arrived for the short wait (``max_wait`` after the
latest one, at most five times ``max_wait`` after the first), whichever comes first (requests
already waiting are taken without waiting); it runs the batch with the operation's function and
settles each request's future on the event loop. With one client a request waits ``max_wait`` at
most; with many, the requests their clients send while the previous batch is answered join as a
whole.

* The queue is bounded: a request finding ``maxsize`` others waiting is refused at once with
  503 and ``Retry-After`` (it never waits unboundedly).
* A batch that fails is run again one request at a time, so one bad request fails alone.
* A request whose future was cancelled (its client left) before its batch starts is skipped.
* :meth:`BatchQueue.close` refuses new requests (503), lets the worker finish every request
  already accepted, then stops it: what SIGTERM does, after the requests in flight.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qkv.serve.errors import ApiError
from qkv.serve.metrics import Metrics

__all__ = ["BatchQueue", "Job"]

_STOP = object()
#: The longest a batch waits for more requests, in units of ``max_wait`` after its first one.
_WAIT_CAP = 5


@dataclass
class Job:
    """One request waiting in a :class:`BatchQueue`.

    Attributes:
        payload: what the operation's function receives for it.
        texts, tokens: its size (for the budget and the metrics).
        future: settled on ``loop`` with the function's result for it, or its exception.
    """

    payload: Any
    texts: int
    tokens: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued: float = field(default_factory=time.monotonic)


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():  # cancelled: its client left
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class BatchQueue:
    """A bounded queue of requests and the thread that runs them in batches.

    Args:
        model, op: the model's name and the operation (for the thread's name, messages, metrics).
        run: ``run(payloads) -> results``, one result per payload in order; called on the worker
            thread only, so it may keep state.
        budget: gather requests until their tokens reach this many.
        max_wait: seconds a batch waits after its latest request for another (at most five times that
            after its first; 0: take only those waiting).
        maxsize: requests that may wait; one more is refused (503).
        max_items: at most this many requests per batch (``None``: the budget alone decides).
        metrics: where batch sizes, queue depth and refusals are counted.
    """

    def __init__(self, model: str, op: str, run: Callable[[list], list], *, budget: int, max_wait: float,
                 maxsize: int, max_items: int | None = None, metrics: Metrics | None = None):
        self.model, self.op, self.run = model, op, run
        self.budget, self.max_wait, self.maxsize, self.max_items = budget, max_wait, maxsize, max_items
        self.metrics = metrics
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting = 0  # requests accepted and not yet taken by the worker (bounded by maxsize)
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=f"qkv-serve-{model}-{op}", daemon=True)
        if metrics is not None:
            metrics.watch_queue(model, op, lambda: self.depth)

    @property
    def depth(self) -> int:
        """Requests waiting for a batch now."""
        with self._lock:
            return self._waiting

    def start(self) -> None:
        self._thread.start()

    def submit(self, payload: Any, *, texts: int = 1, tokens: int = 1) -> asyncio.Future:
        """Queue one request (call on the event loop); await the returned future for its result.

        Raises:
            ApiError: 503 when the queue is full or the server is shutting down.
        """
        if self._closed:
            raise ApiError(503, "the server is shutting down and takes no new requests; send it to another "
                           "instance", code="shutting_down", headers={"Retry-After": "5"})
        with self._lock:
            if self._waiting >= self.maxsize:
                full = True
            else:
                full = False
                self._waiting += 1
        if full:
            if self.metrics is not None:
                self.metrics.rejected(self.model, self.op, "queue_full")
            raise ApiError(503, f"model {self.model!r} has {self.maxsize} {self.op} requests waiting, its queue's "
                           "limit (--queue-size); retry in a moment", code="queue_full",
                           headers={"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        job = Job(payload, texts, tokens, loop.create_future(), loop)
        self._q.put(job)
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the accepted ones, stop the worker (blocks until it stopped)."""
        self._closed = True
        self._q.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the worker thread ----------------------------------------------------------------------------
    def _take(self, block: bool, timeout: float | None = None):
        item = self._q.get(block, timeout)
        if item is not _STOP:
            with self._lock:
                self._waiting -= 1
        return item

    def _gather(self, first: Job) -> tuple[list[Job], bool]:
        """``first`` and the requests that join it; whether the stop mark was reached.

        The wait is ``max_wait`` after the latest request that joined (so a burst of concurrent
        clients, whose requests arrive spread over a few milliseconds, joins as a whole), and at most
        ``_WAIT_CAP × max_wait`` after the first."""
        batch, tokens = [first], first.tokens
        start = time.monotonic()
        cap = start + _WAIT_CAP * self.max_wait
        deadline = start + self.max_wait
        while tokens < self.budget and (self.max_items is None or len(batch) < self.max_items):
            try:
                item = self._take(False)
            except queue.Empty:
                remaining = min(deadline, cap) - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._take(True, remaining)
                except queue.Empty:
                    break
            if item is _STOP:
                return batch, True
            batch.append(item)
            tokens += item.tokens
            deadline = time.monotonic() + self.max_wait
        return batch, False

    def _work(self) -> None:
        while True:
            first = self._take(True)
            if first is _STOP:
                return
            batch, stop = self._gather(first)
            self._run([job for job in batch if not job.future.cancelled()])
            if stop:
                return

    def _run(self, batch: list[Job]) -> None:
        if not batch:
            return
        try:
            results = self.run([job.payload for job in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self.op} gave {len(results)} results for {len(batch)} requests")
            outcomes = [(True, r) for r in results]
        except Exception as e:  # noqa: BLE001 - every failure goes back to its request
            if len(batch) > 1:
                for job in batch:  # one at a time: a bad request fails alone
                    self._run([job])
                return
            outcomes = [(False, e)]
        if self.metrics is not None:
            self.metrics.observe_batch(self.model, self.op, sum(j.texts for j in batch), sum(j.tokens for j in batch))
        for job, (ok, value) in zip(batch, outcomes):
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, ok, value)
            except RuntimeError:  # the event loop is closed: nobody waits for the answer any more
                pass
