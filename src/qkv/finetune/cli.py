"""``qkv finetune`` and ``qkv predict``: parse → :class:`FinetuneConfig` → :func:`finetune`.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from qkv.training.cli import LOOP_OPTIONS, add_run_arguments, add_table_options, report_interrupted

__all__ = ["add_finetune_parsers", "config_from_args"]


def _csv(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _baselines(text: str) -> tuple[str, ...]:
    return () if text.strip().lower() == "none" else _csv(text)


# (flag, field, type, help) — defaults come from FinetuneConfig and are shown in --help; the loop's
# options (lr, schedule, time budget, precision, threads, …) are pretraining's
_OPTIONS = [
    ("--task", "task", str, "sequence-classification, token-classification or regression"),
    ("--eval", "eval", _csv, "held-out data spec(s), comma-separated (default: the named dataset's test split, "
     "else a seeded --eval-fraction of the training examples)"),
    ("--eval-fraction", "eval_fraction", float, "share of training examples held out when no --eval is given"),
    ("--text-field", "text_field", str, "JSONL field / CSV column of the text"),
    ("--label-field", "label_field", str, "JSONL field / CSV column of the label (or regression target)"),
    ("--encoding-errors", "encoding_errors", str, "'strict' (stop at invalid UTF-8, naming file and line; the "
     "default) or 'replace' (U+FFFD for bad bytes)"),
    ("--tokens-field", "tokens_field", str, "JSONL field of the word list (token-classification)"),
    ("--tags-field", "tags_field", str, "JSONL field of the tag list (token-classification)"),
    ("--labels", "labels", _csv, "the label set in id order, comma-separated (default: sorted training labels, or "
     "the model's head labels)"),
    ("--max-len", "max_len", int, "tokens per window, the tokenizer's special tokens included (default: 128, or "
     "the model's shorter window or pretraining block)"),
    ("--stride", "stride", int, "text tokens between window starts of a long text (default ¾ of a window)"),
    ("--pooling", "pooling", str, "sequence tasks: pooler (BERT's [CLS] -> dense -> tanh), cls or mean (default: "
     "the model's own head, else its family's, which converts back to Hugging Face)"),
    ("--classifier-dropout", "classifier_dropout", float, "dropout before the classifier"),
    ("--dropout", "dropout", float, "override the model's hidden dropout (default: keep it)"),
    ("--attention-dropout", "attention_dropout", float, "attention dropout (0 keeps the fused attention kernel)"),
    ("--epochs", "epochs", float, "passes over the training windows (not used with --steps/--time-budget)"),
    ("--steps", "steps", int, "optimiser steps (default: from --epochs)"),
    ("--batch-size", "batch_size", int, "windows per process per micro-batch"),
    ("--warmup-steps", "warmup_steps", int, "linear warm-up steps (default 10 %% of the steps)"),
    ("--eval-every", "eval_every", int, "steps between held-out evaluations on a sample (default ~4 per run)"),
    ("--save-every", "save_every", int, "steps between checkpoints (default: --eval-every)"),
    ("--eval-sample", "eval_sample", int, "held-out examples scored at the evaluations during training (the final "
     "report scores all)"),
    ("--eval-batch-size", "eval_batch_size", int, "windows per batch when scoring"),
    ("--max-train", "max_train", int, "use a seeded random subsample of at most N training examples"),
    ("--max-eval", "max_eval", int, "use a seeded random subsample of at most N held-out examples"),
    ("--baselines", "baselines", _baselines, "comma-separated: tfidf, frozen (sequence tasks), word-tag (token "
     "tasks), or none"),
    ("--seed", "seed", int, "seed of the new head, data order and dropout"),
] + LOOP_OPTIONS


def add_finetune_parsers(sub) -> None:
    from qkv.finetune.config import FinetuneConfig

    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)}
    p = sub.add_parser(
        "finetune",
        help="fine-tune an encoder for sequence classification, token classification or regression",
        description="Put a task head on a pretrained encoder (a qkv model or run folder, or a Hugging Face BERT "
        "folder, with or without a head) and train it. Data: dataset:NAME[:SPLIT] (20newsgroups, reuters8, "
        "reuters52, kjv), .jsonl (text + label, or tokens + tags), .csv/.tsv with a header row, or CoNLL-style "
        "token files. Long texts are read in windows (every token seen; predictions averaged), or cut to one "
        "window with --truncate (counted). Every input problem is reported before training. Writes a run folder "
        "with metrics.jsonl, curve.png, checkpoints, the fine-tuned model (qkv.load / qkv predict / qkv convert), "
        "report.json/.md with accuracy, macro-F1 and per-class figures (entity F1 for tokens, RMSE and "
        "Pearson/Spearman for regression) against TF-IDF and frozen-vector baselines on the same split, and "
        "confusion.png. SIGINT/SIGTERM save a checkpoint; --resume continues bit-identically.",
    )
    p.add_argument("model", help="the folder of the model to fine-tune")
    p.add_argument("--train", action="append", default=None, metavar="SPEC",
                   help="training data: dataset:NAME[:SPLIT], a .jsonl/.csv/.tsv file or a CoNLL file; repeatable")
    add_run_arguments(p, "FinetuneConfig")
    add_table_options(p, _OPTIONS, defaults)
    p.add_argument("--truncate", dest="truncate", action="store_true", default=None,
                   help="keep only the first window of a long text (counted and reported)")
    p.add_argument("--reset-head", dest="reset_head", action="store_true", default=None,
                   help="replace a task head the model already has (e.g. other labels)")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bars")
    p.set_defaults(func=_finetune)

    q = sub.add_parser(
        "predict",
        help="labels (and probabilities) of new texts, or of pictures, with a fine-tuned model or image classifier",
        description="Predict with a fine-tuning run folder (or any folder with a task head): a text file (one "
        "input per line), .jsonl/.csv/.tsv (the --text-field; an 'id' field is kept), or for token models a "
        "CoNLL file or .jsonl with --tokens-field. Writes JSONL: id, label and probabilities per label "
        "(classification), value (regression), or tokens and tags. Long texts are read in the run's windows. "
        "With an image classifier (qkv pretrain --objective image, or a converted ViT): PNG/JPEG pictures or "
        "folders of them (at any depth), of the model's size (never resized); each line holds the picture's "
        "path as id, its label and the probabilities per label.",
    )
    q.add_argument("run", help="the fine-tuning run (or model) folder, or an image classifier's")
    q.add_argument("input", nargs="+", help="the inputs: one text file; or, for an image classifier, pictures "
                   "and folders of pictures")
    q.add_argument("--out", required=True, help="the .jsonl file to write (atomically)")
    q.add_argument("--force", action="store_true",
                   help="replace an existing --out (atomically, when the new one is complete)")
    q.add_argument("--text-field", default="text", help="field/column of the text (default: text)")
    q.add_argument("--tokens-field", default="tokens", help="field of the word list (default: tokens)")
    q.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict",
                   help="'strict' (stop at invalid UTF-8, naming file and line; default) or 'replace' (U+FFFD)")
    q.add_argument("--batch-size", type=int, default=64, help="windows per batch at most (default: 64)")
    q.add_argument("--batch-tokens", type=int, default=4096,
                   help="tokens per padding-free batch at most (a longer window runs alone; default: 4096)")
    q.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"),
                   help="inference precision: fp32, bf16 (CPUs with AVX-512 BF16 or AMX, GPUs with bf16) or int8 "
                   "(CPU; see docs/inference.md for the accuracy bounds) (default: fp32)")
    q.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    q.add_argument("--mirror", action="store_true",
                   help="image classifiers: average each picture's probabilities with its mirror image's "
                   "(test-time mirroring; for models trained with --augment flip)")
    q.add_argument("--no-progress", dest="progress", action="store_false", default=True, help="no progress bar")
    q.set_defaults(func=_predict)


def config_from_args(args: argparse.Namespace):
    """The run's :class:`FinetuneConfig`: stored (resume) or file config, overlaid with given options."""
    from qkv.finetune.config import FinetuneConfig
    from qkv.training.cli import given_options

    data = given_options(args, _OPTIONS, ("truncate", "reset_head", "progress"))
    if args.train:
        data["train"] = tuple(args.train)
    data.update(model=args.model, out=args.out)
    for name, flag in (("train", "--train"), ("task", "--task")):
        if name not in data:
            raise ValueError(f"{flag} is required")
    return FinetuneConfig.from_dict(data)


