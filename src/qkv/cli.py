"""Command line: ``qkv SUBCOMMAND …`` — parse, build a dataclass or arguments, call the library."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qkv",
        description="qkv — transformer encoders built around self-attention.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="pretrain cpu-small on 20 Newsgroups for 8 minutes and show what it learned "
        "(or --attention: the core showcase)",
        description="Pretrain the cpu-small preset with masked-language modelling on the 20 Newsgroups "
        "training split for --minutes of wall-clock training (the learning rate decays to zero at the "
        "deadline, whatever the machine's speed), then show what it learned: held-out masked-token "
        "accuracy on the test split against the most-frequent-token baseline, fill-in-the-blank examples "
        "against the unigram baseline, which attention heads specialised, a heatmap PNG and an offline "
        "attention viewer. With --attention, instead run the showcase of the attention core: the "
        "textbook equations in NumPy against qkv's PyTorch attention, every similarity and path.",
    )
    demo.add_argument("--attention", action="store_true", help="run the attention-core showcase instead")
    demo.add_argument("--out", default="runs/demo", help="run folder (default runs/demo); a folder an "
                      "earlier qkv demo made is replaced, any other non-empty folder is refused")
    demo.add_argument("--minutes", type=float, default=8.0, help="training time in minutes (default 8; "
                      "data preparation, under a minute, and the final report come on top)")
    demo.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                      help="auto (default): bf16 mixed precision where the CPU has native bf16, else fp32")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)
    _add_convert(sub)
    from qkv.training.cli import add_pretrain_parser

    add_pretrain_parser(sub)
    from qkv.analysis.cli import add_analysis_parsers

    add_analysis_parsers(sub)
    from qkv.embeddings.cli import add_embedding_parsers

    add_embedding_parsers(sub)
    from qkv.experiments.cli import add_ablate_parser

    add_ablate_parser(sub)
    return parser


def _add_convert(sub) -> None:
    convert = sub.add_parser(
        "convert",
        help="convert a checkpoint folder: Hugging Face BERT <-> qkv",
        description="Convert a model folder. A Hugging Face BERT folder (config.json + "
        "model.safetensors or pytorch_model.bin) becomes a qkv folder; a qkv folder (qkv.json + "
        "model.safetensors) becomes a folder that transformers' from_pretrained loads. The "
        "tokenizer travels along.",
    )
    convert.add_argument("src", help="the folder to read")
    convert.add_argument("dst", help="the folder to write (replaced file by file if it exists)")
    convert.add_argument("--to", choices=("qkv", "hf"), default=None,
                         help="output format (default: the other one than src's)")
    convert.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    from qkv.models.errors import CheckpointError
    from qkv.models.io import convert

    try:
        out = convert(args.src, args.dst, to=args.to)
    except CheckpointError as e:
        print(f"qkv convert: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from qkv.demo import run_attention_demo
    from qkv.demo_pretrain import DemoError, run_pretrain_demo

    if args.attention:
        run_attention_demo(seed=args.seed)
        return 0
    try:
        figures = run_pretrain_demo(args.out, minutes=args.minutes, seed=args.seed, precision=args.precision)
    except DemoError as e:
        print(f"qkv demo: error: {e}", file=sys.stderr)
        return 2
    return 0 if figures.get("status", "complete") == "complete" else 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
