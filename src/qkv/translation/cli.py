"""``qkv translate MODEL TEXT [TEXT …]`` (or ``--input FILE --output FILE``): translate with an
encoder–decoder folder and its tokenizer — a model trained by :mod:`qkv.translation.train`, or a
Marian (opus-mt) folder read by :func:`qkv.load`.

Library modules are imported inside the command function, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse

__all__ = ["add_translate_parser"]


def add_translate_parser(sub) -> None:
    p = sub.add_parser(
        "translate",
        help="translate text with an encoder-decoder model folder (greedy or beam search)",
        description="Load an encoder-decoder folder (kind encoder_decoder, with a translation tokenizer: "
        "[PAD] [BOS] [EOS] [UNK] as ids 0-3, as qkv.translation.train writes) and translate each TEXT, or "
        "each line of --input (empty lines are refused), in batches of similar length. Prints one "
        "translation per line, in order, or writes them to --output (atomically). A text longer than the "
        "model's window is refused.",
    )
    p.add_argument("model", help="the model folder")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="text to translate; several are batched")
    p.add_argument("--input", help="a file of texts (instead of TEXT): one per line, or .jsonl/.csv/.tsv with the "
                   "text in --text-field, each optionally .gz")
    p.add_argument("--text-field", default="text", help="JSONL field or CSV/TSV column of the text (default text)")
    p.add_argument("--output", help="write the translations here, one per line (default: print them)")
    p.add_argument("--force", action="store_true", help="replace an existing --output (atomically)")
    p.add_argument("--beams", type=int, default=1, help="beam search with this many beams (default 1: greedy)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per translation at most (default: twice the source plus 10, within the window)")
    p.add_argument("--batch-size", type=int, default=32, help="texts decoded together (default 32)")
    p.set_defaults(func=_translate)


def _translate(args: argparse.Namespace) -> int:
    from pathlib import Path

    import qkv
    from qkv._fs import atomic_write_text, check_output_path
    from qkv.data.readers import read_records
    from qkv.models.seq2seq import EncoderDecoder
    from qkv.translation.translate import translate
    from qkv.validation import MAX_BEAMS

    if bool(args.texts) == bool(args.input):
        raise ValueError("give the texts to translate either as TEXT arguments or as --input FILE (one of them)")
    for flag, value in (("--beams", args.beams), ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: give at least 1")
    if args.beams > MAX_BEAMS:  # before the model is loaded: the beams' cache would not fit in memory
        raise ValueError(f"--beams {args.beams:,} is above {MAX_BEAMS} (the most beams of one search); give fewer")
    if args.output:
        check_output_path(args.output, "--output", inputs=(args.input,) if args.input else (), replace=args.force)
    if args.input:
        texts = [text for _, text in read_records(args.input, text_field=args.text_field)]  # the one reader
        if not texts:
            raise ValueError(f"--input {args.input} is empty; give one text per line")
        empty = [i + 1 for i, t in enumerate(texts) if not t.strip()]
        if empty:
            raise ValueError(f"--input {args.input}: line {empty[0]} is empty ({len(empty)} empty lines); "
                             "give one text per line")
    else:
        texts = list(args.texts)
    model, tokenizer = qkv.load(args.model)
    if not isinstance(model, EncoderDecoder):
        raise ValueError(f"{args.model} holds a model of type {type(model).__name__}, not an encoder-decoder: translate needs a "
                         "model folder of kind encoder_decoder")
    if tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer (tokenizer.json): translate needs one to read and write text")
    try:
        out = translate(model.eval(), tokenizer, texts, beams=args.beams, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size)
    except ValueError as e:
        raise ValueError(str(e).replace("max_new_tokens", "--max-new-tokens")) from None
    if args.output:
        atomic_write_text(Path(args.output), "".join(t.replace("\n", " ") + "\n" for t in out))
    else:
        for t in out:
            print(t.replace("\n", " "))
    return 0
