"""Inference speed: qkv ``Encoder`` vs ``transformers.BertModel`` (sdpa), forward without grad.

Legend: B batch, T padded length, C model width, N real tokens in a batch.

Same config (a qkv preset exported with qkv's exporter), same weights (the Hugging Face model is
initialised by transformers and qkv is built from it with qkv's importer), eval mode, no grad.
Outputs are checked to agree at real positions before timing.

Cases (each timed interleaved, qkv and HF alternating in flipped order, medians after warm-up):

* ``equal``: B × T tokens, every sequence of length T (no padding; both get an all-ones mask).
* ``mixed/mask``: B sequences with lengths drawn from a fixed seed in [16, T], right-padded to the
  longest; both get the padded ``(B,T)`` batch and its padding mask (the standard padded path of
  both libraries: the same work).
* ``mixed/packed``: the same padded batch; Hugging Face as above, qkv packs it
  (``PackedBatch.from_padded``) and runs ``Encoder.forward_packed``: embeddings and layers run on
  the N real tokens only (packed; each sequence attends on its own, unmasked) and
  padded positions come back as zeros. Same inputs, same real-position outputs.

Tokens/s counts real tokens (N) for every case, so the mixed cases of both implementations are
measured in the same unit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# idle OpenMP threads sleep instead of spinning (see benchmarks/pretrain.py); set it to override
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting, which is read when torch loads)

try:
    from qkv.config import ModelConfig
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.checkpoints.families import bert as bert_family
from qkv.nn.packed import PackedBatch

CASES = ("equal", "mixed/mask", "mixed/packed")


def build_pair(preset: str, *, seed: int = 0, vocab_size: int | None = None, max_len: int | None = None):
    """``(qkv_encoder, hf_model)`` with identical weights, eval mode."""
    import transformers

    overrides = {}
    if vocab_size:
        overrides["vocab_size"] = vocab_size
    if max_len:
        overrides["max_len"] = max_len
    base = ModelConfig.preset(preset, **overrides)
    hf_cfg = transformers.BertConfig(**bert_family.config_to_hf(base, "encoder"))
    torch.manual_seed(seed)
    hf = transformers.BertModel._from_config(hf_cfg, attn_implementation="sdpa", add_pooling_layer=False)
    imported = bert_family.read(hf.config.to_dict(), hf.state_dict(), config_source="config", weights_source="weights")
    cfg = imported.config
    enc = build_encoder(cfg, init=False)
    enc.load_state_dict(imported.state)
    return enc.eval(), hf.eval(), cfg


def make_batch(vocab_size: int, batch: int, length: int, *, mixed: bool, min_len: int = 16, seed: int = 0):
    """``(ids, mask)``: ``(B,T)`` ids (0 at padding) and a right-padded 0/1 mask."""
    g = torch.Generator().manual_seed(seed)
    if mixed:
        lengths = torch.randint(min(min_len, length), length + 1, (batch,), generator=g)
        T = int(lengths.max())
    else:
        lengths, T = torch.full((batch,), length), length
    ids = torch.randint(999 if vocab_size > 2000 else 1, vocab_size, (batch, T), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()  # (B,T)
    return ids * mask, mask


def run_case(case: str, impl: str, qkv, hf, ids, mask) -> torch.Tensor:
    with torch.inference_mode():
        if impl == "hf":
            return hf(input_ids=ids, attention_mask=mask).last_hidden_state
        if case == "mixed/packed":  # packing and unpacking are part of the time
            batch = PackedBatch.from_padded(ids, mask)
            return batch.unpack(qkv.forward_packed(batch).last_hidden_state, ids.shape[1])
        return qkv(ids, mask).last_hidden_state


def bench_preset(preset: str, args) -> list[dict]:
    qkv, hf, cfg = build_pair(preset, seed=args.seed, vocab_size=args.vocab_size,
                              max_len=args.seq_len if preset == "tiny" else None)
    rows = []
    for case in args.cases:
        ids, mask = make_batch(cfg.vocab_size, args.batch_size, args.seq_len, mixed=case != "equal",
                               min_len=args.min_len, seed=args.seed)
        real = mask.bool()
        n_tokens = int(mask.sum())
        a, b = (run_case(case, i, qkv, hf, ids, mask) for i in ("qkv", "hf"))
        diff = float((a - b)[real].abs().max())
        times: dict[str, list[float]] = {"qkv": [], "hf": []}
        for rep in range(args.warmup + args.reps):
            for impl in (("qkv", "hf") if rep % 2 == 0 else ("hf", "qkv")):
                t0 = time.perf_counter()
                run_case(case, impl, qkv, hf, ids, mask)
                if rep >= args.warmup:
                    times[impl].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        tps = {k: n_tokens / med[k] for k in med}
        row = {"preset": preset, "case": case, "batch": args.batch_size, "padded_len": ids.shape[1],
               "real_tokens": n_tokens, "lengths": mask.sum(1).tolist(), "max_abs_diff": diff,
               "median_s": med, "tokens_per_s": tps, "ratio": tps["qkv"] / tps["hf"]}
        rows.append(row)
        print(f"{preset:>6} {case:<12} {args.batch_size:>3}×{ids.shape[1]:<4} {n_tokens:>6} | "
              f"{med['qkv'] * 1e3:>9.1f} {med['hf'] * 1e3:>9.1f} | {tps['qkv']:>9,.0f} {tps['hf']:>9,.0f} | "
              f"{row['ratio']:>5.2f}× | {diff:.1e}", flush=True)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", default=["mini", "base"], help="qkv presets (default: mini base)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128, help="T (equal) and the longest mixed length")
    p.add_argument("--min-len", type=int, default=16, help="shortest mixed length")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per implementation")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write all figures to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    load = os.getloadavg()[0]
    stamp = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    print(f"# qkv Encoder vs transformers.BertModel (sdpa) inference — {stamp}, {platform.machine()}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, load {load:.2f}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print(f"median of {args.reps} after {args.warmup} warm-up, interleaved; tokens/s over real tokens")
    print(f"{'preset':>6} {'case':<12} {'B×T':>8} {'tokens':>6} | {'qkv ms':>9} {'hf ms':>9} | "
          f"{'qkv tok/s':>9} {'hf tok/s':>9} | {'ratio':>6} | max|Δ|")
    rows = [r for preset in args.preset for r in bench_preset(preset, args)]
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        meta = {"date": stamp, "machine": platform.machine(), "torch": torch.__version__,
                "transformers": transformers.__version__, "threads": torch.get_num_threads(),
                "load_start": load, "load_end": os.getloadavg()[0]}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
