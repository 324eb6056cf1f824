"""``qkv serve`` as its own process: SIGTERM during a burst answers every request it had accepted
(correctly), refuses new connections, and exits 0."""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np

import qkv


def _start(folder: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(Path(qkv.__file__).resolve().parents[1])}
    # a long wait holds the burst's requests in the queue while the signal arrives
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "serve", f"mlm={folder}", "--port", "0", "--max-wait-ms",
                             "1500", "--batch-tokens", "1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, proc.stderr.read()
            continue
        if "serving on " in line:
            return proc, line.split("serving on ")[1].split()[0]
    proc.kill()
    raise AssertionError("the server did not start")


def _post(url: str, text: str):
    """``(status, vector)``, or ``(None, exception name)`` when no answer came (refused, reset)."""
    parts = urllib.parse.urlsplit(url)
    try:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        conn.request("POST", "/v1/embeddings", body=json.dumps({"model": "mlm", "input": text, "encoding_format":
                                                                "float"}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        body = json.loads(r.read())
        conn.close()
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        return None, type(e).__name__
    return r.status, (np.array(body["data"][0]["embedding"], np.float32) if r.status == 200 else body)


def _in_flight(url: str) -> float:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("qkv_requests_in_flight ")))


def test_sigterm_during_a_burst_loses_no_accepted_request(tiny_folders):
    folder = tiny_folders["mlm"]
    texts = [f"request {i}: the value of a function is {'an object ' * (i % 5)}" for i in range(24)]
    late_texts = [f"late request {i}" for i in range(200)]
    expected = dict(zip(texts + late_texts, qkv.embed(folder, texts + late_texts)))
    proc, url = _start(folder)
    try:
        answers: dict[str, tuple] = {}
        burst = [threading.Thread(target=lambda t=t: answers.__setitem__(t, _post(url, t))) for t in texts]
        for t in burst:
            t.start()
        deadline = time.monotonic() + 30
        while _in_flight(url) < len(texts) + 1:  # all 24 accepted (+ this /metrics request)
            assert time.monotonic() < deadline, "the burst was not accepted"
            time.sleep(0.02)
        late: list[tuple] = []

        def keep_sending():
            for t in late_texts:
                got = _post(url, t)
                late.append((t, got))
                if got[0] is None:
                    return

        senders = [threading.Thread(target=keep_sending) for _ in range(2)]
        for t in senders:
            t.start()
        proc.send_signal(signal.SIGTERM)
        for t in burst + senders:
            t.join(60)
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    for t in texts:  # every accepted request answered, correctly
        status, vector = answers[t]
        assert status == 200, (t, answers[t])
        assert np.abs(vector - expected[t]).max() <= 1e-5
    for t, (status, vector) in late:  # later ones: answered correctly, or refused without an answer
        assert status in (200, None), (t, status, vector)
        if status == 200:
            assert np.abs(vector - expected[t]).max() <= 1e-5
    assert _post(url, "after the end")[0] is None  # the port is closed
