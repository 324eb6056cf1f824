"""Where a step's time goes: ``torch.profiler`` over a few steps, ops summed into groups.

Legend: B batch, T window length.

Three workloads, each in every precision this CPU offers:

* ``finetune``: one fine-tuning step (forward + backward + AdamW + ``zero_grad``) of all-MiniLM-L6-v2
  with a sequence-classification head on B × T = 32 × 128 R8 batches, qkv and transformers, fp32 and
  bf16 autocast — the models, batches and step of ``benchmarks/finetune.py``.
* ``decode``: one greedy decode step with the KV cache after a 64-token prefix, on a GPT-2 124M-shaped
  causal LM with random weights (``benchmarks/generate.py``'s model): qkv fp32, bf16 and int8
  (weight-only) through ``qkv.inference.for_inference``, and transformers fp32 on the same weights.
* ``embed``: ``qkv.embed``'s embedder over 64 pydoc-topic documents of ≤ 256 tokens, fp32 / bf16 / int8.

Each op's *self* time (the time in the op itself, not in the ops it calls) is summed into the groups
of :data:`GROUPS` (first match wins; ``other`` takes the rest); the table prints each group's share of
the step and the step's profiled time, then the top ops of every workload. ``--quick`` shrinks every
size to a smoke run (tiny model, batch 4 × 16, one step).

    python benchmarks/profile_step.py                       # all three, 3 profiled steps each
    python benchmarks/profile_step.py --only decode --steps 8 --top 12
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/pretrain.py

import torch
from torch.profiler import ProfilerActivity, profile

try:
    import qkv  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from qkv.embeddings.embedder import Embedder
from qkv.hardware import cpu_features, precision_unsupported
from qkv.inference import for_inference
from qkv.nn.kv_cache import KVCache
from qkv.training.optim import build_optimizer

#: op groups, in matching order: (group, substrings of the lower-cased op name)
GROUPS = (
    ("optimizer", ("adam", "optimizer", "_foreach", "zero_grad")),
    ("quantize", ("quantize", "dequant", "choose_qparams", "quant_per")),
    ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention", "sdpa", "_attention")),
    ("softmax", ("softmax", "nll_loss", "cross_entropy")),
    ("layer norm", ("layer_norm",)),
    ("gelu", ("gelu",)),
    ("matmul", ("linear", "addmm", "::mm", "bmm", "matmul", "mkldnn", "onednn", "int8pack_mm", "_int_mm",
                "baddbmm", "::dot", "mv")),
    ("cast/copy", ("::to", "_to_copy", "copy_", "clone", "contiguous", "::cat", "empty_like")),
    ("elementwise", ("add", "mul", "div", "sub", "tanh", "where", "masked_fill", "pow", "sqrt", "exp", "neg",
                     "fill_", "zero_", "sum", "mean", "clamp", "lerp", "sign", "abs", "maximum", "minimum")),
)
GROUP_NAMES = tuple(g for g, _ in GROUPS) + ("other",)


def group_of(name: str) -> str:
    """The group of an op name (see :data:`GROUPS`)."""
    low = name.lower()
    return next((g for g, keys in GROUPS if any(k in low for k in keys)), "other")


def _sibling(name: str):
    """Another script of benchmarks/ as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"qkv_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def profiled(fn, steps: int, device: str) -> dict:
    """Profile ``steps`` calls of ``fn`` (after one warm-up call): per-group share, profiled ms per step,
    and every op's self ms per step."""
    fn()
    cuda = device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    ops: dict[str, float] = {}
    for ev in prof.key_averages():
        us = ev.self_device_time_total if cuda else ev.self_cpu_time_total
        if us > 0:
            ops[ev.key] = ops.get(ev.key, 0.0) + us / 1e3 / steps
    total = sum(ops.values()) or 1.0
    groups = {g: 0.0 for g in GROUP_NAMES}
    for name, ms in ops.items():
        groups[group_of(name)] += ms
    return {"ms_per_step": total, "share": {g: v / total for g, v in groups.items()},
            "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def _precisions(device: str) -> list[str]:
    return [p for p in ("fp32", "bf16", "int8") if precision_unsupported(p, torch.device(device)) is None]


def finetune_workloads(args) -> dict:
    """``{"finetune qkv fp32": fn, …}``: one training step each, qkv and transformers, fp32 and bf16."""
    ft = _sibling("finetune")
    n = args.batch * (args.steps + 2)
    texts, labels, _ = ft.texts_and_labels(n)
    with tempfile.TemporaryDirectory() as tmp:
        ours, hf, tok = ft.build_pair(ft.minilm(), max(labels) + 1, Path(tmp))
    data = [tuple(t.to(args.device) for t in b) for b in ft.batches(tok, texts, labels, args.batch, args.length, 1)]
    models = {"qkv": ours.to(args.device), "transformers": hf.to(args.device)}
    out = {}
    for name, model in models.items():
        opt = build_optimizer(model, lr=5e-5, weight_decay=0.01)
        for p in [p for p in ("fp32", "bf16") if p in _precisions(args.device)]:
            autocast = ft._autocast(p, args.device)
            out[f"finetune {name} {p}"] = (lambda m=model, o=opt, a=autocast, k=name: ft.step(k, m, o, data[0], a))
    return out


def decode_workloads(args) -> dict:
    """``{"decode qkv fp32": fn, …}``: one cached single-token step after a 64-token prefix."""
    gen = _sibling("generate")
    prefix = 8 if args.quick else 64
    model = gen.build_model("tiny" if args.quick else "gpt2", prefix + 4 * args.steps + 8).to(args.device)
    V = model.config.vocab_size
    ids = torch.randint(0, V, (1, prefix), generator=torch.Generator().manual_seed(0)).to(args.device)
    tok = ids[:, -1:]
    out = {}
    for p in _precisions(args.device):
        m = model if p == "fp32" else for_inference(model, p, smoothing=None)
        holder = {}

        def reset(m=m, holder=holder):
            holder["cache"] = KVCache(len(m.decoder.layers), capacity=prefix + 4 * args.steps + 8)
            m(ids, cache=holder["cache"])

        @torch.no_grad()
        def one(m=m, holder=holder, reset=reset):
            if "cache" not in holder or holder["cache"].seen >= prefix + 4 * args.steps:
                reset()
            m(tok, cache=holder["cache"])

        with torch.no_grad():
            reset()
        out[f"decode qkv {p}"] = one
    hf = gen.copy_to_gpt2(model.cpu()).to(args.device)
    model.to(args.device)
    state = {}

    @torch.no_grad()
    def hf_one():
        if "past" not in state or state["n"] >= 4 * args.steps:
            state["past"], state["n"] = hf(ids, use_cache=True).past_key_values, 0
        state["past"] = hf(tok, past_key_values=state["past"], use_cache=True).past_key_values
        state["n"] += 1

    out["decode transformers fp32"] = hf_one
    return out


def embed_workloads(args) -> dict:
    """``{"embed qkv fp32": fn, …}``: embedding the same documents, each precision."""
    from pydoc_data.topics import topics

    ft = _sibling("finetune")
    docs = [topics[k] for k in sorted(topics)][:4 if args.quick else 64]
    max_len = 32 if args.quick else 256
    out = {}
    for p in _precisions(args.device):
        emb = Embedder(str(ft.minilm()), max_len=max_len, truncate=True, device=args.device, precision=p)
        out[f"embed qkv {p}"] = (lambda e=emb: e.embed(docs))
    return out


WORKLOADS = {"finetune": finetune_workloads, "decode": decode_workloads, "embed": embed_workloads}


def print_tables(results: dict, top: int) -> None:
    short = {"layer norm": "lnorm", "cast/copy": "cast", "elementwise": "elem", "attention": "attn",
             "optimizer": "optim", "quantize": "quant", "softmax": "softmx"}
    heads = [short.get(g, g) for g in GROUP_NAMES]
    print(f"{'workload':30s} {'ms/step':>9s} " + " ".join(f"{h:>6s}" for h in heads))
    for name, r in results.items():
        print(f"{name:30s} {r['ms_per_step']:9.1f} " + " ".join(f"{100 * r['share'][g]:5.1f}%" for g in GROUP_NAMES))
    for name, r in results.items():
        print(f"\n{name}: top {top} ops by self time (ms/step, group)")
        for op, ms in list(r["ops"].items())[:top]:
            print(f"  {ms:9.2f}  {op}  [{group_of(op)}]")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=tuple(WORKLOADS), default=list(WORKLOADS),
                   help="workloads to profile (default all three)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps per workload (default 3)")
    p.add_argument("--batch", type=int, default=32, help="fine-tuning rows per batch B (default 32)")
    p.add_argument("--length", type=int, default=128, help="fine-tuning tokens per row T (default 128)")
    p.add_argument("--top", type=int, default=8, help="top ops printed per workload (default 8)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to profile (default cpu); cuda without a GPU says so and stops")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one step")
    p.add_argument("--json", default=None, help="also write the shares and op times here")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: skipped, there is no CUDA GPU on this machine (run without --device for the CPU)")
        return 0
    if args.quick:
        args.steps, args.batch, args.length = 1, 4, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device == "cuda" else \
        f"CPU flags {', '.join(k for k, v in cpu_features().items() if v) or 'none'}"
    print(f"# profile of a step — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {where}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, {args.steps} profiled steps")
    results = {}
    for kind in args.only:
        with contextlib.redirect_stdout(sys.stderr):  # loaders' own messages
            fns = WORKLOADS[kind](args)
        for name, fn in fns.items():
            results[name] = profiled(fn, args.steps, args.device)
    print_tables(results, args.top)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
