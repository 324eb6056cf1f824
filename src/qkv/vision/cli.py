"""``qkv caption MODEL PICTURE [PICTURE …]``: one greedy caption per picture, from a captioner folder
(a run of ``qkv pretrain --objective caption``, or a model folder of kind ``image_captioning``).

Library modules are imported inside the command function, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse

__all__ = ["add_caption_parser"]


def add_caption_parser(sub) -> None:
    p = sub.add_parser(
        "caption",
        help="caption pictures with an image-captioning model (qkv pretrain --objective caption)",
        description="Load an image-captioning model folder (a run of qkv pretrain --objective caption) and print "
        "one greedy caption per PICTURE (PNG or JPEG), in order. Every picture must have the model's size "
        "(e.g. 56×56 for dataset:fashion-captions; nothing is resized) and is read as grey or colour as the "
        "model reads it. An unreadable, empty or wrongly sized picture, or a model that is not a captioner, is "
        "one line and exit 2; nothing is written.",
    )
    p.add_argument("model", help="the model folder (a captioning run folder)")
    p.add_argument("pictures", nargs="+", metavar="PICTURE", help="PNG or JPEG pictures of the model's size")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="words per caption at most (default: the decoder's window less one)")
    p.add_argument("--with-names", action="store_true", help="print each caption after its file name and a tab")
    p.set_defaults(func=_caption)


def _caption(args: argparse.Namespace) -> int:
    import qkv
    from qkv.validation import MAX_NEW_TOKENS, check_at_most
    from qkv.vision.caption import caption_pictures, check_captioner

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    check_at_most("--max-new-tokens", args.max_new_tokens, MAX_NEW_TOKENS, why="the most one caption may write")
    model, tokenizer = qkv.load(args.model)
    try:
        check_captioner(model)
    except ValueError as e:
        raise ValueError(f"{args.model}: {e}") from None
    if tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer (tokenizer.json): a captioner's folder holds the one it "
                         "writes words with")
    try:
        captions = caption_pictures(model, tokenizer, args.pictures, max_new_tokens=args.max_new_tokens)
    except ValueError as e:
        raise ValueError(str(e).replace("max_new_tokens", "--max-new-tokens")) from None
    for path, text in zip(args.pictures, captions):
        print(f"{path}\t{text}" if args.with_names else text)
    return 0
