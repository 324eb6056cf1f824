"""``qkv export MODEL --onnx OUT``: the encoder as an ONNX file, checked in ONNX Runtime."""

from __future__ import annotations

import argparse

__all__ = ["add_export_parser"]


def add_export_parser(sub) -> None:
    """Add ``qkv export`` to ``sub`` (an argparse subparsers object)."""
    e = sub.add_parser("export", help="the encoder of a model as an ONNX file (dynamic batch and length)",
                       description="Export the encoder of MODEL (a qkv or Hugging Face folder) to --onnx OUT: "
                       "inputs input_ids, attention_mask (and token_type_ids with segment embeddings), "
                       "output last_hidden_state, dynamic batch and length up to the model's limit; "
                       "then run OUT in ONNX Runtime and compare with qkv on another padded batch "
                       "(max |diff| ≤ 1e-4, else no file is left). Relative, T5 and ALiBi position "
                       "biases are refused. See docs/deployment.md.")
    e.add_argument("model", help="model folder")
    e.add_argument("--onnx", required=True, metavar="OUT", help="the .onnx file to write")
    e.add_argument("--opset", type=int, default=None, help="ONNX opset (default 18)")
    e.add_argument("--force", action="store_true", help="replace an existing OUT file")
    e.add_argument("--no-check", action="store_true", help="skip the ONNX Runtime check")
    e.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from qkv.export.onnx import DEFAULT_OPSET, export_onnx

    r = export_onnx(args.model, args.onnx, opset=args.opset if args.opset is not None else DEFAULT_OPSET,
                    overwrite=args.force, check=not args.no_check)
    diff = "not checked" if r.max_diff is None else f"ONNX Runtime vs qkv max |diff| {r.max_diff:.2e}"
    print(f"wrote {r.path} ({r.size / 1e6:.1f} MB, opset {r.opset}; inputs {', '.join(r.inputs)}; "
          f"output {r.output}); {diff}")
    return 0
