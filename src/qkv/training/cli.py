"""``qkv pretrain``: parse → :class:`TrainConfig` → :func:`pretrain`.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from qkv.validation import check_cpus

__all__ = ["add_pretrain_parser", "config_from_args", "given_options", "LOOP_OPTIONS", "parse_threads",
           "add_table_options", "add_run_arguments", "given_values", "split_specs", "report_interrupted"]


def parse_threads(text: str):
    if text == "adaptive":
        return text
    try:
        threads = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of threads or 'adaptive'") from None
    try:  # more threads than CPUs: each step waits on its slowest thread (10,000 of them: no step ends)
        check_cpus("--threads", threads)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--threads ")) from None
    return threads


_D = None  # marks "not given": every option defaults to None so that --resume can tell what was set

#: The training loop's options, shared with ``qkv finetune`` (flag, field, type, help).
LOOP_OPTIONS = [
    ("--time-budget", "time_budget", float, "train for this many minutes instead of --steps; the learning "
     "rate decays with elapsed time and reaches zero at the deadline"),
    ("--grad-accum", "grad_accum", int, "micro-batches per optimiser step"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (matrices only)"),
    ("--schedule", "schedule", str, "after warm-up: linear, cosine or constant"),
    ("--clip-norm", "clip_norm", float, "gradient clipping norm"),
    ("--device", "device", str, "auto, cpu or cuda"),
    ("--precision", "precision", str, "fp32, bf16 (mixed precision, float32 master weights; fp32 with a "
     "message where the CPU has no native bf16) or auto (bf16 where native)"),
    ("--threads", "threads", parse_threads, "intra-op CPU threads: a number, or 'adaptive' (with --time-budget: "
     "switch between all threads and one by measured step time as the machine's load changes)"),
    ("--log-every", "log_every", int, "log training metrics every N steps"),
    ("--strategy", "strategy", str, "under torchrun: ddp (every process holds the whole model) or fsdp (weights, "
     "gradients and optimiser state sharded over the processes; sharded checkpoints that resume on any number "
     "of processes; docs/scaling.md)"),
]

# (flag, field, type, help) — defaults come from TrainConfig and are shown in --help
_OPTIONS = [
    ("--objective", "objective", str, "mlm (masked-LM: an encoder), clm (next-token prediction: a causal LM, "
     "GPT-style; continue it with qkv generate), translation (an encoder-decoder on --corpus "
     "dataset:bible-en-es or dataset:bible-es-en; continue it with qkv translate), image (image "
     "classification: a Vision Transformer on --data; see docs/vision.md) or caption (image captioning: a "
     "ViT encoder and a text decoder on dataset:fashion-captions; continue it with qkv caption)"),
    ("--preset", "preset", str, "model preset: tiny, cpu-small, cpu-small-clm, mini, small, base, modernbert, "
     "gpt2; --objective image: vit-fashion, vit-mnist1d, vit-digits; --objective caption: caption-fashion "
     "(its default), caption-tiny"),
    ("--eval-corpus", "eval_corpus", str, "held-out corpus spec(s), comma-separated (default: the "
     "named test split, else a deterministic --eval-fraction of the documents)"),
    ("--eval-fraction", "eval_fraction", float, "share of documents held out when no split is named"),
    ("--tokenizer", "tokenizer", str, "reuse the tokenizer in this folder/file instead of training one"),
    ("--vocab-size", "vocab_size", int, "WordPiece vocabulary size of a trained tokenizer"),
    ("--max-len", "max_len", int, "block length in tokens, [CLS]/[SEP] included"),
    ("--doc-sep", "doc_sep", str, "plain text files: 'line' (one document per line) or 'blank' "
     "(documents separated by blank lines)"),
    ("--text-field", "text_field", str, "JSONL field holding the text"),
    ("--encoding-errors", "encoding_errors", str, "'strict' (stop at invalid UTF-8, naming file and "
     "byte offset) or 'replace'"),
    ("--max-doc-bytes", "max_doc_bytes", int, "longest document read in one piece, in UTF-8 bytes"),
    ("--long-docs", "long_docs", str, "a longer document: 'error' or 'split' (plain text, cut at whitespace)"),
    ("--steps", "steps", int, "optimiser steps (not used with --time-budget)"),
    ("--batch-size", "batch_size", int, "blocks per process per micro-batch"),
    ("--warmup-steps", "warmup_steps", int, "linear warm-up steps"),
    ("--position-lr-scale", "position_lr_scale", float, "learning-rate multiplier of learned position-bias "
     "tables (relative, relative-alibi, t5; no weight decay then)"),
    ("--select-rate", "select_rate", float, "share of tokens selected for prediction"),
    ("--mask-rate", "mask_rate", float, "share of selected tokens replaced by [MASK]"),
    ("--random-rate", "random_rate", float, "share of selected tokens replaced by a random token"),
    ("--eval-every", "eval_every", int, "evaluate every N steps (and at the end)"),
    ("--eval-batches", "eval_batches", int, "held-out batches per evaluation"),
    ("--eval-batch-size", "eval_batch_size", int, "held-out batch size"),
    ("--save-every", "save_every", int, "checkpoint every N steps (and at the end)"),
    ("--seed", "seed", int, "seed of weights, data order, masks and dropout"),
    ("--init-from", "init_from", str, "start from this model folder (a qkv run or model, or a Hugging Face "
     "BERT folder) and its tokenizer instead of a new model"),
] + LOOP_OPTIONS


def add_pretrain_parser(sub) -> None:
    from qkv.training.config import TrainConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    p = sub.add_parser(
        "pretrain",
        help="masked-LM (or, --objective clm, causal-LM) pretraining on a corpus; --objective image: "
        "a Vision Transformer on images; --objective caption: an image captioner",
        description="Pretrain a BERT-style masked-LM encoder, or with --objective clm a causal (GPT-style) "
        "language model scored on next-token prediction against unigram and bigram baselines. Trains a WordPiece tokenizer (or reuses "
        "one), tokenises the corpus once into a cached memory-mapped array, trains with dynamic masking, "
        "evaluates on held-out text, and writes a run folder (metrics.jsonl, curve.png, checkpoints, "
        "the final model loadable with qkv.load). Under `torchrun --nproc_per_node=K` it trains on K "
        "processes (--objective translation too: each process takes its share of the token-budget batches, "
        "--grad-accum of them per step). SIGINT/SIGTERM save a checkpoint and exit; --resume continues bit-identically.",
    )
    p.add_argument("--corpus", action="append", default=None, metavar="SPEC",
                   help="training text: a file (.txt, .jsonl, .gz), a folder, or dataset:NAME[:SPLIT] "
                   "with NAME in 20newsgroups, reuters8, reuters52, pydoc, kjv; repeatable")
    from qkv.vision.pretrain_options import add_image_options  # the image objectives' options (part of this command)

    add_image_options(p)
    add_run_arguments(p, "TrainConfig")
    p.add_argument("--model", metavar="JSON", help='ModelConfig overrides as JSON, e.g. \'{"norm": "pre"}\'')
    add_table_options(p, _OPTIONS, defaults)
    p.add_argument("--whole-word", dest="whole_word", action="store_true", default=_D,
                   help="whole-word masking: select all pieces of a word or none")
    p.add_argument("--no-unigram-bias", dest="unigram_bias", action="store_false", default=_D,
                   help="start the output bias at zero instead of the log unigram frequencies")
    p.add_argument("--cased", dest="lowercase", action="store_false", default=_D,
                   help="do not lower-case when training the tokenizer")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=_D,
                   help="no progress bar")
    p.set_defaults(func=_run)


def add_table_options(p: argparse.ArgumentParser, options, defaults: dict | None = None) -> None:
    """Add the (flag, field, type, help) rows of ``options`` to ``p``, each defaulting to ``None``
    ("not given"); with ``defaults`` (field → default) the help ends with ``(default: …)``."""
    for flag, name, typ, text in options:
        default = dataclasses.MISSING if defaults is None else defaults[name]
        shown = default is not dataclasses.MISSING and "(default" not in text  # a required field, or a text that says it
        p.add_argument(flag, dest=name, type=typ, default=_D, help=f"{text} (default: {default})" if shown else text)


def add_run_arguments(p: argparse.ArgumentParser, config_name: str) -> None:
    """Add ``--out`` (the run folder), ``--resume`` and ``--config`` (a JSON file of ``config_name``
    fields) — the run-folder options of ``qkv pretrain`` and ``qkv finetune``."""
    p.add_argument("--out", required=True, help="the run folder")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--config", help=f"a JSON file of {config_name} fields (command-line options override it)")


def given_values(args: argparse.Namespace, options) -> dict:
    """The fields of the (flag, field, type, help) rows of ``options`` that the command line gave."""
    return {name: getattr(args, name) for _, name, _, _ in options if getattr(args, name) is not None}


def split_specs(text: str) -> tuple[str, ...]:
    """A comma-separated list of corpus specs (``--eval-corpus``), empty items dropped."""
    return tuple(s for s in text.split(",") if s)


def report_interrupted(result, command: str) -> int:
    """Print how to continue a run stopped by a signal (``command``: the command line without
    ``--out``); returns the exit status 130."""
    print(f"interrupted after step {result.steps_done}; checkpoint saved. Continue with:\n"
          f"  {command} --out {result.out} --resume")
    return 130


def given_options(args: argparse.Namespace, options, switches: tuple[str, ...] = ()) -> dict:
    """The run's stored (``--resume``) or ``--config`` fields overlaid with the options given on the
    command line (``options``: (flag, field, type, help) rows; ``switches``: flag fields) — the
    shared first half of ``qkv pretrain`` and ``qkv finetune``'s argument handling."""
    from qkv.training.config import read_config_file
    from qkv.training.rundir import read_run

    base: dict = {}
    if args.resume:
        base = read_run(Path(args.out))["train_config"]
    elif args.config:
        base = read_config_file(args.config)
    given = given_values(args, options)
    given.update({name: getattr(args, name) for name in switches if getattr(args, name) is not None})
    return {**base, **given}


