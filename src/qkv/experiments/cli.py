"""``qkv ablate``: parse → :class:`AblationConfig` → :func:`run_ablation`; ``--list-grids``.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from qkv.training.cli import add_table_options, given_values, split_specs
from qkv.validation import check_cpus

__all__ = ["add_ablate_parser", "config_from_args", "parse_set"]

# (flag, TrainConfig field, type, help)
_OPTIONS = [
    ("--preset", "preset", str, "model preset of every variant (grids default to mini)"),
    ("--steps", "steps", int, "optimiser steps per run"),
    ("--batch-size", "batch_size", int, "blocks per step"),
    ("--max-len", "max_len", int, "block length in tokens, [CLS]/[SEP] included"),
    ("--lr", "lr", float, "peak learning rate (variants with lr_scale multiply it)"),
    ("--device", "device", str, "auto, cpu or cuda"),
]


def add_ablate_parser(sub) -> None:
    p = sub.add_parser(
        "ablate",
        help="train the variants of an ablation grid under equal conditions and tabulate them",
        description="Lab grids (lab-projections, lab-scaling, lab-heads, lab-positions, lab-norm, "
        "lab-similarity; --list-grids) train small models on a synthetic task, no corpus: OUT/results.md "
        "gives every seed's held-out exact match, paired comparisons with Holm-corrected p-values and "
        "a verdict, OUT/attention.png the attention of the winner and the loser. Text grids: train every "
        "variant of a grid (built-in: projections, scaling, heads, similarity, "
        "positions, norm; or a JSON grid file) for --seeds seeds with everything else held equal — the "
        "same tokenizer, held-out text, data order, masks, token budget, optimiser and schedule — then "
        "write OUT/results.csv (one row per run), OUT/results.md (mean ± std over seeds of held-out MLM "
        "loss and masked-token accuracy, parameters, tokens/s and the grid's statistics; then the "
        "ranking over seeds with paired t-tests, and how it developed over the held-out evaluations) and "
        "OUT/loss_curves.png. Rerunning the same command skips finished runs and resumes an "
        "interrupted one. See docs/experiments.md.",
    )
    p.add_argument("--grid", metavar="NAME|FILE", help="a built-in grid name or a grid .json file")
    p.add_argument("--list-grids", action="store_true", help="list the built-in grids and exit")
    p.add_argument("--variants", metavar="NAME[,NAME]", default=None,
                   help="train only these of the grid's variants (default: all); the report covers them")
    p.add_argument("--corpus", action="append", default=None, metavar="SPEC",
                   help="training text: file, folder or dataset:NAME[:SPLIT]; repeatable")
    p.add_argument("--eval-corpus", metavar="SPEC[,SPEC]", default=None,
                   help="held-out text (default: the named test split, else a fixed 5%% of the documents, "
                   "the same for every seed)")
    p.add_argument("--out", metavar="DIR", help="the harness folder (rerun the same command to continue)")
    p.add_argument("--seeds", type=int, default=3, help="runs per variant, seeds 0…N-1 (default 3)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs trained at once, each in its own process (default 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per run (default cores // jobs, at most OMP_NUM_THREADS); equal numbers across different "
                   "--jobs need equal --threads")
    add_table_options(p, _OPTIONS)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a TrainConfig field (warmup_steps=50) or a model field (model.dropout=0) "
                   "for every variant; VALUE is JSON, else a string; repeatable")
    p.add_argument("--reuse", action="append", default=[], metavar="DIR",
                   help="an earlier harness folder (its --out): runs there that are the same run — same "
                   "configuration, seed, tokenizer and text — are copied instead of trained again "
                   "(e.g. the mini default, which every grid holds); repeatable")
    p.add_argument("--quiet", action="store_true", help="print only the final table")
    p.set_defaults(func=_run)


def parse_set(items: list[str]) -> dict:
    """``["lr=3e-4", "model.norm=pre"]`` → ``{"lr": 0.0003, "model": {"norm": "pre"}}``."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. warmup_steps=50 or model.dropout=0")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key.startswith("model."):
            out.setdefault("model", {})[key[len("model."):]] = value
        else:
            out[key] = value
    return out


