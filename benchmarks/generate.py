"""Generation speed: per-token latency with and without the KV cache, and qkv vs transformers.

Legend: P prefix length (tokens already seen), K timed decode steps, B batch (1).

1. **Per-token latency** on a GPT-2-shaped causal LM (random weights, learned positions, pre-LN,
   tied head, B = 1): with the cache, the prefix is fed once (not timed) and K single-token steps
   are timed; without it, each token costs a full forward of the P + 1 tokens. Printed per P,
   with the ratio no-cache / cache, and the cache's flatness (latency at the longest prefix over
   the shortest; acceptance: ≤ 2).
2. **qkv vs transformers** ``generate``: greedy, the same random weights (copied into a
   ``GPT2LMHeadModel``), the same prompt, tokens/s of each and the ratio; the tokens must agree.

Sizes: ``--size small`` (default; d_model 256, 4 layers, 4 heads, vocab 8192: under 2 minutes on
a laptop CPU), ``--size gpt2`` (124M: d_model 768, 12 layers, 12 heads, vocab 50257).
``--quick``: tiny model, prefixes 16 and 64, a few steps (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

try:
    from qkv.config import ModelConfig
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from qkv.config import ModelConfig
from qkv.generation.loop import generate  # noqa: E402
from qkv.hardware import precision_unsupported  # noqa: E402
from qkv.inference import for_inference  # noqa: E402
from qkv.models.builders import build_causal_lm  # noqa: E402
from qkv.nn.kv_cache import KVCache  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers
from peak_memory import mark_peak, measure_alone, print_peak  # noqa: E402

SIZES = {
    "tiny": dict(vocab_size=512, d_model=64, n_heads=2, n_layers=2),
    "small": dict(vocab_size=8192, d_model=256, n_heads=4, n_layers=4),
    "gpt2": dict(vocab_size=50257, d_model=768, n_heads=12, n_layers=12),
}


def build_model(size: str, max_len: int, *, position: str = "learned", seed: int = 0):
    """A GPT-2-shaped qkv CausalLM with random weights, eval mode."""
    s = SIZES[size]
    torch.manual_seed(seed)
    cfg = ModelConfig.from_flat(vocab_size=s["vocab_size"], d_model=s["d_model"], n_heads=s["n_heads"],
                      d_ff=4 * s["d_model"], n_layers=s["n_layers"], max_len=max_len, norm="pre",
                      activation="gelu_tanh", layer_norm_eps=1e-5, type_vocab_size=0, embedding_norm=False,
                      pad_token_id=None, position=position, dropout=0.0)
    return build_causal_lm(cfg).eval()


def copy_to_gpt2(model):
    """A transformers ``GPT2LMHeadModel`` holding ``model``'s weights (Conv1D weights transposed)."""
    import transformers

    c = model.config
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=c.vocab_size, n_embd=c.d_model, n_head=c.attention.n_heads, n_layer=c.n_layers, n_positions=c.max_len,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)).eval()
    dec, src = model.decoder, hf.transformer
    with torch.no_grad():
        src.wte.weight.copy_(dec.embeddings.tokens.weight)
        src.wpe.weight.copy_(dec.embeddings.positions.weight)
        for block, layer in zip(src.h, dec.layers):
            att, ff = layer.attention, layer.feed_forward
            block.attn.c_attn.weight.copy_(att.qkv_proj.weight.t())
            block.attn.c_attn.bias.copy_(att.qkv_proj.bias)
            block.attn.c_proj.weight.copy_(att.out_proj.weight.t())
            block.attn.c_proj.bias.copy_(att.out_proj.bias)
            block.mlp.c_fc.weight.copy_(ff.linear1.weight.t())
            block.mlp.c_fc.bias.copy_(ff.linear1.bias)
            block.mlp.c_proj.weight.copy_(ff.linear2.weight.t())
            block.mlp.c_proj.bias.copy_(ff.linear2.bias)
            for mine, theirs in ((layer.norm1, block.ln_1), (layer.norm2, block.ln_2)):
                theirs.weight.copy_(mine.weight)
                theirs.bias.copy_(mine.bias)
        src.ln_f.weight.copy_(dec.final_norm.weight)
        src.ln_f.bias.copy_(dec.final_norm.bias)
    hf.generation_config.eos_token_id = None  # random weights: always generate every token
    hf.generation_config.pad_token_id = 0
    return hf


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def latency_cached(model, prefix: int, steps: int, reps: int) -> float:
    """Median seconds per decoded token after a prefix of ``prefix`` tokens (cache)."""
    V = model.config.vocab_size
    times = []
    for _ in range(reps):
        cache = KVCache(len(model.decoder.layers), capacity=prefix + steps)
        model(torch.randint(0, V, (1, prefix), device=_device(model)), cache=cache)
        toks = torch.randint(0, V, (steps, 1, 1), device=_device(model))
        t0 = time.perf_counter()
        for i in range(steps):
            model(toks[i], cache=cache)
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