def config_from_args(args: argparse.Namespace):
    """The run's :class:`TrainConfig`: stored (resume) or file config, overlaid with given options."""
    from qkv.training.config import TrainConfig, parse_json_object

    data = given_options(args, _OPTIONS, ("whole_word", "lowercase", "progress", "unigram_bias"))
    if args.eval_corpus is not None:  # given on the command line: comma-separated
        data["eval_corpus"] = split_specs(args.eval_corpus)
    if args.corpus:
        data["corpus"] = tuple(args.corpus)
    if args.model:
        data["model"] = parse_json_object(args.model, "--model")
    data["out"] = args.out
    if "corpus" not in data:
        raise ValueError("--corpus is required (a file, a folder or dataset:NAME[:SPLIT])")
    return TrainConfig.from_dict(data)


#: ``--objective translation``: the options it reads (field → ``train_translation`` keyword).
_TRANSLATION = {"corpus": None, "preset": "preset", "vocab_size": "vocab_size", "steps": "steps",
                "time_budget": "time_budget", "lr": "lr", "warmup_steps": "warmup", "seed": "seed",
                "precision": "precision", "eval_every": "eval_every", "objective": None, "progress": "progress",
                "threads": "threads", "grad_accum": "grad_accum", "strategy": "strategy"}


def _run_kind(args: argparse.Namespace) -> str | None:
    """The ``kind`` in ``run.json`` of the run ``--resume`` continues (``None``: not resuming, or not a
    run folder — the ordinary path says so)."""
    if not args.resume:
        return None
    from qkv.training.rundir import read_run

    try:
        return read_run(Path(args.out)).get("kind")
    except (OSError, ValueError):
        return None


