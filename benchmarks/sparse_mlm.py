"""Sparse vs dense masked-LM prediction: one training step (forward + backward) on the ``mini`` preset.

Legend: B batch, T length, C model width, V vocabulary, N labelled positions (≈ 15 % of B·T).

Both variants are the *same* model object (``MaskedLM.sparse_prediction`` toggled), same batch,
same labels; they give the same loss (checked here). Dense runs the vocabulary projection at all
B·T positions, ``(B·T, C) × (C, V)``; sparse only at the N labelled ones, ``(N, C) × (C, V)``.

Timing: after warm-up, the two variants alternate (the order flips each repetition)
in this process; medians are reported with the ratio dense/sparse.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    from qkv.config import ModelConfig
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm
from qkv.models.mlm import IGNORE_INDEX


def make_batch(vocab_size: int, batch: int, length: int, mask_rate: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (batch, length), generator=g)  # (B,T)
    labels = ids.clone()
    picked = torch.rand(batch, length, generator=g) < mask_rate  # (B,T)
    labels[~picked] = IGNORE_INDEX
    ids[picked] = 4  # a [MASK]-like id
    return ids, torch.ones(batch, length, dtype=torch.long), labels


def step(model, ids, mask, labels) -> float:
    model.zero_grad(set_to_none=True)
    loss = model(ids, mask, labels=labels).loss
    loss.backward()
    return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--mask-rate", type=float, default=0.15)
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig.preset(args.preset)
    model = build_masked_lm(cfg).train()
    ids, mask, labels = make_batch(cfg.vocab_size, args.batch, args.length, args.mask_rate)
    n = int((labels != IGNORE_INDEX).sum())

    # same loss (dropout off for the check, so that both see the same network)
    model.eval()
    with torch.no_grad():
        losses = {}
        for sparse in (True, False):
            model.sparse_prediction = sparse
            losses[sparse] = float(model(ids, mask, labels=labels).loss)
    model.train()

    times: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(args.warmup + args.reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for sparse in order:
            model.sparse_prediction = sparse
            t0 = time.perf_counter()
            step(model, ids, mask, labels)
            if rep >= args.warmup:
                times[sparse].append(time.perf_counter() - t0)
    sparse_s, dense_s = statistics.median(times[True]), statistics.median(times[False])
    print(f"# sparse vs dense masked-LM prediction — {datetime.date.today()}, {platform.machine()}, "
          f"{platform.processor() or 'cpu'}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"preset {args.preset}: {cfg.n_layers} layers × {cfg.d_model}, V={cfg.vocab_size}; "
          f"batch {args.batch} × {args.length} tokens, {n} labelled ({n / ids.numel():.1%})")
    diff = abs(losses[True] - losses[False])
    print(f"loss sparse {losses[True]:.6f}  dense {losses[False]:.6f}  |diff| {diff:.2e}")
    print(f"forward+backward median of {args.reps}: dense {dense_s * 1e3:.0f} ms, "
          f"sparse {sparse_s * 1e3:.0f} ms")
    print(f"speed-up dense/sparse: {dense_s / sparse_s:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
