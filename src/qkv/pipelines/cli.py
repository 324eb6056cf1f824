"""``qkv fill-mask MODEL TEXT [TEXT …]``: a masked LM's most probable tokens for each mask token.

The model's own mask token marks the blank (``[MASK]`` for BERT, ``<mask>`` for RoBERTa); a text
written with the other family's (``[MASK]`` for a RoBERTa model) is read with the model's own. The
texts run as one padding-free batch (:func:`qkv.pipeline`, ``"fill-mask"``).

Library modules are imported inside the command function: ``qkv COMMAND`` builds only that
command's parsers (:data:`qkv.cli._GROUPS`).
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_fill_mask_parser"]

#: The mask tokens of the families, read as the model's own when its own is absent from a text.
_OTHER_MASKS = ("[MASK]", "<mask>")


def add_fill_mask_parser(sub) -> None:
    p = sub.add_parser(
        "fill-mask",
        help="a masked LM's most probable tokens for the mask token of each text",
        description="Load a masked-LM folder (qkv, Hugging Face BERT, RoBERTa, DistilBERT, ModernBERT …, or a "
        "bundled model's short name) and print the --top-k most probable tokens for each mask token of each "
        "text, with their probabilities and the completed text. Write the model's own mask token ([MASK] for "
        "BERT, <mask> for RoBERTa); [MASK] or <mask> is read as the model's own. The same results as "
        "qkv.pipeline('fill-mask', MODEL) and transformers' fill-mask pipeline.",
    )
    p.add_argument("model", help="the masked-LM folder (or a bundled model's short name)")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="text with one or more mask tokens; several are batched")
    p.add_argument("--top-k", type=int, default=5, help="tokens per mask (default 5)")
    p.add_argument("--json", action="store_true", help="one JSON line per text (the pipeline's records)")
    p.set_defaults(func=_fill_mask)


def _fill_mask(args: argparse.Namespace) -> int:
    from qkv.pipelines.factory import pipeline

    if args.top_k < 1:
        raise ValueError(f"--top-k {args.top_k}: give at least 1")
    fill = pipeline("fill-mask", args.model)
    own = fill.mask_token
    texts = []
    for text in args.texts:
        if own not in text:
            for other in _OTHER_MASKS:
                text = text.replace(other, own)
        texts.append(text)
    try:
        results = fill(texts, top_k=args.top_k)
    except ValueError as e:  # the library's words for the option: the command line's
        raise type(e)(str(e).replace("top_k=", "--top-k ")) from None
    for i, (text, result) in enumerate(zip(texts, results)):
        if args.json:
            print(json.dumps({"text": text, "predictions": result}, ensure_ascii=False))
            continue
        if i:
            print()
        print(text)
        for k, rows in enumerate(result if result and isinstance(result[0], list) else [result]):
            if isinstance(result[0], list):
                print(f"  mask {k + 1}:")
            for row in rows:
                print(f"  {row['score']:.4f}  {row['token_str'].strip()!s:<16} {row['sequence']}")
    return 0
