"""The image objectives of ``qkv pretrain`` (``--objective image``: classification; ``--objective
caption``: captioning): their options, their configurations from the command line, their closing
lines. :mod:`qkv.training.cli` runs them.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse

from qkv.training.config import parse_json_object
from qkv.vision.caption_config import CaptionTrainConfig
from qkv.vision.config import ImageTrainConfig

__all__ = ["IMAGE_OPTIONS", "add_image_options", "image_rows", "image_config", "report_image_run", "caption_config",
           "report_caption_run", "CLASSIFY_ONLY"]

#: (flag, field, type, help) of the image objectives' own options.
IMAGE_OPTIONS = [
    ("--data", "data", str, "image objectives: training images, dataset:NAME[:SPLIT] (fashion-mnist, digits, mnist1d) "
     "or a folder with one sub-folder of PNG/JPEG images per class; captioning: dataset:fashion-captions "
     "(default: the recipe's)"),
    ("--eval-data", "eval_data", str, "image objective: held-out images (default: the named dataset's test split, "
     "else --eval-fraction of the folder)"),
    ("--augment", "augment", str, "image objective: comma-separated flip, shift, erase, or none (default: the recipe's)"),
    ("--label-smoothing", "label_smoothing", float, "image objectives: label smoothing of the loss"),
    ("--pooling", "pooling", str, "image classification: cls, mean or pooler (default: the recipe's)"),
    ("--eval-sample", "eval_sample", int, "image objectives: held-out images (canvases) scored at each evaluation "
     "during training; all at the end"),
]
#: The image-classification options that captioning does not read (a flip would change the relations).
CLASSIFY_ONLY = ("eval_data", "augment", "pooling")
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


def image_rows(options, objective: str = "image") -> list:
    """The rows of the training command's option table (flag, field, type, help) an image run of
    ``objective`` (``image`` or ``caption``) reads."""
    caption = objective == "caption"
    own = {f for _, f, _, _ in IMAGE_OPTIONS} - (set(CLASSIFY_ONLY) if caption else set())
    shared = tuple(n for n in _SHARED if not (caption and n == "eval_fraction"))
    loop = ("time_budget", "grad_accum", "lr", "weight_decay", "schedule", "clip_norm", "device", "precision",
            "threads", "log_every")
    return [r for r in options if r[1] in shared or r[1] in own or r[1] in loop]


def _refuse_text(args: argparse.Namespace, objective: str) -> None:
    text = [n for n in _TEXT_ONLY if getattr(args, n, None) not in (None, [])]
    if text:
        flags = ", ".join("--" + n.replace("_", "-") for n in text)
        raise ValueError(f"{flags}: text option(s), not used by --objective {objective} (images come from --data)")


def image_config(args: argparse.Namespace, given: dict):
    """The :class:`~qkv.vision.config.ImageTrainConfig` of the command line; ``given`` holds the options
    the user set (of :func:`image_rows`)."""
    _refuse_text(args, args.objective)
    data = dict(given)
    data.pop("eval_batch_size", None)
    if args.model:
        data["model"] = parse_json_object(args.model, "--model")
    data.update(out=args.out, objective=args.objective)
    return ImageTrainConfig.from_dict(data)


def caption_config(args: argparse.Namespace, given: dict) -> CaptionTrainConfig:
    """The :class:`~qkv.vision.caption_config.CaptionTrainConfig` of the command line; ``given`` holds
    the options the user set or the resumed run stored (of :func:`image_rows` with ``caption``)."""
    _refuse_text(args, "caption")
    other = [f"--{n.replace('_', '-')}" for n in CLASSIFY_ONLY if getattr(args, n, None) is not None]
    if other:
        raise ValueError(f"{', '.join(other)}: image-classification option(s), not used by --objective caption "
                         "(held out: the canvases' test split; no augmentation, a flip would change the relations)")
    data = dict(given)
    data.pop("eval_batch_size", None)
    if args.model:
        data["model"] = parse_json_object(args.model, "--model")
    data.update(out=args.out, objective="caption")
    return CaptionTrainConfig.from_dict(data)


def report_image_run(result) -> None:
    """Print a finished image run's held-out accuracy and where it went."""
    r = result.report
    mirrored = (f"; {r['accuracy_mirrored']:.4f} with each image also scored mirrored" if "accuracy_mirrored" in r
                else "")
    print(f"held-out accuracy {r['accuracy']:.4f} on {r['eval_images']} images ({r['held_out']}; majority "
          f"baseline {r['majority_baseline']:.4f}{mirrored}) after {r['train_minutes']:g} min of training")
    print(f"run folder: {result.out}  (report: {result.out / 'report.json'}, curve: {result.out / 'curve.png'}; "
          f"model: qkv.load('{result.out}'))")


def report_caption_run(result) -> None:
    """Print a finished captioning run's scores against the baselines and where they went."""
    r = result.report
    m, b = r["model"], r["baselines"]
    cell = r["attention_in_cell"].get("all_names", {}).get("all_layers_heads_mean")
    print(f"held-out ({r['eval_canvases']} canvases with held-out combinations, greedy): exact match "
          f"{m['exact_match']:.4f}, BLEU {m['bleu']:.2f}; most frequent caption {b['most_frequent_caption']['exact_match']:.4f} / "
          f"{b['most_frequent_caption']['bleu']:.2f}; names without relations "
          f"{b['names_without_relations']['exact_match']:.4f} / {b['names_without_relations']['bleu']:.2f}")
    if cell is not None:
        print(f"attention in the named item's cell (layers' and heads' mean): {cell:.4f} (chance "
              f"{r['attention_in_cell']['chance']:.4f}) after {r['train_minutes']:g} min of training")
    print(f"run folder: {result.out}  (report: {result.out / 'report.md'}, curve: {result.out / 'curve.png'}; "
          f"qkv caption {result.out} picture.png)")