def _finetune(args: argparse.Namespace) -> int:
    from qkv.finetune.run import finetune

    cfg = config_from_args(args)
    result = finetune(cfg, resume=args.resume)
    if result.status != "complete":
        return report_interrupted(result, f"qkv finetune {cfg.model}")
    print(f"run folder: {result.out}  (report: {result.out / 'report.md'}, curve: {result.out / 'curve.png'}"
          + (f", confusion matrix: {result.out / 'confusion.png'}" if cfg.task == "sequence-classification" else "")
          + f"; predict: qkv predict {result.out} INPUT --out predictions.jsonl)")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from qkv.errors import QkvError
    from qkv.finetune.predict import predict_file
    from qkv.vision.pictures import is_image_model_folder, is_picture_spec

    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} must be ≥ 1")
    if args.batch_tokens < 1:
        raise ValueError(f"--batch-tokens {args.batch_tokens} must be ≥ 1")
    if is_image_model_folder(args.run):
        return _predict_pictures(args)
    if args.mirror:
        raise QkvError("--mirror is for image classifiers (each picture also scored mirrored); "
                       f"{args.run} is not one: drop --mirror")
    pictures = [s for s in args.input if is_picture_spec(s)]
    if pictures and Path(args.run).exists():
        raise QkvError(f"{args.run} is a text model; it reads text, not pictures ({pictures[0]}): give it a text "
                       "file, or give the pictures to an image classifier (qkv pretrain --objective image)")
    if len(args.input) != 1:
        raise QkvError(f"a text model predicts one input file at a time; got {len(args.input)} "
                       f"({', '.join(args.input[:3])}): join them into one file")
    info = predict_file(args.run, args.input[0], args.out, replace=args.force, batch_size=args.batch_size, text_field=args.text_field,
                        tokens_field=args.tokens_field, encoding_errors=args.encoding_errors,
                        progress=args.progress, device=args.device, precision=args.precision,
                        batch_tokens=args.batch_tokens)
    extra = f", {info['long']} long inputs read in several windows" if info["long"] else ""
    print(f"wrote {info['inputs']} predictions to {info['out']} ({info['windows']} windows{extra})")
    return 0


def _predict_pictures(args: argparse.Namespace) -> int:
    from qkv.vision.predict import predict_pictures

    info = predict_pictures(args.run, args.input, args.out, replace=args.force, batch_size=args.batch_size,
                            mirror=args.mirror)
    for note in info["notes"]:
        print(f"note: {note}")
    print(f"wrote {info['inputs']} predictions to {info['out']}")
    return 0
