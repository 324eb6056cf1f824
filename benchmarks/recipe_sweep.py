"""The pretraining-recipe sweep: one `qkv pretrain` per cell at a fixed wall-clock budget.

Every cell is the base recipe with one thing changed (or a named combination); each runs as its own
`qkv pretrain` process, one after another (never two at once: the budget is wall-clock time), and
is then scored on the same held-out data:

* held-out masked-token accuracy and loss — always on the same fixed 15 % masks of the 20 Newsgroups
  test split, whatever the cell's training masking rate;
* steps and tokens/s reached in the budget;
* how specialised the heads became: per head the mean attention on the previous and on the next
  token over 64 unmasked held-out blocks; the table shows the largest and how many heads reach 0.3.

    python benchmarks/recipe_sweep.py --minutes 2.5 --out runs/sweep            # every cell
    python benchmarks/recipe_sweep.py --minutes 2.5 --out runs/sweep --cells base,rope
    python benchmarks/recipe_sweep.py --list                                      # cells and commands

A finished cell (its run.json says complete) is not run again; rerun the command to fill in the
rest. The table is printed as Markdown and written to OUT/results.md; every cell's command is in it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

BASE_MODEL = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 4, "norm": "pre", "dropout": 0.0,
              "position": "alibi"}
BASE_ARGS = {"--lr": "3e-3", "--batch-size": "32", "--max-len": "128", "--vocab-size": "8192",
             "--warmup-steps": "100", "--select-rate": "0.15"}

#: name -> (model overrides, argument overrides, what it tests)
CELLS: dict[str, tuple[dict, dict, str]] = {
    "base": ({}, {}, "4 × 128, 4 heads, FFN 512, pre-LN, ALiBi, lr 3e-3, batch 32 × 128, 15 % masking"),
    "pos-learned": ({"position": "learned"}, {}, "learned absolute table"),
    "pos-sinusoidal": ({"position": "sinusoidal"}, {}, "sinusoidal, added to the input"),
    "pos-t5": ({"position": "t5"}, {}, "T5 buckets (learned, from zero)"),
    "pos-rope": ({"position": "rope"}, {}, "rotary"),
    "pos-relative-alibi": ({"position": "relative-alibi"}, {}, "learned per-offset bias started at ALiBi"),
    "pos-relative-alibi-lr10": ({"position": "relative-alibi"}, {"--position-lr-scale": "10"},
                                "relative-alibi, its table at 10× the learning rate"),
    "pos-relative-alibi-lr30": ({"position": "relative-alibi"}, {"--position-lr-scale": "30"},
                                "relative-alibi, its table at 30× the learning rate"),
    "post-ln": ({"norm": "post"}, {}, "post-LN"),
    # combinations of the single-change winners
    "d2-m25": ({"n_layers": 2}, {"--select-rate": "0.25"}, "2 layers, 25 % masking"),
    "d2-m25-ra30": ({"n_layers": 2, "position": "relative-alibi"}, {"--select-rate": "0.25", "--position-lr-scale": "30"},
                    "2 layers, 25 % masking, relative-alibi at 30× lr"),
    "d2-ra30": ({"n_layers": 2, "position": "relative-alibi"}, {"--position-lr-scale": "30"},
                "2 layers, 15 % masking, relative-alibi at 30× lr"),
    "d2-m25-ra100": ({"n_layers": 2, "position": "relative-alibi"}, {"--select-rate": "0.25", "--position-lr-scale": "100"},
                     "2 layers, 25 % masking, relative-alibi at 100× lr"),
    "d4-m25-ra30": ({"position": "relative-alibi"}, {"--select-rate": "0.25", "--position-lr-scale": "30"},
                    "4 layers, 25 % masking, relative-alibi at 30× lr"),
    "lr-1e-3": ({}, {"--lr": "1e-3"}, "learning rate 1e-3"),
    "lr-6e-3": ({}, {"--lr": "6e-3"}, "learning rate 6e-3"),
    "mask-25": ({}, {"--select-rate": "0.25"}, "25 % of tokens selected for prediction"),
    "mask-40": ({}, {"--select-rate": "0.4"}, "40 % selected"),
    "batch-16": ({}, {"--batch-size": "16"}, "batch 16 × 128"),
    "batch-64": ({}, {"--batch-size": "64"}, "batch 64 × 128"),
    "width-192": ({"d_model": 192, "d_ff": 768}, {}, "width 192, FFN 768"),
    "width-256": ({"d_model": 256, "d_ff": 1024}, {}, "width 256, FFN 1024 (mini's size)"),
    "depth-2": ({"n_layers": 2}, {}, "2 layers"),
    "depth-6": ({"n_layers": 6}, {}, "6 layers"),
    "vocab-4096": ({}, {"--vocab-size": "4096"}, "WordPiece vocabulary 4,096"),
    "vocab-16384": ({}, {"--vocab-size": "16384"}, "WordPiece vocabulary 16,384"),
    "bf16": ({}, {"--precision": "bf16"}, "bf16 mixed precision (falls back to fp32 without native bf16)"),
}


def command(name: str, minutes: float, out: Path, extra: dict | None = None) -> list[str]:
    model_over, args_over, _ = CELLS[name] if name in CELLS else ({}, {}, "")
    extra = extra or {}
    model = {**BASE_MODEL, **model_over, **extra.get("model", {})}
    args = {**BASE_ARGS, **args_over, **extra.get("args", {})}
    cmd = ["qkv", "pretrain", "--corpus", "dataset:20newsgroups:train", "--preset", "mini",
           "--model", json.dumps(model, separators=(",", ":")), "--time-budget", f"{minutes:g}",
           "--eval-every", "250", "--eval-batches", "8", "--save-every", "100000", "--no-progress",
           "--out", str(out / name)]
    for k, v in args.items():
        cmd += [k, v]
    return cmd


def head_specialisation(run: Path, n_blocks: int = 64) -> dict:
    """Largest previous/next-token share over heads, and heads with either ≥ 0.3."""
    import qkv
    from qkv.analysis.specialisation import block_head_statistics
    from qkv.data.cache import open_token_cache
    from qkv.data.packing import PackedBlocks
    from qkv.data.tokenizer import load_tokenizer

    meta = json.loads((run / "run.json").read_text())
    tok = load_tokenizer(run)
    blocks = PackedBlocks(open_token_cache(meta["data"]["eval_cache"]), meta["train_config"]["max_len"],
                          tok.special)
    idx = list(range(0, len(blocks), max(1, len(blocks) // n_blocks)))[:n_blocks]
    b = blocks.batch(idx)
    s = block_head_statistics(qkv.load(run).model, b.input_ids, b.attention_mask, cls_id=tok.special.cls,
                              sep_id=tok.special.sep)
    both = (s.prev_share >= 0.3) | (s.next_share >= 0.3)
    return {"max_prev": float(s.prev_share.max()), "max_next": float(s.next_share.max()),
            "heads_ge_0.3": int(both.sum()), "min_entropy": float(s.entropy.min()),
            "uniform_entropy": s.uniform_entropy}


def summarise(run: Path) -> dict:
    meta = json.loads((run / "run.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    ev = meta["final_eval"]
    return {"accuracy": ev["accuracy"], "eval_loss": ev["eval_loss"], "steps": meta["steps_done"],
            "tokens_per_s": sorted(tps)[len(tps) // 2] if tps else None, **head_specialisation(run)}


def table(results: dict, minutes: float, out: Path) -> str:
    lines = [f"| cell | what | accuracy | loss | steps | tokens/s | max prev | max next | heads ≥ 0.3 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        what = CELLS[name][2] if name in CELLS else r.get("what", "")
        lines.append(f"| `{name}` | {what} | {r['accuracy']:.4f} | {r['eval_loss']:.3f} | {r['steps']} | "
                     f"{r['tokens_per_s']:,.0f} | {r['max_prev']:.2f} | {r['max_next']:.2f} | {r['heads_ge_0.3']} |")
    lines.append("")
    lines.append(f"Commands ({minutes:g} min each):")
    lines.append("")
    for name in results:
        lines.append(f"    {shlex.join(command(name, minutes, out))}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=2.5)
    p.add_argument("--out", type=Path, default=Path("runs/sweep"))
    p.add_argument("--cells", default=",".join(CELLS), help="comma-separated cell names")
    p.add_argument("--list", action="store_true")
    a = p.parse_args(argv)
    names = [c for c in a.cells.split(",") if c]
    unknown = [c for c in names if c not in CELLS]
    if unknown:
        p.error(f"unknown cell(s) {unknown}; known: {', '.join(CELLS)}")
    if a.list:
        for n in names:
            print(f"{n}: {shlex.join(command(n, a.minutes, a.out))}")
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    results_path = a.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for n in names:
        run = a.out / n
        if n not in results:
            if not (run / "run.json").is_file() or json.loads((run / "run.json").read_text())["status"] != "complete":
                t0 = time.time()
                print(f"[{time.strftime('%H:%M:%S')}] {n}: {shlex.join(command(n, a.minutes, a.out))}", flush=True)
                subprocess.run([sys.executable, "-m", "qkv", *command(n, a.minutes, a.out)[1:]], check=True, stdout=subprocess.DEVNULL)
                print(f"  took {time.time() - t0:.0f} s", flush=True)
            results[n] = summarise(run)
            results_path.write_text(json.dumps(results, indent=1))
            print(f"  {json.dumps(results[n])}", flush=True)
    text = table({n: results[n] for n in names if n in results}, a.minutes, a.out)
    (a.out / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
