"""``qkv convert SRC DST`` (qkv ⇄ Hugging Face, → sentence-transformers) and ``qkv export MODEL --onnx OUT``
(the encoder as an ONNX file, checked in ONNX Runtime).

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse

from qkv.checkpoints.convert import convert
from qkv.embeddings.cli import convert_embed_options
from qkv.embeddings.cli_options import add_convert_embed_options

__all__ = ["add_convert_parser", "add_export_parser"]


def add_convert_parser(sub) -> None:
    """Add ``qkv convert`` to ``sub`` (an argparse subparsers object)."""
    convert = sub.add_parser(
        "convert",
        help="convert a checkpoint folder: Hugging Face (BERT, RoBERTa, DistilBERT, ELECTRA, ModernBERT, "
        "GPT-2) <-> qkv, or -> sentence-transformers",
        description="Convert a model folder. A Hugging Face folder (config.json with model_type "
        "bert, roberta, distilbert, electra, modernbert or gpt2 + model.safetensors or pytorch_model.bin) "
        "becomes a qkv folder; a qkv folder (qkv.json + model.safetensors) becomes a folder that "
        "transformers' from_pretrained loads, of the family the model came from (BERT for a "
        "model trained in qkv; GPT-2 for a causal language model built from the gpt2 preset); with "
        "--to sentence-transformers either becomes a folder that "
        "sentence_transformers.SentenceTransformer loads (pooling, normalisation and window from "
        "the flags, else from SRC). Options a family cannot express, and heads qkv cannot "
        "represent, are refused by name. The tokenizer travels along.",
    )
    convert.add_argument("src", help="the folder to read")
    convert.add_argument("dst", help="the folder to write: missing, empty, or a model folder (replaced "
                         "as a whole); a folder holding other files is refused")
    convert.add_argument("--to", choices=("qkv", "hf", "sentence-transformers"), default=None,
                         help="output format (default: the other one than src's); sentence-transformers: a "
                         "folder sentence_transformers.SentenceTransformer loads (docs/embeddings.md)")
    add_convert_embed_options(convert)
    convert.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    out = convert(args.src, args.dst, to=args.to, options=convert_embed_options(args))
    print(f"wrote {out}")
    return 0


def add_export_parser(sub) -> None:
    """Add ``qkv export`` to ``sub`` (an argparse subparsers object)."""
    e = sub.add_parser("export", help="the encoder of a model, or a whole pipeline, as an ONNX file (dynamic "
                       "batch and length)",
                       description="Export MODEL (a qkv or Hugging Face folder) to --onnx OUT: inputs input_ids, "
                       "attention_mask (and token_type_ids with segment embeddings), dynamic batch and length up "
                       "to the model's limit; the output of --pipeline: encoder (last_hidden_state, the "
                       "default), embeddings (sentence_embedding: pooled and normalised as qkv embed, the "
                       "folder's settings unless --pooling/--no-normalize), classifier (logits of a fine-tuned "
                       "model) or causal-lm (next-token logits). Then run OUT in ONNX Runtime and compare with "
                       "qkv on another padded batch (max |diff| ≤ 1e-4, else no file is left). OUT's folder is "
                       "created when missing. Relative, T5 and ALiBi position biases are refused. See "
                       "docs/deployment.md.")
    e.add_argument("model", help="model folder")
    e.add_argument("--onnx", required=True, metavar="OUT", help="the .onnx file to write")
    e.add_argument("--opset", type=int, default=None, help="ONNX opset (default 18)")
    e.add_argument("--force", action="store_true", help="replace an existing OUT file")
    e.add_argument("--no-check", action="store_true", help="skip the ONNX Runtime check")
    e.add_argument("--pipeline", default="encoder", choices=("encoder", "embeddings", "classifier", "causal-lm"),
                   help="what the graph computes (default encoder)")
    e.add_argument("--pooling", default=None, help="embeddings: pooling mode(s), e.g. mean or cls+mean (default: "
                   "the folder's, else mean)")
    e.add_argument("--no-normalize", action="store_true", help="embeddings: leave the vectors unnormalised")
    e.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from qkv.checkpoints.onnx import DEFAULT_OPSET, export_onnx
    from qkv.embeddings.options import EmbedOptions

    if args.pipeline != "embeddings" and (args.pooling is not None or args.no_normalize):
        raise ValueError("--pooling and --no-normalize shape the embeddings pipeline: add --pipeline embeddings")
    options = EmbedOptions(pooling=args.pooling, normalize=False if args.no_normalize else None)
    r = export_onnx(args.model, args.onnx, opset=args.opset if args.opset is not None else DEFAULT_OPSET,
                    overwrite=args.force, check=not args.no_check, pipeline=args.pipeline, options=options)
    diff = "not checked" if r.max_diff is None else f"ONNX Runtime vs qkv max |diff| {r.max_diff:.2e}"
    print(f"wrote {r.path} ({r.size / 1e6:.1f} MB, opset {r.opset}; inputs {', '.join(r.inputs)}; "
          f"output {r.output}); {diff}")
    return 0
