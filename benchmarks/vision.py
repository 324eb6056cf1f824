"""Vision training speed: qkv's image classifier vs ``transformers.ViTForImageClassification`` of the
same shape, full training steps, in one process.

Legend: B batch, K channels, R × W image, P patch, C model width, F feed-forward width, L layers,
H heads, T tokens (N patches + [CLS]).

What is compared: the *same* function trained the same way.

* Identical model: a ``ViTConfig`` (``--width``, ``--layers``, ``--heads``, ``--ffn``, ``--patch``,
  ``--size``, ``--channels``; hidden and attention dropout 0) built by transformers with
  ``attn_implementation="sdpa"`` and saved to a temporary folder; qkv loads that folder
  (``qkv.load``), so both start from the same weights.
* Identical batches: seeded random pixels and labels, the same for both.
* Identical optimiser: ``torch.optim.AdamW`` (lr 1e-3, fused=False, foreach=True) on each.
* A step is forward + cross-entropy + backward + ``optimizer.step()`` + ``zero_grad``.

Timing: after ``--warmup`` steps each, the two alternate step by step (the order flips every step).
Reported: median images/s of each, the ratio qkv / transformers, and the loss of both at the first
step (equal: the same weights and batch).

Run it on an otherwise idle machine: ``python benchmarks/vision.py --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import qkv


def build_pair(args):
    """``(qkv model, transformers model)`` with the same weights."""
    import transformers  # an optional dependency (the test extra): only when the benchmark runs

    config = transformers.ViTConfig(hidden_size=args.width, num_hidden_layers=args.layers,
                                    num_attention_heads=args.heads, intermediate_size=args.ffn,
                                    image_size=args.size, patch_size=args.patch, num_channels=args.channels,
                                    num_labels=args.labels, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)
    torch.manual_seed(args.seed)
    hf = transformers.ViTForImageClassification._from_config(config, attn_implementation="sdpa")
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = qkv.load(tmp).model
    return ours.train(), hf.train()


def _logits(name: str, model, x):
    return model(x).logits if name == "qkv" else model(pixel_values=x).logits


def train_step(name: str, model, opt, batch) -> float:
    x, y = batch
    loss = F.cross_entropy(_logits(name, model, x), y)  # (B,labels) vs (B,)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def run(args) -> dict:
    ours, hf = build_pair(args)
    g = torch.Generator().manual_seed(args.seed)
    batches = [(torch.randn(args.batch_size, args.channels, args.size, args.size, generator=g),
                torch.randint(0, args.labels, (args.batch_size,), generator=g)) for _ in range(4)]
    with torch.no_grad():
        first = {"qkv": float(F.cross_entropy(_logits("qkv", ours.eval(), batches[0][0]), batches[0][1])),
                 "transformers": float(F.cross_entropy(_logits("hf", hf.eval(), batches[0][0]), batches[0][1]))}
    ours.train(), hf.train()
    models = {"qkv": ours, "transformers": hf}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True) for k, m in models.items()}
    for i in range(args.warmup):
        for k in models:
            train_step(k, models[k], opts[k], batches[i % 4])
    times = {k: [] for k in models}
    for i in range(args.steps):
        order = list(models) if i % 2 == 0 else list(models)[::-1]
        for k in order:
            t = time.perf_counter()
            train_step(k, models[k], opts[k], batches[i % 4])
            times[k].append(time.perf_counter() - t)
    rate = {k: args.batch_size / statistics.median(v) for k, v in times.items()}
    return {"images_per_s": rate, "ratio": rate["qkv"] / rate["transformers"], "first_loss": first,
            "shape": {k: getattr(args, k) for k in ("width", "layers", "heads", "ffn", "patch", "size", "channels",
                                                    "batch_size")},
            "threads": torch.get_num_threads()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--width", 64), ("--layers", 4), ("--heads", 4), ("--ffn", 128), ("--patch", 4),
                          ("--size", 28), ("--channels", 1), ("--labels", 10), ("--batch-size", 128),
                          ("--steps", 20), ("--warmup", 3), ("--seed", 0)):
        p.add_argument(flag, type=int, default=default, help=f"default {default}")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    r = run(args)
    print(f"first-step loss: qkv {r['first_loss']['qkv']:.6f}, transformers {r['first_loss']['transformers']:.6f}")
    print(f"training images/s (median of {args.steps}, {r['threads']} threads): qkv {r['images_per_s']['qkv']:.1f}, "
          f"transformers ViTForImageClassification {r['images_per_s']['transformers']:.1f}; ratio {r['ratio']:.2f}×")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
