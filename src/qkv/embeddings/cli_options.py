"""The embedding options of the command line, each defined once: the flags every embedding
subcommand (:mod:`qkv.embeddings.cli`) and ``qkv convert --to sentence-transformers`` add (the
one :class:`~qkv.embeddings.options.EmbedOptions` is read back from them in :mod:`qkv.embeddings.cli`).

Literal values here: building a parser must not import torch (the library is imported when a
command runs).
"""

from __future__ import annotations

import argparse

__all__ = ["EMBED_ARGS", "POOLINGS", "POOLING_HELP", "pooling_arg", "add_embed_options", "add_input_options",
           "add_convert_embed_options"]

#: qkv.embeddings.pooling.POOLINGS, without importing torch.
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
def pooling_arg(value: str) -> str:
    """``--pooling``: a mode, or several joined with ``+`` (checked here: the message lists them)."""
    for mode in value.split("+"):
        if mode not in POOLINGS:
            raise argparse.ArgumentTypeError(f"unknown pooling mode {mode!r} in {value!r}; allowed: "
                                             f"{', '.join(POOLINGS)}, or several joined with + "
                                             "(e.g. cls+mean)")
    return value


POOLING_HELP = ("MODE or MODE+MODE…: " + ", ".join(POOLINGS) + "; several are concatenated in the order "
                 "given (cls+mean: 2C-wide vectors)")


#: The embedding options of the command line, each defined once: ``EmbedOptions`` field → (flag,
#: argparse keywords). Every embedding subcommand adds them (or some of them) with
#: :func:`add_embed_options` and reads them back with :func:`embed_options` (fields it lacks keep their
#: ``EmbedOptions`` defaults). Literal values here: building the parser must not import torch.
EMBED_ARGS: dict[str, tuple[str, dict]] = {
    "pooling": ("--pooling", dict(type=pooling_arg, default=None, metavar="MODE",
                                  help=POOLING_HELP + " (default: what the model folder declares: "
                                  "embedding.json, sentence-transformers' 1_Pooling; else mean)")),
    "layers": ("--layers", dict(type=int, nargs="+", default=None, metavar="I",
                                help="hidden-state index(es), averaged: -1 last (default), 0 embedding "
                                "output, e.g. --layers -4 -3 -2 -1")),
    "normalize": ("--normalize", dict(action=argparse.BooleanOptionalAction, default=None,
                                      help="L2-normalise the vectors, or keep raw lengths with "
                                      "--no-normalize (default: what the model folder declares: "
                                      "embedding.json, a sentence-transformers Normalize module; else "
                                      "normalise)")),
    "batch_size": ("--batch-size", dict(type=int, default=256, help="at most this many windows per forward "
                                       "pass (default 256)")),
    "batch_tokens": ("--batch-tokens", dict(type=int, default=4096, help="at most this many tokens per "
                                            "forward pass (default 4096; windows are batched by length)")),
    "precision": ("--precision", dict(choices=("fp32", "bf16", "int8"), default="fp32",
                                      help="run the encoder in float32 (default), bfloat16 (CPUs with "
                                      "AVX-512 BF16 or AMX, GPUs) or int8 (CPU); accuracy of each: "
                                      "docs/inference.md")),
    "max_len": ("--max-len", dict(type=int, default=None, help="window length in tokens incl. [CLS]/[SEP] "
                                  "(default: the folder's, else the model's)")),
    "stride": ("--stride", dict(type=int, default=None, help="tokens between window starts (default: 3/4 "
                                "of the window: a quarter overlaps)")),
    "truncate": ("--truncate", dict(action="store_true", help="keep only the first window of a long "
                                    "document (reported) instead of averaging all")),
    "empty": ("--empty", dict(choices=("skip", "error", "zero"), default="skip",
                              help="empty documents: leave out (ids show which), fail, or a zero vector "
                              "(default skip)")),
    "device": ("--device", dict(default=None, help="cpu, cuda, cuda:1 … (default: cuda when available)")),
    "progress": ("--no-progress", dict(action="store_false", help="no progress bar")),
}


def add_embed_options(p: argparse.ArgumentParser, fields=tuple(EMBED_ARGS), *,
                       title: str | None = "embedding options", helps: dict | None = None) -> None:
    """Add the embedding options ``fields`` (all by default) to ``p``.

    Args:
        p: the subcommand's parser.
        fields: which of :data:`EMBED_ARGS`, in the order they are listed in the help.
        title: the help section they are listed under; ``None``: the parser's own options.
        helps: help texts that differ for this subcommand, by field (``None``: no help text).
    """
    g = p.add_argument_group(title) if title else p
    for name in fields:
        flag, kwargs = EMBED_ARGS[name]
        kwargs = {**kwargs, **({"help": helps[name]} if helps and name in helps else {})}
        g.add_argument(flag, dest=name, **kwargs)


def add_input_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input options")
    g.add_argument("--input-format", choices=("text", "jsonl", "csv", "tsv"), default=None,
                   help="default: by the name (*.jsonl, *.csv, *.tsv, each optionally .gz), else text (one "
                        "document per line)")
    g.add_argument("--text-field", default="text",
                   help="JSONL field or CSV/TSV column holding the text (default text)")
    g.add_argument("--id-field", default="id",
                   help="JSONL field or CSV/TSV column holding the id (default id; else the line number)")
    g.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict",
                   help="invalid UTF-8: fail with its line and offset (default), or read U+FFFD")


def add_convert_embed_options(p: argparse.ArgumentParser) -> None:
    """``qkv convert``'s options for ``--to sentence-transformers``: ``--pooling``, ``--max-len``,
    ``--normalize/--no-normalize`` (what the written folder declares)."""
    add_embed_options(p, ("pooling", "normalize", "max_len"), title="with --to sentence-transformers",
                       helps={"pooling": POOLING_HELP + " (default: what SRC declares, else mean)",
                              "normalize": "add the Normalize module (default: what SRC declares, else yes); "
                              "--no-normalize: raw vector lengths",
                              "max_len": "max_seq_length: the window in tokens incl. [CLS]/[SEP] (default: "
                              "what SRC declares, else the model's position limit)"})
