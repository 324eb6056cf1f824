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
        help="run the end-to-end showcase",
        description="Run the end-to-end showcase of the attention core: the textbook equations in "
        "NumPy against qkv's PyTorch attention, every similarity function and execution path.",
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)
    return parser


def _demo(args: argparse.Namespace) -> int:
    from qkv.demo import run_attention_demo

    run_attention_demo(seed=args.seed)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
