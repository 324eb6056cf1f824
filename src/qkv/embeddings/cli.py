"""``qkv embed``, ``qkv index``, ``qkv search``, ``qkv train-embeddings``, ``qkv eval-embeddings``:
parse, one library call, print where the result went. Errors are printed by :func:`qkv.cli.main`.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from qkv.embeddings.cli_options import POOLING_HELP, add_embed_options, add_input_options, pooling_arg

__all__ = ["add_embedding_parsers", "convert_embed_options"]

#: qkv.embeddings.ann.INDEX_TYPES, without importing numpy.
_INDEX_TYPES = ("exact", "faiss-ivf", "faiss-hnsw")


def add_embedding_parsers(sub) -> None:
    """Add the embedding subcommands to ``sub`` (an argparse subparsers object)."""
    e = sub.add_parser("embed", help="document vectors of a text/JSONL/CSV/TSV file or stdin",
                       description="Embed every document of INPUT (a text file, one document per line; "
                       "JSONL with a text field; CSV/TSV with a text column; .gz of any; or - for stdin) with MODEL (a qkv folder, "
                       "run, Hugging Face BERT folder, or sentence-transformers folder, whose pooling, "
                       "Normalize and max_seq_length it follows) and write --out: .npy (float32 rows in input "
                       "order), .jsonl (id + vector) or .parquet (needs pyarrow). Streams in chunks; the "
                       "output appears only when complete. Under torchrun --nproc-per-node K, K processes embed "
                       "a share each into shards beside --out, merged into --out in input order; a rerun keeps the "
                       "finished shards. See docs/embeddings.md.")
    e.add_argument("model", help="model folder")
    e.add_argument("input", help="input file, or - for standard input")
    e.add_argument("--out", required=True, help="output file: .npy, .jsonl or .parquet")
    e.add_argument("--force", action="store_true",
                   help="replace an existing --out (atomically, when the new one is complete)")
    e.add_argument("--chunk-size", type=int, default=4096, help="documents per length-grouped chunk")
    add_input_options(e)
    add_embed_options(e)
    e.set_defaults(func=_embed)

    i = sub.add_parser("index", help="embed a corpus into a search index folder",
                       description="Embed CORPUS (a file as for qkv embed, -, a folder, or "
                       "dataset:NAME[:SPLIT]) with MODEL into the folder --out (vectors, ids, texts, model "
                       "reference, and with --index faiss-ivf or faiss-hnsw an approximate FAISS index); query it "
                       "with qkv search. Under torchrun, K processes embed a share each (as for qkv embed).")
    i.add_argument("model", help="model folder")
    i.add_argument("corpus", help="file, -, folder or dataset:NAME[:SPLIT]")
    i.add_argument("--out", required=True, help="index folder (created; must not hold anything)")
    g = i.add_argument_group("index type (docs/embeddings.md: recall and latency of each)")
    g.add_argument("--index", dest="index_type", choices=_INDEX_TYPES, default="exact",
                   help="exact (default: every query scored against all vectors; best for up to ~100k documents), "
                   "faiss-ivf or faiss-hnsw (approximate, through faiss-cpu: pip install faiss-cpu)")
    g.add_argument("--nlist", type=int, default=None, help="faiss-ivf: k-means cells (default ≈ √N)")
    g.add_argument("--nprobe", type=int, default=None, help="faiss-ivf: cells scanned per query, recorded as the "
                   "index's default (default 16)")
    g.add_argument("--hnsw-m", type=int, default=None, help="faiss-hnsw: links per vector (default 32)")
    g.add_argument("--ef-construction", type=int, default=None, help="faiss-hnsw: candidates while building "
                   "(default 40)")
    g.add_argument("--ef-search", type=int, default=None, help="faiss-hnsw: candidates per query, recorded as the "
                   "index's default (default 64)")
    add_input_options(i)
    add_embed_options(i)
    i.set_defaults(func=_index)

    s = sub.add_parser("search", help="top-k documents of an index for a query",
                       description="Embed QUERY with the index's model and options and print the K most "
                       "cosine-similar documents.")
    s.add_argument("index", help="index folder made by qkv index")
    s.add_argument("query", nargs="+", help="query text(s)")
    s.add_argument("-k", type=int, default=10, help="results per query (default 10)")
    s.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    s.add_argument("--nprobe", type=int, default=None, help="a faiss-ivf index: cells scanned per query (default: "
                   "the index's)")
    s.add_argument("--ef-search", type=int, default=None, help="a faiss-hnsw index: candidates per query (default: "
                   "the index's)")
    add_embed_options(s, ("device", "precision"), title=None, helps={"device": None})
    s.set_defaults(func=_search)

    t = sub.add_parser("train-embeddings", help="contrastive training (SimCSE or same-label) of an encoder",
                       description="Train MODEL (a qkv run or folder, or a Hugging Face BERT folder) for "
                       "document embeddings: unsupervised SimCSE (each text twice through dropout is the "
                       "positive pair) or supervised (documents with the same label are positives), "
                       "in-batch negatives, on the training engine. --out is a run folder (run.json, "
                       "metrics.jsonl, curve.png, checkpoints) that ends as a model folder that qkv embed uses "
                       "and (by default, --format sentence-transformers) sentence_transformers.SentenceTransformer "
                       "loads. SIGINT/SIGTERM save a checkpoint and exit; --resume (the same command with "
                       "--resume) continues bit-identically. One process (no torchrun).")
    t.add_argument("model", help="starting model folder")
    t.add_argument("--corpus", action="append", required=True, metavar="SPEC",
                   help="training text: file, folder or dataset:NAME[:SPLIT] (repeatable)")
    t.add_argument("--out", required=True, help="the run folder (must not hold anything, unless --resume)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint (give the same model, data and "
                   "options)")
    t.add_argument("--time-budget", dest="time_budget", type=float, default=None, metavar="MINUTES",
                   help="train for this many minutes instead of --steps: the learning rate decays with elapsed "
                   "time and reaches zero at the deadline")
    t.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="fp32",
                   help="fp32, bf16 (mixed precision, float32 master weights; fp32 with a message where the CPU "
                   "has no native bf16) or auto (bf16 where native) (default fp32)")
    t.add_argument("--objective", choices=("simcse", "supervised"), default="simcse")
    t.add_argument("--label-field", default=None, help="JSONL field or CSV/TSV column with the label (supervised, files)")
    t.add_argument("--text-field", default="text")
    t.add_argument("--max-docs", type=int, default=None, help="seeded random sample of this many documents")
    for flag, typ, default, text in (("--temperature", float, 0.05, "softmax temperature τ"),
                                     ("--steps", int, 300, "optimiser steps"),
                                     ("--batch-size", int, 32, "documents per batch (in-batch negatives)"),
                                     ("--lr", float, 3e-5, "peak learning rate (linear warm-up and decay)"),
                                     ("--max-len", int, 128, "training window in tokens (texts are cut)"),
                                     ("--dropout", float, None, "dropout (default: the model's own)"),
                                     ("--seed", int, 0, "random seed")):
        t.add_argument(flag, type=typ, default=default, help=f"{text} (default {default})")
    t.add_argument("--pooling", type=pooling_arg, default="mean", metavar="MODE",
                   help=POOLING_HELP + " (default mean)")
    t.add_argument("--format", dest="folder_format", choices=("sentence-transformers", "qkv"),
                   default="sentence-transformers",
                   help="the output folder: sentence-transformers (default: a Hugging Face BERT folder with "
                   "modules.json, which both qkv embed and sentence_transformers.SentenceTransformer load; "
                   "needs a BERT-expressible model and the last layer) or qkv (qkv.json, any qkv model)")
    t.add_argument("--layers", type=int, nargs="+", default=[-1], metavar="I")
    t.add_argument("--device", default=None)
    t.add_argument("--no-progress", dest="progress", action="store_false")
    t.set_defaults(func=_train)

    v = sub.add_parser("eval-embeddings", help="k-NN, logistic regression and MAP against TF-IDF",
                       description="Evaluate MODEL(s) on the test split of --dataset: k-NN accuracy and "
                       "logistic-regression accuracy (trained on the train split's vectors), retrieval MAP "
                       "(same label = relevant), next to a TF-IDF baseline computed in the same run. Prints "
                       "a table and writes it as JSON.")
    v.add_argument("model", nargs="+", help="model folder(s)")
    v.add_argument("--dataset", required=True,
                   help="reuters8, 20newsgroups, reuters52, or a labelled .jsonl/.csv/.tsv file (optionally .gz) "
                        "with text, label[, split] fields")
    v.add_argument("--out", default=None, help="JSON result (default: eval-embeddings-DATASET.json)")
    v.add_argument("--force", action="store_true", help="replace an existing --out")
    v.add_argument("--max-train", type=int, default=None, help="subsample the train split (stated in output)")
    v.add_argument("--max-test", type=int, default=None, help="subsample the test split (stated in output)")
    v.add_argument("--k", type=int, default=10, help="neighbours for k-NN (default 10)")
    v.add_argument("--seed", type=int, default=0)
    add_embed_options(v, ("max_len", "batch_size", "precision", "device", "progress"), title=None,
                       helps={"max_len": "window length (default: the model folder's)", "batch_size": None,
                              "device": None, "progress": None})
    v.set_defaults(func=_eval)


def _options(args, **fixed):
    """The one :class:`~qkv.embeddings.options.EmbedOptions` of a subcommand: every option field
    it parsed (the embedding options, ``--chunk-size``), then ``fixed``; validated here, before any
    work."""
    from qkv.embeddings.options import EmbedOptions

    given = {name: getattr(args, name) for name in EmbedOptions.field_names() if hasattr(args, name)}
    return EmbedOptions(**{**given, **fixed})


def convert_embed_options(args):
    """The :class:`~qkv.embeddings.options.EmbedOptions` of ``qkv convert`` (``None`` when no
    ``--to sentence-transformers``; an embedding option without it is refused)."""
    from qkv.embeddings.errors import EmbeddingError

    given = [f for f in ("pooling", "normalize", "max_len") if getattr(args, f, None) is not None]
    if args.to != "sentence-transformers":
        if given:
            raise EmbeddingError(f"--{given[0].replace('_', '-')} sets what a sentence-transformers folder "
                                 "declares; add --to sentence-transformers")
        return None
    return _options(args)


def _records(args, spec: str):
    from qkv.data.readers import read_records

    if spec != "-" and (spec.startswith("dataset:") or Path(spec).is_dir()):
        from qkv.data.corpus import open_corpus

        corpus = open_corpus(spec, text_field=args.text_field, encoding_errors=args.encoding_errors)
        return ((d.source, d.text) for d in corpus.documents())
    return read_records(spec, fmt=args.input_format, text_field=args.text_field, id_field=args.id_field,
                        encoding_errors=args.encoding_errors)


def _report(stats, empty_ids, mode: str) -> str:
    parts = [f"{stats.documents} documents, {stats.tokens} tokens, {stats.windows} windows"]
    if stats.long_documents:
        parts.append(f"{stats.long_documents} longer than one window "
                     + (f"(truncated: {stats.truncated})" if stats.truncated else "(windows averaged)"))
    if stats.empty:
        what = {"skip": "left out", "zero": "zero vectors"}[mode]
        parts.append(f"{stats.empty} empty documents {what} (ids {', '.join(map(str, empty_ids))}"
                     f"{' …' if stats.empty > len(empty_ids) else ''})")
    return "; ".join(parts)


def _embed(args) -> int:
    from qkv._fs import check_output_path
    from qkv.embeddings.embedder import Embedder
    from qkv.embeddings.shards import embed_sharded, shard_plan
    from qkv.embeddings.streams import open_writer, output_format

    output_format(args.out)  # an unknown format fails before the model is loaded
    check_output_path(args.out, inputs=(args.input,), replace=args.force)
    plan = shard_plan(args.out, args.input)
    if plan is not None:  # under torchrun: this process's share, merged by rank 0
        r = embed_sharded(args.model, _records(args, args.input), args.out, plan, options=_options(args),
                          source=args.input)
        if r.rank == 0:
            print(f"wrote {r.rows} × {r.dim} vectors to {args.out} from {r.world} shards: "
                  f"{_report(r.stats, r.empty_ids, args.empty)}")
        else:
            print(_shard_line(r, Path(args.out)))
        return 0
    embedder = Embedder(args.model, _options(args))
    with open_writer(args.out, embedder.dim) as writer:
        for ids, vectors in embedder.embed_stream(_records(args, args.input)):
            writer.write(ids, vectors)
    print(f"wrote {writer.rows} × {embedder.dim} vectors to {args.out}: "
          f"{_report(embedder.stats, embedder.empty_ids, args.empty)}")
    if args.empty == "skip" and embedder.stats.empty and args.out.endswith(".npy"):
        print("note: .npy rows follow the input order without the empty documents; .jsonl/.parquet keep ids")
    return 0


def _shard_line(r, out: Path) -> str:
    how = "kept from an earlier attempt" if r.kept else "written"
    return f"rank {r.rank}/{r.world}: shard of {r.shard_rows} documents {how} (merged into {out} by rank 0)"


def _index(args) -> int:
    from qkv.embeddings.ann import AnnOptions
    from qkv.embeddings.search import build_index
    from qkv.embeddings.shards import index_sharded, shard_plan

    ann = AnnOptions.of(args.index_type, nlist=args.nlist, nprobe=args.nprobe, hnsw_m=args.hnsw_m,
                        ef_construction=args.ef_construction, ef_search=args.ef_search)  # checked before any work
    plan = shard_plan(args.out, args.corpus)
    if plan is None:
        meta = build_index(args.model, _records(args, args.corpus), args.out, source=args.corpus,
                           options=_options(args), ann=ann)  # normalize: forced on for an index
    else:  # under torchrun: this process's share, merged by rank 0
        r = index_sharded(args.model, _records(args, args.corpus), args.out, plan, options=_options(args), ann=ann,
                          source=args.corpus)
        if r.rank != 0:
            print(_shard_line(r, Path(args.out)))
            return 0
        meta = r.meta
    kind = meta["index"]["type"]
    print(f"indexed {meta['count']} documents ({meta['dim']}-d, {meta['long_documents']} longer than one "
          f"window, {meta['empty_skipped']} empty left out) into {args.out}"
          + (f" with a {kind} index" if kind != "exact" else ""))
    return 0


def _search(args) -> int:
    from qkv.embeddings.search import search

    results = search(args.index, args.query, k=args.k, device=args.device, precision=args.precision,
                     nprobe=args.nprobe, ef_search=args.ef_search)
    for query, hits in zip(args.query, results):
        if args.json:
            for h in hits:
                print(json.dumps({"query": query, "rank": h.rank, "score": round(h.score, 6), "id": h.id,
                                  "text": h.text}, ensure_ascii=False))
            continue
        print(f"query: {query}")
        for h in hits:
            text = " ".join(h.text.split())
            print(f"{h.rank:3d}  {h.score:.4f}  {h.id}  {text[:100]}{'…' if len(text) > 100 else ''}")
    return 0


def _train(args) -> int:
    from qkv.data.corpus import open_corpus
    from qkv.embeddings.contrastive import train_embeddings
    from qkv.embeddings.contrastive_config import ContrastiveConfig
    from qkv.embeddings.evaluate import subsample

    cfg = ContrastiveConfig(mode=args.objective, temperature=args.temperature, steps=args.steps,
                            batch_size=args.batch_size, lr=args.lr, max_len=args.max_len,
                            pooling=args.pooling, layers=tuple(args.layers), dropout=args.dropout,
                            seed=args.seed, time_budget=args.time_budget, precision=args.precision)
    corpus = open_corpus(args.corpus, text_field=args.text_field, label_field=args.label_field)
    texts, labels = corpus.labelled()
    notes: list[str] = []
    texts, labels = subsample(texts, labels, args.max_docs, args.seed, "training data", notes)
    source = corpus.describe() + (f" ({notes[0]})" if notes else "")
    result = train_embeddings(args.model, texts, args.out, cfg, labels=labels, device=args.device,
                              progress=args.progress, source=source, folder_format=args.folder_format,
                              resume=args.resume)
    if result.status != "complete":
        print(f"interrupted after step {result.steps_done}; checkpoint saved. Continue with the same command "
              "and --resume")
        return 130
    print(f"{cfg.mode}: {result.steps_done} steps on {len(texts)} documents in {result.seconds:.0f} s; loss on a "
          f"fixed batch {result.initial_loss:.4f} -> {result.final_loss:.4f}. Model folder: {result.out} "
          f"(qkv embed {result.out} …)")
    return 0


def _eval(args) -> int:
    from qkv._fs import check_output_path
    from qkv.embeddings.errors import EmbeddingError
    from qkv.embeddings.evaluate import evaluate_models, format_table, load_eval_data

    out = Path(args.out or f"eval-embeddings-{Path(args.dataset).stem}.json")
    if args.k < 1:
        raise EmbeddingError(f"--k {args.k}: k-NN needs at least one neighbour; give --k 1 or more")
    check_output_path(out, inputs=(args.dataset,), replace=args.force)  # before the computation, not after it
    options = _options(args, empty="zero")  # checked (the device too) before the data is read
    data = load_eval_data(args.dataset, max_train=args.max_train, max_test=args.max_test, seed=args.seed)
    log = (lambda m: print(m, file=sys.stderr)) if args.progress else (lambda m: None)
    result = evaluate_models(args.model, data, k=args.k, options=options, log=log)
    result["command"] = "qkv " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["eval-embeddings"] else None
    from qkv._fs import atomic_write_text

    atomic_write_text(out, json.dumps(result, indent=2))
    print(format_table(result))
    print(f"\nsaved {out}")
    return 0