def _translation_run(args: argparse.Namespace) -> bool:
    """Whether the command line asks for (or resumes) a translation run."""
    if args.objective == "translation":
        return True
    return args.objective is None and _run_kind(args) == "translation"


def _run_translation(args: argparse.Namespace) -> int:
    """``--objective translation``: an encoder–decoder on ``dataset:bible-en-es`` or ``bible-es-en``
    (:func:`qkv.translation.train.train_translation`)."""
    from qkv.training.rundir import read_run
    from qkv.translation.train import train_translation

    given = given_values(args, _OPTIONS)
    if args.progress is not None:
        given["progress"] = args.progress
    other = [flag for flag, name, _, _ in _OPTIONS if name in given and name not in _TRANSLATION]
    other += [f"--{n.replace('_', '-')}" for n in ("whole_word", "unigram_bias", "lowercase")
              if getattr(args, n) is not None]
    if args.config or args.model or other:
        bad = other + (["--config"] if args.config else []) + (["--model"] if args.model else [])
        raise ValueError(f"{', '.join(bad)}: not option(s) of --objective translation; it reads --corpus, --preset, "
                         "--vocab-size, --steps, --time-budget, --lr, --warmup-steps, --seed, --precision, "
                         "--eval-every, --threads, --grad-accum, --strategy")
    if args.resume:
        stored = read_run(Path(args.out))["train_config"]
        kw = {k: stored[k] for k in ("preset", "steps", "time_budget", "seed", "precision", "eval_every",
                                     "vocab_size", "batch_tokens", "lr", "warmup", "smoothing")}
        kw["eval_pairs"], direction = stored["eval_pairs"], stored["direction"]
    else:
        corpus = args.corpus or []
        specs = {f"dataset:bible-{d}{s}": d for d in ("en-es", "es-en") for s in ("", ":train")}
        if len(corpus) != 1 or corpus[0] not in specs:
            raise ValueError("--objective translation trains on --corpus dataset:bible-en-es or "
                             f"dataset:bible-es-en (one of them), got {corpus or 'none'}")
        direction = specs[corpus[0]]
        kw = {_TRANSLATION[k]: v for k, v in given.items() if _TRANSLATION.get(k)}
    kw.setdefault("progress", given.get("progress", True))
    if args.resume and "threads" in given:
        kw["threads"] = given["threads"]
    run = train_translation(direction, out=args.out, resume=args.resume, **kw)
    if run.result.status != "complete":
        return report_interrupted(run.result, "qkv pretrain")
    ev = run.result.final_eval or {}
    print(f"held-out ({ev.get('eval_pairs', 0)} validation verses, greedy): BLEU {ev.get('bleu', float('nan')):.2f}, "
          f"chrF {ev.get('chrf', float('nan')):.2f}, loss {ev.get('eval_loss', float('nan')):.4f}")
    print(f"run folder: {run.out}  (curve: {run.out / 'curve.png'}, model: {run.out / 'model'}; "
          f"qkv translate {run.out / 'model'} \"TEXT\")")
    return 0