@torch.no_grad()
def latency_full(model, prefix: int, steps: int, reps: int) -> float:
    """Median seconds of one next-token forward over ``prefix + 1`` tokens (no cache)."""
    ids = torch.randint(0, model.config.vocab_size, (1, prefix + 1), device=_device(model))
    model(ids)  # warm-up
    times = []
    for _ in range(max(reps, 1) * max(1, min(steps, 4))):
        t0 = time.perf_counter()
        model.logits(model.decoder(ids).last_hidden_state[:, -1])
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def versus_transformers(model, prompt_len: int, new: int, reps: int) -> dict:
    """Greedy tokens/s of qkv's and transformers' generate on the same weights and prompt."""
    hf = copy_to_gpt2(model).to(_device(model))
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), device=_device(model))
    mask = torch.ones_like(ids)
    ours = generate(model, ids, max_new_tokens=new)
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, min_new_tokens=new)
    rates = {"qkv": [], "transformers": []}
    for _ in range(reps):
        for name in (("qkv", "transformers") if _ % 2 == 0 else ("transformers", "qkv")):
            t0 = time.perf_counter()
            if name == "qkv":
                generate(model, ids, max_new_tokens=new)
            else:
                hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, min_new_tokens=new)
            rates[name].append(new / (time.perf_counter() - t0))
    q, h = statistics.median(rates["qkv"]), statistics.median(rates["transformers"])
    return {"prompt": prompt_len, "new_tokens": new, "qkv_tokens_per_s": q, "hf_tokens_per_s": h,
            "ratio_qkv_over_hf": q / h, "tokens_agree": bool(torch.equal(ours, theirs))}


@torch.no_grad()
def precision_table(model, prompt_len: int, new: int, reps: int, precisions: list[str], batches: list[int]) -> list[dict]:
    """Greedy tokens/s of qkv in each precision against transformers' float32 ``generate`` on the same
    weights, at each batch size (prompts of ``prompt_len`` tokens), with the new tokens' agreement with
    qkv float32 and the mean |log p − log p_fp32| of float32's greedy tokens."""
    hf = copy_to_gpt2(model).to(_device(model))
    prepared = {p: model if p == "fp32" else for_inference(model, p, smoothing=None) for p in precisions
                if precision_unsupported(p, torch.device("cpu")) is None}
    rows = []
    for b in batches:
        ids = torch.randint(0, model.config.vocab_size, (b, prompt_len), generator=torch.Generator().manual_seed(b))
        ids = ids.to(_device(model))
        mask = torch.ones_like(ids)
        ref = generate(model, ids, max_new_tokens=new)  # (b, prompt_len + new)
        ref_lp = model(ref).logits[:, prompt_len - 1:-1].log_softmax(-1).gather(-1, ref[:, prompt_len:, None])
        for p, m in prepared.items():
            got = generate(m, ids, max_new_tokens=new)
            lp = m(ref).logits[:, prompt_len - 1:-1].float().log_softmax(-1).gather(-1, ref[:, prompt_len:, None])
            rates = {"qkv": [], "transformers": []}
            for r in range(reps):
                for name in (("qkv", "transformers") if r % 2 == 0 else ("transformers", "qkv")):
                    t0 = time.perf_counter()
                    if name == "qkv":
                        generate(m, ids, max_new_tokens=new)
                    else:
                        hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, min_new_tokens=new)
                    rates[name].append(b * new / (time.perf_counter() - t0))
            q, h = statistics.median(rates["qkv"]), statistics.median(rates["transformers"])
            rows.append({"batch": b, "precision": p, "qkv_tokens_per_s": q, "hf_fp32_tokens_per_s": h,
                         "ratio": q / h, "agree_with_fp32": float((got[:, prompt_len:] == ref[:, prompt_len:]).float().mean()),
                         "mean_abs_logprob_gap": float((lp - ref_lp).abs().mean())})
    return rows


