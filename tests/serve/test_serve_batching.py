"""The batching queue on its own: requests waiting together run as one batch up to the token budget,
a full queue refuses at once, a failing batch fails only its bad request, close() finishes what
was accepted."""

from __future__ import annotations

import asyncio
import threading

import pytest

from qkv.serve.batching import BatchQueue
from qkv.serve.errors import ApiError
from qkv.serve.metrics import Metrics


class Recorder:
    """A batch function that records its batches; ``gate`` holds it until set."""

    def __init__(self, fail_on=None):
        self.batches: list[list] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_on = fail_on

    def __call__(self, payloads):
        self.gate.wait(10)
        self.batches.append(list(payloads))
        if self.fail_on in payloads:
            raise RuntimeError(f"bad payload {self.fail_on}")
        return [p * 10 for p in payloads]


def run(coro):
    return asyncio.run(coro)


def test_requests_waiting_together_share_batches_up_to_the_budget():
    rec = Recorder()
    rec.gate.clear()  # the first request runs alone and holds the worker; the rest queue up behind it
    q = BatchQueue("m", "op", rec, budget=10, max_wait=0.0, maxsize=100, metrics=Metrics())
    q.start()

    async def main():
        first = q.submit(0, tokens=1)
        await asyncio.sleep(0.05)
        rest = [q.submit(i, tokens=4) for i in range(1, 7)]  # 6 × 4 tokens: budget 10 → 3 + 3
        assert q.depth == 6
        rec.gate.set()
        return await asyncio.gather(first, *rest)

    assert run(main()) == [0, 10, 20, 30, 40, 50, 60]
    q.close()
    assert rec.batches == [[0], [1, 2, 3], [4, 5, 6]]  # gathered until the tokens reach the budget


def test_the_first_request_waits_for_others_up_to_max_wait():
    rec = Recorder()
    q = BatchQueue("m", "op", rec, budget=100, max_wait=0.3, maxsize=100)
    q.start()

    async def main():
        a = q.submit(1)
        await asyncio.sleep(0.05)
        b = q.submit(2)
        return await asyncio.gather(a, b)

    assert run(main()) == [10, 20]
    q.close()
    assert rec.batches == [[1, 2]]


def test_a_burst_joins_as_a_whole_but_the_wait_is_capped():
    rec = Recorder()
    q = BatchQueue("m", "op", rec, budget=100, max_wait=0.2, maxsize=100)  # waits ≤ 0.2 s after the latest
    q.start()

    async def main():
        futures = [q.submit(0)]
        for i in range(1, 4):  # one every 0.1 s: each within the wait after the one before
            await asyncio.sleep(0.1)
            futures.append(q.submit(i))
        await asyncio.sleep(1.2)  # beyond the cap (5 × 0.2 s after the first)
        futures.append(q.submit(4))
        return await asyncio.gather(*futures)

    assert run(main()) == [0, 10, 20, 30, 40]
    q.close()
    assert rec.batches == [[0, 1, 2, 3], [4]]


def test_max_items_runs_requests_one_at_a_time():
    rec = Recorder()
    rec.gate.clear()
    q = BatchQueue("m", "op", rec, budget=100, max_wait=0.5, maxsize=100, max_items=1)
    q.start()

    async def main():
        futures = [q.submit(i) for i in range(3)]
        rec.gate.set()
        return await asyncio.gather(*futures)

    assert run(main()) == [0, 10, 20]
    q.close()
    assert rec.batches == [[0], [1], [2]]


def test_a_full_queue_refuses_at_once_with_retry_after():
    rec = Recorder()
    rec.gate.clear()
    metrics = Metrics()
    q = BatchQueue("m", "op", rec, budget=1, max_wait=0.0, maxsize=2, metrics=metrics)
    q.start()

    async def main():
        running = q.submit(0)
        await asyncio.sleep(0.05)  # taken by the worker, which waits at the gate
        waiting = [q.submit(1), q.submit(2)]
        with pytest.raises(ApiError) as e:
            q.submit(3)
        rec.gate.set()
        return e.value, await asyncio.gather(running, *waiting)

    error, results = run(main())
    q.close()
    assert error.status == 503 and error.headers == {"Retry-After": "1"} and error.code == "queue_full"
    assert "(--queue-size)" in error.message and results == [0, 10, 20]
    assert 'qkv_rejected_total{model="m",op="op",reason="queue_full"} 1' in metrics.render()


def test_a_failing_batch_fails_only_its_bad_request():
    rec = Recorder(fail_on=2)
    rec.gate.clear()
    q = BatchQueue("m", "op", rec, budget=100, max_wait=0.0, maxsize=100)
    q.start()

    async def main():
        futures = [q.submit(i) for i in range(4)]
        rec.gate.set()
        return await asyncio.gather(*futures, return_exceptions=True)

    results = run(main())
    q.close()
    assert results[:2] == [0, 10] and results[3] == 30
    assert isinstance(results[2], RuntimeError) and "bad payload 2" in str(results[2])


def test_close_finishes_what_was_accepted_then_refuses():
    rec = Recorder()
    rec.gate.clear()
    q = BatchQueue("m", "op", rec, budget=1, max_wait=0.0, maxsize=100)
    q.start()

    async def main():
        futures = [q.submit(i) for i in range(5)]
        closing = asyncio.get_running_loop().run_in_executor(None, q.close)
        await asyncio.sleep(0.05)
        with pytest.raises(ApiError) as e:
            q.submit(9)
        rec.gate.set()
        await closing
        return e.value, await asyncio.gather(*futures)

    error, results = run(main())
    assert results == [0, 10, 20, 30, 40] and error.status == 503 and error.code == "shutting_down"


def test_a_cancelled_request_is_skipped():
    rec = Recorder()
    rec.gate.clear()
    q = BatchQueue("m", "op", rec, budget=1, max_wait=0.0, maxsize=100)
    q.start()

    async def main():
        first = q.submit(0)
        await asyncio.sleep(0.05)
        gone = q.submit(1)
        kept = q.submit(2)
        gone.cancel()
        rec.gate.set()
        return await asyncio.gather(first, kept)

    assert run(main()) == [0, 20]
    q.close()
    assert [1] not in rec.batches
