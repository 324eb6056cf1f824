"""``qkv lab seq2seq``: train an encoder–decoder on a synthetic task and print its exact match;
``qkv lab image-positions``: the positions question on images, over seeds, with a verdict.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qkv.training.rundir import read_run

__all__ = ["add_lab_parser"]

#: The options' defaults (``None`` on the parser, so that ``--resume`` can tell what was given).
_DEFAULTS = {"preset": "tiny", "seed": 0, "min_len": 4, "max_len": 6, "symbols": 10, "precision": "fp32"}


def add_lab_parser(sub) -> None:
    """Register ``qkv lab`` and its subcommands on the top-level subparsers ``sub``."""
    from qkv.cli import add_common_options
    from qkv.lab.seq2seq import PRESETS
    from qkv.lab.tasks import TASKS

    lab = sub.add_parser("lab", help="the attention lab: small models learning synthetic tasks on CPU",
                         description="Train small models on synthetic tasks and measure what they learn.")
    labsub = lab.add_subparsers(dest="lab_command", metavar="EXPERIMENT", required=True)
    p = labsub.add_parser("seq2seq", help="train an encoder-decoder on reverse or sort",
                          description="Train an encoder-decoder (cross-attention) on a synthetic task on CPU with "
                          "the training engine, evaluate greedy generation by exact match on a held-out set, and "
                          "print the exact match and the chance level. --out is a run folder (run.json, "
                          "metrics.jsonl, curve.png, checkpoints; at the end model/ and metrics.json); SIGINT/"
                          "SIGTERM save a checkpoint and exit, and --resume continues bit-identically.")
    p.add_argument("--task", default=None, choices=sorted(TASKS), help="the task (required unless --resume)")
    p.add_argument("--out", required=True, help="the run folder (must not exist or be empty, unless --resume)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint (its stored options are used; "
                   "options given must match them)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the preset's)")
    budget.add_argument("--time-budget", dest="time_budget", type=float, default=None, metavar="MINUTES",
                        help="train for this many minutes instead of --steps: the learning rate decays with "
                        "elapsed time and reaches zero at the deadline")
    budget.add_argument("--minutes", dest="time_budget", type=float, default=None, metavar="MINUTES",
                        help="the same as --time-budget (its former name)")
    p.add_argument("--precision", default=None, choices=("fp32", "bf16", "auto"),
                   help="fp32, bf16 (mixed precision, float32 master weights; fp32 with a message where the CPU "
                   "has no native bf16) or auto (bf16 where native) (default: fp32)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="model and recipe (default tiny: 1+1 layers, d_model 64, 300 steps, measured to reach exact "
                   "match 1.0 on reverse of 4–6 digits; small: 2+2 layers, relative-alibi, 3700 steps, measured to reach "
                   "0.99 on reverse of 4–16 digits with --max-len 16)")
    p.add_argument("--min-len", type=int, default=None, help="shortest source (default 4)")
    p.add_argument("--max-len", type=int, default=None, help="longest source (default 6)")
    p.add_argument("--symbols", type=int, default=None, help="alphabet size, 2…62 (default 10: the digits)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_common_options(p)
    p.set_defaults(func=_seq2seq)
    _add_image_positions(labsub, add_common_options)


def _add_image_positions(labsub, add_common_options) -> None:
    from qkv.lab.image_positions import VARIANTS
    from qkv.vision.config import RECIPES

    q = labsub.add_parser(
        "image-positions", help="why positions, on images: learned vs none vs patches shuffled, over seeds",
        description="Train one image recipe four ways over --seeds: learned patch positions, none, the patches "
        "shuffled the same way for every image, and shuffled per image; print each run's held-out accuracy, the "
        "mean ± std per variant and the verdicts (paired over seeds, Holm-corrected; decided when every seed "
        "differs by ≥ 0.10 the same way). --out holds one image run folder per variant and seed (a finished one "
        "is reused, an interrupted one resumed) and verdict.md/.json. See docs/vision.md.")
    q.add_argument("--out", required=True, help="the folder of the runs and the verdict")
    q.add_argument("--preset", default="vit-digits", choices=sorted(RECIPES), help="the image recipe (default "
                   "vit-digits)")
    q.add_argument("--data", default=None, help="dataset:NAME or a class folder (default: the recipe's)")
    q.add_argument("--seeds", type=int, default=3, help="seeds per variant (default 3)")
    budget = q.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, default=None, help="optimiser steps per run (default: the recipe's)")
    budget.add_argument("--time-budget", dest="time_budget", type=float, default=None, metavar="MINUTES",
                        help="minutes of training per run instead of --steps")
    q.add_argument("--batch-size", type=int, default=None, help="images per step (default: the recipe's)")
    q.add_argument("--model", default=None, metavar="JSON",
                   help="model overrides as JSON, e.g. '{\"image\": {\"patch\": 2}}' (the shuffles need "
                   "patches side by side: stride = patch)")
    q.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated subset of {', '.join(VARIANTS)} (default all)")
    add_common_options(q)
    q.set_defaults(func=_image_positions)


def _options(args: argparse.Namespace) -> dict:
    """The run's options: given ones over the stored run's (``--resume``) or the defaults."""
    given = {k: getattr(args, k) for k in ("task", "steps", "time_budget", *_DEFAULTS) if getattr(args, k) is not None}
    base = dict(_DEFAULTS)
    if args.resume:
        stored = read_run(Path(args.out))["train_config"]
        opts = stored.get("task_options", {})
        base.update(task=stored.get("task"), preset=stored.get("preset"), seed=stored.get("seed"),
                    precision=stored.get("precision"), min_len=opts.get("min_len"), max_len=opts.get("max_len"),
                    symbols=opts.get("n_symbols"))
        if "steps" not in given and "time_budget" not in given:
            base.update(steps=stored.get("steps"), time_budget=stored.get("time_budget"))
    opts = {**base, **given}
    if opts.get("task") is None:
        raise ValueError("--task is required (reverse or sort), unless --resume")
    if opts.get("steps") is not None and opts["steps"] < 1:
        raise ValueError(f"--steps must be ≥ 1, got {opts['steps']}")
    if opts.get("time_budget") is not None and not opts["time_budget"] > 0:
        raise ValueError(f"--time-budget must be > 0 minutes, got {opts['time_budget']}")
    return opts


def _seq2seq(args: argparse.Namespace) -> int:
    from qkv.lab.seq2seq import train
    from qkv.lab.tasks import get_task

    o = _options(args)
    task = get_task(o["task"], n_symbols=o["symbols"], min_len=o["min_len"], max_len=o["max_len"])
    r = train(task, preset=o["preset"], steps=o.get("steps"), time_budget=o.get("time_budget"), seed=o["seed"],
              out=args.out, resume=args.resume, precision=o["precision"], progress=args.progress)
    if r.status != "complete":
        print(f"interrupted after step {r.steps}; checkpoint saved. Continue with:\n"
              f"  qkv lab seq2seq --out {args.out} --resume")
        return 130
    print(f"{r.task}: exact match {r.exact_match:.4f} on {r.eval_examples} held-out examples "
          f"(chance {r.chance:.2g}); {r.steps} steps in {r.wall_s:.1f} s ({r.precision}); model in {r.model_dir}")
    return 0


def _image_positions(args: argparse.Namespace) -> int:
    import json

    from qkv.lab.image_positions import run_image_positions

    try:
        model = json.loads(args.model) if args.model else {}
    except ValueError as e:
        raise ValueError(f"--model {args.model!r} is not JSON ({e}); e.g. --model '{{\"image\": {{\"patch\": 2}}}}'")
    if not isinstance(model, dict):
        raise ValueError(f"--model must be a JSON object of model fields, got {args.model!r}")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be ≥ 1, got {args.steps}")
    if args.time_budget is not None and not args.time_budget > 0:
        raise ValueError(f"--time-budget must be > 0 minutes, got {args.time_budget}")
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    result = run_image_positions(args.out, preset=args.preset, data=args.data, seeds=args.seeds, steps=args.steps,
                                 time_budget=args.time_budget, batch_size=args.batch_size, model=model,
                                 variants=variants)
    print(result.markdown.split("\n", 2)[2].rstrip())
    print(f"written: {Path(args.out) / 'verdict.md'}, verdict.json and one run folder per variant and seed")
    return 0
