"""``qkv analyze`` and ``qkv inspect``: parse, build options, one library call, print where it went.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse

__all__ = ["add_analysis_parsers"]


def add_analysis_parsers(sub) -> None:
    """Add the ``analyze`` and ``inspect`` subcommands to ``sub`` (an argparse subparsers object)."""
    a = sub.add_parser(
        "analyze",
        help="layer and head statistics of a model over a corpus, as a report",
        description="Run MODEL (a qkv or Hugging Face BERT folder) over a corpus and write report.html "
        "(self-contained), report.md, PNG figures and analysis.json into --out: per-layer anisotropy, "
        "self- and intra-context similarity (Ethayarajh 2019), CKA between layers, linear probes, and "
        "per-head attention entropy, distance and [CLS]/[SEP]/self/previous/next shares (Clark et al. "
        "2019). See docs/analysis.md.",
    )
    a.add_argument("model", help="model folder")
    a.add_argument("--corpus", action="append", required=True, metavar="SPEC",
                   help="file, folder or dataset:NAME[:SPLIT] (repeatable), e.g. dataset:20newsgroups:test")
    a.add_argument("--out", required=True, help="report folder (created)")
    a.add_argument("--max-docs", type=int, default=None, help="seeded random sample of this many documents")
    a.add_argument("--max-len", type=int, default=128,
                   help="window length in tokens incl. [CLS]/[SEP] (default 128; 0 = the model's window)")
    a.add_argument("--long-text", choices=("window", "truncate", "error"), default="window",
                   help="texts longer than the window: split into windows (default), keep the first, or fail")
    a.add_argument("--max-windows", type=int, default=None, help="at most this many windows per document")
    a.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default 16)")
    a.add_argument("--token-sample", type=int, default=4000, help="tokens sampled for anisotropy/CKA/probes")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="run the model in float32 (default), bfloat16 (CPUs with AVX-512 BF16 or AMX) or "
                   "calibrated int8; see docs/inference.md")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    a.set_defaults(func=_analyze)

    i = sub.add_parser(
        "inspect",
        help="attention heatmaps and an offline interactive viewer for one text",
        description="Run MODEL on TEXT (or the pair TEXT, --pair) and write attention_layer_K.png "
        "(all heads of layer K), attention_overview.png and viewer.html (single file, works offline: "
        "choose layer and head, hover tokens, model view) into --out.",
    )
    i.add_argument("model", help="model folder")
    i.add_argument("text", help="the text")
    i.add_argument("--pair", default=None, metavar="TEXT_B", help="a second segment: [CLS] a [SEP] b [SEP]")
    i.add_argument("--out", required=True, help="output folder (created)")
    i.add_argument("--truncate", action="store_true",
                   help="cut a text longer than the model's window instead of failing")
    i.set_defaults(func=_inspect)



def _analyze(args: argparse.Namespace) -> int:
    from qkv.analysis.analyze import AnalyzeOptions, run_analyze

    opts = AnalyzeOptions(
        max_len=args.max_len or None, long_text=args.long_text, max_windows_per_doc=args.max_windows,
        batch_size=args.batch_size, token_sample=args.token_sample, seed=args.seed, precision=args.precision,
    )
    result, paths = run_analyze(args.model, args.corpus, args.out, opts, max_docs=args.max_docs,
                                progress=not args.quiet)
    print(f"analysed {result.n_docs} documents ({result.n_contexts} windows, {result.n_tokens} tokens) "
          f"in {result.seconds['total']:.1f} s")
    print(f"report: {paths['html']}  (also {paths['md'].name}, {paths['json'].name}, figures *.png)")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from qkv.analysis.viewer import run_inspect

    ins, paths = run_inspect(args.model, args.text, args.out, text_b=args.pair,
                             long_text="truncate" if args.truncate else "error")
    if "generated" in paths:  # an encoder-decoder: its output and the cross-attention maps
        n_layers, n_heads, t, s = ins.cross_attentions.shape
        print(f"{s} source tokens → {' '.join(ins.output_tokens)}; {n_layers} layers × {n_heads} heads")
        print(f"cross-attention: {paths['viewer']} (interactive), {paths['cross_1']}  (also "
              "cross_attention_layer_*.png, decoder_attention_layer_*.png, encoder_attention_layer_*.png)")
        return 0
    n_layers, n_heads, t, _ = ins.attentions.shape
    print(f"{t} tokens, {n_layers} layers × {n_heads} heads")
    print(f"viewer: {paths['viewer']}  (also {paths['overview'].name} and attention_layer_*.png)")
    return 0
