"""bf16 mixed precision against fp32 for masked-LM training, side by side in one run.

Three models of the demo's shape (``cpu-small``) train on the same 20 Newsgroups batches, one step
each in turn: fp32 seed 0, bf16 seed 0 (same initial weights as fp32 seed 0) and fp32 seed 1 (the
seed-to-seed spread the bf16 difference is compared with). Prints the median step time of each,
the bf16/fp32 speed ratio, the CPU's bf16 support, and the loss curves' differences; writes the
curves as a PNG.

    python benchmarks/precision.py --steps 150 --png docs/pretraining-bf16.png

On a CPU without native bf16 torch emulates it, and the ratio shows what that costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--corpus", default="dataset:20newsgroups:train")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--png", type=Path, default=None)
    a = p.parse_args(argv)

    from qkv.config import ModelConfig
    from qkv.data.pipeline import prepare_pretraining_data
    from qkv.models.builders import build_masked_lm
    from qkv.training.loop import init_unigram_bias
    from qkv.training.optim import build_optimizer, build_scheduler
    from qkv.training.precision import autocast, bf16_support

    ok, why = bf16_support()
    print(f"CPU: {why}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    data = prepare_pretraining_data(a.corpus, vocab_size=a.vocab_size, max_len=a.max_len)
    batches = data.train_batches(a.batch_size, seed=0)
    mc = ModelConfig.preset("cpu-small", vocab_size=data.tokenizer.vocab_size)
    arms = {}
    for name, seed, precision in (("fp32", 0, "fp32"), ("bf16", 0, "bf16"), ("fp32 seed 1", 1, "fp32")):
        torch.manual_seed(seed)
        model = build_masked_lm(mc).train()
        init_unigram_bias(model, data.train_cache.tokens, mc.vocab_size)
        opt = build_optimizer(model, lr=a.lr, weight_decay=0.01)
        sched = build_scheduler(opt, warmup_steps=max(1, a.steps // 15), total_steps=a.steps, schedule="linear")
        arms[name] = dict(model=model, opt=opt, sched=sched, precision=precision, times=[], losses=[])
    for step in range(a.steps):
        batch = batches.batch(step)
        for arm in arms.values():
            t0 = time.perf_counter()
            with autocast(arm["precision"]):
                out = arm["model"](batch.input_ids, batch.attention_mask, labels=batch.labels)
            out.loss.float().backward()
            torch.nn.utils.clip_grad_norm_(arm["model"].parameters(), 1.0)
            arm["opt"].step()
            arm["sched"].step()
            arm["opt"].zero_grad(set_to_none=True)
            arm["times"].append(time.perf_counter() - t0)
            arm["losses"].append(out.loss.item())
        if (step + 1) % 25 == 0:
            print(f"  step {step + 1}: " + ", ".join(f"{n} {arm['losses'][-1]:.3f}" for n, arm in arms.items()),
                  flush=True)
    skip = min(5, a.steps // 2)  # the first steps warm up
    med = {n: statistics.median(arm["times"][skip:]) for n, arm in arms.items()}
    tail = max(10, a.steps // 5)
    last = {n: statistics.fmean(arm["losses"][-tail:]) for n, arm in arms.items()}
    print(f"\nmedian step time: fp32 {med['fp32'] * 1e3:.0f} ms, bf16 {med['bf16'] * 1e3:.0f} ms "
          f"→ bf16 speed {med['fp32'] / med['bf16']:.2f}× fp32")
    print(f"mean training loss over the last {tail} steps: fp32 {last['fp32']:.4f}, bf16 {last['bf16']:.4f} "
          f"(difference {last['bf16'] - last['fp32']:+.4f}); fp32 seed 1 {last['fp32 seed 1']:.4f} "
          f"(seed-to-seed difference {last['fp32 seed 1'] - last['fp32']:+.4f})")
    diffs = [abs(x - y) for x, y in zip(arms["fp32"]["losses"], arms["bf16"]["losses"])]
    seeds = [abs(x - y) for x, y in zip(arms["fp32"]["losses"], arms["fp32 seed 1"]["losses"])]
    print(f"per-step |bf16 − fp32| loss: median {statistics.median(diffs):.4f}, max {max(diffs):.4f}; "
          f"per-step |seed 1 − seed 0|: median {statistics.median(seeds):.4f}")
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        for n, arm in arms.items():
            ax.plot(range(1, a.steps + 1), arm["losses"], lw=1, label=f"{n} ({med[n] * 1e3:.0f} ms/step)")
        ax.set_xlabel("step")
        ax.set_ylabel("training MLM loss")
        ax.set_title(f"bf16 vs fp32, cpu-small, batch {a.batch_size} × {a.max_len} ({why.split(' (')[0]})",
                     fontsize=8)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png)
        print(f"curves: {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