def peak_memory(model, precisions: list[str], batch: int, new: int) -> list[dict]:
    """Peak resident memory of greedy generation, each side alone in a fresh process that loads only its
    own model (written here into a temporary folder): qkv in each precision this CPU offers, and
    transformers fp32. Resident MB once the model is loaded and prepared, and the peak while it
    generates ``new`` tokens for ``batch`` prompts of 16 tokens (the mark restarted after loading where
    the kernel allows; else the peak includes loading)."""
    import tempfile

    import qkv

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        qkv.save(model, Path(tmp) / "qkv")
        copy_to_gpt2(model).save_pretrained(Path(tmp) / "hf")
        sides = [f"qkv-{p}" for p in precisions if precision_unsupported(p, torch.device("cpu")) is None]
        for side in sides + ["transformers-fp32"]:
            measured = measure_alone([__file__, "--alone", side, "--folder", tmp, "--new-tokens", new,
                                      "--batches", batch])
            rows.append({"side": side, "batch": batch, "new_tokens": new, **measured})
    return rows


@torch.no_grad()
def alone(side: str, folder: Path, batch: int, new: int) -> None:
    """Load ``side``'s model only, generate, print resident MB after loading, the peak, and whether the
    peak mark was restarted after loading (``--alone``)."""
    library, precision = side.split("-")
    if library == "qkv":
        import qkv

        model = qkv.load(folder / "qkv")[0].eval()
        model = model if precision == "fp32" else for_inference(model, precision, smoothing=None)
    else:
        import transformers

        model = transformers.GPT2LMHeadModel.from_pretrained(str(folder / "hf")).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, 16), generator=torch.Generator().manual_seed(batch))
    mark = mark_peak()
    if library == "qkv":
        generate(model, ids, max_new_tokens=new)
    else:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                       min_new_tokens=new, pad_token_id=0)
    print_peak(mark)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=tuple(SIZES), default="small", help="model shape (default small)")
    p.add_argument("--prefixes", default="16,64,256,1024", help="comma-separated prefix lengths")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per prefix (default 16)")
    p.add_argument("--reps", type=int, default=3, help="repetitions, median taken (default 3)")
    p.add_argument("--position", default="learned", help="position scheme (default learned, GPT-2's)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens per generate call vs transformers")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--precisions", default=None, metavar="LIST",
                   help="also compare greedy generate in these precisions (e.g. fp32,bf16,int8; the ones this CPU "
                   "lacks are skipped) against transformers' fp32, at the --batches sizes")
    p.add_argument("--batches", default="1,8,32", help="prompts per batch for --precisions (default 1,8,32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="tiny model, prefixes 16 and 64, few steps")
    p.add_argument("--memory", action="store_true",
                   help="also peak resident memory of generation, qkv (each --precisions mode, else fp32) vs "
                   "transformers, each alone in a fresh process, at the largest of --batches")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to time (default cpu); cuda without a GPU says so and stops")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--alone", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.alone:
        alone(args.alone, Path(args.folder), int(args.batches), args.new_tokens)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: skipped, there is no CUDA GPU on this machine (run without --device for the CPU)")
        return 0
    if args.quick:
        args.size, args.prefixes, args.steps, args.reps, args.new_tokens = "tiny", "16,64", 4, 1, 8
    if args.threads:
        torch.set_num_threads(args.threads)
    prefixes = [int(x) for x in args.prefixes.split(",")]
    model = build_model(args.size, max(max(prefixes) + args.steps + 1, 16 + args.new_tokens),
                        position=args.position).to(args.device)
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()} (--memory measures the CPU)")
    print(f"model {args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), "
          f"position {args.position}, {torch.get_num_threads()} threads")
    print(f"{'prefix':>7} {'cache ms/tok':>13} {'no-cache ms/tok':>16} {'speed-up':>9}")
    rows = []
    for P in prefixes:
        c = latency_cached(model, P, args.steps, args.reps)
        f = latency_full(model, P, args.steps, args.reps)
        rows.append({"prefix": P, "cache_ms": c * 1e3, "full_ms": f * 1e3, "speedup": f / c})
        print(f"{P:>7} {c * 1e3:>13.2f} {f * 1e3:>16.2f} {f / c:>8.1f}x")
    flat = rows[-1]["cache_ms"] / rows[0]["cache_ms"]
    print(f"cache flatness: {flat:.2f}x from prefix {prefixes[0]} to {prefixes[-1]} "
          f"({'ok' if flat <= 2 else 'NOT flat'}: acceptance ≤ 2x)")
    result = {"size": args.size, "position": args.position, "latency": rows, "flatness": flat}
    if not args.no_hf and args.position == "learned":
        v = versus_transformers(model, 16, args.new_tokens, args.reps)
        result["versus_transformers"] = v
        print(f"greedy generate, prompt 16 + {v['new_tokens']} new: qkv {v['qkv_tokens_per_s']:.1f} tok/s, "
              f"transformers {v['hf_tokens_per_s']:.1f} tok/s, ratio qkv/hf {v['ratio_qkv_over_hf']:.2f}, "
              f"tokens agree: {v['tokens_agree']}")
    if args.precisions and not args.no_hf and args.position == "learned":
        table = precision_table(model, 16, args.new_tokens, args.reps, args.precisions.split(","),
                                [int(x) for x in args.batches.split(",")])
        result["precisions"] = table
        print(f"{'batch':>5} {'precision':>9} {'qkv tok/s':>10} {'HF fp32 tok/s':>14} {'ratio':>6} "
              f"{'agree w/ fp32':>14} {'|Δ log p|':>10}")
        for r in table:
            print(f"{r['batch']:>5} {r['precision']:>9} {r['qkv_tokens_per_s']:>10.1f} {r['hf_fp32_tokens_per_s']:>14.1f} "
                  f"{r['ratio']:>5.2f}x {r['agree_with_fp32']:>14.3f} {r['mean_abs_logprob_gap']:>10.4f}")
    if args.memory and not args.no_hf and args.position == "learned":
        batch = max(int(x) for x in args.batches.split(","))
        mem = result["memory"] = peak_memory(model.cpu(), (args.precisions or "fp32").split(","), batch,
                                             args.new_tokens)
        print(f"peak resident MB of generate, each alone ({batch} prompts × 16 + {args.new_tokens} new tokens):")
        print(f"{'side':>18} {'loaded':>8} {'peak':>8} {'growth':>8}")
        for r in mem:
            print(f"{r['side']:>18} {r['loaded_mb']:>8.0f} {r['peak_mb']:>8.0f} {r['growth_mb']:>8.0f}"
                  + ("  (peak includes loading)" if r["peak_includes_loading"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