def _run(args: argparse.Namespace) -> int:
    from qkv.training.loop import pretrain
    from qkv.vision.pretrain_options import IMAGE_OPTIONS, image_config, image_rows, report_image_run

    if args.objective == "caption" or (args.objective is None and _run_kind(args) == "caption"):
        from qkv.vision.captioning import train_captions
        from qkv.vision.pretrain_options import caption_config, report_caption_run

        cfg = caption_config(args, given_options(args, image_rows(_OPTIONS + IMAGE_OPTIONS, "caption"), ("progress",)))
        result = train_captions(cfg, resume=args.resume)
        if result.status != "complete":
            return report_interrupted(result, "qkv pretrain --objective caption")
        report_caption_run(result)
        return 0
    if args.objective == "image":
        from qkv.vision.classify import train_images

        cfg = image_config(args, given_options(args, image_rows(_OPTIONS + IMAGE_OPTIONS), ("progress",)))
        result = train_images(cfg, resume=args.resume)
        if result.status != "complete":
            return report_interrupted(result, "qkv pretrain --objective image")
        report_image_run(result)
        return 0
    given = [flag for flag, name, _, _ in IMAGE_OPTIONS if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: image option(s), used by --objective image or caption only")
    if _translation_run(args):
        return _run_translation(args)
    cfg = config_from_args(args)  # errors: printed by qkv.cli.main
    result = pretrain(cfg, resume=args.resume)
    if result.status != "complete":
        return report_interrupted(result, "qkv pretrain")
    ev = result.final_eval or {}
    if ev and cfg.objective == "clm":
        print(f"held-out: loss {ev['eval_loss']:.4f}, perplexity {ev['perplexity']:.1f} (bigram baseline "
              f"{ev['bigram_perplexity']:.1f}, unigram {ev['unigram_perplexity']:.1f}), next-token accuracy "
              f"{ev['accuracy']:.4f} over {ev['scored_tokens']} tokens")
    elif ev:
        print(f"held-out: loss {ev['eval_loss']:.4f}, perplexity {ev['perplexity']:.1f}, "
              f"masked-token accuracy {ev['accuracy']:.4f} (most-frequent-token baseline "
              f"{ev['most_frequent_accuracy']:.4f}) over {ev['masked_tokens']} masked tokens")
    print(f"run folder: {result.out}  (curve: {result.out / 'curve.png'}, metrics: "
          f"{result.out / 'metrics.jsonl'}, model: qkv.load('{result.out}'))")
    return 0
