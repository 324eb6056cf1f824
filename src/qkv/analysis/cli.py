"""``qkv analyze``, ``qkv inspect`` and ``qkv findings``: parse, build options, one library call, print where it went.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_analysis_parsers"]


def add_analysis_parsers(sub) -> None:
    """Add the ``analyze``, ``inspect`` and ``findings`` subcommands to ``sub`` (an argparse subparsers object)."""
    a = sub.add_parser(
        "analyze",
        help="layer and head statistics of a model over a corpus, as a report",
        description="Run MODEL (a qkv or Hugging Face BERT folder) over a corpus and write report.html "
        "(self-contained), report.md, PNG figures and analysis.json into --out: per-layer anisotropy, "
        "self- and intra-context similarity (Ethayarajh 2019), CKA between layers, linear probes, and "
        "per-head attention entropy, distance and [CLS]/[SEP]/self/previous/next shares (Clark et al. "
        "2019). See docs/analysis.md. For an image model (qkv pretrain --objective image, a converted ViT): each "
        "head's mean attention distance per layer (the ViT paper's Figure 7) on --images held-out images of the "
        "model's training run (or --data), as attention_distance.md/.json/.png. See docs/vision.md.",
    )
    a.add_argument("model", help="model folder")
    a.add_argument("--corpus", action="append", default=None, metavar="SPEC",
                   help="text models (required for them): file, folder or dataset:NAME[:SPLIT] (repeatable), e.g. "
                   "dataset:20newsgroups:test")
    a.add_argument("--data", default=None, metavar="SPEC",
                   help="image models: dataset:NAME[:SPLIT] or a folder of pictures of the model's size (default: the "
                   "held-out images of the run the model was trained in)")
    a.add_argument("--images", type=int, default=500, metavar="N",
                   help="image models: a seeded sample of N images (default 500)")
    a.add_argument("--out", required=True, help="report folder (created)")
    a.add_argument("--max-docs", type=int, default=None, help="seeded random sample of this many documents")
    a.add_argument("--max-len", type=int, default=None,
                   help="window length in tokens incl. [CLS]/[SEP] (default 128, or the model's window where it is "
                   "shorter; 0 = the model's window; a value above the window is refused)")
    a.add_argument("--long-text", choices=("window", "truncate", "error"), default="window",
                   help="texts longer than the window: split into windows (default), keep the first, or fail")
    a.add_argument("--max-windows", type=int, default=None, help="at most this many windows per document")
    a.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default 16)")
    a.add_argument("--token-sample", type=int, default=4000, help="tokens sampled for anisotropy/CKA/probes")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="run the model in float32 (default), bfloat16 (CPUs with AVX-512 BF16 or AMX) or "
                   "calibrated int8; see docs/inference.md")
    a.add_argument("--ablation-contexts", type=int, default=8, metavar="N",
                   help="switch each head off alone on the first N windows and report the change of the output "
                   "(default 8; 0 = skip)")
    a.add_argument("--no-parity", dest="parity", action="store_false",
                   help="for a Hugging Face folder, skip comparing qkv's numbers with transformers' own")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    a.set_defaults(func=_analyze)

    i = sub.add_parser(
        "inspect",
        help="attention heatmaps, rollout, flow, value norms, head ablation and an offline viewer for one text",
        description="Run MODEL on TEXT (or the pair TEXT, --pair) and write into --out: attention_layer_K "
        "(all heads of layer K, from 0), attention_overview (layers × heads), methods (raw attention, value-norm "
        "weighted attention, rollout and flow per layer), ablation (what switching off each head does), for a "
        "sequence classifier importance (each token's importance to the predicted class: blank-out, input × gradient, "
        "integrated gradients, rollout, flow) — PNG "
        "and/or SVG — and viewer.html (one file, works offline: method switch, layer and head, head view, "
        "matrix view usable at 512 tokens, model view, ablation beside the maps, SVG/PNG export of every view). "
        "For a Hugging Face folder it also says how far qkv's numbers are from transformers' own. With "
        "--similar-to, instead explain the embedding similarity of TEXT and that text token pair by token pair. "
        "For an image model (qkv pretrain --objective image, a converted ViT, an image captioner) give a PNG/JPEG "
        "picture of the model's size instead of TEXT: image_attention_layer_K (each head's attention of the [CLS] "
        "token, or of --patch ROW,COL, over the picture), image_rollout, for a captioner cross_attention_layer_K "
        "(per written word of its greedy caption) and viewer.html (the picture with the selected token's attention "
        "over it, beside the patch-token views).",
    )
    i.add_argument("model", help="model folder")
    i.add_argument("text", help="the text (for an image model: the picture file)")
    i.add_argument("--patch", default=None, metavar="ROW,COL",
                   help="image models: draw this patch's attention (row and column on the patch grid, from 0) "
                   "instead of the [CLS] token's")
    i.add_argument("--pair", default=None, metavar="TEXT_B", help="a second segment: [CLS] a [SEP] b [SEP]")
    i.add_argument("--out", required=True, help="output folder (created)")
    i.add_argument("--truncate", action="store_true",
                   help="cut a text longer than the model's window instead of failing")
    i.add_argument("--format", default="png", metavar="FORMATS",
                   help="image formats of the figures, comma-separated: png, svg or png,svg (default png)")
    i.add_argument("--methods", default="raw,value_norm,rollout,flow", metavar="LIST",
                   help="views of the attention, comma-separated among raw, value_norm, rollout, flow (default all)")
    i.add_argument("--flow-max-tokens", type=int, default=48, metavar="N",
                   help="compute attention flow only for texts of at most N tokens (T² max-flow problems per layer; "
                   "default 48)")
    i.add_argument("--no-ablation", dest="ablation", action="store_false",
                   help="do not switch each head off to measure what it does to the output")
    i.add_argument("--no-parity", dest="parity", action="store_false",
                   help="for a Hugging Face folder, skip comparing qkv's numbers with transformers' own")
    i.add_argument("--no-importance", dest="importance", action="store_false",
                   help="for a sequence classifier, skip each token's importance to the predicted class (blank-out, "
                   "input × gradient, integrated gradients)")
    i.add_argument("--similar-to", default=None, metavar="TEXT_B",
                   help="explain the embedding cosine of TEXT and TEXT_B: every token pair's contribution (they sum "
                   "to the cosine) as similarity.png/.svg and similarity.json")
    i.set_defaults(func=_inspect)

    f = sub.add_parser(
        "findings",
        help="reproduce a published finding on a model: abnar (rollout/flow), michel (head pruning), kobayashi (value norms)",
        description="Measure one published finding about attention on MODEL (a qkv folder, or a Hugging Face one qkv "
        "loads) over --data, and write NAME.json, NAME.md (the table beside the paper's figures) and NAME.png/.svg "
        "into --out. abnar: per layer, the rank correlation of raw attention, rollout and flow with blank-out "
        "importance (a sequence classifier and its labelled data). michel: accuracy as heads are pruned, least "
        "important first (a sequence classifier; importance on half of the texts, accuracy on the other half). "
        "kobayashi: the share of attention on [CLS], [SEP] and punctuation by weight and by value norm (any "
        "encoder; text with punctuation). See docs/interpretability.md.",
    )
    f.add_argument("finding", choices=("abnar", "michel", "kobayashi"), help="which finding")
    f.add_argument("model", help="model folder")
    f.add_argument("--data", action="append", required=True, metavar="SPEC",
                   help="file, folder or dataset:NAME[:SPLIT] (repeatable), e.g. dataset:reuters8:test; abnar and "
                   "michel read labels from a named dataset or the 'label' field of JSONL records")
    f.add_argument("--out", required=True, help="output folder (created)")
    f.add_argument("--texts", type=int, default=64, metavar="N",
                   help="seeded sample of N texts (michel: 2N, half to rank the heads, half to score; default 64)")
    f.add_argument("--max-len", type=int, default=None, help="cut each text to this many tokens (default 64, or "
                   "the model's window where it is shorter; a value above the window is refused)")
    f.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    f.add_argument("--step", type=int, default=4, help="michel: heads pruned between two evaluations (default 4)")
    f.add_argument("--single", action="store_true", help="michel: also switch off each head alone (L·H evaluations)")
    f.add_argument("--target", choices=("probability", "logit"), default="probability",
                   help="abnar: blank-out importance as the drop of the predicted class's probability (default) or "
                   "its logit (which does not saturate when the model is sure)")
    f.add_argument("--no-flow", dest="flow", action="store_false",
                   help="abnar: leave out attention flow (the slowest view: max-flow problems per layer and text)")
    f.set_defaults(func=_findings)



def _analyze(args: argparse.Namespace) -> int:
    from qkv.analysis.analyze import AnalyzeOptions, run_analyze
    from qkv.errors import QkvError
    from qkv.vision.pictures import is_image_model_folder

    if is_image_model_folder(args.model):
        if args.corpus:
            raise QkvError(f"{args.model} is an image model; give its images with --data (or none: the held-out "
                           "images of its run), not --corpus")
        return _analyze_images(args)
    if args.data is not None:
        raise QkvError(f"--data is for image models; {args.model} reads text: give the texts with --corpus")
    if not args.corpus:
        raise QkvError("--corpus is required for a text model (e.g. --corpus dataset:20newsgroups:test)")

    opts = AnalyzeOptions(
        max_len=128 if args.max_len is None else args.max_len or None, fit_window=args.max_len is None,
        long_text=args.long_text, max_windows_per_doc=args.max_windows,
        batch_size=args.batch_size, token_sample=args.token_sample, seed=args.seed, precision=args.precision,
        ablation_contexts=args.ablation_contexts,
    )
    result, paths = run_analyze(args.model, args.corpus, args.out, opts, max_docs=args.max_docs,
                                progress=not args.quiet, parity=args.parity)
    print(f"analysed {result.n_docs} documents ({result.n_contexts} windows, {result.n_tokens} tokens) "
          f"in {result.seconds['total']:.1f} s")
    if result.parity is not None:
        p = result.parity
        print(f"parity with {p['reference']}: max |Δ| {p['output']} {p['output_diff']:.1e}, "
              f"attention weights {p['attention_diff']:.1e}")
    print(f"report: {paths['html']}  (also {paths['md'].name}, {paths['json'].name}, figures *.png)")
    return 0


def _analyze_images(args: argparse.Namespace) -> int:
    from qkv.vision.analyze_image import run_analyze_images

    _check_out_folder(Path(args.out), ("attention_distance.json", "analysis.json"), "analyze")
    report, paths = run_analyze_images(args.model, args.out, data=args.data, images=args.images, seed=args.seed,
                                       batch_size=args.batch_size)
    print(f"mean attention distance in pixels, {report.images} images ({report.source}); uniform attention "
          f"gives {report.uniform:.2f}:")
    print(report.table())
    print(f"written: {paths['md']}, {paths['json'].name}, {paths['png'].name}")
    return 0


def _findings(args: argparse.Namespace) -> int:
    from qkv.analysis.findings_run import run_findings
    from qkv.errors import QkvError
    from qkv.vision.pictures import is_image_model_folder

    if is_image_model_folder(args.model):
        raise QkvError(f"{args.model} is an image model; findings measures text encoders (for an image model's "
                       "attention distances: qkv analyze MODEL --data …)")
    _check_out_folder(Path(args.out), FINDINGS_MARKS, "findings")
    result, paths = run_findings(args.finding, args.model, args.data, args.out, n_texts=args.texts,
                                 max_len=args.max_len, seed=args.seed, step=args.step, single=args.single,
                                 flow=args.flow, target=args.target)
    print(paths["md"].read_text(encoding="utf-8").split("\n\n", 1)[1].rsplit("\n![", 1)[0].strip())
    print(f"\nwritten: {paths['md']}, {paths['json'].name}, " + ", ".join(
        p.name for k, p in paths.items() if k not in ("md", "json")))
    return 0


def _csv(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise ValueError(f"{flag} {text!r}: allowed {', '.join(allowed)} (comma-separated)")
    return items


#: A folder holding one of these was written by ``qkv inspect`` (``qkv findings``): it may write there again.
INSPECT_MARKS = ("viewer.html", "similarity.json")
FINDINGS_MARKS = ("abnar.json", "michel.json", "kobayashi.json")


def _check_out_folder(out: Path, marks: tuple[str, ...], command: str) -> None:
    """Refuse an ``--out`` that is a file, or a folder holding files the command did not write (its figures
    would be mixed with them, or replace them)."""
    from qkv.errors import QkvError

    if out.is_file():
        raise QkvError(f"--out {out} is a file, not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not any((out / n).is_file() for n in marks):
        raise QkvError(f"--out {out} holds files qkv {command} did not write; its results would be mixed with them "
                       "(or replace them): choose a new or empty --out")


def _inspect(args: argparse.Namespace) -> int:
    from qkv.analysis.inspect_methods import METHODS
    from qkv.analysis.plots import FORMATS
    from qkv.analysis.viewer import run_inspect
    _check_out_folder(Path(args.out), INSPECT_MARKS, "inspect")

    formats = _csv(args.format, FORMATS, "--format")
    methods = _csv(args.methods, METHODS, "--methods")
    if args.flow_max_tokens < 1:
        raise ValueError(f"--flow-max-tokens {args.flow_max_tokens} must be ≥ 1")
    if args.similar_to is not None:
        return _similarity(args, formats)
    if _image_model_or_picture(args):
        return _inspect_picture(args, formats)
    ins, paths = run_inspect(args.model, args.text, args.out, text_b=args.pair,
                             long_text="truncate" if args.truncate else "error", methods=methods,
                             ablation=args.ablation, flow_max_tokens=args.flow_max_tokens, formats=formats,
                             parity=args.parity, importance=args.importance)
    ext = formats[0]
    if "generated" in paths:  # an encoder-decoder: its output and the cross-attention maps
        n_layers, n_heads, t, s = ins.cross_attentions.shape
        print(f"{s} source tokens → {' '.join(ins.output_tokens)}; {n_layers} layers × {n_heads} heads")
        print(f"cross-attention: {paths['cross_0']}  (also decoder_attention_layer_*.{ext}, "
              f"encoder_attention_layer_*.{ext})")
        return 0
    n_layers, n_heads, t, _ = ins.attentions.shape
    print(f"{t} tokens, {n_layers} layers × {n_heads} heads (numbered from 0: L0H0 … L{n_layers - 1}H{n_heads - 1})")
    for note in ins.notes:
        print(f"note: {note}")
    if ins.parity is not None:
        print(ins.parity.describe())
    if ins.importance:
        blank = ins.importance["blank-out"]
        top = sorted(range(len(blank)), key=lambda i: -blank[i])[:5]
        print(f"token importance to {ins.importance_target}, largest by blank-out: "
              + ", ".join(f"{ins.tokens[i]} {blank[i]:+.3f}" for i in top))
    extra = [paths[k].name for k in ("overview", "methods", "ablation", "importance") if k in paths]
    print(f"viewer: {paths['viewer']}  (also {', '.join(extra)} and attention_layer_*.{ext})")
    return 0


def _image_model_or_picture(args: argparse.Namespace) -> bool:
    """Whether the model is an image model (True); a picture given to a text model, or --patch for it, is an
    error."""
    from qkv.errors import QkvError
    from qkv.vision.pictures import is_image_model_folder, is_picture_spec

    if is_image_model_folder(args.model):
        return True
    if Path(args.model).exists() and is_picture_spec(args.text):
        raise QkvError(f"{args.model} is a text model; it reads text, not pictures ({args.text}): give it a text, or "
                       "give the picture to an image model (qkv pretrain --objective image)")
    if args.patch is not None:
        raise QkvError("--patch is for image models; this model reads text")
    return False


def _patch(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--patch {text!r}: give ROW,COL, two whole numbers from 0 (e.g. --patch 3,4)")
    return int(parts[0]), int(parts[1])


def _inspect_picture(args: argparse.Namespace, formats: tuple[str, ...]) -> int:
    from qkv.vision.inspect_image import run_inspect_picture

    ins, paths = run_inspect_picture(args.model, args.text, args.out, patch=_patch(args.patch), formats=formats)
    n_layers, n_heads, t, _ = ins.attentions.shape
    print(f"{t} tokens ([CLS] and patches), {n_layers} layers × {n_heads} heads; drawn: the attention of "
          f"{ins.tokens[ins.query]}")
    for note in ins.notes:
        print(f"note: {note}")
    if ins.prediction:
        print(f"predicted {ins.prediction['label']} (probability {ins.prediction['probability']:.3f})")
    if ins.words:
        print(f"caption: {' '.join(ins.words)}  (cross-attention: {paths['cross_0']})")
    ext = formats[0]
    print(f"viewer: {paths['viewer']}  (also {paths['rollout'].name} and image_attention_layer_*.{ext})")
    return 0


def _similarity(args: argparse.Namespace, formats: tuple[str, ...]) -> int:
    import json

    from qkv._fs import atomic_write_text
    from qkv.analysis import plots
    from qkv.analysis.figures import similarity_figure
    from qkv.analysis.seq2seq_inspect import output_folder
    from qkv.analysis.similarity_map import explain_similarity

    m = explain_similarity(args.model, args.text, args.similar_to)  # the folder: its embedding settings
    out = output_folder(args.out)
    saved = plots.save_formats(similarity_figure(m.tokens_a, m.tokens_b, m.contributions, m.cosine),
                               out / "similarity", formats)
    atomic_write_text(out / "similarity.json", json.dumps(m.to_dict(), indent=1) + "\n")
    print(f"cosine {m.cosine:.4f} ({m.pooling} pooling) = the sum of {m.contributions.size} token-pair contributions "
          f"({m.contributions.sum():.4f}); the largest:")
    for a, b, v in m.top_pairs(5):
        print(f"  {v:+.4f}  {a} · {b}")
    print(f"map: {', '.join(str(p) for p in saved.values())}  (numbers: {out / 'similarity.json'})")
    return 0