def config_from_args(args: argparse.Namespace):
    from qkv.experiments.runner import AblationConfig

    if args.grid:  # an unknown grid is named as such, not as a missing --corpus
        from qkv.experiments.grid import load_grid

        load_grid(args.grid)
    given = (("--grid", args.grid), ("--corpus", args.corpus), ("--out", args.out))
    missing = [flag for flag, v in given if not v]
    if missing:
        raise ValueError(f"{', '.join(missing)} required (see qkv ablate --help; --list-grids lists grids)")
    overrides = {**parse_set(args.sets), **given_values(args, _OPTIONS)}
    eval_corpus = split_specs(args.eval_corpus) if args.eval_corpus else None
    command = ""
    if sys.argv[1:2] == ["ablate"]:
        command = "qkv ablate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    variants = None
    if args.variants is not None:
        variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
        if not variants:
            raise ValueError(f"--variants {args.variants!r}: give variant names separated by commas "
                             "(qkv ablate --list-grids lists them)")
    return AblationConfig(grid=args.grid, corpus=tuple(args.corpus), out=args.out, eval_corpus=eval_corpus,
                          seeds=args.seeds, jobs=args.jobs, threads=args.threads, overrides=overrides,
                          command=command, variants=variants, reuse=tuple(args.reuse))


def _list_grids() -> int:
    from qkv.experiments.grid import builtin_grids, load_grid
    from qkv.lab.grid import builtin_lab_grids, load_lab_grid

    print("Text grids (masked-LM pretraining on --corpus):")
    for name, question in builtin_grids().items():
        grid = load_grid(name)
        print(f"  {name}: {', '.join(grid.variants)}")
        print(f"      {question}")
    print("\nLab grids (synthetic tasks, no corpus: qkv ablate --grid NAME --out DIR --jobs 2):")
    for name, question in builtin_lab_grids().items():
        grid = load_lab_grid(name)
        print(f"  {name} [{grid.task}]: {', '.join(grid.variants)}")
        print(f"      {question}")
    return 0


#: options of text grids that a lab grid (a synthetic task, no corpus, its own model) refuses
_TEXT_ONLY = (("--corpus", "corpus"), ("--eval-corpus", "eval_corpus"), ("--preset", "preset"),
              ("--max-len", "max_len"), ("--device", "device"), ("--reuse", "reuse"))


def lab_config_from_args(args: argparse.Namespace):
    """The :class:`~qkv.lab.runner.LabRunConfig` of ``qkv ablate --grid <lab grid> …``."""
    from qkv.lab.runner import LabRunConfig

    given = [flag for flag, attr in _TEXT_ONLY if getattr(args, attr, None) not in (None, [], ())]
    if given:
        raise ValueError(f"{', '.join(given)}: not for lab grid {args.grid!r}, which trains on its synthetic task "
                         "(drop the option; --steps, --batch-size, --lr and --set change the runs)")
    if not args.out:
        raise ValueError("--out required: the lab's folder (rerun the same command to continue)")
    overrides = parse_set(args.sets)
    for flag, key, value in (("--steps", "steps", args.steps), ("--batch-size", "batch_size", args.batch_size),
                             ("--lr", "lr", args.lr)):
        if value is not None:
            overrides[key] = value
    variants = None
    if args.variants is not None:
        variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    command = "qkv ablate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["ablate"] else ""
    return LabRunConfig(grid=args.grid, out=args.out, seeds=args.seeds, jobs=args.jobs, threads=args.threads,
                        overrides=overrides, variants=variants, command=command)


def _exit_code(result) -> int:
    """130 for an interrupted harness (rerun to continue), 1 when a run failed (each named), else 0."""
    if result.status == "interrupted":
        print("interrupted; rerun the same command to continue")
        return 130
    if result.errors:
        for label, err in result.errors.items():
            print(f"qkv ablate: {label}: {err}", file=sys.stderr)
        return 1
    return 0


def _run_lab(args: argparse.Namespace) -> int:
    from qkv.lab.runner import run_lab

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    result = run_lab(lab_config_from_args(args), log=log, progress=not args.quiet)
    print(result.table)
    for c in result.comparisons:
        print(f"{c.a} vs {c.b}: {c.sentence()}")
    out = result.out
    print(f"\n{out / 'results.md'}, {out / 'results.csv'}, {out / 'accuracy.png'}, {out / 'attention.png'}")
    return _exit_code(result)


def _run(args: argparse.Namespace) -> int:
    if args.list_grids:
        return _list_grids()
    check_cpus("--jobs", args.jobs)  # each job a training process: more than the CPUs only wait on each other
    check_cpus("--threads", args.threads)
    from qkv.lab.grid import is_lab_grid

    if args.grid and is_lab_grid(args.grid):
        return _run_lab(args)
    from qkv.experiments.runner import run_ablation

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    result = run_ablation(config_from_args(args), log=log)
    print(result.table)
    print(f"\n{result.out / 'results.md'}, {result.out / 'results.csv'}, {result.out / 'loss_curves.png'}")
    return _exit_code(result)
