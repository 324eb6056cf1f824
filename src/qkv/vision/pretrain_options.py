"""The image objective of ``qkv pretrain`` (``--objective image``): its options, its configuration
from the command line, its closing lines. :mod:`qkv.training.cli` runs it.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse

from qkv.training.config import parse_json_object
from qkv.vision.config import ImageTrainConfig

__all__ = ["IMAGE_OPTIONS", "add_image_options", "image_rows", "image_config", "report_image_run"]

#: (flag, field, type, help) of the image objectives' own options.
IMAGE_OPTIONS = [
    ("--data", "data", str, "image objective: training images, dataset:NAME[:SPLIT] (fashion-mnist, digits, mnist1d) "
     "or a folder with one sub-folder of PNG/JPEG images per class (default: the recipe's)"),
    ("--eval-data", "eval_data", str, "image objective: held-out images (default: the named dataset's test split, "
     "else --eval-fraction of the folder)"),
    ("--augment", "augment", str, "image objective: comma-separated flip, shift, erase, or none (default: the recipe's)"),
    ("--label-smoothing", "label_smoothing", float, "image classification: label smoothing of the loss"),
    ("--pooling", "pooling", str, "image classification: cls, mean or pooler (default: the recipe's)"),
    ("--eval-sample", "eval_sample", int, "image objective: held-out images scored at each evaluation "
     "during training; all at the end"),
]
#: The pretrain options an image run reads too.
_SHARED = ("preset", "eval_fraction", "steps", "batch_size", "warmup_steps", "eval_every", "save_every", "seed")
_TEXT_ONLY = ("corpus", "eval_corpus", "tokenizer", "vocab_size", "max_len", "doc_sep", "text_field",
              "encoding_errors", "max_doc_bytes", "long_docs", "select_rate", "mask_rate", "random_rate",
              "position_lr_scale", "eval_batches", "eval_batch_size", "init_from", "whole_word", "unigram_bias",
              "lowercase")


def add_image_options(p: argparse.ArgumentParser) -> None:
    """Add :data:`IMAGE_OPTIONS` to the training command's parser."""
    for flag, name, typ, text in IMAGE_OPTIONS:
        p.add_argument(flag, dest=name, type=typ, default=None, help=text)


def image_rows(options) -> list:
    """The rows of the training command's option table (flag, field, type, help) an image run reads."""
    own = {f for _, f, _, _ in IMAGE_OPTIONS}
    loop = ("time_budget", "grad_accum", "lr", "weight_decay", "schedule", "clip_norm", "device", "precision",
            "threads", "log_every")
    return [r for r in options if r[1] in _SHARED or r[1] in own or r[1] in loop]


def image_config(args: argparse.Namespace, given: dict):
    """The :class:`~qkv.vision.config.ImageTrainConfig` of the command line; ``given`` holds the options
    the user set (of :func:`image_rows`)."""
    text = [n for n in _TEXT_ONLY if getattr(args, n, None) not in (None, [])]
    if text:
        flags = ", ".join("--" + n.replace("_", "-") for n in text)
        raise ValueError(f"{flags}: text option(s), not used by --objective {args.objective} (images come from --data)")
    data = dict(given)
    data.pop("eval_batch_size", None)
    if args.model:
        data["model"] = parse_json_object(args.model, "--model")
    data.update(out=args.out, objective=args.objective)
    return ImageTrainConfig.from_dict(data)


def report_image_run(result) -> None:
    """Print a finished image run's held-out accuracy and where it went."""
    r = result.report
    print(f"held-out accuracy {r['accuracy']:.4f} on {r['eval_images']} images ({r['held_out']}; majority "
          f"baseline {r['majority_baseline']:.4f}) after {r['train_minutes']:g} min of training")
    print(f"run folder: {result.out}  (report: {result.out / 'report.json'}, curve: {result.out / 'curve.png'}; "
          f"model: qkv.load('{result.out}'))")
